//! Kernel mounts of btrfs images through loop devices.

use crate::cmd::{command, run};
use crate::loopdev::Loop;
use anyhow::{Context, Result, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A kernel mount (`mount -t btrfs`) of one btrfs filesystem made of one
/// or more image files, each attached to its own loop device. Unmounted on
/// drop (retrying while busy, `umount -l` as a last resort), after which
/// the devices are unregistered from the kernel's btrfs device list
/// (`btrfs device scan --forget`) and the loop devices detached.
#[derive(Debug)]
pub struct Mount {
    target: PathBuf,
    loops: Vec<Loop>,
    mounted: bool,
    /// Held while mounted: a multi-device image set is assembled once at
    /// a time in this process. Dropped after the loops.
    _lease: crate::corpus::Lease,
}

impl Mount {
    /// Mount the filesystem made of `images` (all devices of one btrfs, in
    /// any order) on `target` (created if missing) with the comma-separated
    /// mount `options` (may be empty). With `ro` among the options the loop
    /// devices are attached read-only too, so the images are never written.
    /// Multi-device filesystems are assembled with `device=` options; the
    /// kernel cannot assemble one twice, so a second `Mount` of the same
    /// multi-device images in this process waits for the first to go (up
    /// to two minutes, then fails). Single-device images may be mounted
    /// several times at once (the kernel gives the later mounts a
    /// temporary fsid).
    pub fn new<P: AsRef<Path>>(images: &[P], target: &Path, options: &str) -> Result<Mount> {
        if images.is_empty() {
            bail!("Mount::new needs at least one image");
        }
        let paths: Vec<PathBuf> = images.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let lease = crate::corpus::lease(&paths)?;
        let read_only = options.split(',').any(|o| o.trim() == "ro");
        let mut loops = Vec::with_capacity(images.len());
        for img in images {
            let img = img.as_ref();
            loops.push(if read_only {
                Loop::attach_read_only(img)?
            } else {
                Loop::attach(img)?
            });
        }
        std::fs::create_dir_all(target)
            .with_context(|| format!("cannot create mount point {}", target.display()))?;
        let mut opts: Vec<String> = options
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(String::from)
            .collect();
        if loops.len() > 1 {
            for l in &loops {
                opts.push(format!("device={}", l.device().display()));
            }
        }
        let mut cmd = command("mount");
        cmd.arg("-t").arg("btrfs");
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts.join(","));
        }
        cmd.arg(loops[0].device()).arg(target);
        if let Err(e) = run(&mut cmd) {
            let kernel_log = dmesg_tail(15);
            forget(&loops);
            return Err(e.context(format!(
                "cannot mount {} on {}; kernel log:\n{kernel_log}",
                images
                    .iter()
                    .map(|p| p.as_ref().display().to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                target.display()
            )));
        }
        Ok(Mount {
            target: target.to_path_buf(),
            loops,
            mounted: true,
            _lease: lease,
        })
    }

    /// Mount one image; see [`Mount::new`].
    pub fn single(image: &Path, target: &Path, options: &str) -> Result<Mount> {
        Self::new(&[image], target, options)
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.target
    }

    /// The loop devices, in the order of the images given to [`Mount::new`].
    pub fn devices(&self) -> Vec<&Path> {
        self.loops.iter().map(|l| l.device()).collect()
    }

    /// Unmount now and detach the loop devices, reporting errors.
    pub fn unmount(mut self) -> Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<()> {
        if !self.mounted {
            return Ok(());
        }
        self.mounted = false;
        let r = umount(&self.target);
        if r.is_ok() {
            forget(&self.loops);
        }
        let mut detach_err = None;
        for l in self.loops.drain(..) {
            if let Err(e) = l.detach() {
                detach_err.get_or_insert(e);
            }
        }
        r?;
        match detach_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner() {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Unmount `target`: retry for up to ~5 s while it is busy, then detach it
/// lazily (`MNT_DETACH`, like `umount -l`) and report that as an error.
pub fn umount(target: &Path) -> Result<()> {
    let c = CString::new(target.as_os_str().as_bytes()).context("mount point has a NUL")?;
    let mut last = std::io::Error::from_raw_os_error(0);
    for _ in 0..100 {
        // SAFETY: c is a valid path string.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        last = std::io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    let lazy = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0;
    if lazy {
        bail!(
            "umount {} failed ({last}); unmounted lazily",
            target.display()
        )
    }
    bail!("umount {} failed: {last}", target.display())
}

/// Unregister the loop devices from the kernel's btrfs device list, so a
/// later reuse of the same device numbers starts clean (best effort).
fn forget(loops: &[Loop]) {
    if loops.is_empty() {
        return;
    }
    let mut cmd = command("btrfs");
    cmd.args(["device", "scan", "--forget"]);
    for l in loops {
        cmd.arg(l.device());
    }
    let _ = run(&mut cmd);
}

/// The last `n` lines of the kernel log (empty if unreadable).
pub fn dmesg_tail(n: usize) -> String {
    match run(command("dmesg").arg("--notime")) {
        Ok(s) => {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestDir;
    use crate::tmp::is_mount_point;

    #[test]
    fn mount_and_unmount_single() {
        crate::require_privileged!();
        let t = TestDir::new("mount-unit").unwrap();
        let img = t.sparse_file("a.img", 128 << 20).unwrap();
        crate::run_args("mkfs.btrfs", ["-q", "-f", img.to_str().unwrap()]).unwrap();
        let mnt = t.join("mnt");
        {
            let m = Mount::single(&img, &mnt, "").unwrap();
            assert!(is_mount_point(m.path()));
            std::fs::write(m.path().join("hello"), b"world").unwrap();
            // Busy mount: an open file delays unmounting; drop it later.
            let f = std::fs::File::open(m.path().join("hello")).unwrap();
            let h = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                drop(f);
            });
            m.unmount().unwrap();
            h.join().unwrap();
        }
        assert!(!is_mount_point(&mnt));
        let m = Mount::single(&img, &mnt, "ro").unwrap();
        assert_eq!(std::fs::read(m.path().join("hello")).unwrap(), b"world");
        assert!(std::fs::write(m.path().join("x"), b"").is_err());
        drop(m);
        assert!(!is_mount_point(&mnt));
    }

    #[test]
    fn mount_multi_device() {
        crate::require_privileged!();
        let t = TestDir::new("mount-multi").unwrap();
        let a = t.sparse_file("a.img", 128 << 20).unwrap();
        let b = t.sparse_file("b.img", 128 << 20).unwrap();
        crate::run_args(
            "mkfs.btrfs",
            [
                "-q",
                "-f",
                "-d",
                "raid1",
                "-m",
                "raid1",
                a.to_str().unwrap(),
                b.to_str().unwrap(),
            ],
        )
        .unwrap();
        let m = Mount::new(&[&b, &a], &t.join("mnt"), "").unwrap();
        assert_eq!(m.devices().len(), 2);
        std::fs::write(m.path().join("f"), vec![7u8; 100_000]).unwrap();
        let usage =
            crate::run_args("btrfs", ["filesystem", "df", m.path().to_str().unwrap()]).unwrap();
        assert!(usage.contains("RAID1"), "{usage}");
        m.unmount().unwrap();
    }

    #[test]
    fn mount_error_is_explained() {
        crate::require_privileged!();
        let t = TestDir::new("mount-bad").unwrap();
        let img = t.sparse_file("zero.img", 16 << 20).unwrap();
        let err = Mount::single(&img, &t.join("mnt"), "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot mount"), "{err}");
    }
}

//! Loop devices.

use crate::cmd::{command, run};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// Serializes `losetup --find` within this process; `losetup` itself
/// retries when another process races it for the same free device.
static ATTACH: Mutex<()> = Mutex::new(());

/// An image file attached to a loop device (`losetup --find --show`),
/// detached on drop.
#[derive(Debug)]
pub struct Loop {
    device: PathBuf,
    image: PathBuf,
    read_only: bool,
    attached: bool,
}

impl Loop {
    /// Attach `image` read-write to the first free loop device.
    pub fn attach(image: &Path) -> Result<Loop> {
        Self::attach_with(image, false)
    }

    /// Attach `image` read-only (`losetup --read-only`): nothing, not even
    /// a kernel mount, can write to the image through it.
    pub fn attach_read_only(image: &Path) -> Result<Loop> {
        Self::attach_with(image, true)
    }

    fn attach_with(image: &Path, read_only: bool) -> Result<Loop> {
        let image = image
            .canonicalize()
            .with_context(|| format!("image {} not found", image.display()))?;
        let mut cmd = command("losetup");
        cmd.arg("--find").arg("--show");
        if read_only {
            cmd.arg("--read-only");
        }
        cmd.arg(&image);
        let out = {
            let _g = ATTACH.lock().unwrap_or_else(|e| e.into_inner());
            run(&mut cmd)?
        };
        let dev = out.trim();
        if !dev.starts_with("/dev/") {
            bail!("losetup printed {dev:?}, expected a /dev/loopN path");
        }
        let l = Loop {
            device: PathBuf::from(dev),
            image,
            read_only,
            attached: true,
        };
        if !read_only && l.sysfs_read_only() {
            // Seen with Linux 6.18 and util-linux 2.38: a loop device that
            // was attached read-only stays read-only when attached again
            // read-write. Clear the flag.
            run(command("blockdev").arg("--setrw").arg(&l.device))?;
            if l.sysfs_read_only() {
                bail!(
                    "{} stays read-only after blockdev --setrw",
                    l.device.display()
                );
            }
        }
        Ok(l)
    }

    /// `/sys/block/loopN/ro` says the device is read-only.
    fn sysfs_read_only(&self) -> bool {
        let Some(name) = self.device.file_name() else {
            return false;
        };
        std::fs::read_to_string(Path::new("/sys/block").join(name).join("ro"))
            .is_ok_and(|s| s.trim() == "1")
    }

    /// The loop device, e.g. `/dev/loop3`.
    pub fn device(&self) -> &Path {
        &self.device
    }

    /// The (canonical) image file path.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Whether the device was attached read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Detach now, reporting errors (drop detaches too, ignoring them).
    pub fn detach(mut self) -> Result<()> {
        self.detach_inner()
    }

    fn detach_inner(&mut self) -> Result<()> {
        if !self.attached {
            return Ok(());
        }
        let mut last = None;
        // Right after an unmount the device may still be busy for a moment;
        // `losetup -d` then only sets auto-clear, which is fine too.
        for _ in 0..20 {
            match run(command("losetup").arg("--detach").arg(&self.device)) {
                Ok(_) => {
                    self.attached = false;
                    if self.read_only {
                        // Do not leave the read-only flag to the next user
                        // of this device (see attach_with).
                        let _ = run(command("blockdev").arg("--setrw").arg(&self.device));
                    }
                    return Ok(());
                }
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        self.attached = false;
        Err(last.unwrap()).with_context(|| format!("cannot detach {}", self.device.display()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Err(e) = self.detach_inner() {
            eprintln!("warning: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestDir;

    #[test]
    fn attach_detach() {
        crate::require_privileged!();
        let t = TestDir::new("loop-unit").unwrap();
        let img = t.sparse_file("a.img", 8 << 20).unwrap();
        let l = Loop::attach(&img).unwrap();
        let dev = l.device().to_path_buf();
        let list = crate::run_args(
            "losetup",
            ["--list", "--noheadings", "-O", "NAME,BACK-FILE"],
        )
        .unwrap();
        assert!(
            list.lines()
                .any(|x| x.contains(dev.to_str().unwrap()) && x.contains("a.img")),
            "{list}"
        );
        let ro = Loop::attach_read_only(&img).unwrap();
        assert_ne!(ro.device(), l.device());
        let name = ro.device().file_name().unwrap().to_str().unwrap();
        let flag = std::fs::read_to_string(format!("/sys/block/{name}/ro")).unwrap();
        assert_eq!(flag.trim(), "1");
        let ro_dev = ro.device().to_path_buf();
        drop(ro);
        l.detach().unwrap();
        // A read-write attachment after a read-only one is writable.
        for _ in 0..4 {
            let rw = Loop::attach(&img).unwrap();
            assert!(
                !rw.sysfs_read_only(),
                "{} is read-only",
                rw.device().display()
            );
            std::fs::OpenOptions::new()
                .write(true)
                .open(rw.device())
                .unwrap();
            if rw.device() == ro_dev {
                break;
            }
        }
        let list = crate::run_args(
            "losetup",
            ["--list", "--noheadings", "-O", "NAME,BACK-FILE"],
        )
        .unwrap();
        assert!(
            !list
                .lines()
                .any(|x| x.split_whitespace().next() == dev.to_str()
                    && x.contains(t.path().to_str().unwrap())),
            "{list}"
        );
    }
}

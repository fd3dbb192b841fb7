//! `ubtrfs umount`: unmount a ubtrfs FUSE mount and wait until the process
//! serving it has made its last commit and exited.
//!
//! The mount answers an ioctl on its root with the id of the process
//! serving it ([`crate::fuse::control`]); that is how a ubtrfs mount is
//! told from any other and how the process is found. Before unmounting,
//! the mount's dirty pages are written back (`syncfs`) and its transaction
//! committed (`BTRFS_IOC_SYNC`), so a failing commit is reported here.
//! The unmount itself is `umount(2)` as root, else `fusermount3 -u`.

use crate::fuse::control;
use anyhow::{Context, Result, anyhow, bail};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Arguments of `umount`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Writes back and commits what the mount holds, unmounts it, then waits for \
the ubtrfs process serving it to make its last commit and exit. Fails, \
changing nothing, if MOUNTPOINT is not a ubtrfs mount or is busy. A FUSE \
mount whose process is gone (killed) is unmounted with a warning: what it \
had not committed is lost.")]
pub struct Args {
    /// Where the filesystem is mounted.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
    /// Give up waiting for the process after this many seconds (default:
    /// wait as long as its last commit takes).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
}

use crate::mountinfo::mount_at;

/// Run `umount`.
pub fn run(args: Args) -> Result<()> {
    let mp = absolute(&args.mountpoint)?;
    let shown = mp.display().to_string();
    let entry = mount_at(&mp)?.ok_or_else(|| anyhow!("{shown}: not mounted"))?;
    if !entry.fstype.starts_with("fuse") {
        bail!("{shown}: not a ubtrfs mount (it is {})", entry.fstype);
    }
    let (pid, committed) = match server_info(&mp) {
        Ok(Info { pid, rw }) => {
            let committed = if rw { commit(&mp) } else { Ok(()) };
            (Some(pid), committed)
        }
        // A FUSE mount whose process died: nothing can be asked or
        // committed any more (nor told apart from other FUSE mounts), and
        // unmounting it can only help. Over io_uring a request caught in
        // the dying process's queues ends ECANCELED or ECONNABORTED.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTCONN | libc::ECANCELED | libc::ECONNABORTED)
            ) =>
        {
            eprintln!(
                "ubtrfs: warning: {shown}: the process serving it is gone; what it had not committed is lost"
            );
            (None, Ok(()))
        }
        Err(e) => bail!("{shown}: not a ubtrfs mount ({e})"),
    };
    // Watch the process before it can exit, so its id cannot be reused.
    let watch = pid.map(Watch::new).transpose()?;
    unmount(&mp).with_context(|| format!("cannot unmount {shown}"))?;
    if let Some(w) = watch {
        let deadline = args
            .timeout
            .map(|s| Instant::now() + Duration::from_secs(s));
        w.wait(deadline, &shown)?;
    }
    committed.map_err(|e| {
        anyhow!(
            "{shown}: committing before the unmount failed ({e}); changes made after the last successful commit are lost (the mount process logs why)"
        )
    })
}

/// `path` made absolute without touching it (a dead FUSE mount cannot be
/// looked at).
fn absolute(path: &Path) -> Result<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Ok(p);
    }
    std::path::absolute(path).with_context(|| path.display().to_string())
}

/// What the mount says about itself.
pub(crate) struct Info {
    pub pid: libc::pid_t,
    pub rw: bool,
}

/// Ask the mount at `mp` who serves it; fails if it is not ubtrfs.
pub(crate) fn server_info(mp: &Path) -> std::io::Result<Info> {
    let dir = std::fs::File::open(mp)?;
    let mut buf = [0u8; control::INFO_WORDS * 8];
    // SAFETY: the ioctl writes at most the size encoded in its number,
    // which is the buffer's.
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            control::UBTRFS_IOC_SERVER_INFO as _,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&buf[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    if word(control::INFO_MAGIC) != control::MAGIC {
        return Err(std::io::Error::other("it does not answer as ubtrfs does"));
    }
    let pid = libc::pid_t::try_from(word(control::INFO_PID))
        .map_err(|_| std::io::Error::other("bad process id"))?;
    Ok(Info {
        pid,
        rw: word(control::INFO_FLAGS) & control::FLAG_READ_WRITE != 0,
    })
}

/// Write back the mount's dirty pages and commit its transaction: the
/// kernel's `syncfs` only writes back to a FUSE mount (it sends the mount
/// no FUSE_SYNCFS), then `BTRFS_IOC_SYNC` makes it commit.
pub(crate) fn commit(mp: &Path) -> std::io::Result<()> {
    match commit_and_report(mp)? {
        Some(refused) => Err(refused),
        None => Ok(()),
    }
}

/// [`commit`], with a writeback error (data refused earlier, which the
/// commit does not undo) handed back apart from the commit's own result.
pub(crate) fn commit_and_report(mp: &Path) -> std::io::Result<Option<std::io::Error>> {
    let dir = std::fs::File::open(mp)?;
    // A writeback error (data refused earlier, say for want of space) is
    // reported after the commit, which still keeps everything else.
    // SAFETY: a plain syscall on a descriptor open for this scope.
    let written = if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        let e = std::io::Error::last_os_error();
        Some(std::io::Error::new(
            e.kind(),
            format!("committed, but data written earlier was refused: {e}"),
        ))
    } else {
        None
    };
    // SAFETY: an ioctl without an argument on a descriptor open for this scope.
    if unsafe { libc::ioctl(dir.as_raw_fd(), crate::fuse::BTRFS_IOC_SYNC as _) } == 0 {
        return Ok(written);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOTTY) {
        return Err(std::io::Error::new(
            e.kind(),
            format!("the commit failed: {e}"),
        ));
    }
    // A mount process from before the ioctl: an fsync of the directory
    // reaches it at least.
    dir.sync_all()?;
    Ok(written)
}

/// `umount(2)` as root, `fusermount3 -u` otherwise.
fn unmount(mp: &Path) -> Result<()> {
    let c = CString::new(mp.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e.into());
    }
    let out = std::process::Command::new("fusermount3")
        .args(["-u", "--"])
        .arg(mp)
        .stdin(std::process::Stdio::null())
        .output()
        .context("cannot run fusermount3")?;
    if !out.status.success() {
        bail!(
            "fusermount3 -u: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A process being waited for: a pidfd, readable once it exits.
struct Watch {
    pid: libc::pid_t,
    fd: OwnedFd,
}

impl Watch {
    fn new(pid: libc::pid_t) -> Result<Self> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot watch process {pid}"));
        }
        // SAFETY: the descriptor was just created and is owned here only.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Watch { pid, fd })
    }

    /// Wait until the process has exited (or `deadline` passes).
    fn wait(&self, deadline: Option<Instant>, shown: &str) -> Result<()> {
        let started = Instant::now();
        let mut told = false;
        loop {
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 500) };
            if n > 0 {
                return Ok(());
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e).context("poll");
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                bail!(
                    "{shown} is unmounted, but process {} has not exited yet (still committing?)",
                    self.pid
                );
            }
            if !told && started.elapsed() > Duration::from_secs(5) {
                eprintln!(
                    "ubtrfs: waiting for process {} to commit and exit",
                    self.pid
                );
                told = true;
            }
        }
    }
}

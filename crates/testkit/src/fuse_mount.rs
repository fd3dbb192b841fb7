//! `ubtrfs mount` run as a child process, for tests that work through the
//! FUSE mount with ordinary system calls.

use crate::tmp::is_mount_point;
use anyhow::{Context, Result, bail};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the mount may take to appear, and the process to exit.
const TIMEOUT: Duration = Duration::from_secs(60);

/// `BIN mount [ARGS] DEV... MNT` in the foreground, stderr to
/// `MNT.stderr`. Dropped without [`UbtrfsMount::unmount`] (a failed
/// test), the child is killed and the mount detached.
#[derive(Debug)]
pub struct UbtrfsMount {
    child: Option<Child>,
    mnt: PathBuf,
    stderr: PathBuf,
}

impl UbtrfsMount {
    /// Start the child (`bin` is the `ubtrfs` binary) and wait until `mnt`
    /// (created if missing) is a mount point.
    pub fn start<P: AsRef<Path>>(
        bin: &Path,
        devices: &[P],
        mnt: &Path,
        args: &[&str],
    ) -> Result<UbtrfsMount> {
        std::fs::create_dir_all(mnt).with_context(|| format!("mkdir {}", mnt.display()))?;
        let mnt = mnt.canonicalize()?;
        let stderr = mnt.with_extension("stderr");
        let child = Command::new(bin)
            .arg("mount")
            .args(args)
            .args(devices.iter().map(|d| d.as_ref()))
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let mut m = UbtrfsMount {
            child: Some(child),
            mnt,
            stderr,
        };
        let deadline = Instant::now() + TIMEOUT;
        while !is_mount_point(&m.mnt) {
            if let Some(status) = m.child.as_mut().unwrap().try_wait()? {
                m.child = None;
                bail!(
                    "ubtrfs mount exited ({status}) before the mount appeared:\n{}",
                    m.stderr_text()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not mounted after {TIMEOUT:?}:\n{}",
                    m.mnt.display(),
                    m.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The process id of the child, if it is still running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// What the child wrote on stderr so far.
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `fusermount3 -u`, then wait for the child to exit: it must exit 0,
    /// having printed nothing, and the mount must be gone.
    pub fn unmount(self) -> Result<()> {
        let err = self.unmount_verbose()?;
        if !err.trim().is_empty() {
            bail!("ubtrfs mount printed on stderr:\n{err}");
        }
        Ok(())
    }

    /// [`UbtrfsMount::unmount`] for a child asked to log (`-v`): what it
    /// printed is returned, not an error.
    pub fn unmount_verbose(self) -> Result<String> {
        let mnt = self.mnt.clone();
        let (status, err) = self.unmount_status()?;
        if !status.success() {
            bail!("ubtrfs mount exited with {status} after fusermount3 -u:\n{err}");
        }
        if is_mount_point(&mnt) {
            bail!("{} still mounted", mnt.display());
        }
        Ok(err)
    }

    /// `fusermount3 -u`, then wait for the child to exit: its exit status
    /// and what it printed on stderr, whatever they are.
    pub fn unmount_status(self) -> Result<(ExitStatus, String)> {
        // Files just closed may still pin the mount until the server has
        // answered their (asynchronous) RELEASE: "busy" is retried briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        let out = loop {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .stdin(Stdio::null())
                .output()
                .context("run fusermount3")?;
            let busy = String::from_utf8_lossy(&out.stderr).contains("busy");
            if out.status.success() || !busy || Instant::now() > deadline {
                break out;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !out.status.success() {
            bail!(
                "fusermount3 -u {}: {}",
                self.mnt.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.wait_exit()
    }

    /// Send `sig` to the child, without waiting for it.
    pub fn send_signal(&self, sig: libc::c_int) -> Result<()> {
        let pid = self.pid().context("no child")?;
        // SAFETY: signalling our own child, which has not been reaped.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the child has exited, without waiting: its status if so.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.as_mut().context("no child")?.try_wait()?)
    }

    /// Wait for the child to exit by itself (after an unmount or a
    /// signal): its exit status and what it printed on stderr. Still
    /// running after the timeout, it is killed and the mount detached.
    pub fn wait_exit(mut self) -> Result<(ExitStatus, String)> {
        let mut child = self.child.take().context("no child")?;
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(s) = child.try_wait()? {
                return Ok((s, self.stderr_text()));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                detach(&self.mnt);
                bail!(
                    "ubtrfs mount still running after {TIMEOUT:?}:\n{}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL the child and reap it: its status. The dead mount stays
    /// attached (requests on it fail with `ENOTCONN`) until
    /// [`UbtrfsMount::kill`] or the drop detaches it.
    pub fn sigkill(&mut self) -> Result<ExitStatus> {
        let mut child = self.child.take().context("no child")?;
        child.kill()?;
        Ok(child.wait()?)
    }

    /// Kill the child (SIGKILL) and detach the dead mount: every request
    /// still waiting on it fails (`ENOTCONN`) instead of hanging.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        detach(&self.mnt);
    }
}

impl Drop for UbtrfsMount {
    fn drop(&mut self) {
        // A killed child may have left its dead mount attached.
        if self.child.is_some() || is_mount_point(&self.mnt) {
            self.kill();
        }
    }
}

/// Lazily detach whatever is mounted on `mnt` (a dead FUSE mount too).
pub fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mnt)
        .stdin(Stdio::null())
        .output();
}

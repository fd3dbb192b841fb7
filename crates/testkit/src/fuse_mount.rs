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
    pub fn unmount_verbose(mut self) -> Result<String> {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output()
            .context("run fusermount3")?;
        if !out.status.success() {
            bail!(
                "fusermount3 -u {}: {}",
                self.mnt.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let status = self.wait()?;
        let err = self.stderr_text();
        if !status.success() {
            bail!("ubtrfs mount exited with {status} after fusermount3 -u:\n{err}");
        }
        if is_mount_point(&self.mnt) {
            bail!("{} still mounted", self.mnt.display());
        }
        Ok(err)
    }

    fn wait(&mut self) -> Result<ExitStatus> {
        let mut child = self.child.take().context("no child")?;
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(s) = child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                detach(&self.mnt);
                bail!(
                    "ubtrfs mount still running {TIMEOUT:?} after the unmount:\n{}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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
        if self.child.is_some() {
            self.kill();
        }
    }
}

/// Lazily detach whatever is mounted on `mnt` (a dead FUSE mount too).
fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mnt)
        .stdin(Stdio::null())
        .output();
}

//! A fresh ext4 filesystem on a loop device: a reference ("model")
//! directory whose semantics do not depend on what the host's temporary
//! directory happens to be (tmpfs has no `FALLOC_FL_ZERO_RANGE`, say).

use crate::cmd::{command, run};
use crate::loopdev::Loop;
use crate::mount::umount;
use crate::tmp::sparse_file;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// An ext4 filesystem made on a sparse image file and mounted; unmounted
/// and detached on drop.
#[derive(Debug)]
pub struct ScratchExt4 {
    target: PathBuf,
    loop_dev: Option<Loop>,
    mounted: bool,
}

impl ScratchExt4 {
    /// Make an ext4 filesystem of `size` bytes in `image` (created or
    /// truncated) and mount it on `target` (created if missing) with the
    /// comma-separated mount `options` (may be empty).
    pub fn new(image: &Path, size: u64, target: &Path, options: &str) -> Result<ScratchExt4> {
        sparse_file(image, size)?;
        run(command("mkfs.ext4")
            .args(["-q", "-F", "-I", "256", "-E", "nodiscard"])
            .arg(image))?;
        let l = Loop::attach(image)?;
        std::fs::create_dir_all(target).with_context(|| format!("mkdir {}", target.display()))?;
        let mut cmd = command("mount");
        cmd.args(["-t", "ext4"]);
        if !options.is_empty() {
            cmd.args(["-o", options]);
        }
        run(cmd.arg(l.device()).arg(target))?;
        Ok(ScratchExt4 {
            target: target.to_path_buf(),
            loop_dev: Some(l),
            mounted: true,
        })
    }

    /// The mount point (holding ext4's own `lost+found`).
    pub fn path(&self) -> &Path {
        &self.target
    }
}

impl Drop for ScratchExt4 {
    fn drop(&mut self) {
        if self.mounted {
            self.mounted = false;
            if let Err(e) = umount(&self.target) {
                eprintln!("warning: {e:#}");
            }
        }
        if let Some(l) = self.loop_dev.take()
            && let Err(e) = l.detach()
        {
            eprintln!("warning: {e:#}");
        }
    }
}

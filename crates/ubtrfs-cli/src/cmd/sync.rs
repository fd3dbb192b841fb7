//! `ubtrfs sync`: make everything written to a ubtrfs mount durable, as
//! `btrfs filesystem sync` does on the kernel's btrfs.
//!
//! `sync(1)` and `syncfs(2)` cannot do it for a FUSE mount: the kernel
//! writes the mount's dirty pages back to the process serving it, but
//! sends it no request to make them durable (FUSE_SYNCFS goes to virtiofs
//! only). So this command writes back with `syncfs`, then asks the mount
//! to commit with `BTRFS_IOC_SYNC`, the ioctl of `btrfs filesystem sync`.

use super::umount::{Info, commit, server_info};
use anyhow::{Result, anyhow, bail};
use std::path::PathBuf;

/// Arguments of `sync`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Writes back the mount's dirty pages and commits its running transaction; \
returns once both are on the device. `btrfs filesystem sync PATH` \
commits too, but leaves pages of files still open in the kernel's cache. \
Fails if PATH is not in a ubtrfs mount, or if the commit fails (the mount \
then takes no more changes, and its process logs why).")]
pub struct Args {
    /// The mount point, or any file or directory in the mount.
    #[arg(value_name = "PATH")]
    path: PathBuf,
}

/// Run `sync`.
pub fn run(args: Args) -> Result<()> {
    let shown = args.path.display().to_string();
    match server_info(&args.path) {
        Ok(Info { rw: false, .. }) => Ok(()),
        Ok(Info { rw: true, .. }) => commit(&args.path).map_err(|e| anyhow!("{shown}: {e}")),
        Err(e) => bail!("{shown}: not in a ubtrfs mount ({e})"),
    }
}

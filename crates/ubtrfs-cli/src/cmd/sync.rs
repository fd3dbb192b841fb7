//! `ubtrfs sync`: make everything written to a ubtrfs mount durable, as
//! `btrfs filesystem sync` does on the kernel's btrfs.
//!
//! `sync(1)` and `syncfs(2)` cannot do it for a FUSE mount: the kernel
//! writes the mount's dirty pages back to the process serving it, but
//! sends it no request to make them durable (FUSE_SYNCFS goes to virtiofs
//! only). So this command writes back with `syncfs`, then asks the mount
//! to commit with `BTRFS_IOC_SYNC`, the ioctl of `btrfs filesystem sync`.

use super::umount::{Info, absolute, commit, mount_at, server_info};
use anyhow::{Result, anyhow, bail};
use std::path::PathBuf;

/// Arguments of `sync`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Writes back the mount's dirty pages and commits its running transaction; \
returns once both are on the device. `btrfs filesystem sync MOUNTPOINT` \
commits too, but leaves pages of files still open in the kernel's cache. \
Fails if MOUNTPOINT is not a ubtrfs mount, or if the commit fails (the \
mount then takes no more changes, and its process logs why).")]
pub struct Args {
    /// Where the filesystem is mounted.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
}

/// Run `sync`.
pub fn run(args: Args) -> Result<()> {
    let mp = absolute(&args.mountpoint)?;
    let shown = mp.display().to_string();
    let entry = mount_at(&mp)?.ok_or_else(|| anyhow!("{shown}: not mounted"))?;
    if !entry.fstype.starts_with("fuse") {
        bail!("{shown}: not a ubtrfs mount (it is {})", entry.fstype);
    }
    match server_info(&mp) {
        Ok(Info { rw: false, .. }) => Ok(()),
        Ok(Info { rw: true, .. }) => {
            commit(&mp).map_err(|e| anyhow!("{shown}: the commit failed: {e}"))
        }
        Err(e) => bail!("{shown}: not a ubtrfs mount ({e})"),
    }
}

//! `ubtrfs quota rescan`: count every qgroup again, as `btrfs quota
//! rescan -w` does, of images or a ubtrfs mount.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::path::PathBuf;

/// The `quota` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Count what each qgroup refers to and holds alone, from scratch.
    Rescan(RescanArgs),
}

/// Arguments of `quota rescan`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Walks every subvolume's tree, counts the tree blocks and data extents \
each reaches (a qgroup refers to what its subvolumes reach, and holds \
alone what no other subvolume reaches), writes the counts into the quota \
tree and marks them consistent, in one commit, as the kernel's rescan \
does; then prints them (bytes; through a mount, root only, it says when \
it is done). ubtrfs does not keep the counts up to \
date as it writes: every commit of a filesystem with quotas marks them \
inconsistent, as the kernel does when it cannot count, until a rescan.")]
pub struct RescanArgs {
    /// The filesystem's devices (all of them), or a ubtrfs mount point.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    devices: Vec<PathBuf>,
}

/// Run a `quota` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Rescan(a) => {
            if let [dir] = &a.devices[..]
                && dir.is_dir()
            {
                let mut args = [0u8; 64];
                if let Err(e) = super::filesystem::mount_ioctl(
                    dir,
                    crate::fuse::BTRFS_IOC_QUOTA_RESCAN.into(),
                    &mut args,
                )? {
                    bail!("quota rescan of {}: {e}", dir.display());
                }
                println!("quota rescan of {} done", dir.display());
                return Ok(());
            }
            if let Some(d) = a.devices.iter().find(|d| d.is_dir()) {
                bail!("{}: a directory among devices", d.display());
            }
            let fs = super::open_fs_rw(&a.devices)?;
            let counts = fs.quota_rescan().context("quota rescan")?;
            println!(
                "{:<12} {:>16} {:>16}",
                "qgroupid", "referenced", "exclusive"
            );
            for c in counts {
                let id = format!("{}/{}", c.qgroupid >> 48, c.qgroupid & ((1 << 48) - 1));
                println!("{id:<12} {:>16} {:>16}", c.referenced, c.exclusive);
            }
            Ok(())
        }
    }
}

//! `ubtrfs filesystem df`: the space of each block group type and
//! profile, as `btrfs filesystem df` shows it, of an unmounted filesystem
//! or of a ubtrfs mount.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use ubtrfs::format::consts::*;
use ubtrfs::fs::SpaceInfo;
use ubtrfs::mkfs::human;
use ubtrfs::volume::Profile;

/// The `filesystem` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show the space of each block group type and profile.
    Df(DfArgs),
}

/// Arguments of `filesystem df`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints a line per type and profile: its block groups' size (total) and \
what is used in them, as `btrfs filesystem df` does; then GlobalReserve, \
the metadata space the kernel would hold back for this filesystem (ubtrfs \
holds back as much in `df`'s free space).")]
pub struct DfArgs {
    /// Sizes in bytes.
    #[arg(short = 'b', long)]
    raw: bool,
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Run a `filesystem` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Df(a) => {
            let spaces = match &a.args[..] {
                [dir] if dir.is_dir() => from_mount(dir)?,
                devices => super::open_fs(devices)?
                    .space_info()
                    .context("reading the block groups")?,
            };
            print!("{}", df_lines(&spaces, a.raw));
            Ok(())
        }
    }
}

/// Ask the mount at `dir` (`UBTRFS_IOC_SPACE_INFO`).
fn from_mount(dir: &Path) -> Result<Vec<SpaceInfo>> {
    use crate::fuse::control;
    super::umount::server_info(dir)
        .map_err(|e| anyhow::anyhow!("{}: not in a ubtrfs mount ({e})", dir.display()))?;
    let f = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
    let mut buf = vec![0u8; control::SPACE_SIZE];
    // SAFETY: the ioctl writes at most the size its number encodes, which
    // is the buffer's.
    let rc = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            control::UBTRFS_IOC_SPACE_INFO as _,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOTTY) {
            bail!("{}: the mount is too old to tell its space", dir.display());
        }
        return Err(e).with_context(|| format!("asking {} for its space", dir.display()));
    }
    control::decode_space(&buf)
        .with_context(|| format!("{}: the mount's reply is cut short", dir.display()))
}

/// `btrfs filesystem df`'s lines.
fn df_lines(spaces: &[SpaceInfo], raw: bool) -> String {
    let size = |b: u64| if raw { b.to_string() } else { human(b) };
    let mut out = String::new();
    for s in spaces {
        if s.flags & ubtrfs::fs::SPACE_INFO_GLOBAL_RSV != 0 {
            out += &format!(
                "GlobalReserve, single: total={}, used={}\n",
                size(s.total),
                size(s.used)
            );
            continue;
        }
        let kind = match s.flags & (BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA) {
            BLOCK_GROUP_DATA => "Data",
            BLOCK_GROUP_SYSTEM => "System",
            BLOCK_GROUP_METADATA => "Metadata",
            f if f == BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA => "Data+Metadata",
            _ => "unknown",
        };
        let profile = Profile::from_flags(s.flags).map_or("unknown", |p| p.name());
        out += &format!(
            "{kind}, {profile}: total={}, used={}\n",
            size(s.total),
            size(s.used)
        );
    }
    out
}

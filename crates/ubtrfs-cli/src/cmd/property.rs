//! `ubtrfs property`: a subvolume's read-only flag, as `btrfs property
//! get|set PATH ro` shows and sets it: in a ubtrfs mount (through the
//! btrfs ioctls `BTRFS_IOC_SUBVOL_GETFLAGS` / `SETFLAGS`, which the mount
//! answers) or in an image that is not mounted, given its devices.

use super::{fs_path, resolve};
use crate::fuse::subvol_ioctl::SUBVOL_RDONLY;
use crate::fuse::{BTRFS_IOC_SUBVOL_GETFLAGS, BTRFS_IOC_SUBVOL_SETFLAGS};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use ubtrfs::format::consts::FIRST_INODE;
use ubtrfs::fs::Filesystem;

/// The `property` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show a subvolume's properties (`ro`).
    Get(GetArgs),
    /// Set a subvolume's property: `ro true` or `ro false`.
    Set(SetArgs),
}

/// Arguments of `property get`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs property get <PATH> [ro]\n       ubtrfs property get <DEV>... <PATH> [ro]",
    after_help = "\
PATH is the root of a subvolume or snapshot: in a ubtrfs mount, or, with \
devices, absolute inside an unmounted filesystem ('/' for the top level). \
Prints ro=true or ro=false, as `btrfs property get` does."
)]
pub struct GetArgs {
    /// The filesystem's devices (all of them, any order) if it is not
    /// mounted, then PATH, then optionally the property's name.
    #[arg(required = true, num_args = 1.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Arguments of `property set`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs property set [-f] <PATH> ro <true|false>\n       ubtrfs property set [-f] <DEV>... <PATH> ro <true|false>",
    after_help = "\
Makes the subvolume or snapshot at PATH read-only (ro true) or writable \
(ro false), and commits. In a mount, as in the kernel, its owner or root \
may; what was written to it before it turns read-only is in it. A \
snapshot `btrfs receive` made stays read-only unless -f is given: it then \
forgets it was received (its received UUID, which incremental sends into \
it rely on), as `btrfs property set -f` does."
)]
pub struct SetArgs {
    /// Make a received snapshot writable, forgetting it was received.
    #[arg(short, long)]
    force: bool,
    /// The filesystem's devices (all of them, any order) if it is not
    /// mounted, then PATH, `ro`, and `true` or `false`.
    #[arg(required = true, num_args = 3.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Run a `property` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Get(a) => {
            let args = match &a.args[..] {
                [rest @ .., name] if !rest.is_empty() && name.as_os_str() == "ro" => rest,
                // After a path inside an image, or a path in a mount.
                [rest @ .., prev, name]
                    if !name.is_absolute()
                        && (prev.is_absolute() && !rest.is_empty() || prev.is_dir()) =>
                {
                    bail!("unknown property {}: only ro is kept", name.display())
                }
                [first, .., last] if !last.is_absolute() && !first.is_dir() => {
                    bail!(
                        "{}: with devices, the path inside the filesystem is absolute ('/' for the top level)",
                        last.display()
                    )
                }
                [rest @ .., name] if !rest.is_empty() && !name.is_absolute() => {
                    bail!("unknown property {}: only ro is kept", name.display())
                }
                [only] if only.is_file() => {
                    bail!(
                        "{}: give the subvolume's path inside it too (absolute)",
                        only.display()
                    )
                }
                all => all,
            };
            let ro = match args {
                [path] => mounted_get(path)?,
                [devices @ .., path] => image_get(devices, path)?,
                [] => bail!("give the subvolume's path"),
            };
            println!("ro={ro}");
            Ok(())
        }
        Command::Set(a) => {
            let [rest @ .., name, value] = &a.args[..] else {
                bail!("give the path, ro and true or false");
            };
            if name.as_os_str() != "ro" {
                bail!("unknown property {}: only ro is kept", name.display());
            }
            let ro = match value.to_str() {
                Some("true") => true,
                Some("false") => false,
                _ => bail!("ro is true or false, not {}", value.display()),
            };
            match rest {
                [path] => mounted_set(path, ro, a.force),
                [devices @ .., path] => image_set(devices, path, ro, a.force),
                [] => bail!("give the subvolume's path"),
            }
        }
    }
}

/// What the mount's errno means for these requests.
fn explain(e: std::io::Error, path: &Path) -> anyhow::Error {
    let why = match e.raw_os_error().unwrap_or(0) {
        libc::EINVAL => "not the root of a subvolume",
        libc::EPERM => "only the subvolume's owner (or root) changes it",
        libc::EROFS => "the mount is read-only",
        libc::EBUSY => "files in it are open: close them first",
        libc::ENOTTY => "not in a ubtrfs mount, or one too old to answer",
        _ => "",
    };
    if why.is_empty() {
        anyhow::Error::new(e).context(path.display().to_string())
    } else {
        anyhow::anyhow!("{}: {why} ({e})", path.display())
    }
}

fn mounted_get(path: &Path) -> Result<bool> {
    let f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let mut flags = 0u64;
    // SAFETY: the ioctl writes the 8 bytes its number encodes.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BTRFS_IOC_SUBVOL_GETFLAGS as _, &mut flags) };
    if rc != 0 {
        return Err(explain(std::io::Error::last_os_error(), path));
    }
    Ok(flags & SUBVOL_RDONLY != 0)
}

fn mounted_set(path: &Path, ro: bool, force: bool) -> Result<()> {
    let f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let received = if ro {
        None
    } else {
        let mut info = crate::fuse::subvol_info::GetSubvolInfo::zeroed();
        // SAFETY: the ioctl writes the bytes its number encodes, the size
        // of `info`.
        let rc = unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                crate::fuse::subvol_info::BTRFS_IOC_GET_SUBVOL_INFO as _,
                info.bytes_mut().as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(explain(std::io::Error::last_os_error(), path));
        }
        info.received_uuid()
    };
    if let Some(uuid) = received {
        refuse_received(path, &uuid, force)?;
    }
    let flags: u64 = if ro { SUBVOL_RDONLY } else { 0 };
    // SAFETY: the ioctl reads the 8 bytes its number encodes.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BTRFS_IOC_SUBVOL_SETFLAGS as _, &flags) };
    if rc != 0 {
        return Err(explain(std::io::Error::last_os_error(), path));
    }
    if received.is_some() {
        // Forgotten: all zero, as `btrfs property set -f` sends it.
        let mut args = [0u8; crate::fuse::subvol_info::RECEIVED_ARGS_SIZE];
        // SAFETY: the ioctl reads and writes the bytes its number encodes.
        let rc = unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                crate::fuse::subvol_info::BTRFS_IOC_SET_RECEIVED_SUBVOL as _,
                args.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(explain(std::io::Error::last_os_error(), path))
                .context("made writable, but its received UUID is left");
        }
    }
    Ok(())
}

/// A received snapshot stays read-only unless forced (as `btrfs property
/// set` has it): incremental sends into it rely on its received UUID.
fn refuse_received(path: &Path, uuid: &[u8; 16], force: bool) -> Result<()> {
    if !force {
        bail!(
            "{}: a received snapshot (received UUID {}): incremental sends into it rely on that; -f makes it writable and forgets it (or make a writable snapshot of it)",
            path.display(),
            ubtrfs::format::uuid_string(uuid)
        );
    }
    Ok(())
}

/// The subvolume whose root `path` names in the filesystem on `fs`.
fn subvolume_at(fs: &Filesystem, path: &Path) -> Result<u64> {
    let p = fs_path(path)?;
    let id = resolve(fs, p, true)?;
    if id.ino != FIRST_INODE || id.is_placeholder() {
        bail!("{}: not the root of a subvolume", crate::util::show(p));
    }
    Ok(id.subvol)
}

fn image_get(devices: &[PathBuf], path: &Path) -> Result<bool> {
    let fs = super::open_fs(devices)?;
    let id = subvolume_at(&fs, path)?;
    fs.subvolume_readonly(id)
        .with_context(|| format!("subvolume {id}"))
}

fn image_set(devices: &[PathBuf], path: &Path, ro: bool, force: bool) -> Result<()> {
    let fs = super::open_fs_rw(devices)?;
    let id = subvolume_at(&fs, path)?;
    let received = if ro { None } else { fs.received_uuid(id)? };
    if let Some(uuid) = &received {
        refuse_received(path, uuid, force)?;
    }
    fs.set_subvolume_readonly(id, ro)
        .with_context(|| format!("setting ro={ro} on {}", path.display()))?;
    if received.is_some() {
        fs.set_received(id, [0; 16], 0, Default::default())
            .with_context(|| {
                format!(
                    "made {} writable, but its received UUID is left",
                    path.display()
                )
            })?;
    }
    Ok(())
}

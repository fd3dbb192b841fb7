//! `ubtrfs subvolume`: create and delete subvolumes and snapshots in an
//! image, as `btrfs subvolume create|snapshot|delete` do on a mount.

use super::{fs_path, list, resolve};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::path::PathBuf;
use ubtrfs::format::consts::FIRST_INODE;
use ubtrfs::fs::{FileKind, Filesystem, InodeId};

/// The `subvolume` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create an empty subvolume.
    Create(CreateArgs),
    /// Snapshot a subvolume.
    Snapshot(SnapshotArgs),
    /// Delete subvolumes or snapshots, with their content.
    Delete(DeleteArgs),
}

/// Arguments of `subvolume create`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume create <DEV>... <PATH>",
    after_help = "\
PATH is absolute inside the filesystem; its parent directory must exist and \
its last component must not. The new subvolume's root directory belongs to \
the calling user."
)]
pub struct CreateArgs {
    /// The filesystem's devices (all of them, any order).
    #[arg(required = true, value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// The new subvolume (starting with '/').
    #[arg(value_name = "PATH")]
    path: PathBuf,
}

/// Arguments of `subvolume snapshot`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume snapshot [-r] <DEV>... <SOURCE> <DEST>",
    after_help = "\
SOURCE is the root directory of a subvolume ('/' for the default one). If \
DEST is an existing directory the snapshot goes into it under SOURCE's name; \
else DEST names the snapshot. Nested subvolumes show up in the snapshot as \
empty directories, as with the kernel. Pending changes are committed first."
)]
pub struct SnapshotArgs {
    /// Make the snapshot read-only.
    #[arg(short = 'r', long = "readonly")]
    readonly: bool,
    /// The filesystem's devices (all of them, any order), then SOURCE, the
    /// subvolume to snapshot, and DEST, where the snapshot goes (both
    /// starting with '/').
    #[arg(required = true, num_args = 3.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Arguments of `subvolume delete`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume delete <DEV>... <PATH>",
    after_help = "\
PATH (absolute inside the filesystem) must be the root of a subvolume or \
snapshot; it is deleted with everything in it and the deletion is \
committed. The top-level subvolume, the default subvolume \
and a subvolume holding other subvolumes cannot be deleted."
)]
pub struct DeleteArgs {
    /// The filesystem's devices (all of them, any order), then PATH, the
    /// subvolume to delete (starting with '/').
    #[arg(required = true, num_args = 2.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Run a `subvolume` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Create(args) => create(args),
        Command::Snapshot(args) => snapshot(args),
        Command::Delete(args) => delete(args),
    }
}

fn open_rw(devices: &[PathBuf]) -> Result<Filesystem> {
    let fs = Filesystem::open_read_write(devices).with_context(|| {
        format!(
            "cannot open a btrfs filesystem on {} for writing",
            list(devices)
        )
    })?;
    for warning in fs.warnings() {
        eprintln!("ubtrfs: warning: {warning}");
    }
    Ok(fs)
}

/// Split an absolute path into its parent directory and last name.
fn parent_and_name(path: &[u8]) -> Result<(&[u8], &[u8])> {
    let trimmed = {
        let mut p = path;
        while p.len() > 1 && p.ends_with(b"/") {
            p = &p[..p.len() - 1];
        }
        p
    };
    let at = trimmed.iter().rposition(|&c| c == b'/').unwrap_or(0);
    let (dir, name) = (&trimmed[..at.max(1)], &trimmed[at + 1..]);
    if name.is_empty() || name == b"." || name == b".." {
        bail!(
            "{}: needs a name for the new subvolume",
            crate::util::show(path)
        );
    }
    Ok((dir, name))
}

/// The directory `dir` names, which must be one.
fn directory(fs: &Filesystem, dir: &[u8]) -> Result<InodeId> {
    let id = resolve(fs, dir, true)?;
    let st = fs.stat(id).with_context(|| crate::util::show(dir))?;
    if st.kind != FileKind::Dir {
        bail!("{}: not a directory", crate::util::show(dir));
    }
    Ok(id)
}

fn create(args: CreateArgs) -> Result<()> {
    let path = fs_path(&args.path)?;
    let (dir, name) = parent_and_name(path)?;
    let fs = open_rw(&args.devices)?;
    let parent = directory(&fs, dir)?;
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    fs.create_subvolume(parent, name, uid, gid)
        .with_context(|| format!("cannot create subvolume {}", crate::util::show(path)))?;
    fs.commit().context("commit")?;
    println!("Create subvolume '{}'", crate::util::show(path));
    Ok(())
}

fn snapshot(args: SnapshotArgs) -> Result<()> {
    let [devices @ .., source, dest] = &args.args[..] else {
        bail!("give the devices, the source subvolume and the destination");
    };
    if devices.is_empty() {
        bail!("give the devices, the source subvolume and the destination");
    }
    let src_path = fs_path(source)?;
    let dest_path = fs_path(dest)?;
    let fs = open_rw(devices)?;
    let src = resolve(&fs, src_path, true)?;
    if src.ino != FIRST_INODE {
        bail!("{}: not a subvolume", crate::util::show(src_path));
    }
    // Into an existing directory under the source's name, else as DEST.
    let (dir, name, shown) = match resolve(&fs, dest_path, true) {
        Ok(id) if fs.stat(id).is_ok_and(|s| s.kind == FileKind::Dir) => {
            let (_, src_name) = parent_and_name(src_path)
                .context("give the snapshot a name: the source is the top level")?;
            let shown = format!(
                "{}/{}",
                crate::util::show(dest_path).trim_end_matches('/'),
                crate::util::show(src_name)
            );
            (id, src_name.to_vec(), shown)
        }
        Ok(_) => bail!("{}: exists", crate::util::show(dest_path)),
        Err(_) => {
            let (d, n) = parent_and_name(dest_path)?;
            (directory(&fs, d)?, n.to_vec(), crate::util::show(dest_path))
        }
    };
    fs.create_snapshot(src.subvol, dir, &name, args.readonly)
        .with_context(|| format!("cannot snapshot {} as {shown}", crate::util::show(src_path)))?;
    println!(
        "Create a {}snapshot of '{}' in '{shown}'",
        if args.readonly { "readonly " } else { "" },
        crate::util::show(src_path)
    );
    Ok(())
}

fn delete(args: DeleteArgs) -> Result<()> {
    let [devices @ .., target] = &args.args[..] else {
        bail!("give the devices and the subvolume to delete");
    };
    if devices.is_empty() {
        bail!("give the devices and the subvolume to delete");
    }
    let path = fs_path(target)?;
    let shown = crate::util::show(path);
    let (dir, name) = parent_and_name(path)
        .with_context(|| format!("cannot delete {shown}: the top level cannot go"))?;
    let fs = open_rw(devices)?;
    let parent = directory(&fs, dir)?;
    fs.delete_subvolume(parent, name, false)
        .with_context(|| format!("cannot delete subvolume {shown}"))?;
    println!("Delete subvolume '{shown}'");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_paths() {
        assert_eq!(parent_and_name(b"/a/b").unwrap(), (&b"/a"[..], &b"b"[..]));
        assert_eq!(parent_and_name(b"/b/").unwrap(), (&b"/"[..], &b"b"[..]));
        assert!(parent_and_name(b"/").is_err());
        assert!(parent_and_name(b"/a/..").is_err());
    }
}

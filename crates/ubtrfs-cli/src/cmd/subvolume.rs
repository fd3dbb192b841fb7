//! `ubtrfs subvolume`: create and delete subvolumes and snapshots, as
//! `btrfs subvolume create|snapshot|delete` do: in a ubtrfs mount (through
//! the btrfs ioctls the mount answers, see `fuse::subvol_ioctl`), or in an
//! image that is not mounted, given its devices.

use super::{fs_path, list, open_fs_rw as open_rw, resolve};
use crate::fuse::subvol_ioctl::{self, SubvolRequest};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
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
    /// List the subvolumes and snapshots.
    List(ListArgs),
    /// Make a subvolume the one a mount shows by default.
    SetDefault(SetDefaultArgs),
    /// Show the default subvolume.
    GetDefault(GetDefaultArgs),
}

/// Arguments of `subvolume set-default`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume set-default <SUBVOLUME>\n       ubtrfs subvolume set-default <ID> <PATH>\n       ubtrfs subvolume set-default <DEV>... <ID|/SUBVOLUME>",
    after_help = "\
Makes a subvolume the default, as `btrfs subvolume set-default` does: a \
mount without subvol= (the kernel's or ubtrfs') shows it. Give the \
subvolume's directory in a ubtrfs mount, or its id and any path in the \
mount (root only, as in the kernel), or the devices of an unmounted \
filesystem and the id or the path (from the default subvolume's root, \
as ubtrfs' other commands take paths). 0 and 5 are the top level. \
Committed at once."
)]
pub struct SetDefaultArgs {
    #[arg(required = true, value_name = "ARGS")]
    args: Vec<PathBuf>,
}

/// Arguments of `subvolume get-default`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints the default subvolume as `btrfs subvolume get-default` does: \
`ID 5 (FS_TREE)` for the top level, else its id, generation, the id of \
the subvolume holding it and its path from the top level.")]
pub struct GetDefaultArgs {
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Arguments of `subvolume list`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume list [-r] <PATH>\n       ubtrfs subvolume list [-r] <DEV>...",
    after_help = "\
Lists every subvolume and snapshot but the top level, by id, as `btrfs \
subvolume list` does: its id, generation, the id of the subvolume holding \
it and its path from the top level. PATH is a directory in a ubtrfs mount \
(root only, as the kernel's listing); else the arguments are the devices \
of a filesystem that is not mounted."
)]
pub struct ListArgs {
    /// Only read-only subvolumes and snapshots.
    #[arg(short = 'r', long = "readonly")]
    readonly: bool,
    /// A directory in a ubtrfs mount, or the filesystem's devices.
    #[arg(required = true, num_args = 1.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Arguments of `subvolume create`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume create <PATH>\n       ubtrfs subvolume create <DEV>... <PATH>",
    after_help = "\
With PATH alone, PATH is in a ubtrfs mount. With devices, the filesystem is \
not mounted and PATH is absolute inside it. The parent directory must exist \
and the last component must not. The new subvolume's root directory belongs \
to the calling user. In a mount, as in the kernel, anyone who may add a name \
to the parent directory may create a subvolume there."
)]
pub struct CreateArgs {
    /// The filesystem's devices (all of them, any order) if it is not
    /// mounted, then the new subvolume.
    #[arg(required = true, num_args = 1.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Arguments of `subvolume snapshot`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume snapshot [-r] <SOURCE> <DEST>\n       ubtrfs subvolume snapshot [-r] <DEV>... <SOURCE> <DEST>",
    after_help = "\
SOURCE is the root directory of a subvolume: in a ubtrfs mount, or, with \
devices, absolute inside an unmounted filesystem ('/' for the default one). \
If DEST is an existing directory the snapshot goes into it under SOURCE's \
name; else DEST names the snapshot. Nested subvolumes show up in the \
snapshot as empty directories, as with the kernel. In a mount, what was \
written to the mount before is in the snapshot; pending changes are \
committed first. As in the kernel, the source's owner (or root) may \
snapshot it wherever they may add a name."
)]
pub struct SnapshotArgs {
    /// Make the snapshot read-only.
    #[arg(short = 'r', long = "readonly")]
    readonly: bool,
    /// The filesystem's devices (all of them, any order) if it is not
    /// mounted, then SOURCE, the subvolume to snapshot, and DEST, where
    /// the snapshot goes.
    #[arg(required = true, num_args = 2.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Arguments of `subvolume delete`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs subvolume delete <PATH>\n       ubtrfs subvolume delete <DEV>... <PATH>",
    after_help = "\
PATH, in a ubtrfs mount or (with devices) absolute inside an unmounted \
filesystem, must be the root of a subvolume or snapshot; it is deleted \
with everything in it and the deletion is committed. The top-level \
subvolume, the default subvolume and a subvolume holding other subvolumes \
cannot be deleted; in a mount, only root deletes. As in the kernel, a \
subvolume still in use in a mount (a file open in it, a working directory) \
goes from view at once, and its space when the last use ends."
)]
pub struct DeleteArgs {
    /// The filesystem's devices (all of them, any order) if it is not
    /// mounted, then PATH, the subvolume to delete.
    #[arg(required = true, num_args = 1.., value_name = "ARG")]
    args: Vec<PathBuf>,
}

/// Run a `subvolume` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Create(a) => match &a.args[..] {
            [path] => mounted_create(path),
            [devices @ .., path] => create(devices, path),
            [] => bail!("give the new subvolume's path"),
        },
        Command::Snapshot(a) => match &a.args[..] {
            [source, dest] => mounted_snapshot(source, dest, a.readonly),
            [devices @ .., source, dest] => snapshot(devices, source, dest, a.readonly),
            _ => bail!("give the source subvolume and the destination"),
        },
        Command::List(a) => list_subvolumes(&a),
        Command::SetDefault(a) => set_default(&a.args),
        Command::GetDefault(a) => get_default(&a.args),
        Command::Delete(a) => match &a.args[..] {
            [path] => mounted_delete(path),
            [devices @ .., path] => delete(devices, path),
            [] => bail!("give the subvolume to delete"),
        },
    }
}

fn list_subvolumes(a: &ListArgs) -> Result<()> {
    let mut listed = listed(&a.args)?;
    listed.sort_by_key(|s| s.id);
    for s in listed.iter().filter(|s| !a.readonly || s.readonly) {
        print_listed(s);
    }
    Ok(())
}

/// A subvolume's line in `subvolume list` (and `get-default`).
fn print_listed(s: &crate::fuse::control::ListedSubvol) {
    println!(
        "ID {} gen {} top level {} path {}",
        s.id,
        s.generation,
        s.parent,
        crate::util::show(&s.path)
    );
}

/// Every subvolume but the top level, from a mount (`args` one directory
/// in it) or from the devices `args`.
fn listed(args: &[PathBuf]) -> Result<Vec<crate::fuse::control::ListedSubvol>> {
    use crate::fuse::control::{self, ListedSubvol};
    let listed: Vec<ListedSubvol> = match args {
        [dir] if dir.is_dir() => {
            let f = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
            super::umount::server_info(dir).map_err(|e| {
                anyhow::anyhow!(
                    "{}: not in a ubtrfs mount ({e}); to list an unmounted image, give its devices",
                    dir.display()
                )
            })?;
            let mut all = Vec::new();
            let mut after = 0u64;
            loop {
                let mut buf = vec![0u8; control::LIST_SIZE];
                buf[..8].copy_from_slice(&after.to_le_bytes());
                // SAFETY: the ioctl reads and writes at most the size its
                // number encodes, which is the buffer's.
                let rc = unsafe {
                    libc::ioctl(
                        f.as_raw_fd(),
                        control::UBTRFS_IOC_SUBVOL_LIST as _,
                        buf.as_mut_ptr(),
                    )
                };
                if rc != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EPERM) {
                        bail!(
                            "{}: only root lists the subvolumes of a mount",
                            dir.display()
                        );
                    }
                    return Err(e).with_context(|| format!("listing {}", dir.display()));
                }
                let page = control::decode_list(&buf)
                    .with_context(|| format!("{}: the mount's list is cut short", dir.display()))?;
                let Some(last) = page.last().map(|s| s.id) else {
                    break;
                };
                if last <= after {
                    bail!("{}: the mount's list does not go on", dir.display());
                }
                after = last;
                all.extend(page);
            }
            all
        }
        devices => {
            let fs = Filesystem::open(devices)
                .with_context(|| format!("cannot open a btrfs filesystem on {}", list(devices)))?;
            let all = fs.subvolumes().context("reading the subvolumes")?;
            let mut out = Vec::with_capacity(all.len());
            for s in &all {
                // One whose link cannot be followed (damaged) is left out,
                // as btrfs-progs leaves it, and named.
                let path = match fs.subvolume_path(&all, s.id) {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("ubtrfs: warning: subvolume {}: {e}", s.id);
                        continue;
                    }
                };
                out.push(ListedSubvol {
                    id: s.id,
                    parent: s.parent,
                    generation: s.generation,
                    readonly: s.readonly,
                    path,
                });
            }
            out
        }
    };
    Ok(listed)
}

/// `subvolume set-default`, of a mount or of images.
fn set_default(args: &[PathBuf]) -> Result<()> {
    use crate::fuse::subvol_info::BTRFS_IOC_GET_SUBVOL_INFO;
    let mounted = |id: Option<u64>, dir: &Path| -> Result<()> {
        let id = match id {
            Some(id) => id,
            None => {
                // The subvolume holding `dir` (its tree id comes first).
                let mut info = vec![0u8; 0x1f8];
                if let Err(e) = super::filesystem::mount_ioctl(
                    dir,
                    BTRFS_IOC_GET_SUBVOL_INFO.into(),
                    &mut info,
                )? {
                    bail!("{}: which subvolume: {e}", dir.display());
                }
                u64::from_le_bytes(info[..8].try_into().unwrap_or_default())
            }
        };
        let mut word = id.to_le_bytes();
        if let Err(e) = super::filesystem::mount_ioctl(
            dir,
            crate::fuse::BTRFS_IOC_DEFAULT_SUBVOL.into(),
            &mut word,
        )? {
            bail!(
                "setting the default subvolume of {} to {id}: {e}",
                dir.display()
            );
        }
        Ok(())
    };
    let number = |p: &Path| p.to_str().and_then(|s| s.parse::<u64>().ok());
    match args {
        [dir] if dir.is_dir() => mounted(None, dir),
        [id, dir] if dir.is_dir() && number(id).is_some() => mounted(number(id), dir),
        [devices @ .., target] if !devices.is_empty() => {
            let fs = open_rw(devices)?;
            let id = match number(target) {
                Some(id) => id,
                None => {
                    let path = fs_path(target)?;
                    let at = resolve(&fs, path, true)?;
                    if at.ino != FIRST_INODE {
                        bail!("{}: not a subvolume", crate::util::show(path));
                    }
                    at.subvol
                }
            };
            fs.set_default_subvolume(id)
                .with_context(|| format!("setting the default subvolume to {id}"))
        }
        _ => bail!("give the subvolume (see --help)"),
    }
}

/// `subvolume get-default`, of a mount or of images.
fn get_default(args: &[PathBuf]) -> Result<()> {
    let id = match args {
        [dir] if dir.is_dir() => {
            use crate::fuse::control::UBTRFS_IOC_DEFAULT_SUBVOL;
            let mut word = [0u8; 8];
            if let Err(e) =
                super::filesystem::mount_ioctl(dir, UBTRFS_IOC_DEFAULT_SUBVOL.into(), &mut word)?
            {
                bail!("the default subvolume of {}: {e}", dir.display());
            }
            u64::from_le_bytes(word)
        }
        devices => super::open_fs(devices)?
            .default_subvolume()
            .context("reading the default subvolume")?,
    };
    if id == ubtrfs::format::consts::FS_TREE_OBJECTID {
        println!("ID 5 (FS_TREE)");
        return Ok(());
    }
    let all = listed(args)?;
    let s = all
        .iter()
        .find(|s| s.id == id)
        .with_context(|| format!("the default subvolume {id} is not listed"))?;
    print_listed(s);
    Ok(())
}

/// `path`'s parent directory (`.` for a bare name) and last name, on the
/// host.
fn host_parent_and_name(path: &Path) -> Result<(PathBuf, Vec<u8>)> {
    let name = path
        .file_name()
        .filter(|n| n.as_bytes() != b".." && n.as_bytes() != b".")
        .with_context(|| format!("{}: needs a name", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.as_bytes().to_vec()))
}

/// Open `dir`, a directory in a writable ubtrfs mount.
fn mounted_dir(dir: &Path) -> Result<std::fs::File> {
    let f = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
    // The mount cannot see a read-only bind mount the caller went through.
    // SAFETY: statvfs fills the struct it is given; the descriptor is open.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatvfs(f.as_raw_fd(), &mut st) } == 0 && st.f_flag & libc::ST_RDONLY != 0 {
        bail!("{}: read-only mount", dir.display());
    }
    match super::umount::server_info(dir) {
        Ok(info) if info.rw => Ok(f),
        Ok(_) => bail!("{}: the ubtrfs mount is read-only", dir.display()),
        Err(e) => bail!(
            "{}: not in a ubtrfs mount ({e}); to work on an unmounted image, give its devices first",
            dir.display()
        ),
    }
}

/// Send `request` to the mount through directory `dir`; an error says
/// what the mount's errno means for this request.
fn send(dir: &std::fs::File, request: &SubvolRequest) -> Result<()> {
    send_raw(dir, request).map_err(|e| {
        let why = match (request, e.raw_os_error().unwrap_or(0)) {
            (SubvolRequest::Snapshot { .. }, libc::EINVAL) => {
                "the source is not the root of a subvolume"
            }
            (SubvolRequest::Snapshot { .. }, libc::EXDEV) => "the source is not in this mount",
            (SubvolRequest::Destroy { .. }, libc::EPERM) if !is_root() => {
                "in a mount, only root deletes subvolumes"
            }
            (SubvolRequest::Destroy { .. }, libc::EPERM) if !has_sys_admin() => {
                "in a mount, only root with CAP_SYS_ADMIN deletes subvolumes"
            }
            (SubvolRequest::Snapshot { .. }, libc::EPERM) if !is_root() => {
                "only the source's owner (or root) snapshots it"
            }
            (_, libc::EACCES) => "no permission to add a name in that directory",
            (SubvolRequest::Destroy { .. }, libc::EINVAL | libc::ENOTDIR) => "not a subvolume",
            (SubvolRequest::Destroy { .. }, libc::EPERM) => {
                "the top-level and the default subvolume are never deleted, nor one that is \
                 immutable or append-only or in such a directory"
            }
            (SubvolRequest::Destroy { .. }, libc::ENOTEMPTY) => "it holds other subvolumes",
            (_, libc::EEXIST) => "the name exists",
            (_, libc::ENOTTY) => "the mount is too old to answer subvolume requests",
            _ => "",
        };
        if why.is_empty() {
            anyhow::Error::new(e)
        } else {
            anyhow::anyhow!("{why} ({e})")
        }
    })
}

fn send_raw(dir: &std::fs::File, request: &SubvolRequest) -> std::io::Result<()> {
    let mut args = subvol_ioctl::encode(request);
    // SAFETY: the ioctl reads at most the size its number encodes, which
    // is the buffer's (`VOL_ARGS_SIZE`).
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            subvol_ioctl::command(request) as _,
            args.as_mut_ptr(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether this process has `CAP_SYS_ADMIN` in effect.
fn has_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << 21) != 0)
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn mounted_create(path: &Path) -> Result<()> {
    let (parent, name) = host_parent_and_name(path)?;
    let dir = mounted_dir(&parent)?;
    send(&dir, &SubvolRequest::Create { name })
        .with_context(|| format!("cannot create subvolume {}", path.display()))?;
    println!("Create subvolume '{}'", path.display());
    Ok(())
}

fn mounted_snapshot(source: &Path, dest: &Path, readonly: bool) -> Result<()> {
    let src = std::fs::File::open(source).with_context(|| source.display().to_string())?;
    // Into an existing directory under the source's name, else as DEST.
    let (parent, name, shown) = if dest.is_dir() {
        let (_, src_name) = host_parent_and_name(&std::path::absolute(source)?)
            .context("give the snapshot a name")?;
        let shown = dest.join(std::ffi::OsStr::from_bytes(&src_name));
        (dest.to_path_buf(), src_name, shown)
    } else {
        let (p, n) = host_parent_and_name(dest)?;
        (p, n, dest.to_path_buf())
    };
    let dir = mounted_dir(&parent)?;
    // The mount has the kernel write back what it caches first.
    send(
        &dir,
        &SubvolRequest::Snapshot {
            fd: src.as_raw_fd() as i64,
            name,
            readonly,
        },
    )
    .with_context(|| {
        format!(
            "cannot snapshot {} as {}",
            source.display(),
            shown.display()
        )
    })?;
    println!(
        "Create a {}snapshot of '{}' in '{}'",
        if readonly { "readonly " } else { "" },
        source.display(),
        shown.display()
    );
    Ok(())
}

fn mounted_delete(path: &Path) -> Result<()> {
    let (parent, name) = host_parent_and_name(path)?;
    let dir = mounted_dir(&parent)?;
    send(&dir, &SubvolRequest::Destroy { name })
        .with_context(|| format!("cannot delete subvolume {}", path.display()))?;
    // As `btrfs subvolume delete --commit-after`: the deletion is durable.
    // Data refused earlier (a full disk) is another write's failure, told
    // but not this command's.
    let refused = super::umount::commit_and_report(&parent)
        .with_context(|| format!("committing the deletion of {}", path.display()))?;
    if let Some(e) = refused {
        eprintln!("ubtrfs: warning: {}: {e}", parent.display());
    }
    println!("Delete subvolume '{}'", path.display());
    Ok(())
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

fn create(devices: &[PathBuf], path: &Path) -> Result<()> {
    let path = fs_path(path)?;
    let (dir, name) = parent_and_name(path)?;
    let fs = open_rw(devices)?;
    let parent = directory(&fs, dir)?;
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    fs.create_subvolume(parent, name, uid, gid)
        .with_context(|| format!("cannot create subvolume {}", crate::util::show(path)))?;
    fs.commit().context("commit")?;
    println!("Create subvolume '{}'", crate::util::show(path));
    Ok(())
}

fn snapshot(devices: &[PathBuf], source: &Path, dest: &Path, readonly: bool) -> Result<()> {
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
    fs.create_snapshot(src.subvol, dir, &name, readonly)
        .with_context(|| format!("cannot snapshot {} as {shown}", crate::util::show(src_path)))?;
    println!(
        "Create a {}snapshot of '{}' in '{shown}'",
        if readonly { "readonly " } else { "" },
        crate::util::show(src_path)
    );
    Ok(())
}

fn delete(devices: &[PathBuf], target: &Path) -> Result<()> {
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

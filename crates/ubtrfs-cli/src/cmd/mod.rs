//! The commands, one module per command group, and what they share: how
//! devices are named on the command line and how a filesystem is opened.

pub mod cat;
pub mod check;
pub mod device;
pub mod dump_tree;
pub mod filesystem;
pub mod inspect;
pub mod ls;
pub mod mkfs;
pub mod mount;
pub mod property;
pub mod quota;
pub mod restore;
pub mod scrub;
pub mod subvolume;
pub mod sync;
pub mod umount;

use anyhow::{Context, Result, bail};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use ubtrfs::fs::{Filesystem, InodeId};

/// Refuse to write to `devices` while a kernel mount uses one of them
/// (itself, or an image file behind a loop device): two writers would
/// destroy the filesystem. Another ubtrfs process is refused by the
/// library's lock.
pub fn refuse_mounted(devices: &[PathBuf]) -> Result<()> {
    for dev in devices {
        if let Some(how) = mounted(dev) {
            bail!("{} is mounted ({how}); unmount it first", dev.display());
        }
    }
    Ok(())
}

/// How `dev` is in use by the kernel, if it is: a block device the kernel
/// holds (mounted, or part of a mounted btrfs), or an image file behind a
/// loop device it holds. Loop devices are matched by the backing file's
/// device and inode numbers, so a hard link, a bind mount or another path
/// to the same file is found too, and so is another loop device on the
/// same file when a loop device is given.
pub fn mounted(dev: &Path) -> Option<String> {
    let meta = std::fs::metadata(dev).ok()?;
    let mut blocks: Vec<PathBuf> = Vec::new();
    let backing = if meta.file_type().is_block_device() {
        let canon = std::fs::canonicalize(dev).ok()?;
        let backing = canon
            .file_name()
            .and_then(|n| loop_backing(&n.to_string_lossy()));
        blocks.push(canon);
        backing
    } else {
        Some((meta.dev(), meta.ino()))
    };
    if let Some((st_dev, ino)) = backing {
        blocks.extend(loops_backed_by(st_dev, ino));
    }
    blocks
        .into_iter()
        .find(|b| held_by_kernel(b))
        .map(|b| describe_holder(&b))
}

/// The (device, inode) numbers of the file behind loop device `name`
/// (`loop3`), if it is one: from `LOOP_GET_STATUS64`, or, where the
/// device cannot be opened (not root), from the path sysfs shows.
fn loop_backing(name: &str) -> Option<(u64, u64)> {
    /// `LOOP_GET_STATUS64`, and the size of its `struct loop_info64`.
    const LOOP_GET_STATUS64: libc::c_ulong = 0x4c05;
    const INFO_SIZE: usize = 232;
    if !name.starts_with("loop") {
        return None;
    }
    if let Ok(f) = std::fs::File::open(Path::new("/dev").join(name)) {
        let mut info = [0u8; INFO_SIZE];
        // SAFETY: the ioctl fills a loop_info64, which is INFO_SIZE bytes.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                LOOP_GET_STATUS64,
                info.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(info[at..at + 8].try_into().unwrap_or_default());
        // lo_device is in the kernel's own encoding of device numbers.
        let d = word(0);
        let (major, minor) = ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00));
        return Some((libc::makedev(major as u32, minor as u32), word(8)));
    }
    let path = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let meta = std::fs::metadata(path.trim_end()).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The loop devices whose backing file is inode `ino` of device `st_dev`.
fn loops_backed_by(st_dev: u64, ino: u64) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| loop_backing(n) == Some((st_dev, ino)))
        .map(|n| Path::new("/dev").join(n))
        .collect()
}

/// Whether the kernel holds block device `b`: an exclusive open fails with
/// EBUSY (it is mounted, or part of a mounted btrfs); where it cannot be
/// opened at all (not root), whether sysfs shows holders of it, a mount
/// of it, or a mounted btrfs with it.
fn held_by_kernel(b: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(b);
    match opened {
        Ok(_) => false,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => true,
        Err(_) => {
            let name = b
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let holders = std::fs::read_dir(format!("/sys/block/{name}/holders"))
                .is_ok_and(|mut d| d.next().is_some());
            let in_btrfs = std::fs::read_dir("/sys/fs/btrfs").is_ok_and(|fss| {
                fss.flatten()
                    .any(|fs| fs.path().join("devices").join(&name).exists())
            });
            holders || in_btrfs || mount_of(b).is_some()
        }
    }
}

/// Where block device `b` is mounted, if it is.
fn mount_of(b: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        let mut parts = line.split(" - ");
        let (Some(head), Some(tail)) = (parts.next(), parts.next()) else {
            continue;
        };
        let source = tail.split(' ').nth(1).unwrap_or("");
        let target = head.split(' ').nth(4).unwrap_or("?");
        // Only a path names a device ("tmpfs", "proc" do not).
        if source.starts_with('/') && std::fs::canonicalize(source).is_ok_and(|s| s == b) {
            return Some(target.to_string());
        }
    }
    None
}

/// Where block device `b` is mounted, or that the kernel holds it.
fn describe_holder(b: &Path) -> String {
    match mount_of(b) {
        Some(target) => format!("as {}, on {target}", b.display()),
        None => format!(
            "as {}, which the kernel holds: part of a mounted btrfs?",
            b.display()
        ),
    }
}

/// Open the filesystem made of `devices` for writing and print the
/// library's warnings on stderr.
pub fn open_fs_rw(devices: &[PathBuf]) -> Result<Filesystem> {
    refuse_mounted(devices)?;
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

/// Open the filesystem made of `devices` read-only and print the library's
/// warnings (for example about a degraded filesystem) on stderr.
pub fn open_fs(devices: &[PathBuf]) -> Result<Filesystem> {
    let fs = Filesystem::open(devices)
        .with_context(|| format!("cannot open a btrfs filesystem on {}", list(devices)))?;
    for warning in fs.warnings() {
        eprintln!("ubtrfs: warning: {warning}");
    }
    Ok(fs)
}

/// The devices, for messages: `a.img, b.img`.
pub fn list(devices: &[PathBuf]) -> String {
    devices
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A path inside the filesystem as bytes; it must be absolute.
pub fn fs_path(path: &Path) -> Result<&[u8]> {
    let bytes = path.as_os_str().as_bytes();
    if !bytes.starts_with(b"/") {
        bail!(
            "{}: a path inside the filesystem must start with '/'",
            path.display()
        );
    }
    Ok(bytes)
}

/// How many symbolic links one path lookup may follow, as on Linux.
const MAX_SYMLINKS: u32 = 40;

/// Resolve an absolute path inside the filesystem, component by component,
/// following symbolic links in the directories on the way (and in the last
/// component if `follow_last`). An absolute link target is taken relative to
/// the filesystem's root, never the host's. The error names the path.
pub fn resolve(fs: &Filesystem, path: &[u8], follow_last: bool) -> Result<InodeId> {
    walk(fs, path, follow_last).with_context(|| crate::util::show(path))
}

fn walk(fs: &Filesystem, path: &[u8], follow_last: bool) -> Result<InodeId> {
    use std::collections::VecDeque;
    let split = |p: &[u8]| -> Vec<Vec<u8>> {
        p.split(|&c| c == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .map(<[u8]>::to_vec)
            .collect()
    };
    let root = fs.root();
    let mut cur = root;
    let mut todo: VecDeque<Vec<u8>> = split(path).into();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == b".." {
            cur = fs.parent(cur)?;
            continue;
        }
        let entry = fs.lookup(cur, &name)?;
        let last = todo.is_empty();
        if entry.kind == ubtrfs::fs::FileKind::Symlink && (!last || follow_last) {
            links += 1;
            if links > MAX_SYMLINKS {
                bail!("too many levels of symbolic links");
            }
            let target = fs.read_link(entry.id)?;
            if target.starts_with(b"/") {
                cur = root;
            }
            for c in split(&target).into_iter().rev() {
                todo.push_front(c);
            }
            continue;
        }
        if !last && entry.kind != ubtrfs::fs::FileKind::Dir {
            bail!("{}: not a directory", crate::util::show(&name));
        }
        cur = entry.id;
    }
    Ok(cur)
}

/// Offset of the magic number in the primary superblock of a device.
const MAGIC_OFFSET: u64 = 0x1_0000 + 0x40;

/// Whether `path` is an existing regular file or block device of the host
/// that carries the btrfs magic in its primary superblock.
pub fn has_btrfs_magic(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut magic = [0u8; 8];
    match file.metadata() {
        Ok(m) if m.is_file() || std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()) => {
        }
        _ => return false,
    }
    file.read_exact_at(&mut magic, MAGIC_OFFSET).is_ok() && &magic == b"_BHRfS_M"
}

/// A file name from the filesystem as an `OsStr` of the host.
pub fn os_name(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

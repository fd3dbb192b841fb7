//! Thin, safe wrappers over the system calls the test kit needs and `std`
//! does not offer: extended attributes, device nodes, fifos, timestamps on
//! symlinks, `fallocate` and the clone (reflink) ioctls.
//!
//! Every function works on the path itself and never follows a final
//! symlink, unless its name says otherwise.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Effective user id is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `makedev(major, minor)`.
pub fn makedev(major: u32, minor: u32) -> u64 {
    libc::makedev(major, minor)
}

/// `(major, minor)` of a device number.
pub fn major_minor(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

/// Create a fifo with the given permission bits.
pub fn mkfifo(path: &Path, mode: u32) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: p is a valid NUL-terminated string.
    check(unsafe { libc::mkfifo(p.as_ptr(), mode as libc::mode_t) })
}

/// The kind of node [`mknod`] creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// Character device.
    Char,
    /// Block device.
    Block,
    /// Unix domain socket node (no listener).
    Socket,
    /// Fifo.
    Fifo,
}

/// Create a device, socket or fifo node (`mknod(2)`); `rdev` is used for
/// device nodes only. Needs root for device nodes.
pub fn mknod(path: &Path, kind: NodeKind, mode: u32, rdev: u64) -> io::Result<()> {
    let p = cstr(path)?;
    let fmt = match kind {
        NodeKind::Char => libc::S_IFCHR,
        NodeKind::Block => libc::S_IFBLK,
        NodeKind::Socket => libc::S_IFSOCK,
        NodeKind::Fifo => libc::S_IFIFO,
    };
    let dev = match kind {
        NodeKind::Char | NodeKind::Block => rdev,
        _ => 0,
    };
    // SAFETY: p is a valid NUL-terminated string.
    check(unsafe { libc::mknod(p.as_ptr(), fmt | (mode & 0o7777) as libc::mode_t, dev) })
}

/// `lchown(2)`: change owner without following a final symlink.
pub fn lchown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

/// Set the permission bits (all 12) with `chmod(2)`. Symlinks have no mode
/// of their own on Linux; do not call this on them.
pub fn chmod(path: &Path, mode: u32) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: p is a valid NUL-terminated string.
    check(unsafe { libc::chmod(p.as_ptr(), (mode & 0o7777) as libc::mode_t) })
}

/// A timestamp: seconds since the epoch (may be negative) and nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp {
    /// Seconds since 1970-01-01 UTC.
    pub sec: i64,
    /// Nanoseconds, `0..1_000_000_000`.
    pub nsec: u32,
}

impl Timestamp {
    /// A timestamp from seconds and nanoseconds.
    pub fn new(sec: i64, nsec: u32) -> Self {
        Timestamp { sec, nsec }
    }
}

/// Set atime and mtime with nanoseconds, never following a final symlink
/// (`utimensat(AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW)`).
pub fn set_times(path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
    let p = cstr(path)?;
    let ts = [
        libc::timespec {
            tv_sec: atime.sec as libc::time_t,
            tv_nsec: atime.nsec as libc::c_long,
        },
        libc::timespec {
            tv_sec: mtime.sec as libc::time_t,
            tv_nsec: mtime.nsec as libc::c_long,
        },
    ];
    // SAFETY: p is valid, ts points to two timespecs.
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Set only the mtime (atime left unchanged), not following symlinks.
pub fn set_mtime(path: &Path, mtime: Timestamp) -> io::Result<()> {
    let p = cstr(path)?;
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: mtime.sec as libc::time_t,
            tv_nsec: mtime.nsec as libc::c_long,
        },
    ];
    // SAFETY: p is valid, ts points to two timespecs.
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// The mtime of a path (not following symlinks).
pub fn mtime(path: &Path) -> io::Result<Timestamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok(Timestamp::new(m.mtime(), m.mtime_nsec() as u32))
}

/// Set an extended attribute on the path itself (`lsetxattr`).
pub fn set_xattr(path: &Path, name: impl AsRef<OsStr>, value: &[u8]) -> io::Result<()> {
    let p = cstr(path)?;
    let n = cname(name.as_ref())?;
    // SAFETY: valid strings; value pointer and length describe a live slice.
    check(unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// Remove an extended attribute (`lremovexattr`).
pub fn remove_xattr(path: &Path, name: impl AsRef<OsStr>) -> io::Result<()> {
    let p = cstr(path)?;
    let n = cname(name.as_ref())?;
    // SAFETY: valid strings.
    check(unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) })
}

/// Names of all extended attributes of the path itself, sorted
/// (`llistxattr`).
pub fn list_xattrs(path: &Path) -> io::Result<Vec<OsString>> {
    let p = cstr(path)?;
    loop {
        // SAFETY: a null buffer with size 0 asks for the needed size.
        let size = unsafe { libc::llistxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; size as usize];
        // SAFETY: buf is writable for buf.len() bytes.
        let got = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ERANGE) {
                continue; // grew in between
            }
            return Err(e);
        }
        buf.truncate(got as usize);
        let mut names: Vec<OsString> = buf
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| OsString::from_vec(s.to_vec()))
            .collect();
        names.sort();
        return Ok(names);
    }
}

/// Value of one extended attribute of the path itself (`lgetxattr`).
pub fn get_xattr(path: &Path, name: impl AsRef<OsStr>) -> io::Result<Vec<u8>> {
    let p = cstr(path)?;
    let n = cname(name.as_ref())?;
    loop {
        // SAFETY: size query with a null buffer.
        let size = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        if size == 0 {
            return Ok(buf);
        }
        // SAFETY: buf is writable for buf.len() bytes.
        let got =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ERANGE) {
                continue;
            }
            return Err(e);
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

/// All extended attributes of the path itself as sorted `(name, value)`.
pub fn xattrs(path: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    list_xattrs(path)?
        .into_iter()
        .map(|n| {
            let v = get_xattr(path, &n)?;
            Ok((n, v))
        })
        .collect()
}

/// `fallocate` mode bits.
pub mod falloc {
    /// Do not change the file size (allocate beyond EOF).
    pub const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
    /// Deallocate the range (must be combined with `KEEP_SIZE`).
    pub const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    /// Zero the range (as preallocated extents where possible).
    pub const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
}

/// `fallocate(2)` on an open file; `mode` is 0 or a combination of
/// [`falloc`] bits.
pub fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: the fd is open for the lifetime of `file`.
    check(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
}

// Linux ioctl numbers (asm-generic encoding): _IOW(0x94, 9, int) and
// _IOW(0x94, 13, struct file_clone_range).
const FICLONE: libc::c_ulong = 0x4004_9409;
const FICLONERANGE: libc::c_ulong = 0x4020_940d;

#[repr(C)]
struct FileCloneRange {
    src_fd: i64,
    src_offset: u64,
    src_length: u64,
    dest_offset: u64,
}

/// Make `dst` share all of `src`'s extents (`FICLONE`, a whole-file
/// reflink). Both must be on the same btrfs.
pub fn reflink(src: &File, dst: &File) -> io::Result<()> {
    // SAFETY: both fds are open; FICLONE takes the source fd as argument.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
    check(r)
}

/// Clone `len` bytes of `src` at `src_offset` to `dst` at `dst_offset`
/// (`FICLONERANGE`). Offsets and length must be block aligned, except a
/// range that ends at `src`'s EOF; `len == 0` means "to EOF".
pub fn reflink_range(
    src: &File,
    src_offset: u64,
    len: u64,
    dst: &File,
    dst_offset: u64,
) -> io::Result<()> {
    let arg = FileCloneRange {
        src_fd: src.as_raw_fd() as i64,
        src_offset,
        src_length: len,
        dest_offset: dst_offset,
    };
    // SAFETY: arg is a valid file_clone_range living across the call.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONERANGE as _, &arg) };
    check(r)
}

/// `syncfs(2)` on the filesystem holding `path`.
pub fn syncfs(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: fd is open.
    check(unsafe { libc::syncfs(f.as_raw_fd()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn xattr_roundtrip_and_times() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        match set_xattr(&f, "user.bin", &[0, 1, 255]) {
            Ok(()) => {
                set_xattr(&f, "user.empty", b"").unwrap();
                let all = xattrs(&f).unwrap();
                let user: Vec<_> = all
                    .into_iter()
                    .filter(|(n, _)| n.as_bytes().starts_with(b"user."))
                    .collect();
                assert_eq!(
                    user,
                    vec![
                        (OsString::from("user.bin"), vec![0, 1, 255]),
                        (OsString::from("user.empty"), vec![]),
                    ]
                );
                remove_xattr(&f, "user.bin").unwrap();
                assert!(get_xattr(&f, "user.bin").is_err());
            }
            // The temp dir may be on a filesystem without user xattrs.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            Err(e) => panic!("{e}"),
        }

        let l = dir.path().join("l");
        std::os::unix::fs::symlink("f", &l).unwrap();
        set_times(&l, Timestamp::new(5, 6), Timestamp::new(-7, 999_999_999)).unwrap();
        let m = std::fs::symlink_metadata(&l).unwrap();
        assert_eq!((m.mtime(), m.mtime_nsec()), (-7, 999_999_999));
        // The target is untouched.
        assert_ne!(mtime(&f).unwrap(), Timestamp::new(-7, 999_999_999));
    }

    #[test]
    fn devnums() {
        let d = makedev(259, 70000);
        assert_eq!(major_minor(d), (259, 70000));
    }
}

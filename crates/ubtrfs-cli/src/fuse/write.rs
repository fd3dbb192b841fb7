//! The handlers that change the filesystem, as plain functions returning
//! an errno. Each runs alone under [`super::Served::write`] and answers
//! with the fresh attributes of the inode it created or changed, read from
//! the library inside the same hold of the lock.

use super::{FuseFs, errno, xattr_errno};
use crate::util::rdev_from_fuse;
use fuser::{Errno, FileAttr, Generation, INodeNo, RenameFlags, Request, TimeOrNow};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{SystemTime, UNIX_EPOCH};
use ubtrfs::format::items::Timespec;
use ubtrfs::fs::{NewInode, SetAttr, Stat};

/// What a `setattr` request asks to change.
pub(super) struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
}

impl FuseFs {
    /// Create an inode of any kind (`mode` holds the type; umask applied)
    /// named `name` in `parent`, owned by the caller. `rdev` is the device
    /// number as FUSE carries it.
    pub(super) fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<(FileAttr, Generation), Errno> {
        let dir = self.inode_of(parent);
        // A zero file type means a regular file, as for mknod(2).
        let mode = match mode & libc::S_IFMT {
            0 => libc::S_IFREG | (mode & 0o7777),
            _ => mode,
        };
        let is_dev = matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK);
        self.served.write(|fs| {
            let p = fs.stat(dir).map_err(errno)?;
            let (mode, gid) = owner_group(&p, mode, req.gid());
            let new = NewInode {
                mode,
                uid: req.uid(),
                gid,
                rdev: if is_dev { rdev_from_fuse(rdev) } else { 0 },
            };
            let st = fs.create(dir, name.as_bytes(), new).map_err(errno)?;
            self.entry(&st)
        })
    }

    /// A symbolic link `name` in `parent` to `target`, owned by the caller.
    pub(super) fn do_symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(FileAttr, Generation), Errno> {
        let dir = self.inode_of(parent);
        self.served.write(|fs| {
            let p = fs.stat(dir).map_err(errno)?;
            let (_, gid) = owner_group(&p, libc::S_IFLNK | 0o777, req.gid());
            let st = fs
                .symlink(dir, name.as_bytes(), target.as_bytes(), req.uid(), gid)
                .map_err(errno)?;
            self.entry(&st)
        })
    }

    pub(super) fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        // RENAME_WHITEOUT (for overlayfs) is not supported: EINVAL, as
        // rename(2) answers for a flag the filesystem does not know.
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            return Err(Errno::EINVAL);
        }
        let mut lib_flags = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            lib_flags |= ubtrfs::fs::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            lib_flags |= ubtrfs::fs::RENAME_EXCHANGE;
        }
        let (from, to) = (self.inode_of(parent), self.inode_of(new_parent));
        self.served.write(|fs| {
            fs.rename(from, name.as_bytes(), to, new_name.as_bytes(), lib_flags)
                .map_err(errno)
        })
    }

    /// chmod, chown, utimens and truncate, in one request.
    pub(super) fn do_setattr(&self, ino: INodeNo, c: Change) -> Result<FileAttr, Errno> {
        let id = self.inode_of(ino);
        let now = Timespec::now();
        let at = |t: TimeOrNow| match t {
            TimeOrNow::Now => now,
            TimeOrNow::SpecificTime(t) => timespec(t),
        };
        let attr = SetAttr {
            mode: c.mode.map(|m| m & 0o7777),
            uid: c.uid,
            gid: c.gid,
            size: c.size,
            atime: c.atime.map(at),
            mtime: c.mtime.map(at),
            ctime: c.ctime.map(timespec),
        };
        self.served.write(|fs| {
            let st = fs.setattr(id, attr).map_err(errno)?;
            self.attr(&st)
        })
    }

    pub(super) fn do_setxattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
    ) -> Result<(), Errno> {
        // A position is for macOS resource forks only.
        if position != 0 {
            return Err(Errno::EINVAL);
        }
        let flags = u32::try_from(flags).map_err(|_| Errno::EINVAL)?;
        let id = self.inode_of(ino);
        self.served.write(|fs| {
            fs.set_xattr(id, name.as_bytes(), value, flags)
                .map_err(xattr_errno)
        })
    }

    /// Preallocate, punch a hole or zero a range. The library checks the
    /// mode: what it does not know is `EOPNOTSUPP`, as fallocate(2) says.
    pub(super) fn do_fallocate(
        &self,
        ino: INodeNo,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let mode = u32::try_from(mode).map_err(|_| Errno::EOPNOTSUPP)?;
        let id = self.inode_of(ino);
        self.served
            .write(|fs| fs.fallocate(id, mode, offset, length).map_err(errno))
    }
}

/// The mode and group of a new inode in directory `parent`, for a caller
/// of group `gid`: in a set-group-ID directory the group is the
/// directory's, and a new directory is set-group-ID too.
fn owner_group(parent: &Stat, mode: u32, gid: u32) -> (u32, u32) {
    if parent.mode & libc::S_ISGID == 0 {
        return (mode, gid);
    }
    let mode = if mode & libc::S_IFMT == libc::S_IFDIR {
        mode | libc::S_ISGID
    } else {
        mode
    };
    (mode, parent.gid)
}

/// A `SystemTime` as a btrfs timestamp (before 1970: negative seconds and
/// nanoseconds counted forward, as `struct timespec` has it).
fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => Timespec {
                    sec: -secs,
                    nsec: 0,
                },
                n => Timespec {
                    sec: -secs - 1,
                    nsec: 1_000_000_000 - n,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use ubtrfs::fs::{FileKind, InodeId};

    #[test]
    fn timestamps() {
        let t = |s: SystemTime| {
            let ts = timespec(s);
            (ts.sec, ts.nsec)
        };
        assert_eq!(t(UNIX_EPOCH + Duration::new(5, 7)), (5, 7));
        assert_eq!(
            t(UNIX_EPOCH - Duration::from_millis(1500)),
            (-2, 500_000_000)
        );
        assert_eq!(t(UNIX_EPOCH - Duration::from_secs(3)), (-3, 0));
        // And back, through the read side.
        for s in [
            UNIX_EPOCH + Duration::new(1_700_000_000, 123),
            UNIX_EPOCH - Duration::new(86_400, 999_999_999),
        ] {
            assert_eq!(super::super::system_time(&timespec(s)), s);
        }
    }

    fn dir(mode: u32, gid: u32) -> Stat {
        let now = Timespec { sec: 0, nsec: 0 };
        Stat {
            id: InodeId {
                subvol: 5,
                ino: 256,
            },
            kind: FileKind::Dir,
            mode: libc::S_IFDIR | mode,
            nlink: 1,
            uid: 0,
            gid,
            size: 0,
            nbytes: 0,
            rdev: 0,
            flags: 0,
            atime: now,
            mtime: now,
            ctime: now,
            otime: now,
            generation: 1,
        }
    }

    #[test]
    fn set_group_id_directories() {
        let plain = dir(0o755, 50);
        assert_eq!(
            owner_group(&plain, libc::S_IFREG | 0o644, 7),
            (libc::S_IFREG | 0o644, 7)
        );
        let sgid = dir(0o2775, 50);
        assert_eq!(
            owner_group(&sgid, libc::S_IFREG | 0o644, 7),
            (libc::S_IFREG | 0o644, 50)
        );
        assert_eq!(
            owner_group(&sgid, libc::S_IFDIR | 0o755, 7),
            (libc::S_IFDIR | 0o2755, 50)
        );
    }
}

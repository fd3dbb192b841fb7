//! The handlers that change the filesystem, as plain functions returning
//! an errno. Each runs alone under [`super::Served::write`] and answers
//! with the fresh attributes of the inode it created or changed, read from
//! the library inside the same hold of the lock.
//!
//! # Set-user-ID and set-group-ID bits
//!
//! The mount asks for `FUSE_HANDLE_KILLPRIV_V2`: the kernel then stops
//! asking for `security.capability` before every write, and leaves it to
//! the filesystem to clear these bits where Linux clears them. The kernel
//! marks the requests that must clear them (`FATTR_KILL_SUIDGID`,
//! `FUSE_WRITE_KILL_SUIDGID`); `on_setattr` takes its arguments in
//! `fuser`'s shape, without the mark, so the others are recognised by
//! their shape:
//!
//! * a write marked by the kernel (the writer lacks `CAP_FSETID`);
//! * a `setattr` that changes nothing: before a write, fallocate or
//!   copy_file_range by a caller without `CAP_FSETID`, the kernel asks to
//!   drop the privileges of a regular file, and with this capability what
//!   reaches the filesystem is that empty request;
//! * a change of owner or group of anything but a directory, always. A
//!   `chown(f, -1, -1)` changes neither and still clears the bits: it
//!   arrives as a `setattr` of the change time alone (for a regular file,
//!   whose times the kernel keeps itself) or as an empty one;
//! * a truncate by a caller without `CAP_FSETID`: the caller's capability
//!   is read from `/proc/PID/status` (a caller that is gone counts as
//!   unprivileged unless it was root).
//!
//! Set-group-ID is cleared only with group execute permission (without,
//! it marks mandatory locking), as the FUSE protocol specifies; Linux
//! also clears it for a caller outside the file's group, which the mount
//! cannot know.

use super::reply::Caller;
use super::{FuseFs, errno, xattr_errno};
use crate::util::rdev_from_fuse;
use fuser::{Errno, FileAttr, Generation, INodeNo, RenameFlags, TimeOrNow};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{SystemTime, UNIX_EPOCH};
use ubtrfs::format::items::Timespec;
use ubtrfs::fs::{FileKind, Filesystem, InodeId, NewInode, SetAttr, Stat};

/// What a `setattr` request asks to change.
pub(super) struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
    /// The request came through an open file (`FATTR_FH`).
    pub open_file: bool,
}

impl FuseFs {
    /// Create an inode of any kind (`mode` holds the type) named `name`
    /// in `parent`, owned by the caller. The caller's `umask` applies
    /// unless `parent` has a default ACL, which the new inode inherits
    /// instead (the kernel leaves both to the mount under
    /// `FUSE_POSIX_ACL`). `rdev` is the device number as FUSE carries it.
    /// No name: a regular file for `O_TMPFILE`, held by the library for
    /// the open file.
    pub(super) fn do_create(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: Option<&OsStr>,
        mode: u32,
        umask: u32,
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
            // The mount's nodatacow/nodatasum come with it (see
            // `Filesystem::set_new_file_flags`).
            let st = match name {
                Some(name) => fs.create_inheriting(dir, name.as_bytes(), new, umask),
                None => fs.create_tmpfile_inheriting(dir, new, umask),
            }
            .map_err(errno)?;
            self.entry(&st)
        })
    }

    /// What a write needs of the mount (also on the thread of deferred
    /// writes).
    pub(super) fn write_ctx(&self) -> WriteCtx {
        WriteCtx {
            served: std::sync::Arc::clone(&self.served),
            root: self.root,
            writeback_cache: self.writeback_cache(),
        }
    }

    /// Run `f`, a change of the contents of `id`, and put back the
    /// modification and change times `id` had if it is a regular file
    /// under the writeback cache: the kernel keeps those times itself
    /// then, and sends them (`setattr`) when it changes them. Were the
    /// library to move them too (say, when written data reaches it after
    /// the kernel sent its times), what is on disk would differ from what
    /// the kernel shows.
    pub(super) fn keeping_times<T>(
        &self,
        fs: &Filesystem,
        id: InodeId,
        f: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        keep_times(self.writeback_cache(), fs, id, f)
    }

    /// A symbolic link `name` in `parent` to `target`, owned by the caller.
    pub(super) fn do_symlink(
        &self,
        req: &Caller,
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
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let known = RenameFlags::RENAME_NOREPLACE
            | RenameFlags::RENAME_EXCHANGE
            | RenameFlags::RENAME_WHITEOUT;
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
        // The kernel let only a caller with CAP_MKNOD ask for a whiteout.
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            lib_flags |= ubtrfs::fs::RENAME_WHITEOUT;
        }
        let (from, to) = (self.inode_of(parent), self.inode_of(new_parent));
        self.served.write(|fs| {
            // The whiteout is the caller's, as a new inode in its directory.
            let dir = fs.stat(from).map_err(errno)?;
            let (_, gid) = owner_group(&dir, libc::S_IFCHR, req.gid());
            // A special file replaced may be open without FUSE having
            // seen it (see `on_unlink`): kept until the kernel forgets it.
            let held = fs
                .rename_holding(
                    from,
                    name.as_bytes(),
                    to,
                    new_name.as_bytes(),
                    lib_flags,
                    (req.uid(), gid),
                    super::is_special,
                )
                .map_err(errno)?;
            if let Some(id) = held {
                self.held().insert(id);
            }
            Ok(())
        })
    }

    /// chmod, chown, utimens and truncate, in one request.
    pub(super) fn do_setattr(
        &self,
        req: &Caller,
        ino: INodeNo,
        c: Change,
    ) -> Result<FileAttr, Errno> {
        let id = self.inode_of(ino);
        let now = Timespec::now();
        let at = |t: TimeOrNow| match t {
            TimeOrNow::Now => now,
            TimeOrNow::SpecificTime(t) => timespec(t),
        };
        // Times of the caller's own (utimensat with times). Under the
        // writeback cache the kernel sends a modification time even for
        // "now" (with the access time as now), and the times of writes
        // through the file written, with no access time.
        let given = |t: Option<TimeOrNow>| matches!(t, Some(TimeOrNow::SpecificTime(_)));
        // That modification time for "now" is the change time the same
        // request carries (the kernel stamps both from one reading of its
        // clock); any other beside an access time of now is the caller's
        // own (utimensat(now, t)).
        let just_now = |t: Option<TimeOrNow>| match (t, c.ctime) {
            (Some(TimeOrNow::SpecificTime(t)), Some(ct)) => t == ct,
            _ => false,
        };
        // An access time of now alone is utimensat(now, omit) (`touch -a`):
        // "now" with no modification time is never the kernel's own.
        let explicit_times = given(c.atime)
            || (c.atime.is_some() && c.mtime.is_none())
            || (given(c.mtime)
                && if c.atime.is_none() {
                    !c.open_file
                } else {
                    !just_now(c.mtime)
                });
        let mut attr = SetAttr {
            mode: c.mode.map(|m| m & 0o7777),
            uid: c.uid,
            gid: c.gid,
            size: c.size,
            atime: c.atime.map(at),
            mtime: c.mtime.map(at),
            ctime: c.ctime.map(timespec),
            drops_set_id: false,
            // The times the writeback cache sends after writes, through
            // the file written: never an access time.
            times_of_writes: c.open_file && c.atime.is_none(),
            size_through_open_file: c.open_file,
        };
        let times_only = SetAttr {
            atime: None,
            mtime: None,
            ctime: None,
            ..attr
        } == SetAttr::default();
        let changed = self.served.write(|fs| {
            let change = |attr: &mut SetAttr| -> ubtrfs::Result<Stat> {
                let kill = self.killpriv() && attr.mode.is_none();
                if explicit_times || kill {
                    let st = fs.stat(id)?;
                    // As in the kernel: times of the caller's own are
                    // refused on an append-only file (the library lets its
                    // writes' times through).
                    if explicit_times && st.flags & ubtrfs::format::consts::INODE_APPEND != 0 {
                        return Err(ubtrfs::Error::NotPermitted(format!(
                            "setting times: inode {} is append-only",
                            id.ino
                        )));
                    }
                    if kill {
                        // See the module documentation; an explicit mode wins.
                        attr.mode = self.mode_killed(req, &st, attr);
                        attr.drops_set_id = attr.mode.is_some();
                    }
                }
                fs.setattr(id, *attr)
            };
            match change(&mut attr) {
                Ok(st) => self.attr(&st).map(Some),
                // With the writeback cache the kernel sends the times of a
                // file it has just unlinked, and which no one has open: the
                // library has deleted it already. Nothing is left to change.
                Err(ubtrfs::Error::NotFound(_)) if times_only => Ok(None),
                Err(e) => Err(errno(e)),
            }
        })?;
        if c.size.is_some() {
            self.served.note_changed(ino);
        }
        Ok(changed.unwrap_or_else(|| deleted_file(ino)))
    }

    /// The mode a `setattr` of `st` must set to clear set-user-ID bits,
    /// if any (see the module documentation).
    fn mode_killed(&self, req: &Caller, st: &Stat, attr: &SetAttr) -> Option<u32> {
        let outsider = |gid| outside_group(req.pid(), gid);
        let owner = killed_mode(st, false, outsider)?;
        let chown = attr.uid.is_some() || attr.gid.is_some();
        let times = attr.atime.is_some() || attr.mtime.is_some();
        let ctime_only = attr.ctime.is_some() && !times && attr.size.is_none();
        // An empty request is `chown(f, -1, -1)` of a file the kernel
        // keeps no times of, or the kernel dropping a regular file's
        // privileges before a change of contents.
        if chown || ctime_only || *attr == SetAttr::default() {
            return Some(owner);
        }
        let contents = killed_mode(st, true, outsider)?;
        (attr.size.is_some() && !has_fsetid(req)).then_some(contents)
    }

    /// Set an xattr; with `kill_sgid` (over io_uring only, see `ring.rs`)
    /// setting an access ACL also clears set-group-ID.
    pub(super) fn do_setxattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        kill_sgid: bool,
    ) -> Result<(), Errno> {
        // A position is for macOS resource forks only.
        if position != 0 {
            return Err(Errno::EINVAL);
        }
        let flags = u32::try_from(flags).map_err(|_| Errno::EINVAL)?;
        let id = self.inode_of(ino);
        self.served.write(|fs| {
            fs.set_xattr(id, name.as_bytes(), value, flags)
                .map_err(xattr_errno)?;
            // The kernel asks this of an access ACL set by a caller outside
            // the file's group without CAP_FSETID, as its own filesystems
            // clear the bit then.
            if kill_sgid && name.as_bytes() == b"system.posix_acl_access" {
                let st = fs.stat(id).map_err(errno)?;
                if st.mode & libc::S_ISGID != 0 {
                    let mode = st.mode & 0o7777 & !libc::S_ISGID;
                    let change = SetAttr {
                        mode: Some(mode),
                        ..SetAttr::default()
                    };
                    fs.setattr(id, change).map_err(errno)?;
                }
            }
            Ok(())
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
        self.served.write(|fs| {
            self.keeping_times(fs, id, || {
                fs.fallocate(id, mode, offset, length).map_err(errno)
            })
        })?;
        self.served.note_changed(ino);
        Ok(())
    }
}

/// The attributes answered for a regular file the library has deleted:
/// no names, nothing in it (also the blank of an entry listed without
/// attributes).
pub(super) fn deleted_file(ino: INodeNo) -> FileAttr {
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The mode of `st` with the set-user-ID bits a change clears, if it has
/// any: set-user-ID, and set-group-ID with group execute permission or
/// when `outsider(gid)` says the caller is outside the file's group
/// ([`outside_group`]). A change of contents (`contents`) clears them on
/// regular files only, a change of owner on anything but a directory.
fn killed_mode(st: &Stat, contents: bool, outsider: impl FnOnce(u32) -> bool) -> Option<u32> {
    let applies = match st.kind {
        FileKind::File => true,
        FileKind::Dir => false,
        _ => !contents,
    };
    if !applies {
        return None;
    }
    let mut m = st.mode & 0o7777;
    m &= !libc::S_ISUID;
    if m & libc::S_ISGID != 0 && (m & libc::S_IXGRP != 0 || outsider(st.gid)) {
        m &= !libc::S_ISGID;
    }
    (m != st.mode & 0o7777).then_some(m)
}

/// What a write needs of the mount: the filesystem, the mount's root
/// (FUSE inode numbers are relative to it) and whether the kernel keeps
/// the times (writeback cache).
pub(super) struct WriteCtx {
    pub served: std::sync::Arc<super::Served>,
    root: InodeId,
    writeback_cache: bool,
}

impl WriteCtx {
    /// Write `data` at `offset` of `ino`; with `kill` (the writing
    /// process), clear the set-user-ID bits first. `cached`: the kernel's
    /// page cache writes it back, and keeps the file's times itself under
    /// the writeback cache; else (a file opened past the cache, whose
    /// times the kernel does not move) the write moves them. Returns the
    /// bytes written and whether bits were cleared.
    pub(super) fn write(
        &self,
        ino: INodeNo,
        offset: u64,
        data: &[u8],
        kill: Option<u32>,
        cached: bool,
    ) -> Result<(u32, bool), Errno> {
        let id = super::from_fuse(self.root, ino);
        // Wait for the device here, not inside the lock every other
        // change needs.
        self.served.fs_unlocked().throttle_writes(id, data.len());
        let kernel_times = self.writeback_cache && cached;
        let done = self.served.write(|fs| {
            // The common case in one change of the inode: the kernel keeps
            // a regular file's times under the writeback cache.
            if kernel_times && kill.is_none() {
                let n = fs.write_keep_times(id, offset, data).map_err(errno)?;
                return Ok((u32::try_from(n).map_err(|_| Errno::EOVERFLOW)?, false));
            }
            keep_times(kernel_times, fs, id, || {
                let killed = match kill {
                    Some(pid) => kill_privs(fs, id, pid)?,
                    None => false,
                };
                let n = fs.write(id, offset, data).map_err(errno)?;
                Ok((u32::try_from(n).map_err(|_| Errno::EOVERFLOW)?, killed))
            })
        })?;
        self.served.note_changed(ino);
        Ok(done)
    }
}

/// See [`FuseFs::keeping_times`].
fn keep_times<T>(
    writeback_cache: bool,
    fs: &Filesystem,
    id: InodeId,
    f: impl FnOnce() -> Result<T, Errno>,
) -> Result<T, Errno> {
    if !writeback_cache {
        return f();
    }
    let before = fs.stat(id).map_err(errno)?;
    let done = f()?;
    if before.kind == FileKind::File {
        let times = SetAttr {
            mtime: Some(before.mtime),
            ctime: Some(before.ctime),
            ..SetAttr::default()
        };
        fs.setattr(id, times).map_err(errno)?;
    }
    Ok(done)
}

/// Clear the set-user-ID bits of `id` ([`killed_mode`]) before a write by
/// process `pid`; true if any were set.
fn kill_privs(fs: &Filesystem, id: InodeId, pid: u32) -> Result<bool, Errno> {
    let st = fs.stat(id).map_err(errno)?;
    let Some(mode) = killed_mode(&st, true, |gid| outside_group(pid, gid)) else {
        return Ok(false);
    };
    let change = SetAttr {
        mode: Some(mode),
        drops_set_id: true,
        ..SetAttr::default()
    };
    fs.setattr(id, change).map_err(errno)?;
    Ok(true)
}

/// `CAP_FSETID`: may keep set-user-ID bits while changing a file.
const CAP_FSETID: u32 = 4;

/// Whether the caller of `req` has `CAP_FSETID` in its effective set.
fn has_fsetid(req: &Caller) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{}/status", req.pid()));
    match status.ok().as_deref().and_then(cap_eff) {
        Some(caps) => caps & (1 << CAP_FSETID) != 0,
        // Gone already (or no /proc): only root is presumed to hold it.
        None => req.uid() == 0,
    }
}

/// Whether process `pid` is outside group `gid` (neither its file-system
/// group nor a supplementary one) and without `CAP_FSETID`: the kernel
/// then clears set-group-ID even from a file without group execute
/// permission. A process gone already counts as inside.
fn outside_group(pid: u32, gid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let Some(c) = super::caller_access::Credentials::parse(&status) else {
        return false;
    };
    let fsetid = cap_eff(&status).is_some_and(|caps| caps & (1 << CAP_FSETID) != 0);
    c.gid != gid && !c.groups.contains(&gid) && !fsetid
}

/// The effective capability set in the text of `/proc/PID/status`.
fn cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
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
    fn privileges_killed() {
        let inside = |_| false;
        let file = |mode: u32| Stat {
            kind: FileKind::File,
            mode: libc::S_IFREG | mode,
            ..dir(0, 0)
        };
        assert_eq!(killed_mode(&file(0o4755), true, inside), Some(0o755));
        assert_eq!(killed_mode(&file(0o6755), true, inside), Some(0o755));
        assert_eq!(killed_mode(&file(0o2755), true, inside), Some(0o755));
        // No group execute: set-group-ID marks mandatory locking and stays.
        assert_eq!(killed_mode(&file(0o2745), true, inside), None);
        assert_eq!(killed_mode(&file(0o6745), true, inside), Some(0o2745));
        // ... unless the writer is outside the file's group.
        assert_eq!(killed_mode(&file(0o2745), true, |_| true), Some(0o745));
        assert_eq!(killed_mode(&file(0o6745), true, |_| true), Some(0o745));
        assert_eq!(killed_mode(&file(0o755), true, inside), None);
        assert_eq!(killed_mode(&dir(0o4755, 0), false, inside), None);
        // A change of owner clears them on a fifo too, not a write.
        let fifo = Stat {
            kind: FileKind::Fifo,
            mode: libc::S_IFIFO | 0o6755,
            ..dir(0, 0)
        };
        assert_eq!(killed_mode(&fifo, false, inside), Some(0o755));
        assert_eq!(killed_mode(&fifo, true, inside), None);
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(cap_eff("Name: x\n"), None);
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

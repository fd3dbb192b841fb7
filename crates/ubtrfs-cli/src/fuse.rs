//! The FUSE adapter: serves a [`ubtrfs::fs::Filesystem`] to the kernel
//! through `fuser` (pure-Rust mount through `fusermount3`, no libfuse).
//!
//! Read-only for now: every operation that would change the filesystem
//! answers `EROFS`; operations that are not implemented answer `ENOSYS`.
//! None silently succeeds.
//!
//! # Inode numbers
//!
//! FUSE names an inode by one `u64`, and the kernel treats two entries with
//! the same number as hard links of one inode. btrfs inode numbers are only
//! unique within a subvolume, so they are mapped, stably across mounts:
//!
//! * the root directory of the mounted (default) subvolume is
//!   [`fuser::INodeNo::ROOT`] (1);
//! * any other inode of the top-level subvolume (tree id 5) keeps its own
//!   number (btrfs never uses 1 for a file);
//! * an inode of any other subvolume is `subvol << 40 | ino`.
//!
//! Inode numbers must be below 2^40 and subvolume ids below 2^24; anything
//! else is answered with `EOVERFLOW`. The same number is reported as
//! `st_ino`, so snapshots of a file are never mistaken for hard links.
//!
//! # Directory offsets
//!
//! `.` has cookie 1 and `..` cookie 2; a real entry has its DIR_INDEX
//! sequence number plus 2, so a listing resumes exactly where it stopped
//! even if it was interrupted.

use crate::util::rdev_to_fuse;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use ubtrfs::format::items::Timespec;
use ubtrfs::fs::{FileKind, Filesystem, InodeId, Stat};

/// How long the kernel may cache entries and attributes. The filesystem is
/// read-only, so nothing changes under it.
const TTL: Duration = Duration::from_secs(1);
/// Tree id of the top-level subvolume.
const TOP_SUBVOL: u64 = 5;
/// Bits of a FUSE inode number that carry the btrfs inode number.
const INO_BITS: u32 = 40;
const INO_MASK: u64 = (1 << INO_BITS) - 1;
/// Largest subvolume id that fits above the inode bits.
const MAX_SUBVOL: u64 = (1 << (64 - INO_BITS)) - 1;
/// First directory cookie of a real entry (1 and 2 are `.` and `..`).
const COOKIE_BASE: u64 = 2;

/// A read-only ubtrfs filesystem served over FUSE.
pub struct FuseFs {
    fs: Filesystem,
    root: InodeId,
    /// Data sector size: `st_blocks` counts whole sectors, as the kernel does.
    sectorsize: u64,
}

impl FuseFs {
    /// Serve `fs`; its default subvolume's root becomes the mount's root.
    pub fn new(fs: Filesystem) -> Self {
        let root = fs.root();
        let sectorsize = u64::from(fs.superblock().sectorsize.max(512));
        FuseFs {
            fs,
            root,
            sectorsize,
        }
    }

    /// The FUSE inode number of `id` (see the module documentation).
    fn to_fuse(&self, id: InodeId) -> Result<INodeNo, Errno> {
        to_fuse(self.root, id)
    }

    /// The inode a FUSE inode number stands for.
    fn inode_of(&self, ino: INodeNo) -> InodeId {
        from_fuse(self.root, ino)
    }

    fn stat(&self, ino: INodeNo) -> Result<Stat, Errno> {
        self.fs.stat(self.inode_of(ino)).map_err(errno)
    }

    /// The attributes the kernel sees for `st`.
    fn attr(&self, st: &Stat) -> Result<FileAttr, Errno> {
        Ok(FileAttr {
            ino: self.to_fuse(st.id)?,
            size: st.size,
            blocks: st.nbytes.div_ceil(self.sectorsize) * (self.sectorsize / 512),
            atime: system_time(&st.atime),
            mtime: system_time(&st.mtime),
            ctime: system_time(&st.ctime),
            crtime: system_time(&st.otime),
            kind: file_type(st.kind),
            perm: (st.mode & 0o7777) as u16,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            rdev: match st.kind {
                FileKind::CharDev | FileKind::BlockDev => rdev_to_fuse(st.rdev),
                _ => 0,
            },
            blksize: 4096,
            flags: 0,
        })
    }

    /// The inode `name` names in directory `dir`, including `.` and `..`.
    fn child(&self, dir: InodeId, name: &[u8]) -> Result<InodeId, Errno> {
        match name {
            b"." => Ok(dir),
            b".." => self.fs.parent(dir).map_err(errno),
            _ => Ok(self.fs.lookup(dir, name).map_err(errno)?.id),
        }
    }

    /// Entries of `dir` from cookie `offset` on, as (cookie, name, id, kind).
    fn entries(&self, dir: InodeId, offset: u64) -> Result<Vec<Listed>, Errno> {
        let mut out = Vec::new();
        if offset < 1 {
            out.push((1, b".".to_vec(), dir, FileKind::Dir));
        }
        if offset < 2 {
            let parent = self.fs.parent(dir).map_err(errno)?;
            out.push((2, b"..".to_vec(), parent, FileKind::Dir));
        }
        let after = offset.saturating_sub(COOKIE_BASE);
        for e in self.fs.read_dir(dir, after).map_err(errno)? {
            let cookie = e.index.checked_add(COOKIE_BASE).ok_or(Errno::EOVERFLOW)?;
            out.push((cookie, e.name, e.id, e.kind));
        }
        Ok(out)
    }
}

/// One directory entry for readdir: (cookie, name, inode, kind).
type Listed = (u64, Vec<u8>, InodeId, FileKind);

/// See the module documentation.
fn to_fuse(root: InodeId, id: InodeId) -> Result<INodeNo, Errno> {
    if id == root {
        return Ok(INodeNo::ROOT);
    }
    if id.ino > INO_MASK || id.ino == 0 {
        return Err(Errno::EOVERFLOW);
    }
    if id.subvol == TOP_SUBVOL {
        if id.ino == INodeNo::ROOT.0 {
            return Err(Errno::EOVERFLOW);
        }
        return Ok(INodeNo(id.ino));
    }
    if id.subvol > MAX_SUBVOL || id.subvol == 0 {
        return Err(Errno::EOVERFLOW);
    }
    Ok(INodeNo(id.subvol << INO_BITS | id.ino))
}

/// The inverse of [`to_fuse`].
fn from_fuse(root: InodeId, ino: INodeNo) -> InodeId {
    if ino == INodeNo::ROOT {
        return root;
    }
    match ino.0 >> INO_BITS {
        0 => InodeId {
            subvol: TOP_SUBVOL,
            ino: ino.0,
        },
        subvol => InodeId {
            subvol,
            ino: ino.0 & INO_MASK,
        },
    }
}

/// The errno for a library error; damage is also logged, since the caller
/// only sees `EIO`.
fn errno(e: ubtrfs::Error) -> Errno {
    let code = e.errno();
    if code == libc::EIO {
        tracing::warn!("{e}");
    } else {
        tracing::debug!("{e}");
    }
    Errno::from_i32(code)
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// A btrfs timestamp as a `SystemTime` (saturating at the representable ends).
fn system_time(t: &Timespec) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    if t.sec >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::from_secs(t.sec as u64) + nanos)
            .unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
            .and_then(|s| s.checked_add(nanos))
            .unwrap_or(UNIX_EPOCH)
    }
}

/// Answer an xattr request with the size-probe protocol: a request of size
/// 0 learns the size, a too-small buffer gets `ERANGE`.
fn reply_sized(reply: ReplyXattr, size: u32, data: &[u8]) {
    let Ok(len) = u32::try_from(data.len()) else {
        return reply.error(Errno::E2BIG);
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

impl fuser::Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Ask for what helps a read-only filesystem; a kernel without a
        // capability simply keeps the default behaviour.
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            if config.add_capabilities(cap).is_err() {
                tracing::debug!("kernel lacks FUSE capability {cap:?}");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self
            .child(self.inode_of(parent), name.as_bytes())
            .and_then(|id| self.fs.stat(id).map_err(errno))
            .and_then(|st| Ok((self.attr(&st)?, st.generation)));
        match result {
            Ok((attr, generation)) => reply.entry(&TTL, &attr, Generation(generation)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.stat(ino).and_then(|st| self.attr(&st)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.read_link(self.inode_of(ino)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        match self.stat(ino) {
            Ok(st) if st.kind == FileKind::Dir => reply.error(Errno::EISDIR),
            // Nothing changes under a read-only mount: keep the page cache.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(self.inode_of(ino), offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // No per-open state is kept.
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Called on every close(2). A read-only mount never holds dirty data,
        // so there is truly nothing to write back.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        // Read-only: nothing is ever dirty, so everything is already durable.
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.stat(ino) {
            Ok(st) if st.kind != FileKind::Dir => reply.error(Errno::ENOTDIR),
            // The directory never changes: let the kernel cache listings.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.entries(self.inode_of(ino), offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (cookie, name, id, kind) in entries {
            let fino = match self.to_fuse(id) {
                Ok(n) => n,
                Err(e) => return reply.error(e),
            };
            if reply.add(fino, cookie, file_type(kind), OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.entries(self.inode_of(ino), offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (cookie, name, id, _kind) in entries {
            let st = match self.fs.stat(id) {
                Ok(s) => s,
                Err(e) => return reply.error(errno(e)),
            };
            let attr = match self.attr(&st) {
                Ok(a) => a,
                Err(e) => return reply.error(e),
            };
            let name = OsStr::from_bytes(&name);
            if reply.add(
                attr.ino,
                cookie,
                name,
                &TTL,
                &attr,
                Generation(st.generation),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        // Read-only: nothing is ever dirty.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        let bsize = u64::from(s.block_size.max(1));
        let free = s.free_bytes / bsize;
        reply.statfs(
            s.total_bytes / bsize,
            free,
            free,
            s.files,
            0,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.get_xattr(self.inode_of(ino), name.as_bytes()) {
            Ok(Some(value)) => reply_sized(reply, size, &value),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.list_xattrs(self.inode_of(ino)) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                reply_sized(reply, size, &list);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let st = match self.stat(ino) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        if permitted(&st, req.uid(), req.gid(), mask) {
            reply.ok();
        } else {
            reply.error(Errno::EACCES);
        }
    }

    // Everything below changes the filesystem: refused on a read-only mount.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    // Not implemented (the kernel falls back to its generic behaviour for
    // these). Answered here without fuser's default warning on every call.

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: fuser::ReplyLock,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _bs: u32, _idx: u64, reply: fuser::ReplyBmap) {
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }
}

/// Whether `uid`/`gid` may access `st` with `mask` (read and execute only;
/// the caller refuses writes). Supplementary groups are not known here;
/// mounts use `default_permissions`, so the kernel makes the real check.
fn permitted(st: &Stat, uid: u32, gid: u32, mask: AccessFlags) -> bool {
    let want = (if mask.contains(AccessFlags::R_OK) {
        4
    } else {
        0
    }) | (if mask.contains(AccessFlags::X_OK) {
        1
    } else {
        0
    });
    if want == 0 {
        return true;
    }
    if uid == 0 {
        // Root reads anything and executes what has any execute bit (or a directory).
        return want & 1 == 0 || st.kind == FileKind::Dir || st.mode & 0o111 != 0;
    }
    let bits = if uid == st.uid {
        st.mode >> 6
    } else if gid == st.gid {
        st.mode >> 3
    } else {
        st.mode
    } & 7;
    bits & want == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_round_trip() {
        let root = InodeId {
            subvol: 5,
            ino: 256,
        };
        let cases = [
            InodeId {
                subvol: 5,
                ino: 257,
            },
            InodeId { subvol: 5, ino: 2 },
            InodeId {
                subvol: 256,
                ino: 256,
            },
            InodeId {
                subvol: 300,
                ino: 9_978_956,
            },
            InodeId {
                subvol: MAX_SUBVOL,
                ino: INO_MASK,
            },
        ];
        assert_eq!(to_fuse(root, root), Ok(INodeNo::ROOT));
        assert_eq!(from_fuse(root, INodeNo::ROOT), root);
        for id in cases {
            let n = to_fuse(root, id).unwrap();
            assert_ne!(n, INodeNo::ROOT);
            assert_eq!(from_fuse(root, n), id);
        }
        // The same inode number in two subvolumes gives two FUSE inodes.
        let a = to_fuse(
            root,
            InodeId {
                subvol: 5,
                ino: 300,
            },
        )
        .unwrap();
        let b = to_fuse(
            root,
            InodeId {
                subvol: 256,
                ino: 300,
            },
        )
        .unwrap();
        assert_ne!(a, b);
        assert_eq!(
            to_fuse(
                root,
                InodeId {
                    subvol: 5,
                    ino: 1 << 40
                }
            ),
            Err(Errno::EOVERFLOW)
        );
        assert_eq!(
            to_fuse(
                root,
                InodeId {
                    subvol: 1 << 24,
                    ino: 257
                }
            ),
            Err(Errno::EOVERFLOW)
        );
    }

    #[test]
    fn other_default_subvolume() {
        let root = InodeId {
            subvol: 257,
            ino: 256,
        };
        assert_eq!(to_fuse(root, root), Ok(INodeNo::ROOT));
        let top = InodeId {
            subvol: 5,
            ino: 256,
        };
        let n = to_fuse(root, top).unwrap();
        assert_eq!(from_fuse(root, n), top);
    }

    #[test]
    fn times() {
        let t = system_time(&Timespec { sec: 1, nsec: 5 });
        assert_eq!(t, UNIX_EPOCH + Duration::new(1, 5));
        let t = system_time(&Timespec {
            sec: -2,
            nsec: 500_000_000,
        });
        assert_eq!(t, UNIX_EPOCH - Duration::from_millis(1500));
        let _ = system_time(&Timespec {
            sec: i64::MAX,
            nsec: u32::MAX,
        });
        let _ = system_time(&Timespec {
            sec: i64::MIN,
            nsec: u32::MAX,
        });
    }
}

//! Requests in their wire form, whichever way they came (read from
//! `/dev/fuse` in `dev.rs`, or over io_uring in `ring.rs`): each is
//! decoded here and given to its handler (the `on_*` methods), with an
//! answer built in the wire layout and sent back the way the request came
//! ([`Wire`]).

use super::FuseFs;
use super::reply::{
    AttrReply, Caller, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply,
    IoctlReply, LseekReply, OpenReply, Reply, StatfsReply, WriteReply, XattrReply,
};
use fuse_ring::abi::{Args, Out, opcode, split_name};
use fuse_ring::from_fuser;
use fuse_ring::ring::Request;
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, IoctlFlags, LockOwner, OpenFlags, RenameFlags, SessionACL, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who may use the mount, as `fuser` checks it (`allow_root`, or
/// `auto_unmount`, which needs `allow_other` underneath).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    pub acl: SessionACL,
    pub owner: u32,
}

/// `fuser`'s check of who may use the mount (see [`Access`]): `uid` may
/// make request `op`.
pub(super) fn allowed(access: &Access, op: u32, uid: u32) -> bool {
    use opcode::*;
    let refused = match access.acl {
        SessionACL::All => false,
        SessionACL::RootAndOwner => uid != access.owner && uid != 0,
        SessionACL::Owner => uid != access.owner,
    };
    !refused
        || matches!(
            op,
            READ | READDIR | READDIRPLUS | WRITE | FSYNC | FSYNCDIR | RELEASE | RELEASEDIR
        )
}

/// Where an answer goes: the ring entry or the `/dev/fuse` descriptor
/// its request came from.
pub(super) trait Wire: Send + 'static {
    /// Answers with the concatenation of `parts`.
    fn send(self, parts: &[&[u8]]);
    /// Answers with an error number.
    fn fail(self, errno: i32);
}

/// The answer to one request. Dropped unanswered, it answers EIO.
pub(super) struct WireReply<W: Wire> {
    wire: Option<W>,
}

impl<W: Wire> WireReply<W> {
    pub(super) fn new(wire: W) -> WireReply<W> {
        WireReply { wire: Some(wire) }
    }

    fn send(mut self, parts: &[&[u8]]) {
        if let Some(w) = self.wire.take() {
            w.send(parts);
        }
    }
}

impl<W: Wire> Drop for WireReply<W> {
    fn drop(&mut self) {
        if let Some(w) = self.wire.take() {
            w.fail(libc::EIO);
        }
    }
}

/// Whether the request carries names or data after its fixed part.
pub(super) fn has_payload(op: u32) -> bool {
    use opcode::*;
    matches!(
        op,
        LOOKUP
            | SYMLINK
            | MKNOD
            | MKDIR
            | UNLINK
            | RMDIR
            | RENAME
            | RENAME2
            | LINK
            | WRITE
            | SETXATTR
            | GETXATTR
            | REMOVEXATTR
            | CREATE
            | TMPFILE
            | IOCTL
    )
}

/// The fixed part of a request, copied out of its buffer.
pub(super) struct Decoded {
    op: u32,
    ino: INodeNo,
    caller: Caller,
    arg: [u8; 128],
}

impl Decoded {
    pub(super) fn of(req: &Request<'_>) -> Decoded {
        let mut arg = [0u8; 128];
        let n = req.arg.0.len().min(arg.len());
        arg[..n].copy_from_slice(&req.arg.0[..n]);
        let h = req.header;
        Decoded {
            op: h.opcode,
            ino: INodeNo(h.nodeid),
            caller: caller(&h),
            arg,
        }
    }
    fn a(&self) -> Args<'_> {
        Args(&self.arg)
    }
}

/// `FUSE_GETATTR_FH`, `FUSE_READ_LOCKOWNER`, `FUSE_WRITE_LOCKOWNER`,
/// `FUSE_RELEASE_FLUSH`, `FUSE_FSYNC_FDATASYNC`.
const GETATTR_FH: u32 = 1;
const READ_LOCKOWNER: u32 = 2;
const WRITE_LOCKOWNER: u32 = 2;
const RELEASE_FLUSH: u32 = 1;
const FSYNC_FDATASYNC: u32 = 1;
/// `FUSE_SETXATTR_ACL_KILL_SGID`.
const SETXATTR_ACL_KILL_SGID: u32 = 1;
/// `FUSE_IOCTL_UNRESTRICTED`.
const IOCTL_UNRESTRICTED: u32 = 1 << 1;
/// `fuse_setattr_in.valid` bits.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_FH: u32 = 1 << 6;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FATTR_CTIME: u32 = 1 << 10;

fn time(secs: u64, nanos: u32) -> SystemTime {
    let secs = secs as i64;
    let nanos = Duration::from_nanos(u64::from(nanos.min(999_999_999)));
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

fn offset(v: u64) -> Result<u64, Errno> {
    // The kernel never sends offsets past i64::MAX; refuse them.
    i64::try_from(v).map(|_| v).map_err(|_| Errno::EINVAL)
}

/// Who made a request, from its header.
pub(super) fn caller(h: &fuse_ring::abi::InHeader) -> Caller {
    Caller::new(h.uid, h.gid, h.pid)
}

impl FuseFs {
    pub(super) fn serve_fixed<W: Wire>(&self, d: Decoded, reply: WireReply<W>) {
        use opcode::*;
        let fs = self;
        let (a, ino, req) = (d.a(), d.ino, &d.caller);
        match d.op {
            GETATTR => {
                let fh = (a.u32(0) & GETATTR_FH != 0).then(|| FileHandle(a.u64(8)));
                fs.on_getattr(req, ino, fh, reply)
            }
            SETATTR => {
                let valid = a.u32(0);
                let has = |bit| valid & bit != 0;
                let when = |set, now, secs, nanos| {
                    has(set).then(|| {
                        if has(now) {
                            TimeOrNow::Now
                        } else {
                            TimeOrNow::SpecificTime(time(secs, nanos))
                        }
                    })
                };
                fs.on_setattr(
                    req,
                    ino,
                    has(FATTR_MODE).then(|| a.u32(68)),
                    has(FATTR_UID).then(|| a.u32(76)),
                    has(FATTR_GID).then(|| a.u32(80)),
                    has(FATTR_SIZE).then(|| a.u64(16)),
                    when(FATTR_ATIME, FATTR_ATIME_NOW, a.u64(32), a.u32(56)),
                    when(FATTR_MTIME, FATTR_MTIME_NOW, a.u64(40), a.u32(60)),
                    has(FATTR_CTIME).then(|| time(a.u64(48), a.u32(64))),
                    has(FATTR_FH).then(|| FileHandle(a.u64(8))),
                    None,
                    None,
                    None,
                    None,
                    reply,
                )
            }
            // The same attributes as GETATTR, with the birth time.
            STATX => {
                let fh = (a.u32(0) & GETATTR_FH != 0).then(|| FileHandle(a.u64(8)));
                fs.on_getattr(req, ino, fh, WireStatx(reply))
            }
            READLINK => fs.on_readlink(req, ino, reply),
            OPEN => fs.on_open(req, ino, OpenFlags(a.u32(0) as i32), reply),
            READ => {
                let Ok(off) = offset(a.u64(8)) else {
                    return reply.error(Errno::EINVAL);
                };
                let owner = (a.u32(20) & READ_LOCKOWNER != 0).then(|| LockOwner(a.u64(24)));
                let flags = OpenFlags(a.u32(32) as i32);
                fs.on_read(
                    req,
                    ino,
                    FileHandle(a.u64(0)),
                    off,
                    a.u32(16),
                    flags,
                    owner,
                    reply,
                )
            }
            STATFS => fs.on_statfs(req, ino, reply),
            RELEASE => {
                let flush = a.u32(12) & RELEASE_FLUSH != 0;
                let flags = OpenFlags(a.u32(8) as i32);
                fs.on_release(req, ino, FileHandle(a.u64(0)), flags, None, flush, reply)
            }
            FSYNC | FSYNCDIR => {
                let ds = a.u32(8) & FSYNC_FDATASYNC != 0;
                if d.op == FSYNC {
                    fs.on_fsync(req, ino, FileHandle(a.u64(0)), ds, reply)
                } else {
                    fs.on_fsyncdir(req, ino, FileHandle(a.u64(0)), ds, reply)
                }
            }
            LISTXATTR => fs.on_listxattr(req, ino, a.u32(0), reply),
            FLUSH => fs.on_flush(req, ino, FileHandle(a.u64(0)), LockOwner(a.u64(16)), reply),
            OPENDIR => fs.on_opendir(req, ino, OpenFlags(a.u32(0) as i32), reply),
            READDIR | READDIRPLUS => {
                let (fh, off, size) = (FileHandle(a.u64(0)), a.u64(8), a.u32(16) as usize);
                if d.op == READDIR {
                    fs.on_readdir(req, ino, fh, off, WireDir::new(reply, size))
                } else {
                    fs.on_readdirplus(req, ino, fh, off, WireDirPlus::new(reply, size))
                }
            }
            RELEASEDIR => {
                let flags = OpenFlags(a.u32(8) as i32);
                fs.on_releasedir(req, ino, FileHandle(a.u64(0)), flags, reply)
            }
            ACCESS => fs.on_access(
                req,
                ino,
                AccessFlags::from_bits_retain(a.u32(0) as i32),
                reply,
            ),
            FALLOCATE => {
                let (Ok(off), Ok(len)) = (offset(a.u64(8)), offset(a.u64(16))) else {
                    return reply.error(Errno::EINVAL);
                };
                let mode = a.u32(24) as i32;
                fs.on_fallocate(req, ino, FileHandle(a.u64(0)), off, len, mode, reply)
            }
            LSEEK => {
                let (off, whence) = (a.i64(8), a.u32(16) as i32);
                fs.on_lseek(req, ino, FileHandle(a.u64(0)), off, whence, reply)
            }
            COPY_FILE_RANGE => {
                let (Ok(off_in), Ok(off_out), Ok(len)) =
                    (offset(a.u64(8)), offset(a.u64(32)), offset(a.u64(40)))
                else {
                    return reply.error(Errno::EINVAL);
                };
                fs.on_copy_file_range(
                    req,
                    ino,
                    FileHandle(a.u64(0)),
                    off_in,
                    INodeNo(a.u64(16)),
                    FileHandle(a.u64(24)),
                    off_out,
                    len,
                    CopyFileRangeFlags::from_bits_retain(a.u64(48)),
                    reply,
                )
            }
            // Locks stay with the kernel (no FUSE_POSIX_LOCKS); the rest
            // is not implemented.
            _ => reply.error(Errno::ENOSYS),
        }
    }

    pub(super) fn serve_named<W: Wire>(&self, r: &Request<'_>, reply: WireReply<W>) {
        use opcode::*;
        let fs = self;
        let h = r.header;
        let (a, ino, req) = (r.arg, INodeNo(h.nodeid), &caller(&h));
        match h.opcode {
            WRITE => {
                let (Ok(off), Some(data)) = (offset(a.u64(8)), r.payload.get(..a.u32(16) as usize))
                else {
                    return reply.error(Errno::EINVAL);
                };
                let wflags = a.u32(20);
                let owner = (wflags & WRITE_LOCKOWNER != 0).then(|| LockOwner(a.u64(24)));
                let flags = OpenFlags(a.u32(32) as i32);
                let write_flags = WriteFlags::from_bits_retain(wflags);
                let fh = FileHandle(a.u64(0));
                return fs.on_write(req, ino, fh, off, data, write_flags, flags, owner, reply);
            }
            // Unrestricted ioctls (retried with iovecs) are refused.
            IOCTL if a.u32(8) & IOCTL_UNRESTRICTED != 0 => return reply.error(Errno::ENOSYS),
            IOCTL => {
                let in_data = r.payload.get(..a.u32(24) as usize).unwrap_or(r.payload);
                let flags = IoctlFlags::from_bits_retain(a.u32(8));
                let fh = FileHandle(a.u64(0));
                let (cmd, out_size) = (a.u32(12), a.u32(28));
                return fs.on_ioctl(req, ino, fh, flags, cmd, in_data, out_size, reply);
            }
            _ => {}
        }
        let name = |buf| split_name(buf).map(|(n, rest)| (OsStr::from_bytes(n), rest));
        let Some((first, rest)) = name(r.payload) else {
            return reply.error(Errno::EINVAL);
        };
        match h.opcode {
            LOOKUP => fs.on_lookup(req, ino, first, reply),
            MKNOD => fs.on_mknod(req, ino, first, a.u32(0), a.u32(8), a.u32(4), reply),
            MKDIR => fs.on_mkdir(req, ino, first, a.u32(0), a.u32(4), reply),
            UNLINK => fs.on_unlink(req, ino, first, reply),
            RMDIR => fs.on_rmdir(req, ino, first, reply),
            SYMLINK => match name(rest) {
                Some((target, _)) => {
                    fs.on_symlink(req, ino, first, std::path::Path::new(target), reply)
                }
                None => reply.error(Errno::EINVAL),
            },
            RENAME | RENAME2 => {
                let flags = if h.opcode == RENAME2 { a.u32(8) } else { 0 };
                match name(rest) {
                    Some((newname, _)) => fs.on_rename(
                        req,
                        ino,
                        first,
                        INodeNo(a.u64(0)),
                        newname,
                        RenameFlags::from_bits_retain(flags),
                        reply,
                    ),
                    None => reply.error(Errno::EINVAL),
                }
            }
            LINK => fs.on_link(req, INodeNo(a.u64(0)), ino, first, reply),
            CREATE => {
                let (flags, mode, umask) = (a.u32(0) as i32, a.u32(4), a.u32(8));
                fs.on_create(req, ino, first, mode, umask, flags, reply)
            }
            // O_TMPFILE: as CREATE, with a name that means nothing ("/").
            TMPFILE => fs.on_tmpfile(req, ino, a.u32(4), a.u32(8), reply),
            GETXATTR => fs.on_getxattr(req, ino, first, a.u32(0), reply),
            REMOVEXATTR => fs.on_removexattr(req, ino, first, reply),
            SETXATTR => {
                let size = a.u32(0) as usize;
                let Some(value) = rest.get(..size) else {
                    return reply.error(Errno::EINVAL);
                };
                // `setxattr_flags` (FUSE_SETXATTR_EXT): the caller may not
                // keep set-group-ID (FUSE_SETXATTR_ACL_KILL_SGID).
                let kill_sgid = a.0.len() >= 16 && a.u32(8) & SETXATTR_ACL_KILL_SGID != 0;
                let flags = a.u32(4) as i32;
                fs.on_setxattr(req, ino, first, value, flags, 0, kill_sgid, reply)
            }
            _ => reply.error(Errno::ENOSYS),
        }
    }
}

fn entry_out(node: INodeNo, ttl: &Duration, attr: &FileAttr, generation: Generation) -> Out {
    let mut out = Out::with_capacity(fuse_ring::abi::ENTRY_OUT_LEN + 16);
    out.entry(node.0, generation.0, *ttl, &from_fuser::attr(attr));
    out
}

impl<W: Wire> Reply for WireReply<W> {
    fn error(mut self, e: Errno) {
        if let Some(w) = self.wire.take() {
            w.fail(i32::from(e));
        }
    }
}

impl<W: Wire> EntryReply for WireReply<W> {
    fn entry_of(self, node: INodeNo, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        self.send(&[&entry_out(node, ttl, attr, generation).0]);
    }
}

impl<W: Wire> AttrReply for WireReply<W> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let mut out = Out::with_capacity(fuse_ring::abi::ATTR_OUT_LEN);
        out.attr_out(*ttl, &from_fuser::attr(attr));
        self.send(&[&out.0]);
    }
}

impl<W: Wire> DataReply for WireReply<W> {
    fn data(self, data: &[u8]) {
        self.send(&[data]);
    }
}

impl<W: Wire> OpenReply for WireReply<W> {
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.send(&[&Out::default().open(fh.0, flags.bits()).0]);
    }
}

impl<W: Wire> EmptyReply for WireReply<W> {
    fn ok(self) {
        self.send(&[]);
    }
}

impl<W: Wire> CreateReply for WireReply<W> {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        let mut out = entry_out(attr.ino, ttl, attr, generation);
        out.open(fh.0, flags.bits());
        self.send(&[&out.0]);
    }
}

impl<W: Wire> WriteReply for WireReply<W> {
    fn written(self, size: u32) {
        self.send(&[&Out::default().u32(size).u32(0).0]);
    }
}

impl<W: Wire> XattrReply for WireReply<W> {
    fn size(self, size: u32) {
        self.send(&[&Out::default().u32(size).u32(0).0]);
    }
    fn data(self, data: &[u8]) {
        self.send(&[data]);
    }
}

impl<W: Wire> LseekReply for WireReply<W> {
    fn offset(self, offset: i64) {
        self.send(&[&offset.to_ne_bytes()]);
    }
}

impl<W: Wire> IoctlReply for WireReply<W> {
    fn ioctl(self, result: i32, data: &[u8]) {
        // `fuse_ioctl_out`: result, flags, in and out iovec counts.
        let mut out = Out::default();
        out.u32(result as u32).u32(0).u32(0).u32(0);
        self.send(&[&out.0, data]);
    }
}

impl<W: Wire> StatfsReply for WireReply<W> {
    fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        // `fuse_kstatfs`: five counts, three sizes, padding, six spares.
        let mut out = Out::with_capacity(80);
        out.u64(blocks).u64(bfree).u64(bavail).u64(files).u64(ffree);
        out.u32(bsize).u32(namelen).u32(frsize).u32(0);
        out.0.resize(80, 0);
        self.send(&[&out.0]);
    }
}

/// Attributes answered as `fuse_statx_out`.
struct WireStatx<W: Wire>(WireReply<W>);

impl<W: Wire> Reply for WireStatx<W> {
    fn error(self, e: Errno) {
        self.0.error(e);
    }
}

impl<W: Wire> AttrReply for WireStatx<W> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let mut out = Out::with_capacity(fuse_ring::abi::STATX_OUT_LEN);
        out.statx_out(*ttl, &from_fuser::attr(attr));
        self.0.send(&[&out.0]);
    }
}

/// A directory listing, at most the size the kernel asked.
struct WireDir<W: Wire> {
    reply: WireReply<W>,
    out: Out,
    limit: usize,
}

impl<W: Wire> WireDir<W> {
    fn new(reply: WireReply<W>, limit: usize) -> WireDir<W> {
        WireDir {
            reply,
            out: Out::with_capacity(limit.min(64 << 10)),
            limit,
        }
    }
}

impl<W: Wire> Reply for WireDir<W> {
    fn error(self, e: Errno) {
        self.reply.error(e);
    }
}

impl<W: Wire> DirReply for WireDir<W> {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        let kind = from_fuser::dirent_type(kind);
        !self
            .out
            .dirent(ino.0, offset, kind, name.as_bytes(), self.limit)
    }
    fn ok(self) {
        self.reply.send(&[&self.out.0]);
    }
}

/// A listing with attributes.
struct WireDirPlus<W: Wire> {
    dir: WireDir<W>,
}

impl<W: Wire> WireDirPlus<W> {
    fn new(reply: WireReply<W>, limit: usize) -> WireDirPlus<W> {
        WireDirPlus {
            dir: WireDir::new(reply, limit),
        }
    }
}

impl<W: Wire> Reply for WireDirPlus<W> {
    fn error(self, e: Errno) {
        self.dir.reply.error(e);
    }
}

impl<W: Wire> DirPlusReply for WireDirPlus<W> {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let wire = from_fuser::attr(attr);
        let kind = from_fuser::dirent_type(attr.kind);
        let entry = (ino.0, generation.0, *ttl, &wire);
        !self
            .dir
            .out
            .direntplus(entry, offset, kind, name.as_bytes(), self.dir.limit)
    }
    fn ok(self) {
        self.dir.ok();
    }
}

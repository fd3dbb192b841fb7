//! The answers a handler gives, whichever way the request came: through
//! `fuser` (`/dev/fuse`) or over io_uring (`ring.rs`). Each handler is
//! written once against these traits; `fuser`'s reply types implement
//! them here, the ring's in `ring.rs`.

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use std::ffi::OsStr;
use std::time::Duration;

/// Who made a request: the credentials new inodes and permission checks
/// use, and the process whose capabilities a set-user-ID kill reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Caller {
    pub fn new(uid: u32, gid: u32, pid: u32) -> Caller {
        Caller { uid, gid, pid }
    }
    pub fn uid(&self) -> u32 {
        self.uid
    }
    pub fn gid(&self) -> u32 {
        self.gid
    }
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl From<&fuser::Request> for Caller {
    fn from(r: &fuser::Request) -> Caller {
        Caller::new(r.uid(), r.gid(), r.pid())
    }
}

/// Every answer may be an error.
pub(crate) trait Reply: Send + 'static {
    fn error(self, e: Errno);
}

pub(crate) trait EntryReply: Reply {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation);
}

pub(crate) trait AttrReply: Reply {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

pub(crate) trait DataReply: Reply {
    fn data(self, data: &[u8]);
}

pub(crate) trait OpenReply: Reply {
    fn opened(self, fh: FileHandle, flags: FopenFlags);
}

pub(crate) trait EmptyReply: Reply {
    fn ok(self);
}

pub(crate) trait CreateReply: Reply {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    );
}

pub(crate) trait WriteReply: Reply {
    fn written(self, size: u32);
}

/// A write's answer behind a pointer, for a write answered on another
/// thread (`deferred.rs`).
pub(crate) trait WriteAnswer: Send {
    fn answer(self: Box<Self>, r: Result<u32, Errno>);
}

impl<T: WriteReply> WriteAnswer for T {
    fn answer(self: Box<Self>, r: Result<u32, Errno>) {
        match r {
            Ok(n) => (*self).written(n),
            Err(e) => (*self).error(e),
        }
    }
}

pub(crate) trait XattrReply: Reply {
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

pub(crate) trait LseekReply: Reply {
    fn offset(self, offset: i64);
}

pub(crate) trait IoctlReply: Reply {
    fn ioctl(self, result: i32, data: &[u8]);
}

pub(crate) trait StatfsReply: Reply {
    #[allow(clippy::too_many_arguments)]
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
    );
}

/// A directory listing filled entry by entry; `add` says when it is full.
pub(crate) trait DirReply: Reply {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool;
    fn ok(self);
}

/// A listing with each entry's attributes (readdirplus).
pub(crate) trait DirPlusReply: Reply {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool;
    fn ok(self);
}

// `fuser`'s types answer through `/dev/fuse`.

macro_rules! fuser_error {
    ($($t:ty),*) => {$(
        impl Reply for $t {
            fn error(self, e: Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}

fuser_error!(
    fuser::ReplyEntry,
    fuser::ReplyAttr,
    fuser::ReplyData,
    fuser::ReplyOpen,
    fuser::ReplyEmpty,
    fuser::ReplyCreate,
    fuser::ReplyWrite,
    fuser::ReplyXattr,
    fuser::ReplyLseek,
    fuser::ReplyIoctl,
    fuser::ReplyStatfs,
    fuser::ReplyDirectory,
    fuser::ReplyDirectoryPlus
);

impl EntryReply for fuser::ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        fuser::ReplyEntry::entry(self, ttl, attr, generation)
    }
}

impl AttrReply for fuser::ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        fuser::ReplyAttr::attr(self, ttl, attr)
    }
}

impl DataReply for fuser::ReplyData {
    fn data(self, data: &[u8]) {
        fuser::ReplyData::data(self, data)
    }
}

impl OpenReply for fuser::ReplyOpen {
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        fuser::ReplyOpen::opened(self, fh, flags)
    }
}

impl EmptyReply for fuser::ReplyEmpty {
    fn ok(self) {
        fuser::ReplyEmpty::ok(self)
    }
}

impl CreateReply for fuser::ReplyCreate {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        fuser::ReplyCreate::created(self, ttl, attr, generation, fh, flags)
    }
}

impl WriteReply for fuser::ReplyWrite {
    fn written(self, size: u32) {
        fuser::ReplyWrite::written(self, size)
    }
}

impl XattrReply for fuser::ReplyXattr {
    fn size(self, size: u32) {
        fuser::ReplyXattr::size(self, size)
    }
    fn data(self, data: &[u8]) {
        fuser::ReplyXattr::data(self, data)
    }
}

impl LseekReply for fuser::ReplyLseek {
    fn offset(self, offset: i64) {
        fuser::ReplyLseek::offset(self, offset)
    }
}

impl IoctlReply for fuser::ReplyIoctl {
    fn ioctl(self, result: i32, data: &[u8]) {
        fuser::ReplyIoctl::ioctl(self, result, data)
    }
}

impl StatfsReply for fuser::ReplyStatfs {
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
        fuser::ReplyStatfs::statfs(
            self, blocks, bfree, bavail, files, ffree, bsize, namelen, frsize,
        )
    }
}

impl DirReply for fuser::ReplyDirectory {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        fuser::ReplyDirectory::add(self, ino, offset, kind, name)
    }
    fn ok(self) {
        fuser::ReplyDirectory::ok(self)
    }
}

impl DirPlusReply for fuser::ReplyDirectoryPlus {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        fuser::ReplyDirectoryPlus::add(self, ino, offset, name, ttl, attr, generation)
    }
    fn ok(self) {
        fuser::ReplyDirectoryPlus::ok(self)
    }
}

//! The answers a handler gives, whichever way the request came: read
//! from `/dev/fuse` (`dev.rs`) or over io_uring (`ring.rs`). Each handler
//! is written once against these traits; `wire.rs` implements them in the
//! wire layout for both.

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

/// Every answer may be an error.
pub(crate) trait Reply: Send + 'static {
    fn error(self, e: Errno);
}

pub(crate) trait EntryReply: Reply {
    /// An entry naming node `attr.ino`.
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation)
    where
        Self: Sized,
    {
        self.entry_of(attr.ino, ttl, attr, generation);
    }
    /// An entry naming node `node`, whose `st_ino` is `attr.ino` (they
    /// differ for the mount's root).
    fn entry_of(self, node: INodeNo, ttl: &Duration, attr: &FileAttr, generation: Generation);
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

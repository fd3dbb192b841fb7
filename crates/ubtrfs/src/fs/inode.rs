//! Inode identities and attributes as callers see them.

use crate::format::items::{InodeItem, Timespec};

/// An inode: the subvolume (fs tree id) it lives in and its number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId {
    /// The subvolume's tree id (5 for the top-level subvolume).
    pub subvol: u64,
    /// The inode number inside that subvolume (256 for its root directory).
    pub ino: u64,
}

/// The bit that marks a placeholder's made-up inode number (see
/// [`InodeId::placeholder`]); real inode numbers never reach it.
const PLACEHOLDER_BIT: u64 = 1 << 63;

impl InodeId {
    /// The empty directory that stands where a snapshot holds the link of
    /// a subvolume nested in its source (`nested`, that subvolume's id).
    /// Each placeholder gets an identity of its own, so two of them are
    /// never taken for one directory with two names (the kernel makes a
    /// fresh inode, numbered 2, for each).
    pub fn placeholder(subvol: u64, nested: u64) -> Self {
        InodeId {
            subvol,
            ino: PLACEHOLDER_BIT | nested,
        }
    }

    /// Whether this is a placeholder (see [`InodeId::placeholder`]).
    pub fn is_placeholder(self) -> bool {
        self.ino & PLACEHOLDER_BIT != 0
    }

    /// The id of the nested subvolume a placeholder stands for.
    pub fn placeholder_of(self) -> Option<u64> {
        self.is_placeholder().then_some(self.ino & !PLACEHOLDER_BIT)
    }
}

/// The kind of an inode, from its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    CharDev,
    BlockDev,
    Fifo,
    Socket,
}

impl FileKind {
    /// The kind encoded in a `st_mode`.
    pub fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            _ => return None,
        })
    }
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub id: InodeId,
    pub kind: FileKind,
    /// Full `st_mode` (type and permission bits).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Bytes of disk used (`st_blocks` * 512).
    pub nbytes: u64,
    /// Device number for device nodes, in the kernel's encoding.
    pub rdev: u64,
    /// btrfs inode flags (`INODE_*`).
    pub flags: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Birth time.
    pub otime: Timespec,
    /// Generation the inode was created in.
    pub generation: u64,
}

impl Stat {
    pub(crate) fn from_item(id: InodeId, item: &InodeItem) -> Option<Self> {
        Some(Stat {
            id,
            kind: FileKind::from_mode(item.mode)?,
            mode: item.mode,
            nlink: item.nlink,
            uid: item.uid,
            gid: item.gid,
            size: item.size,
            nbytes: item.nbytes,
            rdev: item.rdev,
            flags: item.flags,
            atime: item.atime,
            mtime: item.mtime,
            ctime: item.ctime,
            otime: item.otime,
            generation: item.generation,
        })
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    /// The target. A subvolume entry points at that subvolume's root directory.
    pub id: InodeId,
    pub kind: FileKind,
    /// The DIR_INDEX sequence number: a stable, increasing readdir cookie.
    pub index: u64,
}

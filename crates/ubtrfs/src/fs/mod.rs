//! The filesystem layer: subvolumes, inodes, directories, names and xattrs,
//! on top of the trees. [`Filesystem`] is the library's entry point.

pub mod dir;
mod inode;
mod namespace;
mod open;
mod subvol;
mod xattr;

pub use inode::{DirEntry, FileKind, InodeId, Stat};
pub use namespace::NewInode;
pub use open::{Filesystem, Geometry, StatFs};
pub use subvol::SubvolInfo;

//! The filesystem layer: subvolumes, inodes, directories, names and xattrs,
//! on top of the trees. [`Filesystem`] is the library's entry point.

mod inode;
mod open;
mod subvol;

pub use inode::{DirEntry, FileKind, InodeId, Stat};
pub use open::Filesystem;

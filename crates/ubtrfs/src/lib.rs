//! ubtrfs: btrfs in user space, on the kernel's own on-disk format.
//!
//! The modules follow the layers of the design: [`device`] (raw block I/O),
//! [`volume`] (chunk map: logical to physical), [`format`] (on-disk
//! structures, pure functions), [`tree`] (verified B-tree reads and the node
//! cache), [`csum_tree`] (data checksums), [`fs`] (inodes, directories,
//! subvolumes) and [`data`] (file contents, compression).
//!
//! ```no_run
//! use ubtrfs::fs::Filesystem;
//! let fs = Filesystem::open(&["disk.img"]).unwrap();
//! let ino = fs.resolve_path(b"/etc/hostname").unwrap();
//! let bytes = fs.read_all(ino).unwrap();
//! ```

pub mod alloc;
pub mod check;
pub mod csum_tree;
pub mod data;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
pub mod mkfs;
pub mod scrub;
pub mod transaction;
pub mod tree;
pub mod tree_log;
pub mod volume;

#[cfg(test)]
mod test_fs;

pub use error::{Error, Result};

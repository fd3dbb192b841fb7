//! The filesystem layer: subvolumes, inodes, directories, names and xattrs,
//! on top of the trees. [`Filesystem`] is the library's entry point.

mod access_time;
mod acl;
mod attr;
mod default_subvol;
mod dev_stats;
pub mod dir;
mod flags;
mod inode;
mod label;
mod links;
mod namespace;
mod open;
mod props;
mod quota_rescan;
pub(crate) mod read_repair;
pub mod resize;
pub(crate) mod snapshot;
mod space_info;
mod subvol;
mod subvol_delete;
mod xattr;

pub use access_time::AtimeUpdate;
pub(crate) use access_time::PendingAtimes;
pub use acl::{ACL_ACCESS, ACL_DEFAULT, Acl, Inherited, inherit};
pub use attr::{SetAttr, XATTR_CREATE, XATTR_REPLACE};
pub use dev_stats::DeviceStatsEntry;
pub(crate) use flags::Allowed;
pub use flags::SETTABLE_FLAGS;
pub use inode::{DirEntry, FileKind, InodeId, Stat};
pub use links::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
pub use namespace::NewInode;
pub use open::{Filesystem, Geometry, StatFs};
pub use props::COMPRESSION_PROP;
pub use quota_rescan::QgroupCounts;
pub use space_info::{DeviceUsage, SPACE_INFO_GLOBAL_RSV, SpaceInfo, Usage};
pub use subvol::SubvolInfo;

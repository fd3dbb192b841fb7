//! Inode flags (what `chattr` changes): no-COW, compression, immutable,
//! append-only and the rest, with btrfs's rules for switching them.

use super::inode::{FileKind, InodeId};
use super::open::Filesystem;
use crate::format::consts::*;
use crate::{Error, Result};

/// Flags a caller may set or clear.
pub const SETTABLE_FLAGS: u64 = INODE_NODATACOW
    | INODE_NODATASUM
    | INODE_NOCOMPRESS
    | INODE_COMPRESS
    | INODE_SYNC
    | INODE_IMMUTABLE
    | INODE_APPEND
    | INODE_NODUMP
    | INODE_NOATIME
    | INODE_DIRSYNC;

impl Filesystem {
    /// Replace the settable flags of `id` with `flags`. No-COW can only be
    /// switched on a directory (new files inherit it) or an empty file, and
    /// brings no-checksum with it, as in the kernel.
    pub fn set_flags(&self, id: InodeId, flags: u64) -> Result<u64> {
        self.change("setting inode flags", || {
            if flags & !SETTABLE_FLAGS != 0 {
                return Err(Error::Unsupported(format!(
                    "inode flags {:#x}",
                    flags & !SETTABLE_FLAGS
                )));
            }
            if id.is_placeholder() {
                return Err(Error::ReadOnly(
                    "placeholder of an unreachable subvolume".into(),
                ));
            }
            let mut w = self.writer()?;
            let st = self.stat(id)?;
            let old = st.flags;
            let mut new = (old & !SETTABLE_FLAGS) | flags;
            if (old ^ new) & INODE_NODATACOW != 0 {
                let empty = st.size == 0 && !self.delalloc().has(id);
                if st.kind == FileKind::File && !empty {
                    return Err(Error::Invalid(
                        "no-COW can only change on an empty file".into(),
                    ));
                }
                if new & INODE_NODATACOW != 0 {
                    new |= INODE_NODATASUM;
                } else {
                    new &= !INODE_NODATASUM;
                }
            }
            if new & INODE_COMPRESS != 0 && new & INODE_NOCOMPRESS != 0 {
                return Err(Error::Invalid("compress and nocompress together".into()));
            }
            let now = crate::format::items::Timespec::now();
            let item = self.change_inode(&mut w, id, |i| {
                i.flags = new;
                i.ctime = now;
            })?;
            Ok(item.flags)
        })
    }
}

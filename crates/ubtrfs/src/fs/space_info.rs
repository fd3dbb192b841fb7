//! Space by kind and profile (`btrfs filesystem df`): what the block
//! groups of each type and profile hold, and how much of it is used.

use super::open::Filesystem;
use crate::Result;
use crate::format::Key;
use crate::format::consts::*;

/// The block groups of one type and profile, added up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceInfo {
    /// Block group flags: the type (`BLOCK_GROUP_DATA`, `_SYSTEM`,
    /// `_METADATA`) and the profile bits.
    pub flags: u64,
    /// Logical bytes of the block groups.
    pub total: u64,
    /// Logical bytes used in them.
    pub used: u64,
}

impl Filesystem {
    /// The space of each type and profile, in the kernel's order: data,
    /// system, metadata (mixed groups last), each profile once.
    pub fn space_info(&self) -> Result<Vec<SpaceInfo>> {
        let groups = self.block_group_usage()?;
        let mut out: Vec<SpaceInfo> = Vec::new();
        for (flags, len, used) in groups {
            match out.iter_mut().find(|s| s.flags == flags) {
                Some(s) => {
                    s.total += len;
                    s.used += used;
                }
                None => out.push(SpaceInfo {
                    flags,
                    total: len,
                    used,
                }),
            }
        }
        let kind = |f: u64| match f & (BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA)
        {
            BLOCK_GROUP_DATA => 0,
            BLOCK_GROUP_SYSTEM => 1,
            BLOCK_GROUP_METADATA => 2,
            _ => 3,
        };
        out.sort_by_key(|s| (kind(s.flags), s.flags));
        Ok(out)
    }

    /// (flags, length, used) of every block group: as the running
    /// transaction has them when writable, else from the block group
    /// items.
    fn block_group_usage(&self) -> Result<Vec<(u64, u64, u64)>> {
        if let Some(w) = &self.writer {
            let w = w.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(w
                .blocks
                .alloc
                .groups
                .values()
                .map(|g| (g.flags, g.len, g.used))
                .collect());
        }
        self.block_group_items()
    }

    /// (flags, length, used) of every chunk's block group item (one
    /// lookup per chunk).
    pub(crate) fn block_group_items(&self) -> Result<Vec<(u64, u64, u64)>> {
        let tree = self.tree_by_id(self.superblock().block_group_tree())?;
        let mut out = Vec::new();
        for c in self.tree_reader().volume().chunks.all() {
            let key = Key::new(c.logical, BLOCK_GROUP_ITEM_KEY, c.item.length);
            let item = tree.get(&key)?.ok_or_else(|| {
                crate::Error::corrupt(format!("chunk {} has no block group item", c.logical))
            })?;
            let used = item
                .data()
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| {
                    crate::Error::corrupt(format!("block group {} is short", c.logical))
                })?;
            out.push((c.item.chunk_type, c.item.length, used));
        }
        Ok(out)
    }
}

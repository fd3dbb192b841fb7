//! Block groups: the usage record of each chunk, with its free space.

use super::RangeSet;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::BlockGroupItem;
use crate::tree::Tree;
use crate::{Error, Result};

/// One block group.
#[derive(Clone, Debug)]
pub struct BlockGroup {
    /// First logical address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// Type and profile flags.
    pub flags: u64,
    /// Bytes used, as recorded in the block group item.
    pub used: u64,
    /// The chunk tree objectid recorded in the item.
    pub chunk_objectid: u64,
    /// Allocatable space.
    pub free: RangeSet,
    /// Space freed by the running transaction, free after its commit.
    pub pinned: RangeSet,
    /// `used` changed: the block group item must be rewritten.
    pub dirty_used: bool,
    /// Free space changed: the free-space tree must be rewritten.
    pub dirty_free: bool,
    /// No new allocations here.
    pub read_only: bool,
}

impl BlockGroup {
    /// The key of this group's item.
    pub fn key(&self) -> Key {
        Key::new(self.start, BLOCK_GROUP_ITEM_KEY, self.len)
    }

    /// The item's bytes.
    pub fn item_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&self.used.to_le_bytes());
        v.extend_from_slice(&self.chunk_objectid.to_le_bytes());
        v.extend_from_slice(&self.flags.to_le_bytes());
        v
    }
}

/// Read every block group item of `tree` (the extent tree, or the block
/// group tree when the filesystem has one). Free space starts empty.
pub fn load_groups(tree: &Tree<'_>) -> Result<Vec<BlockGroup>> {
    let mut out = Vec::new();
    for item in tree.range(Key::MIN, Key::MAX)? {
        let item = item?;
        let key = item.key();
        if key.item_type != BLOCK_GROUP_ITEM_KEY {
            continue;
        }
        let bg = BlockGroupItem::parse(item.data())?;
        if bg.used > key.offset {
            return Err(Error::corrupt(format!(
                "block group {} uses {} of {} bytes",
                key.objectid, bg.used, key.offset
            )));
        }
        out.push(BlockGroup {
            start: key.objectid,
            len: key.offset,
            flags: bg.flags,
            used: bg.used,
            chunk_objectid: bg.chunk_objectid,
            free: RangeSet::new(),
            pinned: RangeSet::new(),
            dirty_used: false,
            dirty_free: false,
            read_only: false,
        });
    }
    Ok(out)
}

/// Fill each group's free space from the extent tree: everything not
/// covered by an extent or tree block item is free.
pub fn free_space_from_extent_tree(
    groups: &mut [BlockGroup],
    extent_tree: &Tree<'_>,
    nodesize: u64,
) -> Result<()> {
    for g in groups.iter_mut() {
        let end = g.start + g.len;
        let mut cursor = g.start;
        let mut free = RangeSet::new();
        for item in extent_tree.range(
            Key::new(g.start, 0, 0),
            Key::new(end - 1, u8::MAX, u64::MAX),
        )? {
            let key = item?.key();
            let (s, l) = match key.item_type {
                EXTENT_ITEM_KEY => (key.objectid, key.offset),
                METADATA_ITEM_KEY => (key.objectid, nodesize),
                _ => continue,
            };
            if s > cursor {
                free.insert(cursor, s - cursor);
            }
            cursor = cursor.max(s + l);
        }
        if cursor < end {
            free.insert(cursor, end - cursor);
        }
        g.free = free;
    }
    Ok(())
}

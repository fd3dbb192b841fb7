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
    /// Free bytes when `used` was last brought up to date (at open, after
    /// each commit): what the running transaction allocated and freed
    /// since is the difference (see [`BlockGroup::live_used`]).
    pub settled_free: u64,
}

impl BlockGroup {
    /// Bytes in use now, the running transaction's allocations and frees
    /// counted (its references are counted into `used` at the commit), as
    /// the kernel's figures move while its delayed references run.
    pub fn live_used(&self) -> u64 {
        (self.used + self.settled_free)
            .saturating_sub(self.free.total())
            .saturating_sub(self.pinned.total())
    }

    /// The key of this group's item.
    pub fn key(&self) -> Key {
        Key::new(self.start, BLOCK_GROUP_ITEM_KEY, self.len)
    }

    /// Whether all of `[start, start + len)` lies in this group.
    pub fn holds(&self, start: u64, len: u64) -> bool {
        start >= self.start
            && start
                .checked_add(len)
                .is_some_and(|e| e <= self.start + self.len)
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
        // Groups are looked up and walked by their end: it must exist.
        if key.offset == 0 || key.objectid.checked_add(key.offset).is_none() {
            return Err(Error::corrupt(format!(
                "block group {} of {} bytes",
                key.objectid, key.offset
            )));
        }
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
            settled_free: 0,
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
            cursor = cursor.max(s.saturating_add(l));
        }
        if cursor < end {
            free.insert(cursor, end - cursor);
        }
        g.free = free;
    }
    Ok(())
}

/// Take the superblock copies out of the free space: a chunk another
/// program made may cover one on some device (ubtrfs keeps its own chunks
/// off them), and the kernel never puts data or tree blocks there. For
/// striped profiles the whole row of stripes holding the copy is left out.
pub fn exclude_super_copies(
    groups: &mut std::collections::BTreeMap<u64, BlockGroup>,
    chunks: &[(u64, crate::format::items::ChunkItem)],
) -> Result<()> {
    use crate::volume::Profile;
    for (logical, c) in chunks {
        let Some(g) = groups.get_mut(logical) else {
            continue;
        };
        let n = c.stripes.len() as u64;
        let profile = Profile::from_flags(c.chunk_type)?;
        // Data stripes in one row (0: not striped).
        let row = match profile {
            Profile::Raid0 => n,
            Profile::Raid10 => n / (c.sub_stripes.max(1) as u64),
            Profile::Raid5 => n.saturating_sub(1),
            Profile::Raid6 => n.saturating_sub(2),
            _ => 0,
        };
        let dev_len = c.length.checked_div(row).unwrap_or(c.length);
        let stripe_len = if c.stripe_len == 0 {
            0x1_0000
        } else {
            c.stripe_len
        };
        for (i, s) in c.stripes.iter().enumerate() {
            let i = i as u64;
            for &sb in &SUPER_OFFSETS {
                if sb < s.offset || sb >= s.offset + dev_len {
                    continue;
                }
                // The stripe holding the copy, as the kernel leaves it out.
                let nr = (sb - s.offset) / stripe_len;
                let (lo, len) = match profile {
                    Profile::Raid0 => (logical + (nr * row + i) * stripe_len, stripe_len),
                    Profile::Raid10 => (
                        logical + (nr * row + i / (c.sub_stripes.max(1) as u64)) * stripe_len,
                        stripe_len,
                    ),
                    // Parity rotates: the whole row.
                    Profile::Raid5 | Profile::Raid6 => {
                        (logical + nr * row * stripe_len, row * stripe_len)
                    }
                    _ => (logical + nr * stripe_len, stripe_len),
                };
                let (lo, hi) = (lo.max(g.start), (lo + len).min(g.start + g.len));
                for (a, l) in g.free.clone().iter() {
                    let (x, y) = (a.max(lo), (a + l).min(hi));
                    if x < y {
                        g.free.remove(x, y - x);
                    }
                }
            }
        }
    }
    Ok(())
}

//! Removing empty chunks: a data or metadata block group that holds
//! nothing at a commit goes away with its chunk, as the kernel removes
//! unused block groups, so space a burst of writes took for one kind goes
//! back to the devices for any kind (without this, data chunks left empty
//! by deleted files could leave metadata no room to grow).

use super::{BlockGroup, SpaceKind};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DevExtent, DevItem};
use crate::fs::Filesystem;
use crate::transaction::Writer;
use crate::{Error, Result};

impl Filesystem {
    /// The block groups a commit should remove: wholly free and not
    /// needed. Not system (its chunks live in the superblock too), not the
    /// last of its kind, and not space that dirty data or the metadata
    /// reserve counts on.
    pub(crate) fn unused_groups(&self, w: &Writer) -> Vec<u64> {
        let reserve = self.metadata_reserve();
        let dirty = self.delalloc().reserved_bytes();
        let mut doomed: Vec<u64> = Vec::new();
        for kind in [SpaceKind::Data, SpaceKind::Metadata] {
            let flag = kind_flag(kind);
            let of_kind: Vec<&BlockGroup> = w
                .blocks
                .alloc
                .groups
                .values()
                .filter(|g| g.flags & TYPE_MASK == flag)
                .collect();
            let mut free = w.blocks.alloc.free_bytes(kind);
            let keep_free = match kind {
                SpaceKind::Data => dirty,
                _ => 4 * reserve,
            };
            let mut left = of_kind.len();
            for g in of_kind {
                let empty =
                    g.used == 0 && g.pinned.total() == 0 && g.free.total() == g.len && !g.read_only;
                if empty && left > 1 && free >= g.len + keep_free {
                    doomed.push(g.start);
                    free -= g.len;
                    left -= 1;
                }
            }
        }
        doomed
    }

    /// Remove the block groups at `doomed` (from [`Self::unused_groups`])
    /// and their chunks. Runs in a commit, before the trees settle.
    pub(crate) fn remove_groups(&self, w: &mut Writer, doomed: &[u64]) -> Result<()> {
        // Nothing may land in them while their items go.
        for start in doomed {
            if let Some(g) = w.blocks.alloc.groups.get_mut(start) {
                g.read_only = true;
            }
        }
        for &start in doomed {
            self.remove_group(w, start)?;
        }
        Ok(())
    }

    /// Delete the block group at `start` and its chunk: the block group
    /// item, its free-space tree entries, the chunk item, the dev extents
    /// (the devices' used bytes shrink by them), and the in-memory group
    /// and chunk mapping.
    fn remove_group(&self, w: &mut Writer, start: u64) -> Result<()> {
        let g = w
            .blocks
            .alloc
            .groups
            .get(&start)
            .ok_or_else(|| Error::corrupt(format!("block group {start} vanished")))?;
        let (key, len) = (g.key(), g.len);
        tracing::debug!(start, len, flags = g.flags, "removing an empty block group");
        let bg_tree = w.bg_tree();
        self.modify_tree(w, bg_tree, |ed, root| {
            ed.delete(root, key)?
                .map(|_| ())
                .ok_or_else(|| Error::corrupt(format!("block group item {key} missing")))
        })?;
        if w.has_free_space_tree() {
            self.modify_tree(w, FREE_SPACE_TREE_OBJECTID, |ed, root| {
                let lo = Key::new(start, FREE_SPACE_INFO_KEY, 0);
                let hi = Key::new(start + len - 1, u8::MAX, u64::MAX);
                let mut keys = Vec::new();
                for item in ed.reader().tree(*root).range(lo, hi)? {
                    let k = item?.key();
                    if matches!(
                        k.item_type,
                        FREE_SPACE_INFO_KEY | FREE_SPACE_EXTENT_KEY | FREE_SPACE_BITMAP_KEY
                    ) {
                        keys.push(k);
                    }
                }
                for k in keys {
                    ed.delete(root, k)?;
                }
                Ok(())
            })?;
            w.forget_free_space_written(start);
        }
        let chunk = self.tree_reader().volume().chunks.lookup(start)?;
        let stripes: Vec<(u64, u64)> = chunk
            .item
            .stripes
            .iter()
            .map(|s| (s.devid, s.offset))
            .collect();
        let mut freed: Vec<(u64, u64)> = Vec::new();
        self.modify_tree(w, DEV_TREE_OBJECTID, |ed, root| {
            for &(devid, offset) in &stripes {
                let k = Key::new(devid, DEV_EXTENT_KEY, offset);
                let de = ed
                    .delete(root, k)?
                    .ok_or_else(|| Error::corrupt(format!("dev extent {k} missing")))?;
                freed.push((devid, DevExtent::parse(&de)?.length));
            }
            Ok(())
        })?;
        self.modify_tree(w, CHUNK_TREE_OBJECTID, |ed, root| {
            let k = Key::new(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, start);
            ed.delete(root, k)?
                .ok_or_else(|| Error::corrupt(format!("chunk item {k} missing")))?;
            for &(devid, length) in &freed {
                ed.update(
                    root,
                    Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid),
                    |d| {
                        let mut item = DevItem::parse(d)?;
                        item.bytes_used = item.bytes_used.saturating_sub(length);
                        *d = item.to_bytes();
                        Ok(())
                    },
                )?
                .ok_or_else(|| Error::corrupt(format!("device {devid} has no dev item")))?;
            }
            Ok(())
        })?;
        w.blocks.alloc.groups.remove(&start);
        self.tree_reader().volume().chunks.remove(start)?;
        Ok(())
    }
}

/// The type bits of block group flags (mixed groups have two of them and
/// are never removed).
const TYPE_MASK: u64 = BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA;

fn kind_flag(kind: SpaceKind) -> u64 {
    match kind {
        SpaceKind::Data => BLOCK_GROUP_DATA,
        SpaceKind::Metadata => BLOCK_GROUP_METADATA,
        SpaceKind::System => BLOCK_GROUP_SYSTEM,
    }
}

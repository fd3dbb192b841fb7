//! Moving a filesystem from the old free-space cache (`space_cache=v1`:
//! no free-space tree, maybe cache inodes in the root tree) to the
//! free-space tree, as the kernel does when it mounts one with
//! `space_cache=v2`: free space is found from the extent tree, written
//! into a new free-space tree, the feature flags say so, the cache's
//! generation goes to 0, and the cache inodes go with their extents.

use super::{BlockGroup, RangeSet};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::le;
use crate::fs::snapshot::ROOT_ITEM_SIZE;
use crate::fs::{Filesystem, InodeId};
use crate::transaction::Writer;
use crate::tree::{Tree, TreeEditor};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// Each group's free space: what no extent item of the extent tree
/// covers (tree blocks are `nodesize` long).
pub(crate) fn free_from_extent_tree(
    groups: &mut BTreeMap<u64, BlockGroup>,
    extent_tree: &Tree<'_>,
    nodesize: u64,
) -> Result<()> {
    let mut used: BTreeMap<u64, RangeSet> = BTreeMap::new();
    for item in extent_tree.range(Key::MIN, Key::MAX)? {
        let item = item?;
        let k = item.key();
        let len = match k.item_type {
            EXTENT_ITEM_KEY => k.offset,
            METADATA_ITEM_KEY => nodesize,
            _ => continue,
        };
        let Some((&start, g)) = groups.range(..=k.objectid).next_back() else {
            return Err(Error::corrupt(format!(
                "extent {}+{len} is in no block group",
                k.objectid
            )));
        };
        if k.objectid.saturating_add(len) > g.start + g.len {
            return Err(Error::corrupt(format!(
                "extent {}+{len} runs past its block group",
                k.objectid
            )));
        }
        if !used.entry(start).or_default().insert(k.objectid, len) {
            return Err(Error::corrupt(format!(
                "extent {}+{len} overlaps another",
                k.objectid
            )));
        }
    }
    for g in groups.values_mut() {
        let mut free = RangeSet::new();
        free.insert(g.start, g.len);
        if let Some(u) = used.get(&g.start) {
            for (s, l) in u.iter() {
                free.remove(s, l);
            }
        }
        g.free = free;
    }
    Ok(())
}

impl Filesystem {
    /// In the running transaction: start the free-space tree (empty; the
    /// commit writes every group's entries, all marked changed) and drop
    /// the v1 cache inodes. The superblocks get the feature flags and a
    /// cache generation of 0 from the next commit.
    pub(crate) fn start_free_space_tree(&self, w: &mut Writer) -> Result<()> {
        let chunk_uuid = w.chunk_tree_uuid();
        let root = TreeEditor::new(
            self.tree_reader(),
            &mut w.blocks,
            FREE_SPACE_TREE_OBJECTID,
            chunk_uuid,
        )
        .new_tree(Vec::new())?;
        self.set_root(FREE_SPACE_TREE_OBJECTID, root);
        // A root item as the kernel writes one for a tree it makes: no
        // inode, one reference; the commit fills in where the root is and
        // the bytes it uses.
        let mut item = vec![0u8; ROOT_ITEM_SIZE];
        item[216..220].copy_from_slice(&1u32.to_le_bytes());
        self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, r| {
            ed.insert(
                r,
                Key::new(FREE_SPACE_TREE_OBJECTID, ROOT_ITEM_KEY, 0),
                item,
            )
        })?;
        for g in w.blocks.alloc.groups.values_mut() {
            g.dirty_free = true;
        }
        w.start_free_space_tree();
        self.drop_space_cache_inodes(w)
    }

    /// Remove the v1 cache: each block group's header item in the root
    /// tree, and the inode it names with its items and data extents.
    fn drop_space_cache_inodes(&self, w: &mut Writer) -> Result<()> {
        let headers: Vec<(Key, u64)> = self
            .root_tree()
            .items_of(FREE_SPACE_OBJECTID, 0)?
            .map(|it| {
                let it = it?;
                // The header starts with the disk key of the cache inode.
                Ok((it.key(), le::u64(it.data(), 0)?))
            })
            .collect::<Result<_>>()?;
        for (key, ino) in headers {
            if (FIRST_FREE_OBJECTID..FREE_SPACE_OBJECTID).contains(&ino) {
                let id = InodeId {
                    subvol: ROOT_TREE_OBJECTID,
                    ino,
                };
                let items: Vec<(Key, Vec<u8>)> = self
                    .root_tree()
                    .range(Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))?
                    .map(|it| it.map(|it| (it.key(), it.data().to_vec())))
                    .collect::<Result<_>>()?;
                for (k, data) in &items {
                    if k.item_type == EXTENT_DATA_KEY {
                        self.drop_extent_ref(w, id, k.offset, data)?;
                    }
                }
                let keys: Vec<Key> = items.into_iter().map(|(k, _)| k).collect();
                self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, r| {
                    for k in keys {
                        ed.delete(r, k)?;
                    }
                    Ok(())
                })?;
            }
            self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, r| ed.delete(r, key).map(|_| ()))?;
        }
        Ok(())
    }
}

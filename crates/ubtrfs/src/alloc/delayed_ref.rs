//! Delayed references: the reference changes of a transaction, gathered in
//! memory and applied to the extent tree once, at commit.
//!
//! A tree block is referenced either by a tree (a keyed `TREE_BLOCK_REF`,
//! one per tree that reaches it through blocks using normal back
//! references) or by one parent block (a `SHARED_BLOCK_REF`, when that
//! parent is flagged `FULL_BACKREF`). Data extents have the same two
//! kinds, with counts: `EXTENT_DATA_REF` per (tree, inode, offset) and
//! `SHARED_DATA_REF` per parent leaf.

use std::collections::BTreeMap;

/// Who references a tree block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockRef {
    /// Tree `root` reaches the block (TREE_BLOCK_REF).
    Root(u64),
    /// The block at `parent` points at it (SHARED_BLOCK_REF).
    Parent(u64),
}

/// Pending changes to one tree block's references.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeRefs {
    /// Level of the block.
    pub level: u8,
    /// Net change per reference.
    pub changes: BTreeMap<BlockRef, i64>,
    /// Extent flags to set (`BLOCK_FLAG_FULL_BACKREF`).
    pub set_flags: u64,
    /// The block was allocated by the running transaction.
    pub new: bool,
}

impl TreeRefs {
    /// Net change of the reference count.
    pub fn delta(&self) -> i64 {
        self.changes.values().sum()
    }
}

/// Who references a data extent: a file extent item of inode `objectid`
/// in tree `root`, for the extent placed at file offset `offset` (the
/// item's key offset minus its offset into the extent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataOwner {
    pub root: u64,
    pub objectid: u64,
    pub offset: u64,
}

/// A reference to a data extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataRef {
    /// File extent items of a tree (EXTENT_DATA_REF).
    Root(DataOwner),
    /// File extent items of the leaf at `parent` (SHARED_DATA_REF).
    Parent(u64),
}

/// Pending changes to a data extent's references.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataRefs {
    /// Length of the extent.
    pub len: u64,
    /// Net change per reference.
    pub changes: BTreeMap<DataRef, i64>,
}

/// All pending reference changes of the running transaction.
#[derive(Clone, Debug, Default)]
pub struct DelayedRefs {
    /// Tree blocks by address.
    pub tree: BTreeMap<u64, TreeRefs>,
    /// Data extents by address.
    pub data: BTreeMap<u64, DataRefs>,
}

impl DelayedRefs {
    /// Bytes of data extents that lose references in this transaction and
    /// gain none overall (those written and dropped again in it too): about
    /// what its commit frees (less where other references remain).
    pub fn data_bytes_dropping(&self) -> u64 {
        self.data
            .values()
            // Changes that cancelled out leave an empty map: mostly an
            // extent written and dropped again in this transaction.
            .filter(|d| {
                d.changes.is_empty()
                    || (d.changes.values().any(|&c| c < 0) && d.changes.values().sum::<i64>() <= 0)
            })
            .map(|d| d.len)
            .sum()
    }

    /// Tree blocks made before this transaction that lose references in
    /// it: about how many its commit frees (fewer where others share them).
    pub fn tree_blocks_dropping(&self) -> u64 {
        self.tree
            .values()
            .filter(|t| !t.new && t.changes.values().sum::<i64>() < 0)
            .count() as u64
    }

    /// A new tree block of tree `owner`.
    pub fn add_tree(&mut self, bytenr: u64, level: u8, owner: u64) {
        self.tree.entry(bytenr).or_default().new = true;
        self.change_tree(bytenr, level, BlockRef::Root(owner), 1);
    }

    /// Tree `owner` drops its reference to a block. Returns true if the
    /// block was added in this transaction and nothing else references it
    /// (the two cancel: its space can be reused at once).
    pub fn drop_tree(&mut self, bytenr: u64, level: u8, owner: u64) -> bool {
        self.change_tree(bytenr, level, BlockRef::Root(owner), -1);
        let gone = self
            .tree
            .get(&bytenr)
            .is_some_and(|e| e.new && e.changes.is_empty());
        if gone {
            self.tree.remove(&bytenr);
        }
        gone
    }

    /// Change tree block `bytenr`'s reference `r` by `d`.
    pub fn change_tree(&mut self, bytenr: u64, level: u8, r: BlockRef, d: i64) {
        crate::transaction::abort::note_edit();
        let e = self.tree.entry(bytenr).or_default();
        e.level = level;
        let c = e.changes.entry(r).or_insert(0);
        *c += d;
        if *c == 0 {
            e.changes.remove(&r);
        }
        if !e.new && e.changes.is_empty() && e.set_flags == 0 {
            self.tree.remove(&bytenr);
        }
    }

    /// Set extent flags of tree block `bytenr`.
    pub fn set_tree_flags(&mut self, bytenr: u64, level: u8, flags: u64) {
        crate::transaction::abort::note_edit();
        let e = self.tree.entry(bytenr).or_default();
        e.level = level;
        e.set_flags |= flags;
    }

    /// Pending net reference change and flags of tree block `bytenr`.
    pub fn tree_pending(&self, bytenr: u64) -> (i64, u64) {
        self.tree
            .get(&bytenr)
            .map_or((0, 0), |e| (e.delta(), e.set_flags))
    }

    /// Change the references of data extent `bytenr` (of `len` bytes) by `d` for `owner`.
    pub fn change_data(&mut self, bytenr: u64, len: u64, owner: DataOwner, d: i64) {
        self.change_data_ref(bytenr, len, DataRef::Root(owner), d);
    }

    /// Change any reference `r` of data extent `bytenr` (of `len` bytes) by `d`.
    pub fn change_data_ref(&mut self, bytenr: u64, len: u64, r: DataRef, d: i64) {
        crate::transaction::abort::note_edit();
        let e = self.data.entry(bytenr).or_insert_with(|| DataRefs {
            len,
            changes: BTreeMap::new(),
        });
        let c = e.changes.entry(r).or_insert(0);
        *c += d;
        if *c == 0 {
            e.changes.remove(&r);
        }
        // An extent whose changes cancel out stays: if this transaction
        // allocated it, the commit must give its space back.
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty() && self.data.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_block_freed_in_its_transaction_cancels() {
        let mut r = DelayedRefs::default();
        r.add_tree(4096, 0, 5);
        assert!(r.drop_tree(4096, 0, 5));
        assert!(r.is_empty());
    }

    #[test]
    fn shared_block_is_not_released() {
        let mut r = DelayedRefs::default();
        r.add_tree(4096, 1, 256);
        r.change_tree(4096, 1, BlockRef::Root(257), 1);
        assert!(!r.drop_tree(4096, 1, 256));
        assert_eq!(r.tree_pending(4096), (1, 0));
    }

    #[test]
    fn old_block_changes_that_cancel_leave_nothing() {
        let mut r = DelayedRefs::default();
        r.change_tree(8192, 0, BlockRef::Root(256), -1);
        r.change_tree(8192, 0, BlockRef::Root(256), 1);
        assert!(r.is_empty());
        r.set_tree_flags(8192, 0, 1 << 8);
        assert_eq!(r.tree_pending(8192), (0, 1 << 8));
    }
}

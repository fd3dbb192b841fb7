//! Delayed references: the reference changes of a transaction, gathered in
//! memory and applied to the extent tree once, at commit.

use std::collections::BTreeMap;

/// Pending change to a tree block's single reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeRef {
    /// Level of the block.
    pub level: u8,
    /// Tree that references it.
    pub owner: u64,
    /// +1: a new block; -1: a dropped block.
    pub delta: i32,
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

/// Pending changes to a data extent's references.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataRefs {
    /// Length of the extent.
    pub len: u64,
    /// Net change per owner.
    pub changes: BTreeMap<DataOwner, i64>,
}

/// All pending reference changes of the running transaction.
#[derive(Clone, Debug, Default)]
pub struct DelayedRefs {
    /// Tree blocks by address.
    pub tree: BTreeMap<u64, TreeRef>,
    /// Data extents by address.
    pub data: BTreeMap<u64, DataRefs>,
}

impl DelayedRefs {
    /// A new tree block.
    pub fn add_tree(&mut self, bytenr: u64, level: u8, owner: u64) {
        self.change_tree(bytenr, level, owner, 1);
    }

    /// A tree block dropped. Returns true if the block was added in this
    /// transaction (the two cancel: its space can be reused at once).
    pub fn drop_tree(&mut self, bytenr: u64, level: u8, owner: u64) -> bool {
        let cancels = self.tree.get(&bytenr).is_some_and(|r| r.delta > 0);
        self.change_tree(bytenr, level, owner, -1);
        cancels
    }

    fn change_tree(&mut self, bytenr: u64, level: u8, owner: u64, d: i32) {
        let e = self.tree.entry(bytenr).or_insert(TreeRef {
            level,
            owner,
            delta: 0,
        });
        e.delta += d;
        if e.delta == 0 {
            self.tree.remove(&bytenr);
        }
    }

    /// Change the references of data extent `bytenr` (of `len` bytes) by `d` for `owner`.
    pub fn change_data(&mut self, bytenr: u64, len: u64, owner: DataOwner, d: i64) {
        let e = self.data.entry(bytenr).or_insert_with(|| DataRefs {
            len,
            changes: BTreeMap::new(),
        });
        let c = e.changes.entry(owner).or_insert(0);
        *c += d;
        if *c == 0 {
            e.changes.remove(&owner);
        }
        // An extent whose changes cancel out stays: if this transaction
        // allocated it, the commit must give its space back.
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty() && self.data.is_empty()
    }
}

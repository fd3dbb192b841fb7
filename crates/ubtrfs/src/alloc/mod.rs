//! Allocation: block groups, their free space, and the references that
//! the extent tree keeps for every allocated extent.
//!
//! Free space is known in memory for every block group (loaded from the
//! free-space tree, or from the extent tree when there is none). Space a
//! transaction frees stays *pinned* until its commit is on disk, so the
//! committed trees are never overwritten before a newer commit replaces
//! them.

pub mod block_group;
mod chunk_alloc;
mod chunk_remove;
pub mod delayed_ref;
pub mod extent_tree;
pub mod free_space_tree;
mod range_set;
mod space_cache;
pub mod trim;

pub use block_group::BlockGroup;
pub use delayed_ref::DelayedRefs;
pub use range_set::RangeSet;
pub(crate) use space_cache::free_from_extent_tree;

use crate::format::consts::*;
use crate::{Error, Result};
use std::collections::BTreeMap;

/// What kind of space an allocation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceKind {
    /// File data.
    Data,
    /// Tree blocks of every tree but the chunk tree.
    Metadata,
    /// Tree blocks of the chunk tree.
    System,
}

impl SpaceKind {
    /// The kind of block groups that serve tree `owner`'s blocks.
    pub fn for_tree(owner: u64) -> Self {
        if owner == CHUNK_TREE_OBJECTID {
            SpaceKind::System
        } else {
            SpaceKind::Metadata
        }
    }

    fn flag(self) -> u64 {
        match self {
            SpaceKind::Data => BLOCK_GROUP_DATA,
            SpaceKind::Metadata => BLOCK_GROUP_METADATA,
            SpaceKind::System => BLOCK_GROUP_SYSTEM,
        }
    }
}

/// The block groups of a filesystem and their free space.
#[derive(Debug, Default)]
pub struct Allocator {
    /// Block groups by logical start.
    pub groups: BTreeMap<u64, BlockGroup>,
    /// Where the last allocation of each kind ended, to keep locality.
    cursor: [u64; 3],
}

impl Allocator {
    /// An allocator over `groups`.
    pub fn new(groups: Vec<BlockGroup>) -> Self {
        Allocator {
            groups: groups.into_iter().map(|g| (g.start, g)).collect(),
            cursor: [0; 3],
        }
    }

    /// The block group holding `logical`.
    pub fn group_of(&mut self, logical: u64) -> Result<&mut BlockGroup> {
        self.groups
            .range_mut(..=logical)
            .next_back()
            .map(|(_, g)| g)
            .filter(|g| logical < g.start + g.len)
            .ok_or_else(|| Error::corrupt(format!("logical {logical} is in no block group")))
    }

    /// Allocate `len` bytes aligned to `align` for `kind`. `None` when no
    /// block group has room (a new chunk is needed).
    pub fn alloc(&mut self, kind: SpaceKind, len: u64, align: u64) -> Option<u64> {
        let ci = kind as usize;
        let from = self.cursor[ci];
        // Groups from the cursor on, then the ones before it.
        let order: Vec<u64> = self
            .groups
            .range(..)
            .filter(|(_, g)| g.flags & kind.flag() != 0 && !g.read_only)
            .map(|(&s, _)| s)
            .collect();
        let (after, before): (Vec<u64>, Vec<u64>) = order.into_iter().partition(|&s| {
            let g = &self.groups[&s];
            g.start + g.len > from
        });
        for s in after.into_iter().chain(before) {
            let g = self.groups.get_mut(&s)?;
            let hint = from.clamp(g.start, g.start + g.len);
            if let Some(at) = g.free.find(len, align, hint) {
                g.free.remove(at, len);
                g.dirty_free = true;
                self.cursor[ci] = at + len;
                return Some(at);
            }
        }
        None
    }

    /// Allocate up to `len` bytes of data space (at least `min`): the
    /// largest piece available if `len` does not fit in one.
    pub fn alloc_data(&mut self, len: u64, min: u64, sectorsize: u64) -> Option<(u64, u64)> {
        if let Some(at) = self.alloc(SpaceKind::Data, len, sectorsize) {
            return Some((at, len));
        }
        let (start, best) = self
            .groups
            .values()
            .filter(|g| g.flags & BLOCK_GROUP_DATA != 0 && !g.read_only)
            .filter_map(|g| g.free.largest())
            .max_by_key(|&(_, l)| l)?;
        let take = best.min(len) / sectorsize * sectorsize;
        if take < min.max(sectorsize) {
            return None;
        }
        let g = self.group_of(start).ok()?;
        g.free.remove(start, take);
        g.dirty_free = true;
        Some((start, take))
    }

    /// Give back space allocated in the running transaction that was
    /// never committed: it is free again at once.
    pub fn release(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.group_of(start)?;
        if !g.free.insert(start, len) {
            return Err(Error::corrupt(format!(
                "release of free space {start}+{len}"
            )));
        }
        g.dirty_free = true;
        Ok(())
    }

    /// Space freed by the running transaction: free after its commit.
    pub fn pin(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.group_of(start)?;
        if !g.pinned.insert(start, len) {
            return Err(Error::corrupt(format!("extent {start}+{len} freed twice")));
        }
        g.dirty_free = true;
        Ok(())
    }

    /// After a commit: pinned space becomes allocatable, and the groups'
    /// `used` is up to date.
    pub fn unpin_all(&mut self) {
        for g in self.groups.values_mut() {
            for (s, l) in std::mem::take(&mut g.pinned).iter() {
                g.free.insert(s, l);
            }
        }
        self.settle();
    }

    /// The groups' `used` is up to date with their free space (at open,
    /// after a commit).
    pub fn settle(&mut self) {
        for g in self.groups.values_mut() {
            g.settled_free = g.free.total();
        }
    }

    /// Bytes used in every block group: the superblock's `bytes_used`.
    pub fn bytes_used(&self) -> u64 {
        self.groups.values().map(|g| g.used).sum()
    }

    /// Pinned bytes (free after the next commit) of groups of `kind`.
    pub fn pinned_bytes(&self, kind: SpaceKind) -> u64 {
        self.groups
            .values()
            .filter(|g| g.flags & kind.flag() != 0)
            .map(|g| g.pinned.total())
            .sum()
    }

    /// Free bytes (not counting pinned space) of groups of `kind` that
    /// take allocations.
    pub fn free_bytes(&self, kind: SpaceKind) -> u64 {
        self.groups
            .values()
            .filter(|g| g.flags & kind.flag() != 0 && !g.read_only)
            .map(|g| g.free.total())
            .sum()
    }
}

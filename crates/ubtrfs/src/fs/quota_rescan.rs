//! Quota rescan (`btrfs quota rescan`): the bytes each qgroup refers to
//! and holds alone, counted from scratch, written into the quota tree's
//! info items, and the counts marked consistent again.
//!
//! Every subvolume tree is walked from its root: each tree block it
//! reaches counts a node, each data extent its file extent items point
//! at counts its size on disk, once per subvolume however many items
//! point at it. A qgroup refers to what any of its subvolumes reaches
//! (a level-0 qgroup has one, a higher one those of its members, down
//! the relation items); it holds alone what only its subvolumes reach.
//! The commit that writes the counts writes nothing else a subvolume
//! reaches, so it does not mark them inconsistent (see
//! [`crate::transaction::quota`]).

use super::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, RootItem};
use crate::transaction::quota::{
    QGROUP_STATUS_FLAG_INCONSISTENT, QGROUP_STATUS_FLAG_RESCAN, QgroupStatus,
};
use crate::tree::RootPtr;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// One qgroup's counts after a rescan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QgroupCounts {
    /// `level << 48 | id`.
    pub qgroupid: u64,
    /// Bytes it refers to.
    pub referenced: u64,
    /// Bytes only it refers to.
    pub exclusive: u64,
}

/// Bits of a qgroup id above the subvolume id: its level.
const LEVEL_SHIFT: u32 = 48;

impl Filesystem {
    /// Count every qgroup again from the trees as committed, write the
    /// counts and commit; returns them by qgroup id.
    pub fn quota_rescan(&self) -> Result<Vec<QgroupCounts>> {
        self.change("quota rescan", || {
            let mut w = self.lock_writer()?;
            if self.superblock().incompat_flags & INCOMPAT_SIMPLE_QUOTA != 0 {
                return Err(Error::Unsupported(
                    "a rescan of simple quotas (squota)".into(),
                ));
            }
            let Some(status) = self.qgroup_status()? else {
                return Err(Error::Invalid("quotas are not enabled".into()));
            };
            // What is counted is what the commit leaves: changes made
            // before go in a commit of their own.
            self.commit_locked(&mut w)?;
            let counts = self.count_qgroups()?;
            let transid = w.blocks.transid;
            self.modify_tree(&mut w, QUOTA_TREE_OBJECTID, |ed, root| {
                for c in &counts {
                    let mut info = Vec::with_capacity(40);
                    for v in [
                        transid,
                        c.referenced,
                        c.referenced,
                        c.exclusive,
                        c.exclusive,
                    ] {
                        info.extend_from_slice(&v.to_le_bytes());
                    }
                    ed.put(root, Key::new(0, QGROUP_INFO_KEY, c.qgroupid), info)?;
                }
                let new = QgroupStatus {
                    generation: transid,
                    flags: status.flags
                        & !(QGROUP_STATUS_FLAG_INCONSISTENT | QGROUP_STATUS_FLAG_RESCAN),
                    // Done, as the kernel's finished rescan leaves it.
                    rescan: u64::MAX,
                    ..status
                };
                ed.update(root, Key::new(0, QGROUP_STATUS_KEY, 0), |d| {
                    new.write(d);
                    Ok(())
                })?
                .ok_or_else(|| Error::corrupt("the qgroup status item vanished"))
            })?;
            w.qgroups_counted = true;
            let committed = self.commit_locked(&mut w);
            w.qgroups_counted = false;
            committed?;
            Ok(counts)
        })
    }

    /// The counts of every qgroup the quota tree has, from the trees.
    fn count_qgroups(&self) -> Result<Vec<QgroupCounts>> {
        let quota = self.tree_by_id(QUOTA_TREE_OBJECTID)?;
        let mut qgroups = BTreeSet::new();
        // Members of each higher-level qgroup (a relation is kept both
        // ways; the one keyed by the member names its parent).
        let mut members: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for item in quota.range(Key::MIN, Key::MAX)? {
            let key = item?.key();
            match key.item_type {
                QGROUP_INFO_KEY => {
                    qgroups.insert(key.offset);
                }
                QGROUP_RELATION_KEY if key.objectid < key.offset => {
                    members.entry(key.offset).or_default().push(key.objectid);
                }
                _ => {}
            }
        }
        // Each subvolume's extents: size, and which subvolumes reach it.
        let mut extents: HashMap<u64, (u64, Vec<u64>)> = HashMap::new();
        let nodesize = u64::from(self.geometry().nodesize);
        for (subvol, item) in self.subvolume_root_items()? {
            let mut mine: HashSet<u64> = HashSet::new();
            let mut reached = |bytenr: u64, size: u64| {
                if mine.insert(bytenr) {
                    let e = extents.entry(bytenr).or_insert((size, Vec::new()));
                    e.1.push(subvol);
                }
            };
            let tree = self.tree_reader().tree(RootPtr {
                bytenr: item.bytenr,
                level: item.level,
                generation: Some(item.generation),
            });
            tree.walk(&mut |node| {
                reached(node.header.bytenr, nodesize);
                if !node.is_leaf() {
                    return Ok(());
                }
                for i in 0..node.nritems() {
                    let it = node.item(i);
                    if it.key.item_type != EXTENT_DATA_KEY {
                        continue;
                    }
                    if let ExtentBody::Regular {
                        disk_bytenr,
                        disk_num_bytes,
                        ..
                    } = FileExtentItem::parse(it.data)?.body
                        && disk_bytenr != 0
                    {
                        reached(disk_bytenr, disk_num_bytes);
                    }
                }
                Ok(())
            })?;
        }
        // The subvolumes of each qgroup.
        fn subvols_of(
            q: u64,
            members: &BTreeMap<u64, Vec<u64>>,
            out: &mut BTreeSet<u64>,
            depth: u32,
        ) {
            if q >> LEVEL_SHIFT == 0 {
                out.insert(q);
                return;
            }
            if depth > 8 {
                return;
            }
            for &m in members.get(&q).map(Vec::as_slice).unwrap_or_default() {
                subvols_of(m, members, out, depth + 1);
            }
        }
        let mut out = Vec::new();
        for &q in &qgroups {
            let mut set = BTreeSet::new();
            subvols_of(q, &members, &mut set, 0);
            let (mut referenced, mut exclusive) = (0u64, 0u64);
            for (size, by) in extents.values() {
                let inside = by.iter().filter(|s| set.contains(s)).count();
                if inside > 0 {
                    referenced += size;
                    if inside == by.len() {
                        exclusive += size;
                    }
                }
            }
            out.push(QgroupCounts {
                qgroupid: q,
                referenced,
                exclusive,
            });
        }
        Ok(out)
    }

    /// The root items of every subvolume tree still in use (the top
    /// level included; not one being deleted).
    fn subvolume_root_items(&self) -> Result<Vec<(u64, RootItem)>> {
        let mut out = Vec::new();
        for item in self.root_tree().range(
            Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, 0),
            Key::new(u64::MAX - 256, ROOT_ITEM_KEY, u64::MAX),
        )? {
            let item = item?;
            let key = item.key();
            let subvol = key.objectid == FS_TREE_OBJECTID
                || (FIRST_FREE_OBJECTID..u64::MAX - 256).contains(&key.objectid);
            if key.item_type != ROOT_ITEM_KEY || !subvol {
                continue;
            }
            let root = RootItem::parse(item.data())?;
            if root.refs > 0 {
                out.push((key.objectid, root));
            }
        }
        Ok(out)
    }
}

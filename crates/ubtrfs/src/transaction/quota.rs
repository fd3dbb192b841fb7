//! Quota groups (qgroups) on a filesystem whose quotas the kernel enabled.
//!
//! The kernel counts, per qgroup, the bytes each subvolume refers to and
//! holds alone, and brings the counts up to date at every commit. ubtrfs
//! does not count: every commit it writes marks the counts inconsistent in
//! the quota tree's status item, as the kernel itself does when it cannot
//! count (and as it would on finding a status item older than the
//! filesystem). `btrfs quota rescan` (or [`Filesystem::quota_rescan`])
//! makes them right again; until then
//! the kernel does not trust them and `btrfs check` does not compare them.
//! A rescan the kernel had under way is stopped: it started before these
//! changes.
//!
//! New subvolumes and snapshots get their level-0 qgroup (an info and a
//! limit item), as the kernel gives them one, so that a rescan counts
//! them. Simple quotas (`squota`), which the kernel counts through owner
//! references in the extent tree, are not written at all (see
//! [`crate::transaction`]'s open).

use super::Writer;
use crate::format::Key;
use crate::format::consts::*;
use crate::fs::Filesystem;
use crate::{Error, Result};

/// Status flags: quotas are on; a rescan is under way; the counts are not
/// to be trusted.
pub const QGROUP_STATUS_FLAG_ON: u64 = 1;
/// See [`QGROUP_STATUS_FLAG_ON`].
pub const QGROUP_STATUS_FLAG_RESCAN: u64 = 2;
/// See [`QGROUP_STATUS_FLAG_ON`].
pub const QGROUP_STATUS_FLAG_INCONSISTENT: u64 = 4;

/// Bytes of a qgroup info or limit item.
const QGROUP_ITEM_SIZE: usize = 40;

/// A qgroup status item's fields (the first 32 bytes; the kernel may add
/// more, which are kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QgroupStatus {
    pub version: u64,
    /// The transaction that last wrote the counts.
    pub generation: u64,
    pub flags: u64,
    /// How far a rescan has come (an objectid).
    pub rescan: u64,
}

impl QgroupStatus {
    /// Parse the status item's data.
    pub fn parse(data: &[u8]) -> Result<Self> {
        if data.len() < 32 {
            return Err(Error::corrupt(format!(
                "qgroup status item of {} bytes",
                data.len()
            )));
        }
        let u = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap_or_default());
        Ok(QgroupStatus {
            version: u(0),
            generation: u(8),
            flags: u(16),
            rescan: u(24),
        })
    }

    /// Write the fields into the status item's data.
    pub(crate) fn write(&self, data: &mut [u8]) {
        for (i, v) in [self.version, self.generation, self.flags, self.rescan]
            .into_iter()
            .enumerate()
        {
            data[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The key of level-0 qgroup `subvol`'s item of type `kind` (info or limit).
fn qgroup_key(kind: u8, subvol: u64) -> Key {
    Key::new(0, kind, subvol)
}

impl Filesystem {
    /// The quota tree's status, if the filesystem has quotas.
    pub fn qgroup_status(&self) -> Result<Option<QgroupStatus>> {
        if self.root_ptr(QUOTA_TREE_OBJECTID)?.is_none() {
            return Ok(None);
        }
        self.tree_by_id(QUOTA_TREE_OBJECTID)?
            .get(&Key::new(0, QGROUP_STATUS_KEY, 0))?
            .map(|it| QgroupStatus::parse(it.data()))
            .transpose()
    }

    /// For a commit: mark the qgroup counts inconsistent as of this
    /// transaction (a no-op without quotas, or once done).
    pub(crate) fn mark_qgroups_inconsistent(&self, w: &mut Writer) -> Result<()> {
        // A rescan's commit writes counts of what it leaves.
        if std::mem::take(&mut w.qgroups_counted) {
            return Ok(());
        }
        let Some(old) = self.qgroup_status()? else {
            return Ok(());
        };
        let new = QgroupStatus {
            generation: w.blocks.transid,
            flags: (old.flags | QGROUP_STATUS_FLAG_INCONSISTENT) & !QGROUP_STATUS_FLAG_RESCAN,
            rescan: 0,
            ..old
        };
        if new == old {
            return Ok(());
        }
        let key = Key::new(0, QGROUP_STATUS_KEY, 0);
        self.modify_tree(w, QUOTA_TREE_OBJECTID, |ed, root| {
            ed.update(root, key, |d| {
                new.write(d);
                Ok(())
            })?
            .ok_or_else(|| Error::corrupt("the qgroup status item vanished"))
        })
    }

    /// Give new subvolume `id` its level-0 qgroup, as the kernel does:
    /// an empty subvolume refers to its root block alone; a snapshot of
    /// `source` to what the source refers to, and holds its root alone.
    /// A no-op without quotas.
    pub(crate) fn add_qgroup(&self, w: &mut Writer, id: u64, source: Option<u64>) -> Result<()> {
        if self.qgroup_status()?.is_none() {
            return Ok(());
        }
        let nodesize = self.geometry().nodesize as u64;
        let quota = self.tree_by_id(QUOTA_TREE_OBJECTID)?;
        let (mut rfer, mut rfer_cmpr) = (nodesize, nodesize);
        if let Some(src) = source
            && let Some(it) = quota.get(&qgroup_key(QGROUP_INFO_KEY, src))?
            && it.data().len() >= 24
        {
            let d = it.data();
            let u = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().unwrap_or_default());
            (rfer, rfer_cmpr) = (u(8), u(16));
        }
        let mut info = vec![0u8; QGROUP_ITEM_SIZE];
        for (i, v) in [w.blocks.transid, rfer, rfer_cmpr, nodesize, nodesize]
            .into_iter()
            .enumerate()
        {
            info[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.modify_tree(w, QUOTA_TREE_OBJECTID, |ed, root| {
            // A stale qgroup of a deleted subvolume with this id is replaced.
            ed.put(root, qgroup_key(QGROUP_INFO_KEY, id), info)?;
            ed.put(
                root,
                qgroup_key(QGROUP_LIMIT_KEY, id),
                vec![0u8; QGROUP_ITEM_SIZE],
            )
        })
    }

    /// Subvolume `id` is gone (its tree dropped, its root item deleted):
    /// its level-0 qgroup goes with it, info, limit and relations both
    /// ways, as kernel 6.18 removes a fully dropped subvolume's qgroup
    /// (the counts are marked inconsistent by the commit anyway). A no-op
    /// without quotas.
    pub(crate) fn remove_qgroup(&self, w: &mut Writer, id: u64) -> Result<()> {
        if self.qgroup_status()?.is_none() {
            return Ok(());
        }
        let quota = self.tree_by_id(QUOTA_TREE_OBJECTID)?;
        let mut gone = vec![
            qgroup_key(QGROUP_INFO_KEY, id),
            qgroup_key(QGROUP_LIMIT_KEY, id),
        ];
        for item in quota.items_of(id, QGROUP_RELATION_KEY)? {
            let parent = item?.key().offset;
            gone.push(Key::new(id, QGROUP_RELATION_KEY, parent));
            gone.push(Key::new(parent, QGROUP_RELATION_KEY, id));
        }
        self.modify_tree(w, QUOTA_TREE_OBJECTID, |ed, root| {
            for key in gone {
                ed.delete(root, key)?;
            }
            Ok(())
        })
    }
}

//! Deleting subvolumes and snapshots, as `btrfs subvolume delete` does.
//!
//! The link goes first (directory entries in the parent, ROOT_REF and
//! ROOT_BACKREF, UUID tree entries), then the tree is dropped: every block
//! it reaches loses this tree's reference, blocks it alone held are freed
//! (their space pinned until the commit), and the ROOT_ITEM goes. v1 does
//! all of it in one transaction, so a crash leaves either the subvolume or
//! nothing; no half-dropped root is ever written. A drop the kernel left
//! half done is finished from where it stopped.

use super::dir::name_hash;
use super::inode::{FileKind, InodeId};
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{RootRef, Timespec};
use crate::transaction::{Writer, is_subvol_tree};
use crate::{Error, Result};

impl Filesystem {
    /// Delete the subvolume or snapshot linked as `name` in directory
    /// `dir`, with all its content, and commit. Refused for the top-level
    /// subvolume, the default subvolume, a subvolume holding other
    /// subvolumes, a name that is not a subvolume, and, if `only_empty`
    /// (the `rmdir` rule), a subvolume whose root directory has entries.
    pub fn delete_subvolume(&self, dir: InodeId, name: &[u8], only_empty: bool) -> Result<()> {
        let mut w = self.writer_deleting()?;
        self.long_work_ahead();
        self.writable_dir(dir)?;
        w.check_writable(dir.subvol)?;
        let entry = self.find_name(dir, name)?;
        let shown = || String::from_utf8_lossy(name).into_owned();
        if entry.kind != FileKind::Dir {
            return Err(Error::NotDir(shown()));
        }
        let id = entry.id.subvol;
        if id == dir.subvol || entry.id.ino != FIRST_INODE {
            return Err(Error::Invalid(format!("{} is not a subvolume", shown())));
        }
        if !is_subvol_tree(id) || id == FS_TREE_OBJECTID {
            return Err(Error::NotPermitted(format!(
                "subvolume {id} cannot be deleted"
            )));
        }
        if id == self.default_subvol || id == self.find_default_subvol()? {
            return Err(Error::NotPermitted(format!(
                "{} is the default subvolume ({id})",
                shown()
            )));
        }
        if self.root_ptr(QUOTA_TREE_OBJECTID)?.is_some() {
            return Err(Error::Unsupported(
                "deleting subvolumes with quotas enabled".into(),
            ));
        }
        let nested = self
            .root_tree()
            .items_of(id, ROOT_REF_KEY)?
            .next()
            .transpose()?;
        if let Some(n) = nested {
            return Err(Error::NotEmpty(format!(
                "{} holds subvolume {}",
                shown(),
                n.key().offset
            )));
        }
        // The kernel keeps a deleted tree until its last open file closes;
        // v1 does not, so it refuses instead.
        if self.open_inodes().users.keys().any(|i| i.subvol == id) {
            return Err(Error::Unsupported(format!(
                "deleting {}: files in it are open",
                shown()
            )));
        }
        if only_empty && !self.read_dir(entry.id, 0)?.is_empty() {
            return Err(Error::NotEmpty(shown()));
        }
        let (_, item) = self
            .find_root(id)?
            .ok_or_else(|| Error::NotFound(format!("subvolume {id}")))?;
        // The subvolume's blocks on disk: the drop then meets no block this
        // transaction made, and delayed data of its files is written.
        self.commit_locked(&mut w)?;
        let now = Timespec::now();
        self.unlink_subvol(&mut w, dir, name, id, now)?;
        self.remove_uuid(&mut w, &item.uuid, UUID_KEY_SUBVOL, id)?;
        if item.received_uuid != [0; 16] {
            self.remove_uuid(&mut w, &item.received_uuid, UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        self.drop_subvol_tree(&mut w, id, None)?;
        self.commit_locked(&mut w)
    }

    /// Finish the deletions the kernel left to its cleaner: a deleted
    /// subvolume keeps its ROOT_ITEM (refs 0) and an ORPHAN_ITEM for its
    /// root in the root tree until its tree is dropped. The drop is done
    /// here, one commit per subvolume, as the kernel's next mount would:
    /// whole, or, if the kernel had started it (drop progress set), from
    /// where it stopped. A partly dropped tree whose path is not as the
    /// kernel leaves one is left to the kernel. Returns the ids of the
    /// subvolumes dropped.
    pub(crate) fn finish_dead_subvolumes(&self) -> Result<Vec<u64>> {
        let orphans: Vec<u64> = self
            .root_tree()
            .items_of(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY)?
            .map(|it| it.map(|it| it.key().offset))
            .collect::<Result<_>>()?;
        let mut dropped = Vec::new();
        for id in orphans {
            if !is_subvol_tree(id) || id == FS_TREE_OBJECTID {
                continue;
            }
            let Some((_, item)) = self.find_root(id)? else {
                continue;
            };
            if item.refs != 0 {
                continue;
            }
            // As in the kernel: a drop has started once its key names an object.
            let untouched = item.drop_progress.objectid == 0;
            let resume = (!untouched).then_some((item.drop_progress, item.drop_level));
            let mut w = self.writer_deleting()?;
            if !self.drop_subvol_tree(&mut w, id, resume)? {
                continue;
            }
            self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| {
                ed.delete(root, Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id))
            })?;
            self.commit_locked(&mut w)?;
            dropped.push(id);
        }
        Ok(dropped)
    }

    /// Remove the link of subvolume `id` named `name` in `dir`: its
    /// DIR_ITEM / DIR_INDEX pair and the ROOT_REF / ROOT_BACKREF pair.
    fn unlink_subvol(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: &[u8],
        id: u64,
        now: Timespec,
    ) -> Result<()> {
        let ref_key = Key::new(dir.subvol, ROOT_REF_KEY, id);
        let back_key = Key::new(id, ROOT_BACKREF_KEY, dir.subvol);
        let rr = self
            .root_tree()
            .get(&ref_key)?
            .map(|it| RootRef::parse(it.data()))
            .transpose()?
            .filter(|r| r.dirid == dir.ino && r.name == name)
            .ok_or_else(|| {
                Error::corrupt(format!("subvolume {id} has no root ref for its link"))
            })?;
        let hash_key = Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name));
        self.index_counter(w, dir)?;
        if w.log.is_some() {
            // Inode 0 is none: only the directory lost a name.
            w.removed_names.push((dir.subvol, dir.ino, 0, rr.sequence));
        }
        self.modify_tree(w, dir.subvol, |ed, root| {
            ed.edit_leaf(root, &hash_key, |leaf| {
                super::namespace::remove_dir_item_name(leaf, &hash_key, name)
            })?;
            ed.delete(root, Key::new(dir.ino, DIR_INDEX_KEY, rr.sequence))
        })?;
        self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, root| {
            ed.delete(root, ref_key)?;
            ed.delete(root, back_key)
        })?;
        self.change_inode(w, dir, |d| {
            d.size = d.size.saturating_sub(2 * name.len() as u64);
            d.mtime = now;
            d.ctime = now;
        })?;
        Ok(())
    }

    /// Remove subvolume `id` from the UUID tree item of `uuid`, if any.
    fn remove_uuid(&self, w: &mut Writer, uuid: &[u8; 16], kind: u8, id: u64) -> Result<()> {
        if self.root_ptr(UUID_TREE_OBJECTID)?.is_none() {
            return Ok(());
        }
        let lo = u64::from_le_bytes(uuid[..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(uuid[8..].try_into().unwrap_or_default());
        let key = Key::new(lo, kind, hi);
        if self.tree_by_id(UUID_TREE_OBJECTID)?.get(&key)?.is_none() {
            return Ok(());
        }
        self.modify_tree(w, UUID_TREE_OBJECTID, |ed, root| {
            ed.edit_leaf(root, &key, |leaf| {
                let Ok(pos) = leaf.search(&key) else {
                    return Ok(());
                };
                let rest: Vec<u8> = leaf
                    .data(pos)
                    .chunks_exact(8)
                    .filter(|c| *c != id.to_le_bytes())
                    .flatten()
                    .copied()
                    .collect();
                if rest.is_empty() {
                    leaf.remove(pos)?;
                    Ok(())
                } else {
                    leaf.set_data(pos, &rest)
                }
            })
        })
    }
}

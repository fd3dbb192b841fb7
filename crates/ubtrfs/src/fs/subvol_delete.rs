//! Deleting subvolumes and snapshots, as `btrfs subvolume delete` does.
//!
//! The link goes first (directory entries in the parent, ROOT_REF and
//! ROOT_BACKREF, UUID tree entries), then the tree is dropped: every block
//! it reaches loses this tree's reference, blocks it alone held are freed
//! (their space pinned until the commit), and the ROOT_ITEM goes. An
//! unused subvolume goes in one transaction, so a crash leaves either the
//! subvolume or nothing; no half-dropped root is ever written.
//!
//! A subvolume in use (open files, a FUSE mount's kernel still knowing
//! inodes in it: a shell's working directory) is, as in the kernel, only
//! unlinked and marked dead: its root item gets no refs and the root tree
//! an orphan item for it. Its files keep working until the last use ends;
//! then the tree is dropped. A crash before that leaves the dead root to
//! the next mount, ours or the kernel's. A drop the kernel left half done
//! is finished from where it stopped.

use super::Allowed;
use super::dir::name_hash;
use super::inode::{FileKind, InodeId};
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{RootRef, Timespec};
use crate::transaction::{Writer, is_subvol_tree};
use crate::{Error, Result};
use std::sync::atomic::Ordering;

impl Filesystem {
    /// Delete the subvolume or snapshot linked as `name` in directory
    /// `dir`, with all its content, and commit. Refused for the top-level
    /// subvolume, the default subvolume, a subvolume holding other
    /// subvolumes, a name that is not a subvolume, and, if `only_empty`
    /// (the `rmdir` rule), a subvolume whose root directory has entries.
    pub fn delete_subvolume(&self, dir: InodeId, name: &[u8], only_empty: bool) -> Result<()> {
        self.change("subvolume delete", || {
            let mut w = self.writer_deleting()?;
            self.long_work_ahead();
            self.writable_dir(dir, Allowed::Nothing)?;
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
            if only_empty && !self.read_dir_up_to(entry.id, 0, 1)?.is_empty() {
                return Err(Error::NotEmpty(shown()));
            }
            self.check_fixed_id(entry.id, Allowed::Nothing, "subvolume delete")?;
            let (_, item) = self
                .find_root(id)?
                .ok_or_else(|| Error::NotFound(format!("subvolume {id}")))?;
            // The subvolume's blocks on disk: the drop then meets no block this
            // transaction made, and delayed data of its files is written.
            // A failure from here on, a commit's too, may leave the
            // transaction half changed (Error::AfterChange), as a failed
            // commit anywhere does.
            let done = (|| -> Result<()> {
                self.commit_locked(&mut w)?;
                let now = Timespec::now();
                self.unlink_subvol(&mut w, dir, name, id, now)?;
                self.remove_uuid(&mut w, &item.uuid, UUID_KEY_SUBVOL, id)?;
                if item.received_uuid != [0; 16] {
                    self.remove_uuid(&mut w, &item.received_uuid, UUID_KEY_RECEIVED_SUBVOL, id)?;
                }
                let in_use = {
                    // Decided and marked at once: a last use ending in between
                    // either came first (the tree goes now) or sees the mark.
                    let mut open = self.open_inodes();
                    let in_use = open.subvol_in_use(id);
                    if in_use {
                        open.deleted_in_use.insert(id);
                        self.subvol_died_in_use.store(true, Ordering::Release);
                    }
                    in_use
                };
                if in_use {
                    self.mark_dead(&mut w, id)?;
                } else {
                    self.drop_subvol_tree(&mut w, id, None)?;
                }
                self.commit_locked(&mut w)
            })();
            done.map_err(Error::after_change)
        })
    }

    /// Someone uses `n` more of subvolume `subvol` (a FUSE mount: the
    /// inodes the kernel knows in it): a deletion keeps its tree until
    /// every use ends, as the kernel keeps a deleted subvolume while an
    /// inode of it is in memory.
    pub fn hold_subvolume(&self, subvol: u64, n: u64) {
        *self.open_inodes().subvol_holds.entry(subvol).or_insert(0) += n;
    }

    /// `n` uses of `subvol` ended. True if it was deleted while in use and
    /// nothing uses it now: [`Filesystem::drop_deleted_subvolume`] (which
    /// changes the disk, so a FUSE mount calls it under its lock) drops it.
    pub fn release_subvolume(&self, subvol: u64, n: u64) -> bool {
        let mut open = self.open_inodes();
        if let Some(held) = open.subvol_holds.get_mut(&subvol) {
            *held = held.saturating_sub(n);
            if *held == 0 {
                open.subvol_holds.remove(&subvol);
            }
        }
        self.writer.is_some() && open.deleted_and_unused(subvol)
    }

    /// Drop the tree of `subvol`, deleted while in use, if nothing uses it
    /// any more, and commit.
    pub fn drop_deleted_subvolume(&self, subvol: u64) -> Result<()> {
        self.change("dropping a deleted subvolume", || {
            let mut w = self.writer_deleting()?;
            {
                let mut open = self.open_inodes();
                if !open.deleted_and_unused(subvol) {
                    return Ok(());
                }
                open.deleted_in_use.remove(&subvol);
                // Its orphans go with the tree.
                open.orphaned.retain(|i| i.subvol != subvol);
            }
            let dead = self.find_root(subvol)?.is_some_and(|(_, r)| r.refs == 0);
            if !dead {
                return Ok(());
            }
            self.long_work_ahead();
            // Its files' delayed data written and its blocks on disk: the
            // drop then meets no block this transaction made.
            // A failure from here on, a commit's too, may leave the
            // transaction half changed (Error::AfterChange), as a failed
            // commit anywhere does.
            let done = (|| -> Result<()> {
                self.commit_locked(&mut w)?;
                self.drop_subvol_tree(&mut w, subvol, None)?;
                self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| {
                    ed.delete(root, Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, subvol))
                })?;
                self.commit_locked(&mut w)
            })();
            done.map_err(Error::after_change)
        })
    }

    /// Every hold on subvolumes ends (a FUSE session is over, whatever
    /// the kernel forgot before): the subvolumes deleted while in use that
    /// no open file holds are dropped.
    pub fn end_subvolume_holds(&self) -> Result<()> {
        let ids: Vec<u64> = {
            let mut open = self.open_inodes();
            open.subvol_holds.clear();
            open.deleted_in_use.iter().copied().collect()
        };
        for id in ids {
            self.drop_deleted_subvolume(id)?;
        }
        Ok(())
    }

    /// Whether subvolume `subvol` was deleted while in use and waits for
    /// its last use to end (its drop then commits).
    pub fn deleted_in_use(&self, subvol: u64) -> bool {
        self.open_inodes().deleted_in_use.contains(&subvol)
    }

    /// Fails if `dir` is the root directory of a deleted subvolume: as in
    /// the kernel, which marks it dead, a descriptor of it opened before
    /// the deletion finds no names in it and adds none.
    pub(crate) fn check_live_dir(&self, dir: InodeId) -> Result<()> {
        if dir.ino != FIRST_INODE
            || dir.subvol == FS_TREE_OBJECTID
            || dir.is_placeholder()
            || !self.subvol_died_in_use.load(Ordering::Acquire)
        {
            return Ok(());
        }
        self.check_not_deleted(dir.subvol)
    }

    /// Refuse to put anything into, or snapshot, a subvolume deleted
    /// while in use (ENOENT, as the kernel answers).
    pub(crate) fn check_not_deleted(&self, subvol: u64) -> Result<()> {
        if self.find_root(subvol)?.is_some_and(|(_, r)| r.refs == 0) {
            return Err(Error::NotFound(format!("subvolume {subvol} was deleted")));
        }
        Ok(())
    }

    /// Mark unlinked subvolume `id` dead, as the kernel leaves a deleted
    /// subvolume for its cleaner: no refs in its root item, and an orphan
    /// item for it in the root tree.
    fn mark_dead(&self, w: &mut Writer, id: u64) -> Result<()> {
        let (key, mut data) = self.root_item_bytes(id)?;
        let refs = data
            .get_mut(216..220)
            .ok_or_else(|| Error::corrupt(format!("subvolume {id} has a short root item")))?;
        refs.copy_from_slice(&0u32.to_le_bytes());
        self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, root| {
            ed.put(root, key, data)?;
            ed.put(
                root,
                Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id),
                Vec::new(),
            )
        })
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
    pub(crate) fn remove_uuid(
        &self,
        w: &mut Writer,
        uuid: &[u8; 16],
        kind: u8,
        id: u64,
    ) -> Result<()> {
        if self.root_ptr(UUID_TREE_OBJECTID)?.is_none() {
            return Ok(());
        }
        let key = super::snapshot::uuid_key(uuid, kind);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::delayed_ref::BlockRef;
    use crate::format::node::Expect;
    use crate::fs::NewInode;
    use crate::test_fs::TestFs;

    /// The kernel saves a drop's progress only between some of its steps:
    /// when it stops, children right of the saved key may have lost the
    /// tree's reference already. A resumed drop skips those (taking their
    /// reference again would take one that is gone) and drops the rest;
    /// `btrfs check` then finds every reference exact.
    #[test]
    fn a_resumed_drop_skips_children_that_already_lost_their_reference() {
        resume_a_drop_stopped_past_its_progress(false);
    }

    /// As above, with the leaves shared with a snapshot: a dropped leaf
    /// keeps its extent item (the snapshot's reference), so only the
    /// reference tells it was dropped. Dropping it again would free the
    /// snapshot's leaf.
    #[test]
    fn a_resumed_drop_skips_shared_children_it_already_let_go() {
        resume_a_drop_stopped_past_its_progress(true);
    }

    fn resume_a_drop_stopped_past_its_progress(snapshot: bool) {
        let mut t = TestFs::new();
        let fs = t.fs();
        let top = fs.root();
        let sv = fs.create_subvolume(top, b"sv", 0, 0).unwrap();
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        for i in 0..3000 {
            fs.create(sv, format!("file-{i:05}").as_bytes(), new)
                .unwrap();
        }
        fs.commit().unwrap();
        let id = sv.subvol;
        let keep = snapshot.then(|| {
            let keep = fs.create_snapshot(id, top, b"keep", false).unwrap();
            fs.commit().unwrap();
            // The origin's root becomes its own again (a change copies it).
            fs.create(sv, b"after-the-snapshot", new).unwrap();
            fs.commit().unwrap();
            (keep, fs.read_dir(keep, 0).unwrap().len())
        });
        let (ptr, item) = fs.find_root(id).unwrap().unwrap();
        assert_eq!(ptr.level, 1, "a tree of leaves under one node");
        let reader = fs.tree_reader();
        let root = reader
            .read_node(&Expect {
                bytenr: ptr.bytenr,
                generation: ptr.generation,
                level: Some(1),
                first_key: None,
            })
            .unwrap();
        let n = root.nritems();
        assert!(n >= 8, "{n} leaves");
        // Saved at `saved`, but the leaves up to `reached` are dropped.
        let (saved, reached) = (n / 3, n / 3 + 2);
        {
            let mut w = fs.writer_deleting().unwrap();
            w.blocks.extent_root = fs.root_ptr(EXTENT_TREE_OBJECTID).unwrap();
            let (_, flags) = w.blocks.block_info(reader, id, ptr.bytenr, 1).unwrap();
            let by = if flags & BLOCK_FLAG_FULL_BACKREF != 0 {
                BlockRef::Parent(ptr.bytenr)
            } else {
                BlockRef::Root(id)
            };
            if snapshot {
                let leaf = root.key_ptr(saved).blockptr;
                let (refs, _) = w.blocks.block_info(reader, id, leaf, 0).unwrap();
                assert_eq!(refs, 2, "the snapshot shares the leaves");
            }
            // What the kernel's deletion leaves: no name, no refs, an
            // orphan item for the cleaner...
            fs.unlink_subvol(&mut w, top, b"sv", id, Timespec::now())
                .unwrap();
            // ...and, from the cleaner, leaves gone and progress saved.
            for s in 0..reached {
                let leaf = root.key_ptr(s).expect(1);
                w.blocks.drop_subtree(reader, id, &leaf, by).unwrap();
            }
            let key = Key::new(id, ROOT_ITEM_KEY, item_offset(fs, id));
            let mut raw = fs.root_tree().get(&key).unwrap().unwrap().data().to_vec();
            raw[216..220].copy_from_slice(&0u32.to_le_bytes()); // refs
            raw[220..237].copy_from_slice(&root.key(saved).to_bytes()); // drop_progress
            raw[237] = 1; // drop_level
            let orphan = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id);
            fs.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, r| {
                ed.put(r, key, raw)?;
                ed.put(r, orphan, Vec::new())
            })
            .unwrap();
            fs.commit_locked(&mut w).unwrap();
        }
        let (_, left) = fs.find_root(id).unwrap().unwrap();
        assert_eq!((left.refs, left.drop_level), (0, 1));
        assert_eq!(left.drop_progress, root.key(saved));
        assert_ne!(item.drop_progress, left.drop_progress);
        // Opened again read-write: the drop is finished.
        t.reopen().unwrap();
        let fs = t.fs();
        assert!(
            fs.find_root(id).unwrap().is_none(),
            "subvolume {id} is left"
        );
        let orphans = fs
            .root_tree()
            .items_of(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY)
            .unwrap()
            .count();
        assert_eq!(orphans, 0);
        if let Some((keep, names)) = keep {
            assert_eq!(fs.read_dir(keep, 0).unwrap().len(), names);
            for i in (0..3000).step_by(97) {
                let name = format!("file-{i:05}");
                assert!(fs.lookup(keep, name.as_bytes()).is_ok(), "{name} is gone");
            }
        }
        fs.commit().unwrap();
        if let Err(e) = testkit::btrfs_check_file(t.image(), &[]) {
            panic!("after the resumed drop: {e:#}");
        }
    }

    /// The offset of subvolume `id`'s root item key.
    fn item_offset(fs: &Filesystem, id: u64) -> u64 {
        fs.root_tree()
            .get_le(&Key::new(id, ROOT_ITEM_KEY, u64::MAX))
            .unwrap()
            .unwrap()
            .key()
            .offset
    }
}

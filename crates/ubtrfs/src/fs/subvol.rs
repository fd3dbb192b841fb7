//! Subvolumes and snapshots: the default subvolume and the list of all.

use super::inode::InodeId;
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, RootRef};
use crate::{Error, Result};

/// A subvolume or snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubvolInfo {
    /// Tree id.
    pub id: u64,
    /// Tree id of the subvolume holding its link (0 for the top level).
    pub parent: u64,
    /// Directory inode of the link in the parent.
    pub dirid: u64,
    /// Name of the link.
    pub name: Vec<u8>,
    /// UUID, and the UUID of the subvolume it is a snapshot of.
    pub uuid: [u8; 16],
    pub parent_uuid: [u8; 16],
    /// Read-only flag.
    pub readonly: bool,
    /// Generation of its root.
    pub generation: u64,
}

impl Filesystem {
    /// The default subvolume: the "default" entry of the root tree's
    /// directory, or the top-level subvolume.
    pub(crate) fn find_default_subvol(&self) -> Result<u64> {
        let found = self.root_tree().get(&Key::new(
            ROOT_TREE_DIR_OBJECTID,
            DIR_ITEM_KEY,
            super::dir::name_hash(b"default"),
        ))?;
        if let Some(item) = found {
            for d in DirItem::parse_all(item.data())? {
                if d.name == b"default" && d.location.objectid != 0 {
                    return Ok(d.location.objectid);
                }
            }
        }
        Ok(FS_TREE_OBJECTID)
    }

    /// Every subvolume and snapshot but the top level, by id.
    pub fn subvolumes(&self) -> Result<Vec<SubvolInfo>> {
        let mut out = Vec::new();
        let tree = self.root_tree();
        for item in tree.range(
            Key::new(FIRST_FREE_OBJECTID, 0, 0),
            Key::new(u64::MAX - 256, u8::MAX, u64::MAX),
        )? {
            let item = item?;
            let key = item.key();
            if key.item_type != ROOT_BACKREF_KEY {
                continue;
            }
            let rr = RootRef::parse(item.data())?;
            let (uuid, parent_uuid, readonly, generation) = match self.find_root(key.objectid)? {
                Some((_, r)) => (
                    r.uuid,
                    r.parent_uuid,
                    r.flags & ROOT_SUBVOL_RDONLY != 0,
                    r.generation,
                ),
                None => continue,
            };
            out.push(SubvolInfo {
                id: key.objectid,
                parent: key.offset,
                dirid: rr.dirid,
                name: rr.name,
                uuid,
                parent_uuid,
                readonly,
                generation,
            });
        }
        Ok(out)
    }

    /// Where subvolume `id` is linked (its ROOT_BACKREF), if anywhere.
    pub fn subvolume_link(&self, id: u64) -> Result<Option<SubvolInfo>> {
        let Some(item) = self
            .root_tree()
            .items_of(id, ROOT_BACKREF_KEY)?
            .next()
            .transpose()?
        else {
            return Ok(None);
        };
        let rr = RootRef::parse(item.data())?;
        let root = self.subvolume_root_item(id)?;
        Ok(Some(SubvolInfo {
            id,
            parent: item.key().offset,
            dirid: rr.dirid,
            name: rr.name,
            uuid: root.uuid,
            parent_uuid: root.parent_uuid,
            readonly: root.flags & ROOT_SUBVOL_RDONLY != 0,
            generation: root.generation,
        }))
    }

    /// The path of subvolume `id` from the top level (`a/b/vol`), through
    /// its link and the links of the subvolumes above it; `all` is
    /// [`Filesystem::subvolumes`].
    pub fn subvolume_path(&self, all: &[SubvolInfo], id: u64) -> Result<Vec<u8>> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut cur = id;
        // A link to itself, or a loop through several, cannot come from a
        // sound root tree: bounded so a damaged one is an error.
        for _ in 0..4096 {
            if cur == FS_TREE_OBJECTID {
                parts.reverse();
                return Ok(parts.join(&b'/'));
            }
            let info = all
                .iter()
                .find(|s| s.id == cur)
                .ok_or_else(|| Error::NotFound(format!("subvolume {cur} has no link")))?;
            parts.push(info.name.clone());
            let mut dir = InodeId {
                subvol: info.parent,
                ino: info.dirid,
            };
            for _ in 0..4096 {
                if dir.ino == FIRST_INODE {
                    break;
                }
                let r = self.inode_refs(dir)?.into_iter().next().ok_or_else(|| {
                    Error::corrupt(format!(
                        "directory {} in subvolume {} has no name",
                        dir.ino, dir.subvol
                    ))
                })?;
                parts.push(r.name);
                dir.ino = r.parent;
            }
            if dir.ino != FIRST_INODE {
                break;
            }
            cur = info.parent;
        }
        Err(Error::corrupt(format!("subvolume {id}: its links loop")))
    }
}

impl Filesystem {
    /// The key and bytes of tree `id`'s root item, to change and put back.
    pub(crate) fn root_item_bytes(&self, id: u64) -> Result<(Key, Vec<u8>)> {
        let found = self
            .root_tree()
            .get_le(&Key::new(id, ROOT_ITEM_KEY, u64::MAX))?
            .filter(|it| it.key().objectid == id && it.key().item_type == ROOT_ITEM_KEY)
            .ok_or_else(|| Error::corrupt(format!("tree {id} has no root item")))?;
        Ok((found.key(), found.data().to_vec()))
    }

    /// Whether subvolume `subvol` is read-only.
    pub fn subvolume_readonly(&self, subvol: u64) -> Result<bool> {
        let (_, item) = self
            .find_root(subvol)?
            .ok_or_else(|| Error::NotFound(format!("subvolume {subvol}")))?;
        Ok(item.flags & ROOT_SUBVOL_RDONLY != 0)
    }

    /// Make subvolume `subvol` read-only or writable (`btrfs property set
    /// ro`), and commit. What was written to it before goes to disk
    /// first, while it may still be written.
    pub fn set_subvolume_readonly(&self, subvol: u64, readonly: bool) -> Result<()> {
        self.change("setting a subvolume read-only", || {
            if !crate::transaction::is_subvol_tree(subvol) {
                return Err(Error::Invalid(format!("tree {subvol} is not a subvolume")));
            }
            let mut w = self.writer()?;
            self.check_not_deleted(subvol)?;
            if self.subvolume_readonly(subvol)? == readonly {
                return Ok(());
            }
            // The kernel lets files open for writing go on writing; here their
            // writes still to come would be refused, and lost.
            // (Open directories take no writes: they do not count.)
            let open: Vec<InodeId> = self
                .open_inodes()
                .users
                .keys()
                .filter(|i| i.subvol == subvol)
                .copied()
                .collect();
            let is_dir = |id: InodeId| {
                self.inode_item(id)
                    .is_ok_and(|i| i.mode & libc::S_IFMT == libc::S_IFDIR)
            };
            if readonly && open.into_iter().any(|id| !is_dir(id)) {
                return Err(Error::Busy(format!(
                    "files in subvolume {subvol} are open: close them first"
                )));
            }
            // A failure from here on, a commit's too, may leave the
            // transaction half changed (Error::AfterChange), as a failed
            // commit anywhere does.
            let done = (|| -> Result<()> {
                self.commit_locked(&mut w)?;
                let (key, mut data) = self.root_item_bytes(subvol)?;
                let field = data.get_mut(208..216).ok_or_else(|| {
                    Error::corrupt(format!("subvolume {subvol} has a short root item"))
                })?;
                let mut flags = u64::from_le_bytes(field.try_into().unwrap_or_default());
                if readonly {
                    flags |= ROOT_SUBVOL_RDONLY;
                } else {
                    flags &= !ROOT_SUBVOL_RDONLY;
                }
                field.copy_from_slice(&flags.to_le_bytes());
                self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| {
                    ed.put(root, key, data)
                })?;
                if readonly {
                    w.blocks.readonly.insert(subvol);
                } else {
                    w.blocks.readonly.remove(&subvol);
                }
                self.commit_locked(&mut w)
            })();
            done.map_err(Error::after_change)
        })
    }
}

impl Filesystem {
    /// The root item of subvolume `subvol`: its flags, UUIDs, transids
    /// and times (what `btrfs subvolume show` prints). As in the kernel,
    /// the fields after `generation_v2` count only if it equals
    /// `generation` (an old kernel that wrote the item left them stale).
    pub fn subvolume_root_item(&self, subvol: u64) -> Result<crate::format::items::RootItem> {
        let mut item = self
            .find_root(subvol)?
            .map(|(_, item)| item)
            .ok_or_else(|| Error::NotFound(format!("subvolume {subvol}")))?;
        if item.generation_v2 != item.generation {
            let t = crate::format::items::Timespec::default();
            (item.uuid, item.parent_uuid, item.received_uuid) = ([0; 16], [0; 16], [0; 16]);
            (item.ctransid, item.otransid, item.stransid, item.rtransid) = (0, 0, 0, 0);
            (item.ctime, item.otime, item.stime, item.rtime) = (t, t, t, t);
        }
        Ok(item)
    }

    /// What `btrfs receive` recorded of subvolume `subvol`: the UUID of
    /// the subvolume it was sent from, if it was received.
    pub fn received_uuid(&self, subvol: u64) -> Result<Option<[u8; 16]>> {
        let item = self.subvolume_root_item(subvol)?;
        Ok(Some(item.received_uuid).filter(|u| *u != [0; 16]))
    }

    /// Record that subvolume `subvol` was received from the subvolume
    /// `uuid` as it was in its transaction `stransid` at `stime`, as
    /// `BTRFS_IOC_SET_RECEIVED_SUBVOL` does (`btrfs receive` at its end);
    /// all zero forgets it (what `btrfs property set -f ro false` asks
    /// for). The receive transid and time are this transaction's and now,
    /// and are returned; the change is committed. A read-only subvolume is
    /// refused (EROFS), as in the kernel.
    pub fn set_received(
        &self,
        subvol: u64,
        uuid: [u8; 16],
        stransid: u64,
        stime: crate::format::items::Timespec,
    ) -> Result<(u64, crate::format::items::Timespec)> {
        self.change("setting a subvolume's received UUID", || {
            if !crate::transaction::is_subvol_tree(subvol) {
                return Err(Error::Invalid(format!("tree {subvol} is not a subvolume")));
            }
            let mut w = self.writer()?;
            self.check_not_deleted(subvol)?;
            if self.subvolume_readonly(subvol)? {
                return Err(Error::ReadOnly(format!("subvolume {subvol} is read-only")));
            }
            let (key, mut data) = self.root_item_bytes(subvol)?;
            let item = self.subvolume_root_item(subvol)?;
            if data.len() < super::snapshot::ROOT_ITEM_SIZE || item.generation_v2 != item.generation
            {
                // An old root item has no receive fields that count (nor
                // a UUID of its own): nothing to forget, nothing to record.
                if uuid == [0; 16] {
                    return Ok((w.blocks.transid, crate::format::items::Timespec::now()));
                }
                return Err(Error::Unsupported(format!(
                    "subvolume {subvol} has an old-format root item without receive fields"
                )));
            }
            let old: [u8; 16] = data[279..295].try_into().unwrap_or_default();
            let now = crate::format::items::Timespec::now();
            let transid = w.blocks.transid;
            let time = |t: crate::format::items::Timespec| {
                let mut b = Vec::with_capacity(12);
                t.encode(&mut b);
                b
            };
            data[279..295].copy_from_slice(&uuid); // received_uuid
            data[311..319].copy_from_slice(&stransid.to_le_bytes());
            data[319..327].copy_from_slice(&transid.to_le_bytes()); // rtransid
            data[351..363].copy_from_slice(&time(stime));
            data[363..375].copy_from_slice(&time(now)); // rtime
            if old != [0; 16] {
                self.remove_uuid(&mut w, &old, UUID_KEY_RECEIVED_SUBVOL, subvol)?;
            }
            self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| {
                ed.put(root, key, data)
            })?;
            if uuid != [0; 16] {
                self.add_uuid(&mut w, &uuid, UUID_KEY_RECEIVED_SUBVOL, subvol)?;
            }
            self.commit_locked(&mut w)?;
            Ok((transid, now))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fs::TestFs;

    fn link(id: u64, parent: u64, name: &str) -> SubvolInfo {
        SubvolInfo {
            id,
            parent,
            dirid: FIRST_INODE,
            name: name.as_bytes().to_vec(),
            uuid: [0; 16],
            parent_uuid: [0; 16],
            readonly: false,
            generation: 1,
        }
    }

    #[test]
    fn subvolume_paths_follow_links_up_to_the_top_level() {
        let t = TestFs::new();
        let all = [link(256, 5, "a"), link(257, 256, "b"), link(258, 257, "c")];
        assert_eq!(t.fs().subvolume_path(&all, 258).unwrap(), b"a/b/c");
        assert_eq!(t.fs().subvolume_path(&all, 256).unwrap(), b"a");
        // A link into a subvolume that is not there, and a loop: errors.
        let orphan = [link(259, 300, "x")];
        assert!(matches!(
            t.fs().subvolume_path(&orphan, 259),
            Err(Error::NotFound(_))
        ));
        let looped = [link(260, 261, "p"), link(261, 260, "q")];
        assert!(matches!(
            t.fs().subvolume_path(&looped, 260),
            Err(Error::Corrupt(_))
        ));
    }

    /// Subvolumes the UUID tree lists under `uuid` as received.
    fn received_ids(fs: &Filesystem, uuid: &[u8; 16]) -> Vec<u64> {
        let key = crate::fs::snapshot::uuid_key(uuid, UUID_KEY_RECEIVED_SUBVOL);
        match fs
            .tree_by_id(UUID_TREE_OBJECTID)
            .unwrap()
            .get(&key)
            .unwrap()
        {
            Some(it) => it
                .data()
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Recording a receive, as `btrfs receive` does at its end: the root
    /// item and the UUID tree (each id once), then forgetting it; the
    /// kernel's checker agrees at each step.
    #[test]
    fn a_receive_is_recorded_and_forgotten() {
        let t = TestFs::new();
        let fs = t.fs();
        let vol = fs.create_subvolume(fs.root(), b"vol", 0, 0).unwrap().subvol;
        let uuid = [0xab; 16];
        let stime = crate::format::items::Timespec { sec: 1234, nsec: 5 };
        let (rtransid, _) = fs.set_received(vol, uuid, 77, stime).unwrap();
        // Again: the UUID tree still lists it once.
        fs.set_received(vol, uuid, 77, stime).unwrap();
        let item = fs.subvolume_root_item(vol).unwrap();
        assert_eq!(
            (item.received_uuid, item.stransid, item.stime),
            (uuid, 77, stime)
        );
        assert!(item.rtransid >= rtransid);
        assert_eq!(fs.received_uuid(vol).unwrap(), Some(uuid));
        assert_eq!(received_ids(fs, &uuid), [vol]);
        {
            let mut w = fs.lock_writer().unwrap();
            fs.add_uuid(&mut w, &uuid, UUID_KEY_RECEIVED_SUBVOL, vol)
                .unwrap();
            fs.commit_locked(&mut w).unwrap();
        }
        assert_eq!(received_ids(fs, &uuid), [vol]);
        if let Err(e) = testkit::btrfs_check_file(t.image(), &[]) {
            panic!("received: {e:#}");
        }
        // Read-only: refused, as in the kernel.
        fs.set_subvolume_readonly(vol, true).unwrap();
        let e = fs
            .set_received(vol, [0; 16], 0, Default::default())
            .unwrap_err();
        assert_eq!(e.errno(), libc::EROFS, "{e}");
        fs.set_subvolume_readonly(vol, false).unwrap();
        fs.set_received(vol, [0; 16], 0, Default::default())
            .unwrap();
        assert_eq!(fs.received_uuid(vol).unwrap(), None);
        assert!(received_ids(fs, &uuid).is_empty());
        assert!(fs.aborted().is_none());
        if let Err(e) = testkit::btrfs_check_file(t.image(), &[]) {
            panic!("forgotten: {e:#}");
        }
    }
}

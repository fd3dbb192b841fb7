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
            if readonly && self.open_inodes().users.keys().any(|i| i.subvol == subvol) {
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
}

//! The default subvolume (`btrfs subvolume set-default`/`get-default`):
//! the one a mount without `subvol=` shows, named by the "default" entry
//! of the root tree's directory.

use super::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::DirItem;
use crate::{Error, Result};

/// The directory entry's key in the root tree.
fn default_key() -> Key {
    Key::new(
        ROOT_TREE_DIR_OBJECTID,
        DIR_ITEM_KEY,
        super::dir::name_hash(b"default"),
    )
}

impl Filesystem {
    /// The default subvolume's id as committed or set since (5, the top
    /// level, unless set otherwise).
    pub fn default_subvolume(&self) -> Result<u64> {
        self.find_default_subvol()
    }

    /// Make subvolume `id` (0 or 5: the top level) the default, as the
    /// kernel does: the "default" entry names it, the superblocks get the
    /// DEFAULT_SUBVOL feature, and a commit writes both. A subvolume that
    /// does not exist or is being deleted is refused.
    pub fn set_default_subvolume(&self, id: u64) -> Result<()> {
        let id = if id == 0 { FS_TREE_OBJECTID } else { id };
        self.change("set-default", || {
            let mut w = self.writer()?;
            let live = match self.find_root(id)? {
                Some((_, root)) => {
                    root.refs > 0
                        && (id == FS_TREE_OBJECTID
                            || (FIRST_FREE_OBJECTID..u64::MAX - 256).contains(&id))
                }
                None => false,
            };
            if !live {
                return Err(Error::NotFound(format!("subvolume {id}")));
            }
            let transid = w.blocks.transid;
            self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| {
                let key = default_key();
                let location = Key::new(id, ROOT_ITEM_KEY, 0);
                let found = ed.update(root, key, |d| {
                    let mut entries = DirItem::parse_all(d)?;
                    let Some(e) = entries.iter_mut().find(|e| e.name == b"default") else {
                        return Ok(false);
                    };
                    e.location = location;
                    d.clear();
                    for e in &entries {
                        e.encode(d);
                    }
                    Ok(true)
                })?;
                if found == Some(true) {
                    return Ok(());
                }
                // No entry (mkfs always makes one): a new one, beside any
                // other of the same hash.
                let entry = DirItem {
                    location,
                    transid,
                    file_type: FT_DIR,
                    name: b"default".to_vec(),
                    data: Vec::new(),
                };
                let mut data = match found {
                    Some(false) => ed
                        .reader()
                        .tree(*root)
                        .get(&key)?
                        .map(|it| it.data().to_vec())
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                entry.encode(&mut data);
                ed.put(root, key, data)
            })?;
            w.add_incompat(INCOMPAT_DEFAULT_SUBVOL);
            self.commit_locked(&mut w)
        })
    }
}

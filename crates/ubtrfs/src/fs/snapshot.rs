//! Creating subvolumes and snapshots, as the kernel lays them out.
//!
//! A subvolume is a tree with a ROOT_ITEM in the root tree (keyed by
//! the subvolume's id; offset 0 for a new subvolume, the creating
//! transaction for a snapshot), a ROOT_REF / ROOT_BACKREF pair naming the
//! directory that links it, a DIR_ITEM / DIR_INDEX pair in that directory
//! whose location is the ROOT_ITEM key, and its UUID in the UUID tree.
//!
//! A snapshot copies the source's root block into a block of its own; every
//! block below is then shared, each child of the root gaining a reference
//! from the snapshot (see `alloc::delayed_ref`). The source is committed
//! first, so no block it shares is one the running transaction may still
//! rewrite in place, and the snapshot is committed at once, as the kernel
//! does.

use super::dir::name_hash;
use super::inode::{FileKind, InodeId};
use super::namespace::check_name;
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, InodeItem, InodeRef, Timespec};
use crate::transaction::{LAST_FREE_OBJECTID, Writer, is_subvol_tree};
use crate::tree::TreeEditor;
use crate::{Error, Result};

/// Inode flag of the inode embedded in a root item: the item is initialized.
const INODE_ROOT_ITEM_INIT: u64 = 1 << 31;

/// Size of a current root item.
pub(crate) const ROOT_ITEM_SIZE: usize = 439;

impl Filesystem {
    /// Create an empty subvolume `name` in directory `dir`, its root
    /// directory owned by `uid`:`gid`. Returns that root directory.
    pub fn create_subvolume(
        &self,
        dir: InodeId,
        name: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<InodeId> {
        self.change("subvolume create", || {
            let mut w = self.writer()?;
            self.check_new_link(&w, dir, name)?;
            self.index_left(&mut w, dir)?;
            let transid = w.blocks.transid;
            let id = self.next_subvol_id()?;
            let now = Timespec::now();
            let inode = InodeItem {
                generation: transid,
                transid,
                nlink: 1,
                uid,
                gid,
                mode: libc::S_IFDIR | 0o755,
                sequence: 1,
                atime: now,
                ctime: now,
                mtime: now,
                otime: now,
                ..Default::default()
            };
            let mut dotdot = Vec::new();
            InodeRef {
                parent: FIRST_INODE,
                index: 0,
                name: b"..".to_vec(),
            }
            .encode_ref(&mut dotdot);
            let items = vec![
                (Key::new(FIRST_INODE, INODE_ITEM_KEY, 0), inode.to_bytes()),
                (Key::new(FIRST_INODE, INODE_REF_KEY, FIRST_INODE), dotdot),
            ];
            let uuid = crate::mkfs::random_uuid()?;
            let chunk_uuid = w.chunk_tree_uuid();
            let root = TreeEditor::new(self.tree_reader(), &mut w.blocks, id, chunk_uuid)
                .new_tree(items)?;
            self.set_root(id, root);
            // As in the kernel, a subvolume takes the compression property
            // of its parent subvolume's root, not of the directory it is
            // made in.
            let parent_root = InodeId {
                subvol: dir.subvol,
                ino: FIRST_INODE,
            };
            let parent_flags = self.inode_item(parent_root)?.flags;
            let root_dir = InodeId {
                subvol: id,
                ino: FIRST_INODE,
            };
            self.inherit_properties(
                &mut w,
                parent_root,
                parent_flags,
                root_dir,
                FileKind::Dir,
                inode.flags,
            )?;
            // The root item's own inode is the kernel's placeholder directory.
            let placeholder = InodeItem {
                generation: 1,
                size: 3,
                nbytes: self.geometry().nodesize as u64,
                nlink: 1,
                mode: libc::S_IFDIR | 0o755,
                flags: INODE_ROOT_ITEM_INIT,
                ..Default::default()
            };
            let mut item = vec![0u8; ROOT_ITEM_SIZE];
            item[..InodeItem::SIZE].copy_from_slice(&placeholder.to_bytes());
            put64(&mut item, 160, transid); // generation
            put64(&mut item, 168, FIRST_INODE); // root_dirid
            put64(&mut item, 176, root.bytenr);
            put64(&mut item, 192, self.geometry().nodesize as u64); // bytes_used
            item[216..220].copy_from_slice(&1u32.to_le_bytes()); // refs
            item[238] = 0; // level
            put64(&mut item, 239, transid); // generation_v2
            item[247..263].copy_from_slice(&uuid);
            put64(&mut item, 295, transid); // ctransid
            put64(&mut item, 303, transid); // otransid
            put_time(&mut item, 327, now); // ctime
            put_time(&mut item, 339, now); // otime
            self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, r| {
                ed.insert(r, Key::new(id, ROOT_ITEM_KEY, 0), item)
            })?;
            w.blocks.last_snapshot.insert(id, 0);
            self.add_qgroup(&mut w, id, None)?;
            self.link_subvol(&mut w, dir, name, id, 0, &uuid, now)?;
            Ok(InodeId {
                subvol: id,
                ino: FIRST_INODE,
            })
        })
    }

    /// Snapshot subvolume `source` as `name` in directory `dir`, read-only
    /// if `readonly`. The running transaction is committed before and
    /// after. Returns the snapshot's root directory.
    pub fn create_snapshot(
        &self,
        source: u64,
        dir: InodeId,
        name: &[u8],
        readonly: bool,
    ) -> Result<InodeId> {
        self.change("snapshot", || {
            if !is_subvol_tree(source) {
                return Err(Error::Invalid(format!("tree {source} is not a subvolume")));
            }
            let mut w = self.writer()?;
            self.check_new_link(&w, dir, name)?;
            self.index_left(&mut w, dir)?;
            let (_, src_item) = self
                .find_root(source)?
                .ok_or_else(|| Error::NotFound(format!("subvolume {source}")))?;
            self.check_not_deleted(source)?;
            // The source's blocks on disk, none left for this transaction to
            // rewrite in place once they are shared.
            // A failure from here on, a commit's too, may leave the
            // transaction half changed (Error::AfterChange), as a failed
            // commit anywhere does.
            let done = (|| -> Result<InodeId> {
                self.commit_locked(&mut w)?;
                let transid = w.blocks.transid;
                let id = self.next_subvol_id()?;
                let was_readonly = w.blocks.readonly.remove(&source);
                let copied = self.modify_tree(&mut w, source, |ed, root| {
                    ed.cow_root(root)?;
                    Ok(*root)
                });
                if was_readonly {
                    w.blocks.readonly.insert(source);
                }
                // Copying the source's root changes no content: the kernel keeps
                // its ctransid.
                w.keep_ctransid.insert(source);
                let src_root = copied?;
                let chunk_uuid = w.chunk_tree_uuid();
                let root = TreeEditor::new(self.tree_reader(), &mut w.blocks, id, chunk_uuid)
                    .copy_root(src_root)?;
                self.set_root(id, root);
                // The source's root item, with its last snapshot now.
                let key = self
                    .root_tree()
                    .get_le(&Key::new(source, ROOT_ITEM_KEY, u64::MAX))?
                    .map(|it| it.key())
                    .ok_or_else(|| {
                        Error::corrupt(format!("subvolume {source} has no root item"))
                    })?;
                let mut src_raw = self
                    .root_tree()
                    .get(&key)?
                    .map(|it| it.data().to_vec())
                    .ok_or_else(|| {
                        Error::corrupt(format!("subvolume {source} has no root item"))
                    })?;
                if src_raw.len() < ROOT_ITEM_SIZE {
                    // An old, short root item: extend it to the current layout.
                    src_raw.resize(ROOT_ITEM_SIZE, 0);
                    put64(&mut src_raw, 239, src_item.generation);
                }
                put64(&mut src_raw, 200, transid); // last_snapshot
                let src_new = src_raw.clone();
                self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, r| ed.put(r, key, src_new))?;
                let uuid = crate::mkfs::random_uuid()?;
                let now = Timespec::now();
                let mut item = src_raw;
                put64(&mut item, 160, transid); // generation
                put64(&mut item, 176, root.bytenr);
                item[216..220].copy_from_slice(&1u32.to_le_bytes()); // refs
                item[220..238].fill(0); // drop_progress, drop_level
                item[238] = root.level;
                put64(&mut item, 239, transid); // generation_v2
                item[247..263].copy_from_slice(&uuid);
                item[263..279].copy_from_slice(&src_item.uuid); // parent_uuid
                put64(&mut item, 303, transid); // otransid
                put_time(&mut item, 339, now); // otime
                let mut flags = src_item.flags & !ROOT_SUBVOL_RDONLY;
                if readonly {
                    flags |= ROOT_SUBVOL_RDONLY;
                } else {
                    // Only a read-only snapshot keeps what `receive` recorded.
                    item[279..295].fill(0); // received_uuid
                    put64(&mut item, 311, 0); // stransid
                    put64(&mut item, 319, 0); // rtransid
                    item[351..375].fill(0); // stime, rtime
                }
                put64(&mut item, 208, flags);
                let received: [u8; 16] = item[279..295].try_into().unwrap_or_default();
                self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, r| {
                    ed.insert(r, Key::new(id, ROOT_ITEM_KEY, transid), item)
                })?;
                w.blocks.last_snapshot.insert(source, transid);
                w.blocks.last_snapshot.insert(id, transid);
                self.add_qgroup(&mut w, id, Some(source))?;
                self.link_subvol(&mut w, dir, name, id, u64::MAX, &uuid, now)?;
                // Files the source has open with no name (O_TMPFILE, or
                // unlinked while open) are nobody's in the snapshot: they
                // go now, as the kernel cleans a new snapshot's orphans.
                self.clean_orphans(&mut w, id)?;
                if received != [0; 16] {
                    self.add_uuid(&mut w, &received, UUID_KEY_RECEIVED_SUBVOL, id)?;
                }
                if readonly {
                    w.blocks.readonly.insert(id);
                }
                self.commit_locked(&mut w)?;
                Ok(InodeId {
                    subvol: id,
                    ino: FIRST_INODE,
                })
            })();
            done.map_err(Error::after_change)
        })
    }

    /// Checks before a new subvolume link `name` goes into `dir`.
    fn check_new_link(&self, w: &Writer, dir: InodeId, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.writable_dir(dir, super::Allowed::Growth)?;
        w.check_writable(dir.subvol)?;
        self.check_not_deleted(dir.subvol)?;
        match self.lookup(dir, name) {
            Ok(_) => Err(Error::Exists(String::from_utf8_lossy(name).into_owned())),
            Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The id the next subvolume gets: one above every id in use.
    fn next_subvol_id(&self) -> Result<u64> {
        let last = self
            .root_tree()
            .get_le(&Key::new(LAST_FREE_OBJECTID, u8::MAX, u64::MAX))?
            .map_or(0, |it| it.key().objectid);
        let id = last.max(FIRST_FREE_OBJECTID - 1) + 1;
        if id > LAST_FREE_OBJECTID {
            return Err(Error::NoSpace("no subvolume id left".into()));
        }
        Ok(id)
    }

    /// Link subvolume `id` as `name` in `dir`: the directory entries (their
    /// location's offset is `loc_offset`), the root ref and back ref, and
    /// its UUID.
    #[allow(clippy::too_many_arguments)]
    fn link_subvol(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: &[u8],
        id: u64,
        loc_offset: u64,
        uuid: &[u8; 16],
        now: Timespec,
    ) -> Result<()> {
        let transid = w.blocks.transid;
        let index = self.next_index(w, dir)?;
        let entry = DirItem {
            location: Key::new(id, ROOT_ITEM_KEY, loc_offset),
            transid,
            file_type: super::namespace::file_type(FileKind::Dir),
            name: name.to_vec(),
            data: Vec::new(),
        };
        let mut one = Vec::new();
        entry.encode(&mut one);
        let hash_key = Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name));
        let one2 = one.clone();
        self.modify_tree(w, dir.subvol, |ed, root| {
            // Names with the same hash share one DIR_ITEM.
            ed.edit(root, &hash_key, |items| {
                match items.binary_search_by(|(k, _)| k.cmp(&hash_key)) {
                    Ok(pos) => items[pos].1.extend_from_slice(&one2),
                    Err(pos) => items.insert(pos, (hash_key, one2)),
                }
                Ok(())
            })?;
            ed.insert(root, Key::new(dir.ino, DIR_INDEX_KEY, index), one)
        })?;
        let mut rr = Vec::with_capacity(18 + name.len());
        rr.extend_from_slice(&dir.ino.to_le_bytes());
        rr.extend_from_slice(&index.to_le_bytes());
        rr.extend_from_slice(&(name.len() as u16).to_le_bytes());
        rr.extend_from_slice(name);
        let rr2 = rr.clone();
        self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, root| {
            ed.insert(root, Key::new(dir.subvol, ROOT_REF_KEY, id), rr)?;
            ed.insert(root, Key::new(id, ROOT_BACKREF_KEY, dir.subvol), rr2)
        })?;
        self.change_inode(w, dir, |d| {
            d.size = d.size.saturating_add(2 * name.len() as u64);
            d.mtime = now;
            d.ctime = now;
        })?;
        self.add_uuid(w, uuid, UUID_KEY_SUBVOL, id)
    }

    /// Record `uuid` of subvolume `id` in the UUID tree, if there is one.
    pub(crate) fn add_uuid(
        &self,
        w: &mut Writer,
        uuid: &[u8; 16],
        kind: u8,
        id: u64,
    ) -> Result<()> {
        if self.root_ptr(UUID_TREE_OBJECTID)?.is_none() {
            return Ok(());
        }
        let key = uuid_key(uuid, kind);
        self.modify_tree(w, UUID_TREE_OBJECTID, |ed, root| {
            // Ids with the same UUID share one item.
            ed.edit(root, &key, |items| {
                match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                    // Listed already (the kernel adds an id once).
                    Ok(pos) if items[pos].1.chunks_exact(8).any(|c| c == id.to_le_bytes()) => {}
                    Ok(pos) => items[pos].1.extend_from_slice(&id.to_le_bytes()),
                    Err(pos) => items.insert(pos, (key, id.to_le_bytes().to_vec())),
                }
                Ok(())
            })
        })
    }
}

/// The UUID tree's key of `uuid` for `kind` (subvolume or received): its
/// two halves, little-endian, as objectid and offset.
pub(crate) fn uuid_key(uuid: &[u8; 16], kind: u8) -> Key {
    let lo = u64::from_le_bytes(uuid[..8].try_into().unwrap_or_default());
    let hi = u64::from_le_bytes(uuid[8..].try_into().unwrap_or_default());
    Key::new(lo, kind, hi)
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_time(b: &mut [u8], off: usize, t: Timespec) {
    let mut v = Vec::with_capacity(12);
    t.encode(&mut v);
    b[off..off + 12].copy_from_slice(&v);
}

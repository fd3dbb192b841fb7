//! Names during replay: directory entries and inode back references, added
//! with the index the log gives and removed without touching any times
//! (the log's inode items carry the times the kernel's fsync saw).
//!
//! A name is a DIR_ITEM entry (by name hash) and a DIR_INDEX entry (by
//! index) in the directory, and an INODE_REF entry (or an INODE_EXTREF
//! entry, keyed by the hash of parent and name) in the inode.

use super::replay::Replay;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, InodeItem, InodeRef, Timespec};
use crate::format::node::{HEADER_SIZE, ITEM_SIZE};
use crate::fs::dir::name_hash;
use crate::{Error, Result};

/// The key offset of an INODE_EXTREF item: CRC32C of the name seeded with
/// the parent's inode number, without the inversions.
pub(super) fn extref_hash(parent: u64, name: &[u8]) -> u64 {
    !crc32c::crc32c_append(!(parent as u32), name) as u64
}

/// The directory entry type for an inode mode.
pub(super) fn file_type_of(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FT_REG_FILE,
        libc::S_IFDIR => FT_DIR,
        libc::S_IFLNK => FT_SYMLINK,
        libc::S_IFCHR => FT_CHRDEV,
        libc::S_IFBLK => FT_BLKDEV,
        libc::S_IFIFO => FT_FIFO,
        libc::S_IFSOCK => FT_SOCK,
        _ => FT_UNKNOWN,
    }
}

/// A directory entry found in the subvolume.
#[derive(Clone, Debug)]
pub(super) struct Found {
    /// The entry as its DIR_ITEM holds it.
    pub entry: DirItem,
    /// Its DIR_INDEX offset, if one was found.
    pub index: Option<u64>,
}

/// Rewrite (or delete, when empty) the item at `key` of `leaf` with the
/// entries `keep` says to keep. Returns whether an entry was dropped.
fn keep_entries(
    leaf: &mut crate::tree::Leaf,
    key: &Key,
    keep: impl Fn(&DirItem) -> bool,
) -> Result<bool> {
    let Ok(pos) = leaf.search(key) else {
        return Ok(false);
    };
    let all = DirItem::parse_all(leaf.data(pos))?;
    let mut rest = Vec::new();
    let mut dropped = false;
    for d in all {
        if keep(&d) {
            d.encode(&mut rest);
        } else {
            dropped = true;
        }
    }
    if !dropped {
        return Ok(false);
    }
    if rest.is_empty() {
        leaf.remove(pos)?;
    } else {
        leaf.set_data(pos, &rest)?;
    }
    Ok(true)
}

impl Replay<'_> {
    /// The entry `name` of directory `dir` in the subvolume, with its index.
    pub(super) fn find_entry(&self, dir: u64, name: &[u8]) -> Result<Option<Found>> {
        let tree = self.tree()?;
        let Some(item) = tree.get(&Key::new(dir, DIR_ITEM_KEY, name_hash(name)))? else {
            return Ok(None);
        };
        let Some(entry) = DirItem::parse_all(item.data())?
            .into_iter()
            .find(|d| d.name == name)
        else {
            return Ok(None);
        };
        // The index is in the target's back reference; a subvolume link
        // or a damaged reference leaves only a scan of the directory.
        let mut index = None;
        if entry.location.item_type == INODE_ITEM_KEY {
            index = self
                .names_in(entry.location.objectid, dir)?
                .into_iter()
                .find(|r| r.name == name)
                .map(|r| r.index);
        }
        if index.is_none() {
            for item in tree.items_of(dir, DIR_INDEX_KEY)? {
                let item = item?;
                if DirItem::parse_all(item.data())?
                    .iter()
                    .any(|d| d.name == name)
                {
                    index = Some(item.key().offset);
                    break;
                }
            }
        }
        Ok(Some(Found { entry, index }))
    }

    /// The names inode `ino` has in directory `parent` (INODE_REF and
    /// INODE_EXTREF entries).
    pub(super) fn names_in(&self, ino: u64, parent: u64) -> Result<Vec<InodeRef>> {
        let tree = self.tree()?;
        let mut out = Vec::new();
        if let Some(item) = tree.get(&Key::new(ino, INODE_REF_KEY, parent))? {
            out.extend(InodeRef::parse_refs(item.data(), parent)?);
        }
        for item in tree.items_of(ino, INODE_EXTREF_KEY)? {
            out.extend(
                InodeRef::parse_extrefs(item?.data())?
                    .into_iter()
                    .filter(|r| r.parent == parent),
            );
        }
        Ok(out)
    }

    /// Every name of inode `ino`.
    pub(super) fn all_names(&self, ino: u64) -> Result<Vec<InodeRef>> {
        let tree = self.tree()?;
        let mut out = Vec::new();
        for item in tree.items_of(ino, INODE_REF_KEY)? {
            let item = item?;
            out.extend(InodeRef::parse_refs(item.data(), item.key().offset)?);
        }
        for item in tree.items_of(ino, INODE_EXTREF_KEY)? {
            out.extend(InodeRef::parse_extrefs(item?.data())?);
        }
        Ok(out)
    }

    /// Remove the entry `name` of `dir` and the back reference of the inode
    /// it names (whose link count the fixup recounts). A link to another
    /// subvolume is left alone (false).
    pub(super) fn unlink(&mut self, dir: u64, name: &[u8]) -> Result<bool> {
        let Some(found) = self.find_entry(dir, name)? else {
            return Ok(false);
        };
        if found.entry.location.item_type != INODE_ITEM_KEY {
            self.warn(format!(
                "the log drops the subvolume link {:?} in directory {dir}; it is kept",
                String::from_utf8_lossy(name)
            ));
            return Ok(false);
        }
        let target = found.entry.location.objectid;
        let hash_key = Key::new(dir, DIR_ITEM_KEY, name_hash(name));
        let index_key = found.index.map(|i| Key::new(dir, DIR_INDEX_KEY, i));
        let ref_key = Key::new(target, INODE_REF_KEY, dir);
        let extref_key = Key::new(target, INODE_EXTREF_KEY, extref_hash(dir, name));
        self.edit(|ed, root| {
            ed.edit_leaf(root, &hash_key, |leaf| {
                keep_entries(leaf, &hash_key, |d| d.name != name)
            })?;
            if let Some(k) = index_key {
                ed.edit_leaf(root, &k, |leaf| keep_entries(leaf, &k, |d| d.name != name))?;
            }
            let in_ref = ed.edit_leaf(root, &ref_key, |leaf| {
                drop_ref(leaf, &ref_key, dir, name, false)
            })?;
            if !in_ref {
                ed.edit_leaf(root, &extref_key, |leaf| {
                    drop_ref(leaf, &extref_key, dir, name, true)
                })?;
            }
            Ok(())
        })?;
        // An unlink stamps the inode's change time with the time of the
        // replay, as the kernel's replay does (a logged inode item replayed
        // later puts the logged time back); the directory's times stay.
        let now = Timespec::now();
        self.touch(target, |i| i.ctime = now)?;
        self.fixup.insert(target);
        self.fixup.insert(dir);
        Ok(true)
    }

    /// Change the inode item of `ino`, if the subvolume has one.
    fn touch(&mut self, ino: u64, f: impl FnOnce(&mut InodeItem)) -> Result<()> {
        let Some(mut item) = self.inode(ino)? else {
            return Ok(());
        };
        f(&mut item);
        item.transid = self.w.blocks.transid;
        let bytes = item.to_bytes();
        self.edit(|ed, root| ed.put(root, Key::new(ino, INODE_ITEM_KEY, 0), bytes))
    }

    /// Add the name `name` at `index` in `dir` for inode `target`: whatever
    /// of its three items is missing. The back reference goes into the
    /// INODE_REF item unless `extended` or that item is full.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn link(
        &mut self,
        dir: u64,
        name: &[u8],
        target: u64,
        file_type: u8,
        index: u64,
        transid: u64,
        extended: bool,
    ) -> Result<()> {
        let entry = DirItem {
            location: Key::new(target, INODE_ITEM_KEY, 0),
            transid,
            file_type,
            name: name.to_vec(),
            data: Vec::new(),
        };
        let mut one = Vec::new();
        entry.encode(&mut one);
        let has_ref = self.names_in(target, dir)?.iter().any(|r| r.name == name);
        let ref_key = Key::new(target, INODE_REF_KEY, dir);
        let ref_len = self.tree()?.get(&ref_key)?.map_or(0, |it| it.data().len());
        let max_item = self.fs.geometry().nodesize as usize - HEADER_SIZE - ITEM_SIZE;
        let use_extref = extended || ref_len + 10 + name.len() > max_item;
        let extref_ok = self.fs.superblock().incompat_flags & INCOMPAT_EXTENDED_IREF != 0;
        if !has_ref && use_extref && !extref_ok {
            return Err(Error::TooManyLinks(format!(
                "inode {target} has no room for the logged name {:?} (no extended inode refs)",
                String::from_utf8_lossy(name)
            )));
        }
        let r = InodeRef {
            parent: dir,
            index,
            name: name.to_vec(),
        };
        let mut rb = Vec::new();
        let back_key = if use_extref {
            r.encode_extref(&mut rb);
            Key::new(target, INODE_EXTREF_KEY, extref_hash(dir, name))
        } else {
            r.encode_ref(&mut rb);
            ref_key
        };
        let hash_key = Key::new(dir, DIR_ITEM_KEY, name_hash(name));
        let index_key = Key::new(dir, DIR_INDEX_KEY, index);
        self.edit(|ed, root| {
            ed.edit_leaf(root, &hash_key, |leaf| match leaf.search(&hash_key) {
                Ok(pos) => {
                    let all = DirItem::parse_all(leaf.data(pos))?;
                    if all.iter().any(|d| d.name == name) {
                        return Ok(());
                    }
                    let mut data = leaf.data(pos).to_vec();
                    data.extend_from_slice(&one);
                    leaf.set_data(pos, &data)
                }
                Err(pos) => leaf.insert(pos, hash_key, &one),
            })?;
            ed.put(root, index_key, one.clone())?;
            if !has_ref {
                ed.edit_leaf(root, &back_key, |leaf| match leaf.search(&back_key) {
                    Ok(pos) => {
                        let mut data = leaf.data(pos).to_vec();
                        data.extend_from_slice(&rb);
                        leaf.set_data(pos, &data)
                    }
                    Err(pos) => leaf.insert(pos, back_key, &rb),
                })?;
            }
            Ok(())
        })?;
        self.fixup.insert(target);
        self.fixup.insert(dir);
        Ok(())
    }

    /// Make `name` in `dir` name inode `target` at `index`: a different
    /// entry under that name, or a different name at that index, is
    /// unlinked first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ensure_link(
        &mut self,
        dir: u64,
        name: &[u8],
        target: u64,
        file_type: u8,
        index: u64,
        transid: u64,
        extended: bool,
    ) -> Result<()> {
        if let Some(f) = self.find_entry(dir, name)? {
            let same = f.entry.location == Key::new(target, INODE_ITEM_KEY, 0);
            if same && f.index == Some(index) {
                // Present; make sure the back reference is too.
                if !self.names_in(target, dir)?.iter().any(|r| r.name == name) {
                    self.link(dir, name, target, file_type, index, transid, extended)?;
                }
                return Ok(());
            }
            if f.entry.location.item_type != INODE_ITEM_KEY {
                self.warn(format!(
                    "the log names inode {target} {:?} in directory {dir}, where a subvolume link is; the link is kept",
                    String::from_utf8_lossy(name)
                ));
                return Ok(());
            }
            self.unlink(dir, name)?;
        }
        let at_index = self.tree()?.get(&Key::new(dir, DIR_INDEX_KEY, index))?;
        if let Some(item) = at_index {
            for d in DirItem::parse_all(item.data())? {
                if d.location.item_type == INODE_ITEM_KEY {
                    self.unlink(dir, &d.name)?;
                }
            }
        }
        self.link(dir, name, target, file_type, index, transid, extended)
    }
}

/// Drop the name (`parent`, `name`) from the INODE_REF (or, if `extended`,
/// INODE_EXTREF) item at `key` of `leaf`; true if it was there.
fn drop_ref(
    leaf: &mut crate::tree::Leaf,
    key: &Key,
    parent: u64,
    name: &[u8],
    extended: bool,
) -> Result<bool> {
    let Ok(pos) = leaf.search(key) else {
        return Ok(false);
    };
    let all = if extended {
        InodeRef::parse_extrefs(leaf.data(pos))?
    } else {
        InodeRef::parse_refs(leaf.data(pos), parent)?
    };
    let mut rest = Vec::new();
    let mut found = false;
    for r in all {
        if !found && r.parent == parent && r.name == name {
            found = true;
        } else if extended {
            r.encode_extref(&mut rest);
        } else {
            r.encode_ref(&mut rest);
        }
    }
    if !found {
        return Ok(false);
    }
    if rest.is_empty() {
        leaf.remove(pos)?;
    } else {
        leaf.set_data(pos, &rest)?;
    }
    Ok(true)
}

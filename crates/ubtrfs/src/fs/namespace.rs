//! Changing the namespace: creating inodes, linking and unlinking names.
//!
//! A name is three items: DIR_ITEM (by name hash) and DIR_INDEX (by
//! sequence number) in the directory, and INODE_REF in the inode; the
//! directory's size counts each name twice, as the kernel does.

use super::Allowed;
use super::dir::name_hash;
use super::inode::{DirEntry, FileKind, InodeId, Stat};
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, InodeItem, InodeRef, Timespec};
use crate::format::node::{HEADER_SIZE, ITEM_SIZE};
use crate::transaction::Writer;
use crate::{Error, Result};

/// Who creates an inode and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewInode {
    /// Full mode: type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number for device nodes.
    pub rdev: u64,
}

impl NewInode {
    /// A regular file with permission bits `perm`, owned by root.
    pub fn file(perm: u32) -> Self {
        NewInode {
            mode: libc::S_IFREG | (perm & 0o7777),
            uid: 0,
            gid: 0,
            rdev: 0,
        }
    }
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::Invalid(format!(
            "bad file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    check_name_len(name)
}

/// Longest name a directory entry can hold.
const NAME_MAX: usize = 255;

/// `ENAMETOOLONG` for a name no directory entry can hold (checked on
/// lookups too, as POSIX wants that error rather than `ENOENT`).
pub(crate) fn check_name_len(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong(format!(
            "name of {} bytes is longer than {NAME_MAX}",
            name.len()
        )));
    }
    Ok(())
}

pub(crate) fn file_type(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => FT_REG_FILE,
        FileKind::Dir => FT_DIR,
        FileKind::Symlink => FT_SYMLINK,
        FileKind::CharDev => FT_CHRDEV,
        FileKind::BlockDev => FT_BLKDEV,
        FileKind::Fifo => FT_FIFO,
        FileKind::Socket => FT_SOCK,
    }
}

/// The key offset of an INODE_EXTREF item: CRC32C of the name seeded
/// with the parent directory's inode number, without the inversions.
pub(crate) fn extref_hash(parent: u64, name: &[u8]) -> u64 {
    !crc32c::crc32c_append(!(parent as u32), name) as u64
}

impl Filesystem {
    /// Write an inode item in the running transaction.
    pub(crate) fn put_inode(&self, w: &mut Writer, id: InodeId, item: &InodeItem) -> Result<()> {
        let bytes = item.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.put(root, Key::new(id.ino, INODE_ITEM_KEY, 0), bytes)
        })?;
        // The item holds whatever access time was noted for it.
        self.pending_atimes.forget(id);
        Ok(())
    }

    /// Read, change and write an inode item; the change counts as a new
    /// version of the inode in this transaction.
    pub(crate) fn change_inode(
        &self,
        w: &mut Writer,
        id: InodeId,
        f: impl FnOnce(&mut InodeItem),
    ) -> Result<InodeItem> {
        let mut item = self.inode_item(id)?;
        f(&mut item);
        item.transid = w.blocks.transid;
        item.sequence = item.sequence.wrapping_add(1);
        self.put_inode(w, id, &item)?;
        Ok(item)
    }

    fn next_ino(&self, w: &mut Writer, subvol: u64) -> Result<u64> {
        if let Some(n) = w.next_ino.get_mut(&subvol) {
            *n += 1;
            return Ok(*n - 1);
        }
        let tree = self.fs_tree(subvol)?;
        let last = tree
            .get_le(&Key::new(u64::MAX - 256, 0, 0))?
            .map_or(FIRST_FREE_OBJECTID, |it| it.key().objectid)
            .max(FIRST_FREE_OBJECTID);
        let n = last + 1;
        w.next_ino.insert(subvol, n + 1);
        Ok(n)
    }

    pub(crate) fn next_index(&self, w: &mut Writer, dir: InodeId) -> Result<u64> {
        let n = self.index_left(w, dir)?;
        w.next_index.insert((dir.subvol, dir.ino), n + 1);
        Ok(n)
    }

    /// The index a new entry of `dir` would get; an error naming the
    /// damage if none is left (an entry at index 2^64-1). Operations that
    /// add names ask before they change anything.
    pub(crate) fn index_left(&self, w: &mut Writer, dir: InodeId) -> Result<u64> {
        let n = self.index_counter(w, dir)?;
        if n == u64::MAX {
            return Err(Error::corrupt(format!(
                "directory {} has index u64::MAX: no index is left for a new entry",
                dir.ino
            )));
        }
        Ok(n)
    }

    /// The next free entry index of `dir`, looked up once and then counted
    /// in memory, so that an index freed by removing the last entry is not
    /// given again (a log of the directory relies on new entries having
    /// higher indexes).
    pub(crate) fn index_counter(&self, w: &mut Writer, dir: InodeId) -> Result<u64> {
        if let Some(&n) = w.next_index.get(&(dir.subvol, dir.ino)) {
            return Ok(n);
        }
        let tree = self.fs_tree(dir.subvol)?;
        let n = tree
            .get_le(&Key::new(dir.ino, DIR_INDEX_KEY, u64::MAX))?
            .map(|it| it.key())
            .filter(|k| k.objectid == dir.ino && k.item_type == DIR_INDEX_KEY)
            // Indexes 0 and 1 stand for "." and "..".
            // An entry at the last index leaves none (`index_left`).
            .map_or(2, |k| k.offset.saturating_add(1))
            .max(2);
        w.next_index.insert((dir.subvol, dir.ino), n);
        Ok(n)
    }

    /// The inode item of directory `dir`, to which names may be added
    /// ([`Allowed::Growth`]) or from which they may go
    /// ([`Allowed::Nothing`]) as its flags allow.
    pub(crate) fn writable_dir(&self, dir: InodeId, allowed: Allowed) -> Result<InodeItem> {
        // The kernel's stand-in directory takes no names: EPERM.
        if dir.is_placeholder() {
            return Err(Error::NotPermitted(
                "names in the placeholder of an unreachable subvolume".into(),
            ));
        }
        let item = self.inode_item(dir)?;
        if FileKind::from_mode(item.mode) != Some(FileKind::Dir) {
            return Err(Error::NotDir(format!(
                "inode {} in subvolume {}",
                dir.ino, dir.subvol
            )));
        }
        let what = match allowed {
            Allowed::Growth => "a new name in the directory",
            Allowed::Nothing | Allowed::Anything => "a name out of the directory",
        };
        self.check_fixed(dir, &item, allowed, what)?;
        if allowed == Allowed::Growth {
            self.check_live_dir(dir)?;
        }
        Ok(item)
    }

    /// Whether the name `name` in `dir` for inode `target` must go into an
    /// INODE_EXTREF item, its INODE_REF item for `dir` being full once
    /// `freed` bytes of it went; EMLINK if it must and the filesystem has
    /// no extended inode refs. An operation that removes names before it
    /// adds one (rename) asks first, so it fails before changing anything.
    pub(crate) fn needs_extref(
        &self,
        dir: InodeId,
        name: &[u8],
        target: InodeId,
        freed: usize,
    ) -> Result<bool> {
        let ref_key = Key::new(target.ino, INODE_REF_KEY, dir.ino);
        let ref_len = self
            .fs_tree(target.subvol)?
            .get(&ref_key)?
            .map_or(0, |it| it.data().len());
        let max_item = self.geometry().nodesize as usize - HEADER_SIZE - ITEM_SIZE;
        let use_extref = ref_len.saturating_sub(freed) + 10 + name.len() > max_item;
        if use_extref && self.superblock().incompat_flags & INCOMPAT_EXTENDED_IREF == 0 {
            return Err(Error::TooManyLinks(format!(
                "inode {} has no room for another name in directory {} (no extended inode refs)",
                target.ino, dir.ino
            )));
        }
        Ok(use_extref)
    }

    /// Add the name `name` in `dir` for inode `target` of `kind`. The
    /// name goes into the inode's INODE_REF item for `dir`, or, when that
    /// item would outgrow a leaf, into an INODE_EXTREF item (with the
    /// extended-iref feature; without it the inode has too many links).
    pub(crate) fn add_name(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: &[u8],
        target: InodeId,
        kind: FileKind,
        now: Timespec,
    ) -> Result<()> {
        let transid = w.blocks.transid;
        let ref_key = Key::new(target.ino, INODE_REF_KEY, dir.ino);
        let use_extref = self.needs_extref(dir, name, target, 0)?;
        let index = self.next_index(w, dir)?;
        let entry = DirItem {
            location: Key::new(target.ino, INODE_ITEM_KEY, 0),
            transid,
            file_type: file_type(kind),
            name: name.to_vec(),
            data: Vec::new(),
        };
        let mut one = Vec::new();
        entry.encode(&mut one);
        let hash_key = Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name));
        let one2 = one.clone();
        self.modify_tree(w, dir.subvol, |ed, root| {
            // Names with the same hash share one DIR_ITEM.
            ed.edit_leaf(root, &hash_key, |leaf| match leaf.search(&hash_key) {
                Ok(pos) => {
                    let mut all = leaf.data(pos).to_vec();
                    all.extend_from_slice(&one2);
                    leaf.set_data(pos, &all)
                }
                Err(pos) => leaf.insert(pos, hash_key, &one2),
            })?;
            ed.insert(root, Key::new(dir.ino, DIR_INDEX_KEY, index), one)
        })?;
        let r = InodeRef {
            parent: dir.ino,
            index,
            name: name.to_vec(),
        };
        let mut rb = Vec::new();
        let key = if use_extref {
            r.encode_extref(&mut rb);
            Key::new(target.ino, INODE_EXTREF_KEY, extref_hash(dir.ino, name))
        } else {
            r.encode_ref(&mut rb);
            ref_key
        };
        self.modify_tree(w, target.subvol, |ed, root| {
            // Names whose key is the same share one item.
            ed.edit_leaf(root, &key, |leaf| match leaf.search(&key) {
                Ok(pos) => {
                    let mut all = leaf.data(pos).to_vec();
                    all.extend_from_slice(&rb);
                    leaf.set_data(pos, &all)
                }
                Err(pos) => leaf.insert(pos, key, &rb),
            })
        })?;
        self.change_inode(w, dir, |d| {
            d.size = d.size.saturating_add(2 * name.len() as u64);
            d.mtime = now;
            d.ctime = now;
        })?;
        Ok(())
    }

    /// Remove the name `name` from `dir`; returns the inode it named.
    pub(crate) fn remove_name(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: &[u8],
        entry: &DirEntry,
        now: Timespec,
    ) -> Result<InodeId> {
        // Every caller has found the name (`entry`), so `dir` is a directory.
        if entry.id.subvol != dir.subvol {
            return Err(Error::Unsupported("removing a subvolume link".into()));
        }
        let target = entry.id;
        // Count on from the index this may have been the last of.
        self.index_counter(w, dir)?;
        if target.is_placeholder() {
            self.remove_placeholder(w, dir, name, now)?;
            return Ok(target);
        }
        // Where the inode keeps this name: its INODE_REF for `dir`, or an
        // INODE_EXTREF keyed by the hash of `dir` and the name.
        let ref_key = Key::new(target.ino, INODE_REF_KEY, dir.ino);
        let extref_key = Key::new(target.ino, INODE_EXTREF_KEY, extref_hash(dir.ino, name));
        let tree = self.fs_tree(target.subvol)?;
        let in_ref = match tree.get(&ref_key)? {
            Some(it) => InodeRef::parse_refs(it.data(), dir.ino)?
                .into_iter()
                .find(|r| r.name == name),
            None => None,
        };
        let (r, key) = match in_ref {
            Some(r) => (r, ref_key),
            None => {
                let found = match tree.get(&extref_key)? {
                    Some(it) => InodeRef::parse_extrefs(it.data())?
                        .into_iter()
                        .find(|r| r.parent == dir.ino && r.name == name),
                    None => None,
                };
                let r = found.ok_or_else(|| {
                    Error::corrupt(format!("inode {} has no ref for its name", target.ino))
                })?;
                (r, extref_key)
            }
        };
        let hash_key = Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name));
        self.modify_tree(w, dir.subvol, |ed, root| {
            ed.edit_leaf(root, &hash_key, |leaf| {
                remove_dir_item_name(leaf, &hash_key, name)
            })
        })?;
        let extended = key.item_type == INODE_EXTREF_KEY;
        if w.log.is_some() {
            w.removed_names
                .push((dir.subvol, dir.ino, target.ino, r.index));
        }
        self.modify_tree(w, dir.subvol, |ed, root| {
            ed.delete(root, Key::new(dir.ino, DIR_INDEX_KEY, r.index))?;
            ed.edit_leaf(root, &key, |leaf| {
                let pos = leaf
                    .search(&key)
                    .map_err(|_| Error::corrupt("inode ref vanished"))?;
                let all = if extended {
                    InodeRef::parse_extrefs(leaf.data(pos))?
                } else {
                    InodeRef::parse_refs(leaf.data(pos), dir.ino)?
                };
                let mut rest = Vec::new();
                let mut found = false;
                for x in all {
                    if !found && x.parent == dir.ino && x.name == name {
                        found = true;
                    } else if extended {
                        x.encode_extref(&mut rest);
                    } else {
                        x.encode_ref(&mut rest);
                    }
                }
                if rest.is_empty() {
                    leaf.remove(pos)?;
                    Ok(())
                } else {
                    leaf.set_data(pos, &rest)
                }
            })
        })?;
        // The directory's index counter keeps going (as the kernel's does):
        // a name added later never takes the index of one removed.
        self.change_inode(w, dir, |d| {
            d.size = d.size.saturating_sub(2 * name.len() as u64);
            d.mtime = now;
            d.ctime = now;
        })?;
        Ok(target)
    }

    /// Remove `name` from `dir` where it links a subvolume that is not
    /// there (a snapshot's copy of a link to a subvolume nested in its
    /// source): no inode holds the name, only the directory's two items.
    fn remove_placeholder(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: &[u8],
        now: Timespec,
    ) -> Result<()> {
        let tree = self.fs_tree(dir.subvol)?;
        let mut index = None;
        for item in tree.items_of(dir.ino, DIR_INDEX_KEY)? {
            let item = item?;
            if DirItem::parse_all(item.data())?
                .iter()
                .any(|d| d.name == name && d.location.item_type == ROOT_ITEM_KEY)
            {
                index = Some(item.key().offset);
                break;
            }
        }
        let index = index.ok_or_else(|| {
            Error::corrupt(format!(
                "directory {} links a subvolume without an index item",
                dir.ino
            ))
        })?;
        let hash_key = Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name));
        self.modify_tree(w, dir.subvol, |ed, root| {
            ed.edit_leaf(root, &hash_key, |leaf| {
                remove_dir_item_name(leaf, &hash_key, name)
            })?;
            ed.delete(root, Key::new(dir.ino, DIR_INDEX_KEY, index))
                .map(drop)
        })?;
        // A log cannot name what no inode holds: fsyncs commit until the
        // next commit, as the kernel's do after a subvolume link goes.
        w.log_broken = true;
        self.change_inode(w, dir, |d| {
            d.size = d.size.saturating_sub(2 * name.len() as u64);
            d.mtime = now;
            d.ctime = now;
        })
        .map(drop)
    }

    /// Create an inode of any kind but directory-with-contents under `dir`.
    pub fn create(&self, dir: InodeId, name: &[u8], new: NewInode) -> Result<Stat> {
        self.change("create", || {
            check_name(name)?;
            let mut w = self.writer()?;
            let id = self.create_locked(&mut w, dir, name, new)?;
            self.stat(id)
        })
    }

    /// [`Filesystem::create`] inside the caller's hold on the transaction.
    pub(crate) fn create_locked(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: &[u8],
        new: NewInode,
    ) -> Result<InodeId> {
        check_name(name)?;
        self.new_inode(w, dir, Some(name), new)
    }

    /// A new regular file in `dir`'s subvolume with no name, as
    /// `O_TMPFILE` makes: held (release it with
    /// [`Filesystem::release_inode`]), deleted with its last release
    /// unless [`Filesystem::link`] gave it a name first, and at the next
    /// open after a crash (an orphan item says so).
    pub fn create_tmpfile(&self, dir: InodeId, new: NewInode) -> Result<Stat> {
        self.change("create", || {
            if new.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(Error::Invalid(format!("O_TMPFILE of mode {:#o}", new.mode)));
            }
            let mut w = self.writer()?;
            let id = self.new_inode(&mut w, dir, None, new)?;
            self.stat(id)
        })
    }

    /// A new inode in `dir`, named `name` there, or none (a held orphan:
    /// see [`Filesystem::create_tmpfile`]).
    pub(crate) fn new_inode(
        &self,
        w: &mut Writer,
        dir: InodeId,
        name: Option<&[u8]>,
        new: NewInode,
    ) -> Result<InodeId> {
        let kind = FileKind::from_mode(new.mode)
            .ok_or_else(|| Error::Invalid(format!("mode {:#o}", new.mode)))?;
        let parent = self.writable_dir(dir, Allowed::Growth)?;
        if let Some(name) = name
            && self.find_name(dir, name).is_ok()
        {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let transid = w.blocks.transid;
        let now = Timespec::now();
        let ino = self.next_ino(w, dir.subvol)?;
        let id = InodeId {
            subvol: dir.subvol,
            ino,
        };
        // New files inherit the directory's no-COW and compression choices.
        let inherit =
            parent.flags & (INODE_NODATACOW | INODE_NODATASUM | INODE_COMPRESS | INODE_NOCOMPRESS);
        let item = InodeItem {
            generation: transid,
            transid,
            size: 0,
            nbytes: 0,
            block_group: 0,
            nlink: u32::from(name.is_some()),
            uid: new.uid,
            gid: new.gid,
            mode: new.mode,
            rdev: new.rdev,
            // The mount's nodatacow and nodatasum reach new files, whatever
            // the directory says.
            flags: match kind {
                FileKind::File => inherit | w.new_file_flags,
                FileKind::Dir => inherit,
                _ => 0,
            },
            sequence: 1,
            atime: now,
            ctime: now,
            mtime: now,
            otime: now,
        };
        match name {
            Some(name) => {
                // The directory's next index is looked up before anything
                // changes: a damaged directory refuses the create whole.
                self.index_left(w, dir)?;
                self.put_inode(w, id, &item)?;
                self.add_name(w, dir, name, id, kind, now)?;
            }
            None => {
                // Held and marked before its orphan item is in: its last
                // release deletes it.
                self.hold_inode(id);
                self.open_inodes().orphaned.insert(id);
                let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id.ino);
                let made = self.put_inode(w, id, &item).and_then(|()| {
                    self.modify_tree(w, id.subvol, |ed, root| ed.put(root, key, Vec::new()))
                });
                if let Err(e) = made {
                    self.release_after_failure(id);
                    return Err(e);
                }
            }
        }
        self.inherit_properties(w, dir, parent.flags, id, kind, item.flags)?;
        Ok(id)
    }

    /// Create a directory.
    pub fn mkdir(&self, dir: InodeId, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Stat> {
        self.create(
            dir,
            name,
            NewInode {
                mode: libc::S_IFDIR | (mode & 0o7777),
                uid,
                gid,
                rdev: 0,
            },
        )
    }

    /// Remove a non-directory name; the inode goes when its last name does.
    pub fn unlink(&self, dir: InodeId, name: &[u8]) -> Result<()> {
        self.unlink_holding(dir, name, |_| false).map(drop)
    }

    /// [`Filesystem::unlink`], but when the name is the inode's last and
    /// `hold` says yes to its kind, the inode is held first (as by
    /// [`Filesystem::hold_inode`]) and outlives its name until
    /// [`Filesystem::release_inode`]; returns the inode so held. For a
    /// caller that cannot tell whether such a file is still open (a FUSE
    /// mount never sees the opens of special files).
    pub fn unlink_holding(
        &self,
        dir: InodeId,
        name: &[u8],
        hold: impl FnOnce(FileKind) -> bool,
    ) -> Result<Option<InodeId>> {
        self.change("unlink", || {
            let mut w = self.writer_deleting()?;
            self.writable_dir(dir, Allowed::Nothing)?;
            let entry = self.find_name(dir, name)?;
            if entry.kind == FileKind::Dir {
                return Err(Error::IsDir(String::from_utf8_lossy(name).into_owned()));
            }
            // Removing the name leaves the inode item as it is.
            let item = self.inode_item(entry.id)?;
            self.check_fixed(entry.id, &item, Allowed::Nothing, "unlink")?;
            let now = Timespec::now();
            let target = self.remove_name(&mut w, dir, name, &entry, now)?;
            let last = item.nlink <= 1;
            let held = (last && hold(entry.kind)).then(|| {
                self.hold_inode(target);
                target
            });
            let r = self.drop_unlinked(&mut w, target, last, now);
            drop(w);
            if let (Err(_), Some(id)) = (&r, held) {
                self.release_after_failure(id);
            }
            r.map(|()| held)
        })
    }

    /// The inode `target` lost a name (its `last`, or not).
    fn drop_unlinked(
        &self,
        w: &mut Writer,
        target: InodeId,
        last: bool,
        now: Timespec,
    ) -> Result<()> {
        if last && self.open_count(target) == 0 {
            // The last name went and nobody has the inode open: it goes
            // now, so its new link count need not be written first.
            return self.delete_inode_now(w, target);
        }
        let item = self.change_inode(w, target, |i| {
            i.nlink = i.nlink.saturating_sub(1);
            i.ctime = now;
        })?;
        if item.nlink == 0 {
            self.delete_inode(w, target)?;
        }
        Ok(())
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, dir: InodeId, name: &[u8]) -> Result<()> {
        self.change("rmdir", || {
            let mut w = self.writer_deleting()?;
            self.writable_dir(dir, Allowed::Nothing)?;
            let entry = self.find_name(dir, name)?;
            if entry.kind != FileKind::Dir {
                return Err(Error::NotDir(String::from_utf8_lossy(name).into_owned()));
            }
            self.check_fixed_id(entry.id, Allowed::Nothing, "rmdir")?;
            if entry.id.subvol != dir.subvol {
                // An empty subvolume goes with rmdir, as the kernel allows.
                drop(w);
                return self.delete_subvolume(dir, name, true);
            }
            if !self.read_dir_up_to(entry.id, 0, 1)?.is_empty() {
                return Err(Error::NotEmpty(String::from_utf8_lossy(name).into_owned()));
            }
            let now = Timespec::now();
            let target = self.remove_name(&mut w, dir, name, &entry, now)?;
            if target.is_placeholder() {
                return Ok(());
            }
            self.delete_inode(&mut w, target)
        })
    }

    /// An inode lost its last name. If someone still has it open, it lives
    /// on as an orphan (an ORPHAN_ITEM, so a crash leaves it for the next
    /// mount to clean) until [`Filesystem::release_inode`]; else it goes now.
    pub(crate) fn delete_inode(&self, w: &mut Writer, id: InodeId) -> Result<()> {
        let in_use = {
            // Counted and marked at once: a last close in between either
            // came first (the inode goes now) or sees the mark.
            let mut open = self.open_inodes();
            let in_use = open.users.get(&id).is_some_and(|&n| n > 0);
            if in_use {
                open.orphaned.insert(id);
            }
            in_use
        };
        if in_use {
            // A directory (its one link still counted) held open shows no
            // links from now on, as in the kernel.
            if self.inode_item(id)?.nlink != 0 {
                self.change_inode(w, id, |i| i.nlink = 0)?;
            }
            let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id.ino);
            return self.modify_tree(w, id.subvol, |ed, root| ed.put(root, key, Vec::new()));
        }
        self.delete_inode_now(w, id)
    }

    fn open_count(&self, id: InodeId) -> u32 {
        self.open_inodes().users.get(&id).copied().unwrap_or(0)
    }

    /// Someone (an open file of the FUSE mount) uses `id`: keep it even if
    /// its last name goes.
    pub fn hold_inode(&self, id: InodeId) {
        *self.open_inodes().users.entry(id).or_insert(0) += 1;
    }

    /// Let go of `id`, held for an operation that failed: the caller gets
    /// the error and holds nothing (an orphan left behind goes at the next
    /// mount). After a failure half-way (it aborts) only the count goes:
    /// nothing may change on top of the half change.
    pub(crate) fn release_after_failure(&self, id: InodeId) {
        if crate::transaction::abort::is_whole() {
            let _ = self.release_inode(id);
        } else {
            let _ = self.close_inode(id);
        }
    }

    /// The user of `id` is done; an orphaned inode is deleted now.
    pub fn release_inode(&self, id: InodeId) -> Result<()> {
        if self.close_inode(id)? {
            self.delete_closed_orphan(id)?;
        }
        Ok(())
    }

    /// The first half of [`Filesystem::release_inode`], which reads no
    /// tree and changes nothing on disk (so a FUSE mount runs it without
    /// its lock): counts the user of `id` gone, and tells whether it was
    /// the last one of an inode orphaned while in use, or the last use of
    /// a subvolume deleted while in use, which
    /// [`Filesystem::delete_closed_orphan`] then deletes.
    pub fn close_inode(&self, id: InodeId) -> Result<bool> {
        let mut open = self.open_inodes();
        let Some(n) = open.users.get_mut(&id) else {
            return Ok(false);
        };
        *n -= 1;
        if *n > 0 {
            return Ok(false);
        }
        open.users.remove(&id);
        Ok(self.writer.is_some()
            && (open.orphaned.contains(&id) || open.deleted_and_unused(id.subvol)))
    }

    /// Whether `id` has an orphan item (no names left, kept while used).
    fn has_orphan_item(&self, id: InodeId) -> Result<bool> {
        let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id.ino);
        Ok(self.fs_tree(id.subvol)?.get(&key)?.is_some())
    }

    /// The second half of [`Filesystem::release_inode`]: deletes orphan
    /// `id` unless it is in use again or gone already. In a subvolume
    /// deleted while in use, the whole tree goes instead, once unused
    /// ([`Filesystem::drop_deleted_subvolume`]).
    pub fn delete_closed_orphan(&self, id: InodeId) -> Result<()> {
        self.change("deleting an orphan", || {
            if self.writer.is_none() || self.open_count(id) > 0 {
                return Ok(());
            }
            if self.open_inodes().deleted_in_use.contains(&id.subvol) {
                return self.drop_deleted_subvolume(id.subvol);
            }
            self.open_inodes().orphaned.remove(&id);
            if !self.has_orphan_item(id)? {
                return Ok(());
            }
            let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id.ino);
            let mut w = self.writer_deleting()?;
            self.modify_tree(&mut w, id.subvol, |ed, root| ed.delete(root, key))?;
            self.delete_inode_now(&mut w, id)
        })
    }

    /// Delete the orphans a crash left in subvolume `subvol`.
    pub(crate) fn clean_orphans(&self, w: &mut Writer, subvol: u64) -> Result<()> {
        let orphans: Vec<u64> = self
            .fs_tree(subvol)?
            .items_of(
                crate::format::consts::ORPHAN_OBJECTID,
                crate::format::consts::ORPHAN_ITEM_KEY,
            )?
            .map(|it| it.map(|it| it.key().offset))
            .collect::<Result<_>>()?;
        for ino in orphans {
            let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino);
            self.modify_tree(w, subvol, |ed, root| ed.delete(root, key))?;
            let id = InodeId { subvol, ino };
            if self.inode_item(id).is_ok_and(|i| i.nlink == 0) {
                self.delete_inode_now(w, id)?;
            }
        }
        Ok(())
    }

    /// Delete every item of an inode that has no name left, dropping its
    /// references to data extents.
    fn delete_inode_now(&self, w: &mut Writer, id: InodeId) -> Result<()> {
        self.pending_atimes.forget(id);
        let (lo, hi) = (Key::new(id.ino, 0, 0), Key::new(id.ino, u8::MAX, u64::MAX));
        let tree = self.fs_tree(id.subvol)?;
        let mut items = tree
            .range(
                Key::new(id.ino, EXTENT_DATA_KEY, 0),
                Key::new(id.ino, EXTENT_DATA_KEY, u64::MAX),
            )?
            .peekable();
        // Extents of its own (not inline data): reading them all may
        // already take long.
        let type_at = crate::format::items::FileExtentItem::TYPE_OFF;
        if let Some(Ok(first)) = items.peek()
            && first.data().get(type_at) != Some(&FILE_EXTENT_INLINE)
        {
            self.long_work_ahead();
        }
        let extents: Vec<(u64, Vec<u8>)> = items
            .map(|it| it.map(|it| (it.key().offset, it.data().to_vec())))
            .collect::<Result<_>>()?;
        for (offset, data) in &extents {
            self.drop_extent_ref(w, id, *offset, data)?;
        }
        // The inode's items are adjacent: remove them a leaf at a time.
        self.modify_tree(w, id.subvol, |ed, root| {
            loop {
                let first = ed.reader().tree(*root).range(lo, hi)?.next().transpose()?;
                let Some(first) = first.map(|it| it.key()) else {
                    return Ok(());
                };
                ed.edit_leaf(root, &first, |leaf| {
                    let at = leaf.search(&first).unwrap_or_else(|p| p);
                    while at < leaf.len() && leaf.key(at) <= hi {
                        leaf.remove(at)?;
                    }
                    Ok(())
                })?;
            }
        })?;
        w.next_index.remove(&(id.subvol, id.ino));
        self.delalloc().discard(id);
        Ok(())
    }
}

/// Take `name` out of the DIR_ITEM at `key` in `leaf` (names whose hashes
/// collide share one item); the item goes with its last name.
pub(crate) fn remove_dir_item_name(
    leaf: &mut crate::tree::cow::Leaf,
    key: &Key,
    name: &[u8],
) -> Result<()> {
    let pos = leaf
        .search(key)
        .map_err(|_| Error::corrupt("directory item vanished"))?;
    let mut rest = Vec::new();
    for d in DirItem::parse_all(leaf.data(pos))? {
        if d.name != name {
            d.encode(&mut rest);
        }
    }
    if rest.is_empty() {
        leaf.remove(pos)?;
        Ok(())
    } else {
        leaf.set_data(pos, &rest)
    }
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::fs::{InodeId, NewInode};
    use crate::test_fs::TestFs;

    fn file(t: &TestFs, name: &[u8]) -> InodeId {
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        t.fs().create(t.fs().root(), name, new).unwrap().id
    }

    thread_local! {
        static LONG_WORK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    fn long_work_seen() -> u32 {
        LONG_WORK.with(|c| c.get())
    }

    /// A directory whose last entry index is the largest there is: a
    /// new entry would have none, and the create says the directory is
    /// damaged (changing nothing).
    #[test]
    fn a_directory_index_at_its_end_is_corrupt() {
        use crate::format::Key;
        use crate::format::consts::DIR_INDEX_KEY;
        let mut t = TestFs::new();
        let root = t.fs().root();
        file(&t, b"a");
        let tree = t.fs().fs_tree(root.subvol).unwrap();
        let entry = tree
            .items_of(root.ino, DIR_INDEX_KEY)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .data()
            .to_vec();
        t.put(
            root.subvol,
            Key::new(root.ino, DIR_INDEX_KEY, u64::MAX),
            entry,
        );
        t.reopen().unwrap();
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        let fs = t.fs();
        let e = fs.create(root, b"b", new).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
        assert!(e.to_string().contains("index u64::MAX"), "{e}");
        // Nor does a name come in by rename or link; none of it changed
        // anything.
        let sub = fs.mkdir(root, b"sub", 0o755, 0, 0);
        assert!(sub.is_err(), "{sub:?}");
        let a = fs.lookup(root, b"a").unwrap().id;
        let e = fs.link(a, root, b"a2").unwrap_err();
        assert!(e.to_string().contains("index u64::MAX"), "{e}");
        let e = fs.rename(root, b"a", root, b"a3", 0).unwrap_err();
        assert!(e.to_string().contains("index u64::MAX"), "{e}");
        assert!(fs.aborted().is_none());
        // Names still go.
        fs.unlink(root, b"a").unwrap();
        assert!(fs.aborted().is_none());
    }

    #[test]
    fn long_work_is_announced_and_short_work_is_not() {
        let t = TestFs::new();
        let fs = t.fs();
        fs.set_before_long_work(|| LONG_WORK.with(|c| c.set(c.get() + 1)));
        let empty = file(&t, b"empty");
        let inline = file(&t, b"inline");
        fs.write(inline, 0, b"data").unwrap();
        let big = file(&t, b"big");
        fs.write(big, 0, &[7u8; 64 << 10]).unwrap();
        let seen = long_work_seen();
        fs.commit().unwrap();
        assert_eq!(long_work_seen(), seen + 1, "a commit");
        // Files without extents of their own go at once.
        let seen = long_work_seen();
        fs.unlink(fs.root(), b"empty").unwrap();
        fs.unlink(fs.root(), b"inline").unwrap();
        assert_eq!(long_work_seen(), seen);
        assert!(fs.stat(empty).is_err() && fs.stat(inline).is_err());
        // One with an extent: its references are dropped.
        let seen = long_work_seen();
        fs.unlink(fs.root(), b"big").unwrap();
        assert_eq!(long_work_seen(), seen + 1, "freeing extents");
        let other = file(&t, b"other");
        let seen = long_work_seen();
        fs.truncate(other, 1 << 20).unwrap();
        assert_eq!(long_work_seen(), seen + 1, "a truncate");
    }

    #[test]
    fn the_last_close_of_an_unlinked_file_tells_and_deletes_it() {
        let t = TestFs::new();
        let id = file(&t, b"a");
        t.fs().write(id, 0, b"data").unwrap();
        // Two users; the name goes.
        t.fs().hold_inode(id);
        t.fs().hold_inode(id);
        t.fs().unlink(t.fs().root(), b"a").unwrap();
        assert!(t.fs().has_orphan_item(id).unwrap());
        assert!(!t.fs().close_inode(id).unwrap(), "one user left");
        assert!(
            t.fs().close_inode(id).unwrap(),
            "the last close of an orphan"
        );
        assert!(t.fs().stat(id).is_ok(), "closing alone changes nothing");
        // Opened again between the halves: kept.
        t.fs().hold_inode(id);
        t.fs().delete_closed_orphan(id).unwrap();
        assert!(t.fs().stat(id).is_ok());
        assert!(t.fs().close_inode(id).unwrap());
        t.fs().delete_closed_orphan(id).unwrap();
        assert!(matches!(t.fs().stat(id), Err(Error::NotFound(_))));
        assert!(!t.fs().has_orphan_item(id).unwrap());
        // Twice is harmless.
        t.fs().delete_closed_orphan(id).unwrap();
        t.fs().commit().unwrap();
    }

    /// An O_TMPFILE file: held, nameless, an orphan; named by a link it
    /// outlives its release, else it goes with it.
    #[test]
    fn a_tmpfile_goes_with_its_release_unless_named() {
        let t = TestFs::new();
        let fs = t.fs();
        let new = NewInode {
            mode: libc::S_IFREG | 0o600,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        let dir = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().id;
        let gone = fs.create_tmpfile(dir, new).unwrap();
        assert_eq!(gone.nlink, 0);
        assert!(fs.has_orphan_item(gone.id).unwrap());
        fs.write(gone.id, 0, b"scratch").unwrap();
        // A snapshot taken meanwhile does not keep it (nobody holds its
        // copy), as the kernel's does not.
        let snap = fs.create_snapshot(5, fs.root(), b"snap", false).unwrap();
        let orphans = fs
            .fs_tree(snap.subvol)
            .unwrap()
            .items_of(
                crate::format::consts::ORPHAN_OBJECTID,
                crate::format::consts::ORPHAN_ITEM_KEY,
            )
            .unwrap()
            .count();
        assert_eq!(orphans, 0);
        let copy = InodeId {
            subvol: snap.subvol,
            ino: gone.id.ino,
        };
        assert!(matches!(fs.stat(copy), Err(Error::NotFound(_))));
        let kept = fs.create_tmpfile(dir, new).unwrap().id;
        fs.write(kept, 0, b"kept").unwrap();
        fs.link(kept, dir, b"named").unwrap();
        assert!(!fs.has_orphan_item(kept).unwrap());
        assert_eq!(fs.stat(kept).unwrap().nlink, 1);
        fs.release_inode(gone.id).unwrap();
        fs.release_inode(kept).unwrap();
        assert!(matches!(fs.stat(gone.id), Err(Error::NotFound(_))));
        assert_eq!(fs.read(kept, 0, 10).unwrap(), b"kept");
        assert_eq!(fs.lookup(dir, b"named").unwrap().id, kept);
        // A name is still needed for a file nobody holds.
        let e = fs.link(gone.id, dir, b"late").unwrap_err();
        assert!(matches!(e, Error::NotFound(_)), "{e}");
        let e = fs.create_tmpfile(
            dir,
            NewInode {
                mode: libc::S_IFDIR | 0o700,
                ..new
            },
        );
        assert!(matches!(e, Err(Error::Invalid(_))), "{e:?}");
        fs.commit().unwrap();
    }

    #[test]
    fn unlink_holding_keeps_only_the_last_name_of_the_kinds_asked_for() {
        let t = TestFs::new();
        let fs = t.fs();
        let fifo = NewInode {
            mode: libc::S_IFIFO | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        let p = fs.create(fs.root(), b"p", fifo).unwrap().id;
        fs.link(p, fs.root(), b"q").unwrap();
        let is_fifo = |k| k == crate::fs::FileKind::Fifo;
        // Not its last name: nothing held.
        assert_eq!(fs.unlink_holding(fs.root(), b"q", is_fifo).unwrap(), None);
        assert_eq!(fs.stat(p).unwrap().nlink, 1);
        // Its last: held, an orphan until released.
        assert_eq!(
            fs.unlink_holding(fs.root(), b"p", is_fifo).unwrap(),
            Some(p)
        );
        assert!(matches!(
            fs.lookup(fs.root(), b"p"),
            Err(Error::NotFound(_))
        ));
        assert_eq!(fs.stat(p).unwrap().nlink, 0);
        assert!(fs.has_orphan_item(p).unwrap());
        fs.release_inode(p).unwrap();
        assert!(matches!(fs.stat(p), Err(Error::NotFound(_))));
        // A kind not asked for goes at once.
        let f = file(&t, b"f");
        assert_eq!(fs.unlink_holding(fs.root(), b"f", is_fifo).unwrap(), None);
        assert!(matches!(fs.stat(f), Err(Error::NotFound(_))));
        // A name that is not there: an error, nothing held.
        assert!(matches!(
            fs.unlink_holding(fs.root(), b"f", |_| true),
            Err(Error::NotFound(_))
        ));
        fs.commit().unwrap();
    }

    #[test]
    fn closing_a_file_with_names_deletes_nothing() {
        let t = TestFs::new();
        let id = file(&t, b"b");
        t.fs().hold_inode(id);
        assert!(!t.fs().close_inode(id).unwrap());
        // Not open at all: nothing to count.
        assert!(!t.fs().close_inode(id).unwrap());
        t.fs().delete_closed_orphan(id).unwrap();
        assert!(t.fs().stat(id).is_ok());
        t.fs().release_inode(id).unwrap();
        assert!(t.fs().stat(id).is_ok());
    }
}

//! Symbolic links, hard links and rename.
//!
//! A symlink is an inode of mode `0120777` whose target is the content of
//! one inline file extent (no NUL; the inode's size and byte count are the
//! target's length). A hard link is one more name (see
//! [`super::namespace`]) and one more `nlink`. A rename removes the old
//! name and adds the new one with a fresh directory index, as the kernel
//! does; a moved directory's INODE_REF then names its new parent (btrfs
//! keeps no ".." entry, and a directory's `nlink` is always 1).

use super::Allowed;
use super::inode::{DirEntry, FileKind, InodeId, Stat};
use super::namespace::{NewInode, check_name};
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, Timespec};
use crate::format::node::{HEADER_SIZE, ITEM_SIZE};
use crate::transaction::Writer;
use crate::{Error, Result};

/// `rename` flag: fail with [`Error::Exists`] if the new name exists
/// (Linux `RENAME_NOREPLACE`).
pub const RENAME_NOREPLACE: u32 = 1;
/// `rename` flag: swap the two names, which must both exist (Linux
/// `RENAME_EXCHANGE`).
pub const RENAME_EXCHANGE: u32 = 2;
/// [`Filesystem::rename_holding`] flag: the old name then names a whiteout
/// (a character device 0:0 with mode 0, what overlayfs takes for "deleted
/// here"), made in the same change (Linux `RENAME_WHITEOUT`).
pub const RENAME_WHITEOUT: u32 = 4;

/// Most names an inode may have (the kernel's link limit).
const LINK_MAX: u32 = 65535;
/// Longest symlink target the VFS passes (`PATH_MAX` less the NUL).
const SYMLINK_PATH_MAX: usize = 4095;

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Filesystem {
    /// Longest symlink target: what one inline extent item holds in a leaf,
    /// and never more than `PATH_MAX - 1`.
    pub fn symlink_max(&self) -> usize {
        let max_item = self.geometry().nodesize as usize - HEADER_SIZE - ITEM_SIZE;
        (max_item - FileExtentItem::INLINE_DATA_OFF).min(SYMLINK_PATH_MAX)
    }

    /// Create the symbolic link `name` in `dir` pointing at `target`.
    pub fn symlink(
        &self,
        dir: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Stat> {
        self.change("symlink", || {
        check_name(name)?;
        if target.is_empty() {
            return Err(Error::NotFound("empty symlink target".into()));
        }
        if target.contains(&0) {
            return Err(Error::Invalid("symlink target holds a NUL byte".into()));
        }
        let max = self.symlink_max();
        if target.len() > max {
            return Err(Error::NameTooLong(format!(
                "symlink target of {} bytes is too long: at most {max} bytes fit in one inline extent with {}-byte nodes",
                target.len(),
                self.geometry().nodesize
            )));
        }
        let mut w = self.writer()?;
        let new = NewInode {
            mode: libc::S_IFLNK | 0o777,
            uid,
            gid,
            rdev: 0,
        };
        let id = self.create_locked(&mut w, dir, name, new)?;
        let len = target.len() as u64;
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: len,
            compression: COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_INLINE,
            body: ExtentBody::Inline(target.to_vec()),
        };
        let bytes = fe.to_bytes();
        self.modify_tree(&mut w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, 0), bytes)
        })?;
        self.change_inode(&mut w, id, |i| {
            i.size = len;
            i.nbytes = len;
        })?;
        drop(w);
        self.stat(id)
        })
    }

    /// Give inode `inode` the additional name `new_name` in `new_dir` (a
    /// hard link). Directories cannot be linked.
    pub fn link(&self, inode: InodeId, new_dir: InodeId, new_name: &[u8]) -> Result<Stat> {
        self.change("link", || {
            check_name(new_name)?;
            let mut w = self.writer()?;
            self.writable_dir(new_dir, Allowed::Growth)?;
            // The checks come in the order Linux makes them.
            if self.lookup(new_dir, new_name).is_ok() {
                return Err(Error::Exists(show(new_name)));
            }
            let item = self.inode_item(inode)?;
            let kind = FileKind::from_mode(item.mode).ok_or_else(|| {
                Error::corrupt(format!("inode {} has mode {:#o}", inode.ino, item.mode))
            })?;
            if inode.subvol != new_dir.subvol {
                return Err(Error::CrossDevice(format!(
                    "hard link from subvolume {} into subvolume {}",
                    inode.subvol, new_dir.subvol
                )));
            }
            if kind == FileKind::Dir {
                return Err(Error::NotPermitted(format!(
                    "hard link to directory {}",
                    inode.ino
                )));
            }
            // A held orphan (an O_TMPFILE file, or one unlinked while
            // open) may get a name again: the kernel lets linkat(2) do that
            // to an O_TMPFILE file only, and decides it before asking.
            let orphan = item.nlink == 0;
            if orphan && (self.open_inodes().users.get(&inode).is_none_or(|&n| n == 0)) {
                return Err(Error::NotFound(format!(
                    "inode {} has no name left to link to",
                    inode.ino
                )));
            }
            self.check_fixed(inode, &item, Allowed::Nothing, "link")?;
            if item.nlink >= LINK_MAX {
                return Err(Error::TooManyLinks(format!(
                    "inode {} already has {} names",
                    inode.ino, item.nlink
                )));
            }
            let now = Timespec::now();
            self.add_name(&mut w, new_dir, new_name, inode, kind, now)?;
            self.change_inode(&mut w, inode, |i| {
                i.nlink += 1;
                i.ctime = now;
            })?;
            if orphan {
                // Named now: its last release must not delete it.
                let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, inode.ino);
                self.modify_tree(&mut w, inode.subvol, |ed, root| ed.delete(root, key))?;
                self.open_inodes().orphaned.remove(&inode);
                // The committed tree may still hold the orphan item: a log
                // replayed over it would meet a named inode marked for
                // deletion. The next fsync commits instead.
                w.log_broken = true;
            }
            drop(w);
            self.stat(inode)
        })
    }

    /// Whether `dir` is `anc` or below it (same subvolume only).
    fn is_within(&self, anc: InodeId, mut dir: InodeId) -> Result<bool> {
        // A tree deeper than this is a loop in damaged metadata.
        for _ in 0..(1 << 16) {
            if dir == anc {
                return Ok(true);
            }
            if dir.subvol != anc.subvol || dir.ino == FIRST_INODE {
                return Ok(false);
            }
            dir = self.parent(dir)?;
        }
        Err(Error::corrupt(format!(
            "directory {} in subvolume {} has a loop among its parents",
            dir.ino, dir.subvol
        )))
    }

    /// Rename `old_name` in `old_dir` to `new_name` in `new_dir`. `flags`
    /// is 0, [`RENAME_NOREPLACE`] or [`RENAME_EXCHANGE`]. Over an existing
    /// name, the inode it named loses that name (a directory must be
    /// empty); renaming a name onto another name of the same inode does
    /// nothing, as POSIX says.
    pub fn rename(
        &self,
        old_dir: InodeId,
        old_name: &[u8],
        new_dir: InodeId,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        if flags & RENAME_WHITEOUT != 0 {
            return Err(Error::Invalid(
                "a whiteout needs an owner: see rename_holding".into(),
            ));
        }
        self.rename_holding(old_dir, old_name, new_dir, new_name, flags, (0, 0), |_| {
            false
        })
        .map(drop)
    }

    /// [`Filesystem::rename`], but when it replaces the last name of an
    /// inode whose kind `hold` says yes to, that inode is held first (as
    /// by [`Filesystem::hold_inode`]) and outlives its name until
    /// [`Filesystem::release_inode`]; returns the inode so held. As
    /// [`Filesystem::unlink_holding`], for a FUSE mount, which never sees
    /// the opens of special files. With [`RENAME_WHITEOUT`] in `flags`,
    /// the whiteout is owned by `whiteout_owner` (uid, gid).
    #[allow(clippy::too_many_arguments)]
    pub fn rename_holding(
        &self,
        old_dir: InodeId,
        old_name: &[u8],
        new_dir: InodeId,
        new_name: &[u8],
        flags: u32,
        whiteout_owner: (u32, u32),
        hold: impl FnOnce(FileKind) -> bool,
    ) -> Result<Option<InodeId>> {
        self.change("rename", || {
            let mut held = None;
            let names = (old_dir, old_name, new_dir, new_name);
            let r = self.rename_locked(names, flags, whiteout_owner, hold, &mut held);
            if let (Err(_), Some(id)) = (&r, held) {
                self.release_after_failure(id);
            }
            r.map(|()| held)
        })
    }

    fn rename_locked(
        &self,
        (old_dir, old_name, new_dir, new_name): (InodeId, &[u8], InodeId, &[u8]),
        flags: u32,
        whiteout_owner: (u32, u32),
        hold: impl FnOnce(FileKind) -> bool,
        held: &mut Option<InodeId>,
    ) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0 {
            return Err(Error::Unsupported(format!("rename flags {flags:#x}")));
        }
        if flags & RENAME_EXCHANGE != 0 && flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0 {
            return Err(Error::Invalid(
                "rename cannot both exchange and refuse to replace or leave a whiteout".into(),
            ));
        }
        let whiteout = flags & RENAME_WHITEOUT != 0;
        check_name(old_name)?;
        check_name(new_name)?;
        let mut w = self.writer_deleting()?;
        self.writable_dir(old_dir, Allowed::Nothing)?;
        self.writable_dir(new_dir, Allowed::Growth)?;
        let src = self.lookup(old_dir, old_name)?;
        if src.id.subvol != old_dir.subvol {
            return Err(Error::Unsupported("renaming a subvolume".into()));
        }
        if old_dir.subvol != new_dir.subvol {
            return Err(Error::CrossDevice(format!(
                "rename from subvolume {} into subvolume {}",
                old_dir.subvol, new_dir.subvol
            )));
        }
        let dst = match self.lookup(new_dir, new_name) {
            Ok(e) => Some(e),
            Err(Error::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        if let Some(d) = &dst
            && d.id.subvol != new_dir.subvol
        {
            return Err(Error::Unsupported("replacing a subvolume".into()));
        }
        // The placeholder of a subvolume nested in a snapshot's source does
        // not move (ENOTEMPTY, as the kernel answers); it may be replaced.
        let placeholder = |e: &DirEntry| e.id.is_placeholder();
        if placeholder(&src) || (exchange_flag(flags) && dst.as_ref().is_some_and(placeholder)) {
            return Err(Error::NotEmpty(show(old_name)));
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        // The checks come in the order Linux makes them, so each failure
        // has the errno a caller of rename(2) expects.
        match &dst {
            Some(_) if flags & RENAME_NOREPLACE != 0 => {
                return Err(Error::Exists(show(new_name)));
            }
            None if exchange => return Err(Error::NotFound(show(new_name))),
            _ => {}
        }
        if old_dir != new_dir {
            // A directory cannot move below itself...
            if src.kind == FileKind::Dir && self.is_within(src.id, new_dir)? {
                return Err(Error::Invalid(format!(
                    "cannot move directory {} inside itself",
                    show(old_name)
                )));
            }
            // ...nor replace one of the directories above it.
            if let Some(d) = &dst
                && d.kind == FileKind::Dir
                && self.is_within(d.id, old_dir)?
            {
                return Err(if exchange {
                    Error::Invalid(format!(
                        "cannot move directory {} inside itself",
                        show(new_name)
                    ))
                } else {
                    Error::NotEmpty(show(new_name))
                });
            }
        }
        if dst.as_ref().is_some_and(|d| d.id == src.id) {
            return Ok(());
        }
        // What moves, what is replaced and the directory losing the
        // replaced name must all be free to change.
        self.check_fixed_id(src.id, Allowed::Nothing, "rename")?;
        if let Some(d) = &dst {
            self.check_fixed_id(new_dir, Allowed::Nothing, "rename")?;
            self.check_fixed_id(d.id, Allowed::Nothing, "rename")?;
        }
        let now = Timespec::now();
        // Each directory that gets a name has an index left for it.
        self.index_left(&mut w, new_dir)?;
        if exchange || whiteout {
            self.index_left(&mut w, old_dir)?;
        }
        // Each name removed from a directory frees its bytes in the
        // inode's ref item for it.
        let freed = |name: &[u8]| {
            if old_dir == new_dir {
                10 + name.len()
            } else {
                0
            }
        };
        if exchange {
            let Some(dst) = dst else {
                return Err(Error::NotFound(show(new_name)));
            };
            self.needs_extref(new_dir, new_name, src.id, freed(old_name))?;
            self.needs_extref(old_dir, old_name, dst.id, freed(new_name))?;
            self.remove_name(&mut w, old_dir, old_name, &src, now)?;
            self.remove_name(&mut w, new_dir, new_name, &dst, now)?;
            // The kernel numbers the new entry in `new_dir` first.
            self.add_name(&mut w, new_dir, new_name, src.id, src.kind, now)?;
            self.add_name(&mut w, old_dir, old_name, dst.id, dst.kind, now)?;
            for id in [src.id, dst.id] {
                self.change_inode(&mut w, id, |i| i.ctime = now)?;
            }
            return Ok(());
        }
        if let Some(d) = &dst {
            match (src.kind == FileKind::Dir, d.kind == FileKind::Dir) {
                (true, false) => return Err(Error::NotDir(show(new_name))),
                (false, true) => return Err(Error::IsDir(show(new_name))),
                (true, true) if !self.read_dir_up_to(d.id, 0, 1)?.is_empty() => {
                    return Err(Error::NotEmpty(show(new_name)));
                }
                _ => {}
            }
        }
        self.needs_extref(new_dir, new_name, src.id, freed(old_name))?;
        if let Some(d) = dst {
            self.remove_name(&mut w, new_dir, new_name, &d, now)?;
            if placeholder(&d) {
                // Only its directory's items were there.
            } else if d.kind != FileKind::Dir && self.inode_item(d.id)?.nlink <= 1 && hold(d.kind) {
                self.hold_inode(d.id);
                *held = Some(d.id);
                self.drop_link(&mut w, d.id, d.kind, now)?;
            } else {
                self.drop_link(&mut w, d.id, d.kind, now)?;
            }
        }
        self.remove_name(&mut w, old_dir, old_name, &src, now)?;
        self.add_name(&mut w, new_dir, new_name, src.id, src.kind, now)?;
        self.change_inode(&mut w, src.id, |i| i.ctime = now)?;
        if whiteout {
            let (uid, gid) = whiteout_owner;
            let new = super::NewInode {
                mode: libc::S_IFCHR,
                uid,
                gid,
                rdev: 0,
            };
            self.new_inode(&mut w, old_dir, Some(old_name), new)?;
        }
        Ok(())
    }

    /// An inode lost one of its names: one link less, and the inode goes
    /// with its last name (a directory has only one).
    fn drop_link(&self, w: &mut Writer, id: InodeId, kind: FileKind, now: Timespec) -> Result<()> {
        if kind == FileKind::Dir {
            return self.delete_inode(w, id);
        }
        let item = self.change_inode(w, id, |i| {
            i.nlink = i.nlink.saturating_sub(1);
            i.ctime = now;
        })?;
        if item.nlink == 0 {
            self.delete_inode(w, id)?;
        }
        Ok(())
    }
}

/// Whether rename `flags` ask for an exchange.
fn exchange_flag(flags: u32) -> bool {
    flags & RENAME_EXCHANGE != 0
}

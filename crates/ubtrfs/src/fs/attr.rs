//! Changing attributes: mode, owner, times, size, and extended attributes.
//!
//! An xattr is an entry of an XATTR_ITEM keyed by the CRC32C hash of its
//! name; entries whose names share a hash are packed in one item, like
//! directory entries. Every change sets the inode's ctime.

use super::Allowed;
use super::acl::Which;
use super::dir::name_hash;
use super::inode::{FileKind, InodeId, Stat};
use super::open::Filesystem;
use super::props::is_property;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, Timespec};
use crate::format::node::{HEADER_SIZE, ITEM_SIZE};
use crate::transaction::Writer;
use crate::{Error, Result};

/// `set_xattr` flag: fail with [`Error::Exists`] if the xattr exists
/// (Linux `XATTR_CREATE`).
pub const XATTR_CREATE: u32 = 1;
/// `set_xattr` flag: fail with [`Error::NotFound`] (ENODATA) if the xattr
/// does not exist (Linux `XATTR_REPLACE`).
pub const XATTR_REPLACE: u32 = 2;

/// Longest xattr name (Linux `XATTR_NAME_MAX`).
const XATTR_NAME_MAX: usize = 255;
/// Largest xattr value (Linux `XATTR_SIZE_MAX`).
const XATTR_SIZE_MAX: usize = 65536;
/// Bytes of a DIR_ITEM entry before its name.
const DIR_ITEM_HEADER: usize = 30;

/// The attributes `setattr` changes; `None` leaves one as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (`0o7777`); the file type never changes.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// New size of a regular file (see [`Filesystem::truncate`]).
    pub size: Option<u64>,
    pub atime: Option<Timespec>,
    pub mtime: Option<Timespec>,
    /// The change time to record; by default the time of the call.
    pub ctime: Option<Timespec>,
    /// The mode change only drops set-user-ID and set-group-ID bits, as
    /// a write or truncate by an unprivileged caller does: the kernel
    /// does that to immutable and append-only files too, which refuse an
    /// explicit mode change.
    pub drops_set_id: bool,
    /// The modification and change times are those writes through a file
    /// opened for writing brought (a writeback cache sends them after the
    /// writes): they are set on a file made immutable or append-only
    /// since it was opened, as the kernel's own updates of them are.
    pub times_of_writes: bool,
    /// The size comes through a file opened for writing (`ftruncate`):
    /// as in the kernel, it is set on a file made immutable since it was
    /// opened, never on an append-only one.
    pub size_through_open_file: bool,
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Filesystem {
    /// Change attributes of `id`; returns the new ones. A size change goes
    /// through [`Filesystem::truncate`] and sets mtime and ctime unless
    /// they are given.
    pub fn setattr(&self, id: InodeId, attr: SetAttr) -> Result<Stat> {
        self.change("setattr", || {
            if id.is_placeholder() {
                return Err(Error::ReadOnly(
                    "placeholder of an unreachable subvolume".into(),
                ));
            }
            let now = Timespec::now();
            let item = self.inode_item(id)?;
            let resize = attr.size.filter(|&s| s != item.size);
            if attr.size.is_some() {
                match FileKind::from_mode(item.mode) {
                    Some(FileKind::File) => {}
                    Some(FileKind::Dir) => return Err(Error::IsDir(format!("inode {}", id.ino))),
                    _ => {
                        return Err(Error::Invalid(format!(
                            "size of inode {}, which is not a regular file",
                            id.ino
                        )));
                    }
                }
            }
            let others = attr.mode.is_some()
                || attr.uid.is_some()
                || attr.gid.is_some()
                || attr.atime.is_some()
                || attr.mtime.is_some()
                || attr.ctime.is_some();
            // An append-only inode takes new times (its writes bring them)
            // and loses set-ID bits as any file does, nothing else; a size
            // is refused even when it is the size the file has.
            let mode_dropped = attr.drops_set_id
                && attr.mode.is_some_and(|m| {
                    m & 0o7777 == item.mode & 0o7777 & !(libc::S_ISUID | libc::S_ISGID)
                });
            let allowed = match (attr.uid, attr.gid, attr.size) {
                (None, None, None)
                    if attr.mode.is_none() && attr.atime.is_none() && attr.times_of_writes =>
                {
                    Allowed::Anything
                }
                (None, None, None) if attr.mode.is_none() => Allowed::Growth,
                (None, None, Some(_))
                    if attr.mode.is_none()
                        && attr.atime.is_none()
                        && attr.size_through_open_file
                        && item.flags & INODE_APPEND == 0 =>
                {
                    Allowed::Anything
                }
                (None, None, None) if mode_dropped && attr.atime.is_none() => Allowed::Anything,
                _ => Allowed::Nothing,
            };
            if attr.size.is_some() || others {
                self.check_fixed(id, &item, allowed, "setattr")?;
            }
            if resize.is_none() && !others {
                return Stat::from_item(id, &item).ok_or_else(|| {
                    Error::corrupt(format!("inode {} has mode {:#o}", id.ino, item.mode))
                });
            }
            // Growing may need space; everything else may use the reserve.
            let mut w = match resize {
                Some(s) if s > item.size => self.writer()?,
                _ => self.writer_deleting()?,
            };
            if let Some(size) = resize {
                self.truncate_locked(&mut w, id, size, now, allowed)?;
            }
            if others {
                self.change_inode(&mut w, id, |i| {
                    if let Some(m) = attr.mode {
                        i.mode = (i.mode & libc::S_IFMT) | (m & 0o7777);
                    }
                    if let Some(u) = attr.uid {
                        i.uid = u;
                    }
                    if let Some(g) = attr.gid {
                        i.gid = g;
                    }
                    if let Some(t) = attr.atime {
                        i.atime = t;
                    }
                    if let Some(t) = attr.mtime {
                        i.mtime = t;
                    }
                    i.ctime = attr.ctime.unwrap_or(now);
                })?;
                if let Some(m) = attr.mode {
                    self.chmod_acl(&mut w, id, m)?;
                }
            }
            drop(w);
            self.stat(id)
        })
    }

    /// Largest name plus value of one xattr: what one item holds in a leaf.
    pub fn xattr_max(&self) -> usize {
        self.geometry().nodesize as usize - HEADER_SIZE - ITEM_SIZE - DIR_ITEM_HEADER
    }

    /// Set xattr `name` of `id` to `value`. `flags` is 0, [`XATTR_CREATE`]
    /// or [`XATTR_REPLACE`]. The POSIX ACL xattrs are checked and kept in
    /// step with the mode (see `acl.rs`); the flags do not apply to them,
    /// as in Linux.
    pub fn set_xattr(&self, id: InodeId, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.change("setxattr", || {
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Error::Invalid(format!("xattr flags {flags:#x}")));
        }
        check_xattr_name(name)?;
        if let Some(which) = Which::of(name) {
            self.writable_inode(id)?;
            return self.set_acl(id, which, value);
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::Invalid(format!(
                "xattr value of {} bytes is larger than {XATTR_SIZE_MAX}",
                value.len()
            )));
        }
        let max = self.xattr_max();
        if name.len() + value.len() > max {
            return Err(Error::NoSpace(format!(
                "xattr {} of {} bytes: name and value hold at most {max} bytes with {}-byte nodes",
                show(name),
                value.len(),
                self.geometry().nodesize
            )));
        }
        let mut w = self.writer()?;
        let item = self.writable_inode(id)?;
        if is_property(name) {
            self.set_property(&mut w, id, &item, name, Some(value), flags)?;
        } else {
            self.put_xattr(&mut w, id, name, value, flags)?;
        }
        let now = Timespec::now();
        self.change_inode(&mut w, id, |i| i.ctime = now)?;
        Ok(())
        })
    }

    /// Store xattr `name` of `id` (name and size checked by the caller),
    /// leaving the inode item alone.
    pub(crate) fn put_xattr(
        &self,
        w: &mut Writer,
        id: InodeId,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        let max = self.xattr_max();
        let entry = DirItem {
            location: Key::new(0, 0, 0),
            transid: w.blocks.transid,
            file_type: FT_XATTR,
            name: name.to_vec(),
            data: value.to_vec(),
        };
        let key = Key::new(id.ino, XATTR_ITEM_KEY, name_hash(name));
        let max_item = max + DIR_ITEM_HEADER;
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.edit(root, &key, |items| {
                let at = items.binary_search_by(|(k, _)| k.cmp(&key));
                let mut all = match at {
                    Ok(pos) => DirItem::parse_all(&items[pos].1)?,
                    Err(_) => Vec::new(),
                };
                let old = all.iter().position(|d| d.name == name);
                match old {
                    Some(_) if flags & XATTR_CREATE != 0 => {
                        return Err(Error::Exists(format!("xattr {}", show(name))));
                    }
                    None if flags & XATTR_REPLACE != 0 => {
                        return Err(Error::NotFound(format!("xattr {}", show(name))));
                    }
                    Some(i) => {
                        all.remove(i);
                    }
                    None => {}
                }
                all.push(entry);
                let mut bytes = Vec::new();
                for d in &all {
                    d.encode(&mut bytes);
                }
                if bytes.len() > max_item {
                    return Err(Error::NoSpace(format!(
                        "xattr {}: its hash bucket would outgrow a leaf",
                        show(name)
                    )));
                }
                match at {
                    Ok(pos) => items[pos].1 = bytes,
                    Err(pos) => items.insert(pos, (key, bytes)),
                }
                Ok(())
            })
        })
    }

    /// Remove xattr `name` of `id`; [`Error::NotFound`] (ENODATA) if it has none.
    pub fn remove_xattr(&self, id: InodeId, name: &[u8]) -> Result<()> {
        self.change("removexattr", || {
            check_xattr_name(name)?;
            let mut w = self.writer_deleting()?;
            let item = self.writable_inode(id)?;
            if is_property(name) {
                self.set_property(&mut w, id, &item, name, None, 0)?;
            } else if !self.delete_xattr(&mut w, id, name)? {
                return Err(Error::NotFound(format!("xattr {}", show(name))));
            }
            let now = Timespec::now();
            self.change_inode(&mut w, id, |i| i.ctime = now)?;
            Ok(())
        })
    }

    /// Remove xattr `name` of `id` if it has it (whether it had is
    /// returned), leaving the inode item alone.
    pub(crate) fn delete_xattr(&self, w: &mut Writer, id: InodeId, name: &[u8]) -> Result<bool> {
        let key = Key::new(id.ino, XATTR_ITEM_KEY, name_hash(name));
        // Nothing to edit: no copy-on-write of the path for nothing.
        if self.get_xattr(id, name)?.is_none() {
            return Ok(false);
        }
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.edit(root, &key, |items| {
                let missing = || Error::corrupt(format!("xattr {} vanished", show(name)));
                let pos = items
                    .binary_search_by(|(k, _)| k.cmp(&key))
                    .map_err(|_| missing())?;
                let mut all = DirItem::parse_all(&items[pos].1)?;
                let i = all
                    .iter()
                    .position(|d| d.name == name)
                    .ok_or_else(missing)?;
                all.remove(i);
                if all.is_empty() {
                    items.remove(pos);
                } else {
                    let mut bytes = Vec::new();
                    for d in &all {
                        d.encode(&mut bytes);
                    }
                    items[pos].1 = bytes;
                }
                Ok(())
            })
        })?;
        Ok(true)
    }

    /// The item of `id`, a real inode whose xattrs may change.
    fn writable_inode(&self, id: InodeId) -> Result<crate::format::items::InodeItem> {
        // The kernel's stand-in directory has no xattr handlers: ENOTSUP.
        if id.is_placeholder() {
            return Err(Error::Unsupported(
                "xattrs of the placeholder of an unreachable subvolume".into(),
            ));
        }
        let item = self.inode_item(id)?;
        self.check_fixed(id, &item, Allowed::Nothing, "xattr change")?;
        Ok(item)
    }
}

/// Names the kernel stores as xattrs: the `user.`, `trusted.` and
/// `security.` namespaces, the two POSIX ACLs of `system.` (see
/// `acl.rs`) and properties (`btrfs.`, see `props.rs`). Other `system.`
/// names have meanings this library does not implement.
fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Error::Invalid(format!(
            "xattr name of {} bytes (1 to {XATTR_NAME_MAX})",
            name.len()
        )));
    }
    if name.contains(&0) {
        return Err(Error::Invalid("xattr name holds a NUL byte".into()));
    }
    if Which::of(name).is_some() {
        return Ok(());
    }
    let plain = [&b"user."[..], b"trusted.", b"security.", b"btrfs."];
    match plain.iter().find(|p| name.starts_with(p)) {
        Some(p) if name.len() > p.len() => Ok(()),
        Some(_) => Err(Error::Invalid(format!("empty xattr name {}", show(name)))),
        None => Err(Error::Unsupported(format!(
            "xattr {}: only the user., trusted., security. and btrfs. namespaces are supported",
            show(name)
        ))),
    }
}

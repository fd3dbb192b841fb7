//! POSIX access control lists, stored as Linux stores them: in the xattrs
//! `system.posix_acl_access` (who may do what to the inode) and
//! `system.posix_acl_default` (what new inodes of a directory inherit).
//!
//! The value is a little-endian `u32` version (2) followed by 8-byte
//! entries: `u16` tag, `u16` permission bits (read 4, write 2, execute 1),
//! `u32` user or group id. Only named user and group entries carry an id;
//! the others hold `u32::MAX`. Entries come in tag order: owner, named
//! users, owning group, named groups, mask, others.
//!
//! The permission bits of the mode and the access ACL describe the same
//! thing and are kept in step, as the kernel does: setting an access ACL
//! sets the mode (and one that says no more than the mode is not stored),
//! `chmod` rewrites the owner, mask (or owning group) and other entries,
//! and a new inode's mode and ACLs come from its directory's default ACL
//! (or from the umask when it has none).

use super::inode::{FileKind, InodeId, Stat};
use super::namespace::NewInode;
use super::open::Filesystem;
use crate::format::items::Timespec;
use crate::transaction::Writer;
use crate::{Error, Result};

/// Name of the xattr holding an inode's access ACL.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// Name of the xattr holding a directory's default ACL.
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The only version of the xattr format.
const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;

/// Entry tags, in the order entries must come.
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// The id of an entry that names no one.
const NO_ID: u32 = u32::MAX;

/// Which of the two ACLs an xattr name stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Access,
    Default,
}

impl Which {
    /// The ACL an xattr name holds, if it names one.
    pub(crate) fn of(name: &[u8]) -> Option<Which> {
        match name {
            ACL_ACCESS => Some(Which::Access),
            ACL_DEFAULT => Some(Which::Default),
            _ => None,
        }
    }
}

/// One entry: tag, permission bits, id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A valid ACL (see [`Acl::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Decode and check an xattr value. `None` for a value with no entries,
    /// which Linux takes as "no ACL". The entries must come in order, with
    /// one owner, owning group and other entry, a mask if there is any
    /// named entry, and no permission bit but read, write and execute.
    pub fn parse(value: &[u8]) -> Result<Option<Acl>> {
        let bad = |why: &str| Error::Invalid(format!("POSIX ACL xattr: {why}"));
        let (head, body) = value
            .split_first_chunk::<HEADER>()
            .ok_or_else(|| bad("shorter than its header"))?;
        if u32::from_le_bytes(*head) != VERSION {
            return Err(bad("version is not 2"));
        }
        if body.len() % ENTRY != 0 {
            return Err(bad("size is not a whole number of entries"));
        }
        if body.is_empty() {
            return Ok(None);
        }
        let entries: Vec<Entry> = body
            .chunks_exact(ENTRY)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        // Tags must not go backwards; the unique ones appear once.
        let mut last = 0;
        for e in &entries {
            if e.perm & !7 != 0 {
                return Err(bad("permission bits other than rwx"));
            }
            if !matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER) {
                return Err(bad(&format!("unknown tag {:#x}", e.tag)));
            }
            let repeatable = matches!(e.tag, USER | GROUP);
            if e.tag < last || (e.tag == last && !repeatable) {
                return Err(bad("entries out of order or repeated"));
            }
            last = e.tag;
        }
        let has = |tag| entries.iter().any(|e| e.tag == tag);
        if !has(USER_OBJ) || !has(GROUP_OBJ) || !has(OTHER) {
            return Err(bad("owner, group or other entry missing"));
        }
        if (has(USER) || has(GROUP)) && !has(MASK) {
            return Err(bad("named entries without a mask"));
        }
        Ok(Some(Acl { entries }))
    }

    /// The xattr value, ids of unnamed entries written as Linux writes them.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                NO_ID
            };
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// Whether the ACL says more than permission bits can (it has named
    /// entries or a mask).
    fn extended(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.tag, USER | GROUP | MASK))
    }

    fn perm(&self, tag: u16) -> u32 {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map_or(0, |e| u32::from(e.perm))
    }

    fn set_perm(&mut self, tag: u16, perm: u32) {
        for e in self.entries.iter_mut().filter(|e| e.tag == tag) {
            e.perm = (perm & 7) as u16;
        }
    }

    /// The permission bits (`0o777`) the ACL gives the mode: the group
    /// bits are the mask's when there is one.
    pub fn mode_bits(&self) -> u32 {
        let group = if self.entries.iter().any(|e| e.tag == MASK) {
            self.perm(MASK)
        } else {
            self.perm(GROUP_OBJ)
        };
        self.perm(USER_OBJ) << 6 | group << 3 | self.perm(OTHER)
    }

    /// Bring the ACL in step with new permission bits (`chmod`): owner,
    /// mask (or owning group without one) and other entries take them.
    pub fn chmod(&mut self, mode: u32) {
        let group = if self.entries.iter().any(|e| e.tag == MASK) {
            MASK
        } else {
            GROUP_OBJ
        };
        self.set_perm(USER_OBJ, mode >> 6);
        self.set_perm(group, mode >> 3);
        self.set_perm(OTHER, mode);
    }

    /// Inheritance: the ACL (a default one) and the mode asked for at
    /// creation restrict each other. Returns the new inode's mode.
    fn restrict(&mut self, mode: u32) -> u32 {
        let group = if self.entries.iter().any(|e| e.tag == MASK) {
            MASK
        } else {
            GROUP_OBJ
        };
        let mut bits = 0;
        for (tag, shift) in [(USER_OBJ, 6), (group, 3), (OTHER, 0)] {
            let p = self.perm(tag) & (mode >> shift) & 7;
            self.set_perm(tag, p);
            bits |= p << shift;
        }
        (mode & !0o777) | bits
    }
}

/// What a new inode gets from its directory: see [`inherit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    /// Full mode (type and permission bits).
    pub mode: u32,
    /// Value of the access ACL xattr, if the mode bits do not say it all.
    pub access: Option<Vec<u8>>,
    /// Value of the default ACL xattr (directories only).
    pub default: Option<Vec<u8>>,
}

/// The mode and ACLs of a new inode of `mode` (type and permission bits)
/// created by a caller of umask `umask` in a directory whose default ACL
/// is `parent_default`. Without a default ACL the umask applies; with
/// one, the umask is ignored and the default ACL restricts the mode, the
/// result becomes the access ACL (when mode bits cannot express it) and,
/// for a directory, the default ACL too. Symbolic links take neither.
pub fn inherit(parent_default: Option<&[u8]>, mode: u32, umask: u32) -> Result<Inherited> {
    let plain = Inherited {
        mode,
        access: None,
        default: None,
    };
    if mode & libc::S_IFMT == libc::S_IFLNK {
        return Ok(plain);
    }
    let Some(mut acl) = parent_default.map(Acl::parse).transpose()?.flatten() else {
        return Ok(Inherited {
            mode: mode & !(umask & 0o777),
            ..plain
        });
    };
    let default = (mode & libc::S_IFMT == libc::S_IFDIR).then(|| acl.encode());
    let mode = acl.restrict(mode);
    Ok(Inherited {
        mode,
        access: acl.extended().then(|| acl.encode()),
        default,
    })
}

impl Filesystem {
    /// [`Filesystem::create`] the way the kernel creates inodes under POSIX
    /// ACLs: `new.mode` is what the caller asked for, before its `umask`;
    /// the mode and ACLs come from [`inherit`], in one transaction.
    pub fn create_inheriting(
        &self,
        dir: InodeId,
        name: &[u8],
        new: NewInode,
        umask: u32,
    ) -> Result<Stat> {
        super::namespace::check_name(name)?;
        self.create_acl_inheriting(dir, Some(name), new, umask)
    }

    /// [`Filesystem::create_tmpfile`] as [`Filesystem::create_inheriting`]
    /// creates: the mode and ACLs from the directory's default ACL, else
    /// the `umask`.
    pub fn create_tmpfile_inheriting(
        &self,
        dir: InodeId,
        new: NewInode,
        umask: u32,
    ) -> Result<Stat> {
        if new.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::Invalid(format!("O_TMPFILE of mode {:#o}", new.mode)));
        }
        self.create_acl_inheriting(dir, None, new, umask)
    }

    fn create_acl_inheriting(
        &self,
        dir: InodeId,
        name: Option<&[u8]>,
        new: NewInode,
        umask: u32,
    ) -> Result<Stat> {
        self.change("create", || {
            let default = self.get_xattr(dir, ACL_DEFAULT)?;
            let got = inherit(default.as_deref(), new.mode, umask)?;
            let mut w = self.writer()?;
            let new = NewInode {
                mode: got.mode,
                ..new
            };
            let id = self.new_inode(&mut w, dir, name, new)?;
            // No ctime change: these xattrs are part of the new inode.
            for (xname, value) in [(ACL_DEFAULT, &got.default), (ACL_ACCESS, &got.access)] {
                if let Some(v) = value {
                    self.put_xattr(&mut w, id, xname, v, 0)?;
                }
            }
            drop(w);
            self.stat(id)
        })
    }

    /// Set an ACL xattr (from [`Filesystem::set_xattr`]): checked, stored
    /// as Linux writes it, and for the access ACL, the mode follows it.
    pub(crate) fn set_acl(&self, id: InodeId, which: Which, value: &[u8]) -> Result<()> {
        let acl = Acl::parse(value)?;
        let mut w = self.writer()?;
        let item = self.inode_item(id)?;
        let now = Timespec::now();
        match which {
            Which::Default => {
                if FileKind::from_mode(item.mode) != Some(FileKind::Dir) {
                    // Removing what cannot be there succeeds, as in Linux.
                    return match acl {
                        Some(_) => Err(Error::Invalid(format!(
                            "inode {}: only directories have default ACLs",
                            id.ino
                        ))),
                        None => Ok(()),
                    };
                }
                match &acl {
                    Some(a) => self.put_xattr(&mut w, id, ACL_DEFAULT, &a.encode(), 0)?,
                    None => {
                        self.delete_xattr(&mut w, id, ACL_DEFAULT)?;
                    }
                }
                self.change_inode(&mut w, id, |i| i.ctime = now)?;
            }
            Which::Access => {
                // An ACL the mode says all of is not stored (as the kernel does).
                match acl.as_ref().filter(|a| a.extended()) {
                    Some(a) => self.put_xattr(&mut w, id, ACL_ACCESS, &a.encode(), 0)?,
                    None => {
                        self.delete_xattr(&mut w, id, ACL_ACCESS)?;
                    }
                }
                let bits = acl.as_ref().map(Acl::mode_bits);
                self.change_inode(&mut w, id, |i| {
                    if let Some(b) = bits {
                        i.mode = (i.mode & !0o777) | b;
                    }
                    i.ctime = now;
                })?;
            }
        }
        Ok(())
    }

    /// After a change of the permission bits of `id` to `mode`, bring its
    /// access ACL (if it has one) in step.
    pub(crate) fn chmod_acl(&self, w: &mut Writer, id: InodeId, mode: u32) -> Result<()> {
        let Some(value) = self.get_xattr(id, ACL_ACCESS)? else {
            return Ok(());
        };
        let Some(mut acl) = Acl::parse(&value)? else {
            return Ok(());
        };
        acl.chmod(mode);
        let new = acl.encode();
        if new != value {
            self.put_xattr(w, id, ACL_ACCESS, &new, 0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An xattr value from (tag, perm, id) triples.
    fn value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(t, p, i) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&i.to_le_bytes());
        }
        v
    }

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl::parse(&value(entries)).unwrap().unwrap()
    }

    #[test]
    fn parse_checks_shape() {
        assert_eq!(Acl::parse(&value(&[])).unwrap(), None);
        assert!(Acl::parse(&[2, 0]).is_err());
        assert!(Acl::parse(&[3, 0, 0, 0]).is_err());
        let ok = [
            (USER_OBJ, 6, NO_ID),
            (GROUP_OBJ, 4, NO_ID),
            (OTHER, 0, NO_ID),
        ];
        assert!(Acl::parse(&value(&ok)).unwrap().is_some());
        let mut v = value(&ok);
        v.push(0);
        assert!(Acl::parse(&v).is_err(), "partial entry");
        // Out of order, repeated, missing, bad bits, named without mask.
        for bad in [
            &[
                (GROUP_OBJ, 4, NO_ID),
                (USER_OBJ, 6, NO_ID),
                (OTHER, 0, NO_ID),
            ][..],
            &[
                (USER_OBJ, 6, NO_ID),
                (USER_OBJ, 6, NO_ID),
                (GROUP_OBJ, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ],
            &[(USER_OBJ, 6, NO_ID), (OTHER, 0, NO_ID)],
            &[
                (USER_OBJ, 8, NO_ID),
                (GROUP_OBJ, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ],
            &[
                (USER_OBJ, 6, NO_ID),
                (USER, 4, 1000),
                (GROUP_OBJ, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ],
            &[
                (USER_OBJ, 6, NO_ID),
                (GROUP_OBJ, 4, NO_ID),
                (OTHER, 0, NO_ID),
                (0x40, 0, 0),
            ],
        ] {
            assert!(Acl::parse(&value(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mode_and_chmod() {
        // u::rw-, u:1000:r--, g::---, m::r--, o::--- is mode 0640.
        let mut a = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, 1000),
            (GROUP_OBJ, 0, 0),
            (MASK, 4, 0),
            (OTHER, 0, 0),
        ]);
        assert!(a.extended());
        assert_eq!(a.mode_bits(), 0o640);
        // Unnamed ids are written as u32::MAX whatever they were.
        assert_eq!(
            a.encode(),
            value(&[
                (USER_OBJ, 6, NO_ID),
                (USER, 4, 1000),
                (GROUP_OBJ, 0, NO_ID),
                (MASK, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ])
        );
        a.chmod(0o705);
        assert_eq!(a.mode_bits(), 0o705);
        assert_eq!(a.perm(GROUP_OBJ), 0, "the mask moves, not the group");
        let mut plain = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 5, 0)]);
        assert!(!plain.extended());
        plain.chmod(0o640);
        assert_eq!(plain.mode_bits(), 0o640);
    }

    #[test]
    fn inheritance() {
        let dir = libc::S_IFDIR;
        let file = libc::S_IFREG;
        // No default ACL: the umask.
        let got = inherit(None, file | 0o666, 0o022).unwrap();
        assert_eq!(
            (got.mode, got.access, got.default),
            (file | 0o644, None, None)
        );
        // A default ACL with a named user: the umask is ignored.
        let def = value(&[
            (USER_OBJ, 7, NO_ID),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, NO_ID),
            (MASK, 7, NO_ID),
            (OTHER, 0, NO_ID),
        ]);
        let got = inherit(Some(&def), file | 0o666, 0o077).unwrap();
        assert_eq!(got.mode, file | 0o660);
        assert_eq!(
            got.access,
            Some(value(&[
                (USER_OBJ, 6, NO_ID),
                (USER, 7, 1000),
                (GROUP_OBJ, 5, NO_ID),
                (MASK, 6, NO_ID),
                (OTHER, 0, NO_ID),
            ]))
        );
        assert_eq!(got.default, None);
        let got = inherit(Some(&def), dir | 0o2777, 0o077).unwrap();
        assert_eq!(got.mode, dir | 0o2770);
        assert_eq!(got.access.as_ref(), Some(&def));
        assert_eq!(got.default, Some(def.clone()));
        // A minimal default ACL gives mode bits only (but is inherited).
        let min = value(&[
            (USER_OBJ, 7, NO_ID),
            (GROUP_OBJ, 5, NO_ID),
            (OTHER, 1, NO_ID),
        ]);
        let got = inherit(Some(&min), dir | 0o777, 0).unwrap();
        assert_eq!((got.mode, got.access), (dir | 0o751, None));
        assert_eq!(got.default, Some(min));
        // Symbolic links take nothing.
        let got = inherit(Some(&def), libc::S_IFLNK | 0o777, 0o022).unwrap();
        assert_eq!(got.mode, libc::S_IFLNK | 0o777);
        assert!(inherit(Some(b"junk"), file | 0o666, 0).is_err());
    }
}

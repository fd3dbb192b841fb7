//! Inode flags (what `chattr` changes): no-COW, compression, immutable,
//! append-only and the rest, with btrfs's rules for switching them.

use super::inode::{FileKind, InodeId};
use super::open::Filesystem;
use super::props::COMPRESSION_PROP;
use crate::data::compression::Compression;
use crate::format::consts::*;
use crate::{Error, Result};

/// Flags a caller may set or clear.
pub const SETTABLE_FLAGS: u64 = INODE_NODATACOW
    | INODE_NODATASUM
    | INODE_NOCOMPRESS
    | INODE_COMPRESS
    | INODE_SYNC
    | INODE_IMMUTABLE
    | INODE_APPEND
    | INODE_NODUMP
    | INODE_NOATIME
    | INODE_DIRSYNC;

/// What an inode's flags let change, as the kernel's VFS checks them
/// (the FUSE kernel leaves it to the filesystem).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Allowed {
    /// Nothing: only an inode neither immutable nor append-only changes.
    Nothing,
    /// Only growth: an append-only file may gain data at its end and new
    /// times, an append-only directory new entries.
    Growth,
    /// Anything: the flags were checked when the file was opened
    /// ([`Filesystem::check_open_for_write`]).
    Anything,
}

impl Filesystem {
    /// Refuse (`NotPermitted`) `what` to inode `id`, whose item is `item`,
    /// if it is immutable, or append-only and `allowed` is not
    /// [`Allowed::Growth`]: an immutable inode changes in no way (data,
    /// attributes, xattrs, names, a directory's entries), an append-only
    /// one only grows.
    pub(crate) fn check_fixed(
        &self,
        id: InodeId,
        item: &crate::format::items::InodeItem,
        allowed: Allowed,
        what: &str,
    ) -> Result<()> {
        let fixed = if allowed == Allowed::Anything {
            return Ok(());
        } else if item.flags & INODE_IMMUTABLE != 0 {
            "immutable"
        } else if item.flags & INODE_APPEND != 0 && allowed == Allowed::Nothing {
            "append-only"
        } else {
            return Ok(());
        };
        Err(Error::NotPermitted(format!(
            "{what}: inode {} in subvolume {} is {fixed}",
            id.ino, id.subvol
        )))
    }

    /// [`Filesystem::check_fixed`] of inode `id` (a placeholder is never
    /// fixed).
    pub(crate) fn check_fixed_id(&self, id: InodeId, allowed: Allowed, what: &str) -> Result<()> {
        if id.is_placeholder() {
            return Ok(());
        }
        self.check_fixed(id, &self.inode_item(id)?, allowed, what)
    }

    /// Whether file `id` may be opened for writing (`append`: with
    /// `O_APPEND`), as the kernel decides at open: never an immutable or
    /// fs-verity file, an append-only one only to append. A write through
    /// a file so opened is not checked again ([`Filesystem::write`]).
    pub fn check_open_for_write(&self, id: InodeId, append: bool) -> Result<()> {
        if id.is_placeholder() {
            return Ok(());
        }
        let item = self.inode_item(id)?;
        super::open::check_not_verity(id, &item)?;
        let allowed = if append {
            Allowed::Growth
        } else {
            Allowed::Nothing
        };
        self.check_fixed(id, &item, allowed, "open for writing")
    }

    /// Replace the settable flags of `id` with `flags`. No-COW can only be
    /// switched on a directory (new files inherit it) or an empty file, and
    /// brings no-checksum with it, as in the kernel.
    pub fn set_flags(&self, id: InodeId, flags: u64) -> Result<u64> {
        self.change("setting inode flags", || {
            if flags & !SETTABLE_FLAGS != 0 {
                return Err(Error::Unsupported(format!(
                    "inode flags {:#x}",
                    flags & !SETTABLE_FLAGS
                )));
            }
            if id.is_placeholder() {
                return Err(Error::ReadOnly(
                    "placeholder of an unreachable subvolume".into(),
                ));
            }
            let mut w = self.writer()?;
            let st = self.stat(id)?;
            let old = st.flags;
            let mut new = (old & !SETTABLE_FLAGS) | flags;
            if (old ^ new) & INODE_NODATACOW != 0 {
                let empty = st.size == 0 && !self.delalloc().has(id);
                if st.kind == FileKind::File && !empty {
                    return Err(Error::Invalid(
                        "no-COW can only change on an empty file".into(),
                    ));
                }
                if new & INODE_NODATACOW != 0 {
                    new |= INODE_NODATASUM;
                } else {
                    new &= !INODE_NODATASUM;
                }
            }
            if new & INODE_COMPRESS != 0 && new & INODE_NOCOMPRESS != 0 {
                return Err(Error::Invalid("compress and nocompress together".into()));
            }
            // The kernel refuses no-COW with either compression flag (and
            // lets no-checksum alone be).
            if new & (INODE_COMPRESS | INODE_NOCOMPRESS) != 0 && new & INODE_NODATACOW != 0 {
                return Err(Error::Invalid("no-COW with compress or nocompress".into()));
            }
            let now = crate::format::items::Timespec::now();
            let item = self.change_inode(&mut w, id, |i| {
                i.flags = new;
                i.ctime = now;
            })?;
            // As in the kernel: the compress flag brings the compression
            // property, named for the mount's algorithm (zlib without
            // one), even over another; without the flag the property goes.
            if new & INODE_COMPRESS != 0 {
                let kind = w
                    .compress
                    .map(|(k, _)| k)
                    .filter(|&k| k != Compression::None)
                    .unwrap_or(Compression::Zlib);
                self.put_xattr(&mut w, id, COMPRESSION_PROP, kind.name().as_bytes(), 0)?;
            } else {
                self.delete_xattr(&mut w, id, COMPRESSION_PROP)?;
            }
            Ok(item.flags)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::format::Key;
    use crate::format::consts::*;
    use crate::test_fs::TestFs;

    fn refused<T: std::fmt::Debug>(r: crate::Result<T>, what: &str, fixed: &str) {
        match r {
            Err(Error::NotPermitted(m)) => assert!(m.contains(fixed), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
    }

    /// Immutable and append-only inodes refuse what the kernel's VFS
    /// refuses them (the FUSE kernel leaves that to the filesystem), and
    /// a refusal changes nothing.
    #[test]
    fn immutable_and_append_only_inodes_refuse_changes() {
        use crate::fs::{FileKind, NewInode, SetAttr};
        let t = TestFs::new();
        let fs = t.fs();
        let top = fs.root();
        let new = |dir, name: &[u8], mode| {
            let n = NewInode {
                mode,
                uid: 0,
                gid: 0,
                rdev: 0,
            };
            fs.create(dir, name, n).unwrap().id
        };
        let i = t.file(b"i", b"fixed\n");
        let a = t.file(b"a", b"first\n");
        let di = new(top, b"di", libc::S_IFDIR | 0o755);
        let da = new(top, b"da", libc::S_IFDIR | 0o755);
        new(di, b"x", libc::S_IFREG | 0o644);
        new(da, b"x", libc::S_IFREG | 0o644);
        fs.set_flags(i, INODE_IMMUTABLE).unwrap();
        fs.set_flags(di, INODE_IMMUTABLE).unwrap();
        fs.set_flags(a, INODE_APPEND).unwrap();
        fs.set_flags(da, INODE_APPEND).unwrap();
        let file = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        let chmod = SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        let times = SetAttr {
            mtime: Some(crate::format::items::Timespec::now()),
            ..Default::default()
        };
        for (id, fixed) in [(i, "immutable"), (a, "append-only")] {
            refused(fs.truncate(id, 1), "truncate", fixed);
            refused(fs.setattr(id, chmod), "chmod", fixed);
            refused(fs.set_xattr(id, b"user.x", b"1", 0), "setxattr", fixed);
            refused(fs.link(id, top, b"another"), "link", fixed);
            refused(
                fs.fallocate(
                    id,
                    libc::FALLOC_FL_KEEP_SIZE as u32 | libc::FALLOC_FL_PUNCH_HOLE as u32,
                    0,
                    1,
                ),
                "punch",
                fixed,
            );
            refused(fs.clone_range(i, 0, id, 0, 4096), "clone into", fixed);
        }
        for (name, fixed) in [(&b"i"[..], "immutable"), (b"a", "append-only")] {
            refused(fs.unlink(top, name), "unlink", fixed);
            refused(fs.rename(top, name, top, b"moved", 0), "rename", fixed);
        }
        // Immutable: never opened for writing, no times.
        refused(
            fs.check_open_for_write(i, true),
            "open to append",
            "immutable",
        );
        refused(
            fs.check_open_for_write(i, false),
            "open to write",
            "immutable",
        );
        refused(fs.setattr(i, times), "times of immutable", "immutable");
        // Append-only: opened to append only, and new times.
        refused(
            fs.check_open_for_write(a, false),
            "open to write",
            "append-only",
        );
        fs.check_open_for_write(a, true).unwrap();
        fs.write(a, 0, b"first\nsecond\n").unwrap();
        fs.write(a, 13, b"\nthird").unwrap();
        fs.setattr(a, times).unwrap();
        // Set-ID bits go, as any write by another user drops them; an
        // explicit mode, or a size even the same, does not.
        let a_mode = fs.stat(a).unwrap().mode & 0o7777;
        let drop = SetAttr {
            mode: Some(a_mode),
            drops_set_id: true,
            ..Default::default()
        };
        refused(
            fs.setattr(
                a,
                SetAttr {
                    mode: Some(a_mode | libc::S_ISUID),
                    ..drop
                },
            ),
            "set-ID",
            "append-only",
        );
        fs.setattr(a, drop).unwrap();
        refused(
            fs.setattr(
                a,
                SetAttr {
                    size: Some(fs.stat(a).unwrap().size),
                    ..Default::default()
                },
            ),
            "same size",
            "append-only",
        );
        fs.fallocate(a, libc::FALLOC_FL_KEEP_SIZE as u32, 0, 100)
            .unwrap();
        assert_eq!(fs.read(a, 0, 100).unwrap(), b"first\nsecond\n\nthird");
        // Directories: an immutable one takes no names and gives none, an
        // append-only one takes them and gives none.
        refused(
            fs.create(di, b"new", file),
            "create in immutable",
            "immutable",
        );
        refused(fs.unlink(di, b"x"), "unlink in immutable", "immutable");
        refused(
            fs.create_subvolume(di, b"sv", 0, 0),
            "subvolume in immutable",
            "immutable",
        );
        fs.create(da, b"new", file).unwrap();
        fs.mkdir(da, b"sub", 0o755, 0, 0).unwrap();
        refused(fs.unlink(da, b"x"), "unlink in append-only", "append-only");
        refused(fs.rmdir(da, b"sub"), "rmdir in append-only", "append-only");
        refused(
            fs.rename(da, b"x", top, b"out", 0),
            "rename out",
            "append-only",
        );
        refused(
            fs.rename(top, b"a", da, b"x", 0),
            "replace in append-only",
            "append-only",
        );
        let plain = t.file(b"plain", b"p");
        refused(
            fs.rename(top, b"plain", top, b"i", 0),
            "replace immutable",
            "immutable",
        );
        fs.rename(top, b"plain", da, b"plain", 0).unwrap();
        refused(fs.rmdir(top, b"di"), "rmdir of immutable", "immutable");
        assert!(fs.aborted().is_none(), "a refusal is no abort");
        // What was opened before stays writable (the flags are checked at
        // open, as in the kernel).
        fs.write(i, 0, b"F").unwrap();
        // Cleared, everything goes again.
        fs.set_flags(i, 0).unwrap();
        fs.set_flags(di, 0).unwrap();
        fs.set_flags(a, 0).unwrap();
        fs.set_flags(da, 0).unwrap();
        fs.write(a, 0, b"F").unwrap();
        fs.unlink(top, b"i").unwrap();
        fs.unlink(di, b"x").unwrap();
        fs.unlink(da, b"plain").unwrap();
        assert_eq!(fs.stat(plain).map(|s| s.kind).ok(), None::<FileKind>);
        fs.commit().unwrap();
    }

    /// An fs-verity file (flag and Merkle items as the kernel leaves them;
    /// this kernel may lack fs-verity) is read, cloned from and deleted,
    /// never changed.
    #[test]
    fn a_verity_file_keeps_its_data() {
        let t = TestFs::new();
        let fs = t.fs();
        let data = vec![7u8; 20_000];
        let v = t.file(b"v", &data);
        let other = t.file(b"other", &vec![1u8; 8192]);
        let mut inode = t.inode(v);
        inode.flags |= INODE_RO_VERITY;
        t.put(
            v.subvol,
            Key::new(v.ino, INODE_ITEM_KEY, 0),
            inode.to_bytes(),
        );
        t.put(
            v.subvol,
            Key::new(v.ino, VERITY_DESC_ITEM_KEY, 0),
            vec![0u8; 64],
        );
        t.put(
            v.subvol,
            Key::new(v.ino, VERITY_MERKLE_ITEM_KEY, 0),
            vec![0u8; 4096],
        );
        fs.commit().unwrap();
        let verity = "fs-verity";
        refused(fs.check_open_for_write(v, true), "open", verity);
        refused(fs.write(v, 0, b"x"), "write", verity);
        refused(fs.write(v, 20_000, b"x"), "append", verity);
        refused(fs.truncate(v, 100), "truncate", verity);
        refused(fs.fallocate(v, 0, 0, 100_000), "fallocate", verity);
        refused(
            fs.clone_range(other, 0, v, 0, 4096),
            "clone into it",
            verity,
        );
        assert!(fs.aborted().is_none(), "a refusal is no abort");
        fs.clone_range(v, 0, other, 0, 4096).unwrap();
        assert_eq!(fs.read(v, 0, 30_000).unwrap(), data);
        assert_eq!(fs.read(other, 0, 4096).unwrap(), vec![7u8; 4096]);
        // Other flags change and leave it a verity file.
        fs.set_flags(v, INODE_NOATIME).unwrap();
        assert_ne!(t.inode(v).flags & INODE_RO_VERITY, 0);
        // Deleted with its Merkle items.
        fs.unlink(fs.root(), b"v").unwrap();
        fs.commit().unwrap();
        let tree = fs.fs_tree(v.subvol).unwrap();
        let left: Vec<Key> = tree
            .range(Key::new(v.ino, 0, 0), Key::new(v.ino, u8::MAX, u64::MAX))
            .unwrap()
            .map(|it| it.unwrap().key())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

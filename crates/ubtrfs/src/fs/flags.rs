//! Inode flags (what `chattr` changes): no-COW, compression, immutable,
//! append-only and the rest, with btrfs's rules for switching them.

use super::inode::{FileKind, InodeId};
use super::open::Filesystem;
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

impl Filesystem {
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
            let now = crate::format::items::Timespec::now();
            let item = self.change_inode(&mut w, id, |i| {
                i.flags = new;
                i.ctime = now;
            })?;
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
        let refused = |r: crate::Result<()>, what: &str| match r {
            Err(Error::NotPermitted(m)) => assert!(m.contains("fs-verity"), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        };
        refused(fs.write(v, 0, b"x").map(|_| ()), "write");
        refused(fs.write(v, 20_000, b"x").map(|_| ()), "append");
        refused(fs.truncate(v, 100), "truncate");
        refused(fs.fallocate(v, 0, 0, 100_000), "fallocate");
        refused(fs.clone_range(other, 0, v, 0, 4096), "clone into it");
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

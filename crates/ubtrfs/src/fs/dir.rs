//! Directories: name lookup through the name hash, listing by index,
//! parents, and the links into other subvolumes.

use super::inode::{DirEntry, FileKind, InodeId, Stat};
use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, InodeRef, RootRef, Timespec};
use crate::{Error, Result};

/// The name hash of DIR_ITEM and XATTR_ITEM keys: CRC32C seeded with
/// !1 and without the final inversion.
pub fn name_hash(name: &[u8]) -> u64 {
    // crc32c_append inverts on entry and exit; undo both to get the raw register.
    !crc32c::crc32c_append(1, name) as u64
}

/// Attributes of the placeholder directory for an unreachable subvolume link.
/// Its times are when the filesystem was opened, as the kernel shows the
/// time the placeholder was made.
pub(crate) fn empty_subvol_dir_stat(id: InodeId, now: Timespec) -> Stat {
    Stat {
        id,
        kind: FileKind::Dir,
        mode: libc::S_IFDIR | 0o755,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 0,
        nbytes: 0,
        rdev: 0,
        flags: 0,
        atime: now,
        mtime: now,
        ctime: now,
        otime: now,
        generation: 0,
    }
}

fn kind_of(file_type: u8) -> Result<FileKind> {
    Ok(match file_type {
        FT_REG_FILE => FileKind::File,
        FT_DIR => FileKind::Dir,
        FT_CHRDEV => FileKind::CharDev,
        FT_BLKDEV => FileKind::BlockDev,
        FT_FIFO => FileKind::Fifo,
        FT_SOCK => FileKind::Socket,
        FT_SYMLINK => FileKind::Symlink,
        t => return Err(Error::corrupt(format!("directory entry of type {t}"))),
    })
}

impl Filesystem {
    fn dir_check(&self, dir: InodeId) -> Result<()> {
        if dir.is_placeholder() {
            return Ok(());
        }
        let st = self.stat(dir)?;
        if st.kind != FileKind::Dir {
            return Err(Error::NotDir(format!(
                "inode {} in subvolume {}",
                dir.ino, dir.subvol
            )));
        }
        Ok(())
    }

    /// Turn an on-disk entry of directory `dir` into a [`DirEntry`],
    /// following subvolume links.
    fn entry(&self, dir: InodeId, d: DirItem, index: u64) -> Result<DirEntry> {
        let id = if d.location.item_type == ROOT_ITEM_KEY {
            self.subvol_link_target(dir, d.location.objectid, &d.name)?
        } else {
            InodeId {
                subvol: dir.subvol,
                ino: d.location.objectid,
            }
        };
        Ok(DirEntry {
            kind: kind_of(d.file_type)?,
            name: d.name,
            id,
            index,
        })
    }

    /// Where a subvolume link named `name` in `dir` leads: the subvolume's
    /// root, if its ROOT_REF confirms the link, else an empty placeholder.
    fn subvol_link_target(&self, dir: InodeId, child: u64, name: &[u8]) -> Result<InodeId> {
        let r = self
            .root_tree()
            .get(&Key::new(dir.subvol, ROOT_REF_KEY, child))?;
        if let Some(r) = r {
            let rr = RootRef::parse(r.data())?;
            if rr.dirid == dir.ino && rr.name == name {
                let root_dirid = self
                    .find_root(child)?
                    .map(|(_, item)| item.root_dirid)
                    .unwrap_or(FIRST_INODE);
                return Ok(InodeId {
                    subvol: child,
                    ino: root_dirid,
                });
            }
        }
        Ok(InodeId::placeholder(dir.subvol, child))
    }

    /// Look `name` up in directory `dir`.
    pub fn lookup(&self, dir: InodeId, name: &[u8]) -> Result<DirEntry> {
        self.dir_check(dir)?;
        self.check_live_dir(dir)?;
        self.find_name(dir, name)
    }

    /// [`Filesystem::lookup`] in a `dir` the caller knows is a directory.
    pub(crate) fn find_name(&self, dir: InodeId, name: &[u8]) -> Result<DirEntry> {
        super::namespace::check_name_len(name)?;
        let missing = || Error::NotFound(String::from_utf8_lossy(name).into_owned());
        if dir.is_placeholder() {
            return Err(missing());
        }
        let tree = self.fs_tree(dir.subvol)?;
        let item = tree
            .get(&Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name)))?
            .ok_or_else(missing)?;
        for d in DirItem::parse_all(item.data())? {
            if d.name == name {
                // DIR_ITEM does not carry the index; readdir cookies come from DIR_INDEX.
                return self.entry(dir, d, 0);
            }
        }
        Err(missing())
    }

    /// Entries of `dir` whose index is above `after_index`, by index.
    pub fn read_dir(&self, dir: InodeId, after_index: u64) -> Result<Vec<DirEntry>> {
        self.read_dir_up_to(dir, after_index, usize::MAX)
    }

    /// The end of `dir`'s entry indexes: every entry it has now has a
    /// lower index, every entry added later a higher one. A listing that
    /// stops there ends even while entries are renamed in the directory
    /// (each rename gives a name a new index), as the kernel's does.
    pub fn dir_index_end(&self, dir: InodeId) -> Result<u64> {
        let tree = self.fs_tree(dir.subvol)?;
        Ok(tree
            .get_le(&Key::new(dir.ino, DIR_INDEX_KEY, u64::MAX))?
            .map(|it| it.key())
            .filter(|k| k.objectid == dir.ino && k.item_type == DIR_INDEX_KEY)
            .map_or(2, |k| k.offset.saturating_add(1)))
    }

    /// Like [`Filesystem::read_dir`], at most `limit` entries: a listing
    /// read a page at a time costs each page, not the rest of the
    /// directory.
    pub fn read_dir_up_to(
        &self,
        dir: InodeId,
        after_index: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>> {
        self.dir_check(dir)?;
        self.check_live_dir(dir)?;
        if dir.is_placeholder() {
            return Ok(Vec::new());
        }
        let tree = self.fs_tree(dir.subvol)?;
        // Sized up front: growing it copies every entry read so far.
        let mut out = Vec::with_capacity(limit.min(1024));
        let Some(start) = after_index.checked_add(1) else {
            return Ok(out);
        };
        for item in tree.range(
            Key::new(dir.ino, DIR_INDEX_KEY, start),
            Key::new(dir.ino, DIR_INDEX_KEY, u64::MAX),
        )? {
            let item = item?;
            let index = item.key().offset;
            for d in DirItem::parse_all(item.data())? {
                out.push(self.entry(dir, d, index)?);
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The parent directory of `dir` (".."); a subvolume's root leads to
    /// the directory holding its link; the filesystem root is its own parent.
    pub fn parent(&self, dir: InodeId) -> Result<InodeId> {
        let root = self.root();
        // The placeholder does not record where it was linked; ".." goes to the root.
        if dir == root || dir.is_placeholder() {
            return Ok(root);
        }
        if dir.ino == FIRST_INODE {
            // A subvolume root: follow its ROOT_BACKREF.
            if dir.subvol == FS_TREE_OBJECTID {
                return Ok(dir);
            }
            let back = self
                .root_tree()
                .items_of(dir.subvol, ROOT_BACKREF_KEY)?
                .next()
                .transpose()?;
            return match back {
                Some(item) => {
                    let rr = RootRef::parse(item.data())?;
                    Ok(InodeId {
                        subvol: item.key().offset,
                        ino: rr.dirid,
                    })
                }
                None => Ok(root),
            };
        }
        let refs = self.inode_refs(dir)?;
        let first = refs.first().ok_or_else(|| {
            Error::corrupt(format!(
                "directory {} in subvolume {} has no name",
                dir.ino, dir.subvol
            ))
        })?;
        Ok(InodeId {
            subvol: dir.subvol,
            ino: first.parent,
        })
    }

    /// Every name of inode `id`: (parent directory, index, name).
    pub fn inode_refs(&self, id: InodeId) -> Result<Vec<InodeRef>> {
        let tree = self.fs_tree(id.subvol)?;
        let mut out = Vec::new();
        for item in tree.items_of(id.ino, INODE_REF_KEY)? {
            let item = item?;
            out.extend(InodeRef::parse_refs(item.data(), item.key().offset)?);
        }
        for item in tree.items_of(id.ino, INODE_EXTREF_KEY)? {
            out.extend(InodeRef::parse_extrefs(item?.data())?);
        }
        Ok(out)
    }

    /// The inode at absolute `path` ("/" is [`Filesystem::root`]).
    pub fn resolve_path(&self, path: &[u8]) -> Result<InodeId> {
        let mut cur = self.root();
        for part in path.split(|&c| c == b'/') {
            match part {
                b"" | b"." => {}
                b".." => cur = self.parent(cur)?,
                name => cur = self.lookup(cur, name)?.id,
            }
        }
        Ok(cur)
    }
}

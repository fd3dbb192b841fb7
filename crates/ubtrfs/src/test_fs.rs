//! A small filesystem on a temporary file, for unit tests that need a real
//! one, and ways to plant damaged items in it.

use crate::Result;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{FileExtentItem, InodeItem};
use crate::fs::{Filesystem, InodeId, NewInode};
use crate::mkfs::{MkfsOptions, make_filesystem_at};
use std::path::PathBuf;

/// A fresh filesystem, read-write; the directory holding its image lives
/// as long as it does.
pub(crate) struct TestFs {
    fs: Option<Filesystem>,
    img: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestFs {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("fs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        make_filesystem_at(&[&img], &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        TestFs {
            fs: Some(fs),
            img,
            _dir: dir,
        }
    }

    /// The open filesystem.
    pub fn fs(&self) -> &Filesystem {
        self.fs.as_ref().expect("the filesystem failed to reopen")
    }

    /// The image file.
    pub fn image(&self) -> &std::path::Path {
        &self.img
    }

    /// Commit, close and open the image again, read-write.
    pub fn reopen(&mut self) -> Result<()> {
        if let Some(fs) = self.fs.take() {
            fs.commit()?;
        }
        self.fs = Some(Filesystem::open_read_write(&[&self.img])?);
        Ok(())
    }

    /// Close without committing and open the image again, read-write:
    /// what the last commit wrote is what comes back.
    pub fn reopen_uncommitted(&mut self) -> Result<()> {
        drop(self.fs.take());
        self.fs = Some(Filesystem::open_read_write(&[&self.img])?);
        Ok(())
    }

    /// A new regular file `name` in the top directory, holding `data`,
    /// committed.
    pub fn file(&self, name: &[u8], data: &[u8]) -> InodeId {
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        let id = self.fs().create(self.fs().root(), name, new).unwrap().id;
        self.fs().write(id, 0, data).unwrap();
        self.fs().commit().unwrap();
        id
    }

    /// The file extent item of `id` at file offset `at`.
    pub fn extent(&self, id: InodeId, at: u64) -> FileExtentItem {
        let key = Key::new(id.ino, EXTENT_DATA_KEY, at);
        let it = self.fs().fs_tree(id.subvol).unwrap().get(&key).unwrap();
        FileExtentItem::parse(it.unwrap().data()).unwrap()
    }

    /// The inode item of `id`.
    pub fn inode(&self, id: InodeId) -> InodeItem {
        let key = Key::new(id.ino, INODE_ITEM_KEY, 0);
        let it = self.fs().fs_tree(id.subvol).unwrap().get(&key).unwrap();
        InodeItem::parse(it.unwrap().data()).unwrap()
    }

    /// Overwrite (or add) the item `key` of tree `tree` in the running
    /// transaction, as damage would.
    pub fn put(&self, tree: u64, key: Key, data: Vec<u8>) {
        let mut w = self.fs().lock_writer().unwrap();
        self.fs()
            .modify_tree(&mut w, tree, |ed, root| ed.put(root, key, data))
            .unwrap();
    }

    /// Damage the file extent item of `id` at file offset `at`: it now
    /// says its part starts `offset` bytes into its disk extent.
    pub fn skew_extent(&self, id: InodeId, at: u64, offset: u64) {
        let mut fe = self.extent(id, at);
        let crate::format::items::ExtentBody::Regular { offset: o, .. } = &mut fe.body else {
            panic!("not a regular extent: {fe:?}");
        };
        *o = offset;
        self.put(
            id.subvol,
            Key::new(id.ino, EXTENT_DATA_KEY, at),
            fe.to_bytes(),
        );
    }
}

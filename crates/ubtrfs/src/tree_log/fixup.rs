//! The last step of a subvolume's replay: every inode the replay touched
//! gets its link count recounted from its back references, and its size
//! (directories: two bytes per name byte) or byte count (files: the bytes
//! their extents cover) recomputed from its items, which is what the
//! kernel's incremental bookkeeping amounts to and what `btrfs check`
//! verifies. An inode left without names becomes an orphan.

use super::replay::Replay;
use crate::Result;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, ExtentBody, FileExtentItem, InodeItem};

impl Replay<'_> {
    /// Fix every inode in the fixup set (which unlinking may grow).
    pub(super) fn run_fixups(&mut self) -> Result<()> {
        while let Some(ino) = self.fixup.pop_first() {
            self.fix_inode(ino)?;
        }
        Ok(())
    }

    fn fix_inode(&mut self, ino: u64) -> Result<()> {
        let Some(before) = self.inode(ino)? else {
            return Ok(());
        };
        let mut item = before.clone();
        let is_dir = item.mode & libc::S_IFMT == libc::S_IFDIR;
        let names = self.all_names(ino)?.len() as u32;
        if names == 0 {
            if is_dir {
                // A directory that lost its name loses its entries too.
                let mut children = Vec::new();
                for it in self.tree()?.items_of(ino, DIR_INDEX_KEY)? {
                    for d in DirItem::parse_all(it?.data())? {
                        if d.location.item_type == INODE_ITEM_KEY {
                            children.push(d.name);
                        }
                    }
                }
                for name in children {
                    self.unlink(ino, &name)?;
                }
                self.fixup.remove(&ino);
            }
            let key = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino);
            self.edit(|ed, root| ed.put(root, key, Vec::new()))?;
        }
        item.nlink = names;
        if is_dir {
            item.size = self.dir_size(ino)?;
        } else {
            item.nbytes = self.nbytes(ino)?;
        }
        if item != before {
            item.transid = self.w.blocks.transid;
            self.put_inode(ino, &item)?;
        }
        Ok(())
    }

    fn put_inode(&mut self, ino: u64, item: &InodeItem) -> Result<()> {
        let bytes = item.to_bytes();
        self.edit(|ed, root| ed.put(root, Key::new(ino, INODE_ITEM_KEY, 0), bytes))
    }

    /// Two bytes per byte of every name in directory `dir`.
    fn dir_size(&self, dir: u64) -> Result<u64> {
        let mut size = 0;
        for it in self.tree()?.items_of(dir, DIR_INDEX_KEY)? {
            for d in DirItem::parse_all(it?.data())? {
                size += 2 * d.name.len() as u64;
            }
        }
        Ok(size)
    }

    /// Bytes of file `ino` its extents hold: inline bytes, and the file
    /// range of every extent that is not a hole.
    fn nbytes(&self, ino: u64) -> Result<u64> {
        let mut n = 0;
        for it in self.tree()?.items_of(ino, EXTENT_DATA_KEY)? {
            let fe = FileExtentItem::parse(it?.data())?;
            let bytes = match fe.body {
                ExtentBody::Inline(_) => fe.ram_bytes,
                ExtentBody::Regular {
                    disk_bytenr,
                    num_bytes,
                    ..
                } if disk_bytenr != 0 => num_bytes,
                ExtentBody::Regular { .. } => 0,
            };
            n = u64::checked_add(n, bytes).ok_or_else(|| {
                crate::Error::corrupt(format!(
                    "the extents of inode {ino} hold more than 2^64 bytes"
                ))
            })?;
        }
        Ok(n)
    }
}

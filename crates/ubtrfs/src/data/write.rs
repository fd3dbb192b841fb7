//! The write path, in its first form: a write is copied into new data
//! extents at once (copy-on-write, sector-aligned, checksummed), the
//! file extent items it replaces are trimmed or dropped with their
//! references, and small files live inline in their extent item.
//!
//! Later the pipeline of DESIGN.md layer 8 (delalloc, ordered extents,
//! offloaded checksums) replaces the synchronous copy; the items written
//! stay the same.

use crate::alloc::delayed_ref::DataOwner;
use crate::csum_tree;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, Timespec};
use crate::fs::{FileKind, Filesystem, InodeId};
use crate::transaction::Writer;
use crate::{Error, Result};

/// Files up to this size are stored inline, like the kernel's default
/// `max_inline`.
pub const MAX_INLINE: u64 = 2048;
/// Largest data extent the kernel creates.
const MAX_EXTENT: u64 = 128 << 20;

impl Filesystem {
    /// Write `data` at `offset` of file `id`; returns the bytes written.
    pub fn write(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let mut w = self.writer()?;
        let inode = self.inode_item(id)?;
        match FileKind::from_mode(inode.mode) {
            Some(FileKind::File) => {}
            Some(FileKind::Dir) => return Err(Error::IsDir(format!("inode {}", id.ino))),
            _ => {
                return Err(Error::Invalid(format!(
                    "write to inode {} that is not a regular file",
                    id.ino
                )));
            }
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| Error::Invalid("write past the largest file size".into()))?;
        let new_size = inode.size.max(end);
        let ss = self.geometry().sectorsize as u64;
        let now = Timespec::now();
        let inline_now = self.has_inline(id)?;
        if new_size <= MAX_INLINE
            && new_size < ss
            && (inline_now || inode.size == 0)
            && !self.has_regular(id)?
        {
            // Rewrite the whole (small) file as one inline extent.
            let mut content = self.read(id, 0, inode.size as usize)?;
            content.resize(new_size as usize, 0);
            content[offset as usize..end as usize].copy_from_slice(data);
            let removed = self.drop_range(&mut w, id, 0, u64::MAX)?;
            self.insert_inline(&mut w, id, &content)?;
            self.change_inode(&mut w, id, |i| {
                i.size = new_size;
                i.nbytes = i.nbytes.saturating_sub(removed) + new_size;
                i.mtime = now;
                i.ctime = now;
            })?;
            return Ok(data.len());
        }
        // Regular extents: widen to whole sectors, keeping the bytes around the write.
        // An inline extent is folded into the new regular extent, from offset 0.
        let a_start = if inline_now { 0 } else { offset / ss * ss };
        let a_end = end.div_ceil(ss) * ss;
        let mut buf = vec![0u8; (a_end - a_start) as usize];
        let head = (offset - a_start) as usize;
        if head > 0 || end < a_end {
            let old = self.read(id, a_start, buf.len())?;
            buf[..old.len()].copy_from_slice(&old);
        }
        buf[head..head + data.len()].copy_from_slice(data);
        // Take all the space first: a write that cannot finish changes nothing.
        let pieces = self.reserve_data(&mut w, buf.len() as u64)?;
        let removed = self.drop_range(&mut w, id, a_start, a_end)?;
        if !self.superblock().no_holes() {
            let old_end = inode.size.div_ceil(ss) * ss;
            if a_start > old_end {
                self.insert_hole(&mut w, id, old_end, a_start - old_end)?;
            }
        }
        let added = self.write_extents(&mut w, id, a_start, &buf, &pieces)?;
        self.change_inode(&mut w, id, |i| {
            i.size = new_size;
            i.nbytes = i.nbytes.saturating_sub(removed) + added;
            i.mtime = now;
            i.ctime = now;
        })?;
        Ok(data.len())
    }

    fn extent_items(&self, id: InodeId) -> Result<Vec<(u64, FileExtentItem)>> {
        self.fs_tree(id.subvol)?
            .items_of(id.ino, EXTENT_DATA_KEY)?
            .map(|it| {
                let it = it?;
                Ok((it.key().offset, FileExtentItem::parse(it.data())?))
            })
            .collect()
    }

    fn has_inline(&self, id: InodeId) -> Result<bool> {
        Ok(self
            .fs_tree(id.subvol)?
            .get(&Key::new(id.ino, EXTENT_DATA_KEY, 0))?
            .map(|it| FileExtentItem::parse(it.data()))
            .transpose()?
            .is_some_and(|fe| fe.extent_type == FILE_EXTENT_INLINE))
    }

    fn has_regular(&self, id: InodeId) -> Result<bool> {
        Ok(self
            .extent_items(id)?
            .iter()
            .any(|(_, fe)| matches!(fe.body, ExtentBody::Regular { disk_bytenr, .. } if disk_bytenr != 0)))
    }

    fn insert_inline(&self, w: &mut Writer, id: InodeId, content: &[u8]) -> Result<()> {
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: content.len() as u64,
            compression: COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_INLINE,
            body: ExtentBody::Inline(content.to_vec()),
        };
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, 0), bytes)
        })
    }

    fn insert_hole(&self, w: &mut Writer, id: InodeId, at: u64, len: u64) -> Result<()> {
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: len,
            compression: COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr: 0,
                disk_num_bytes: 0,
                offset: 0,
                num_bytes: len,
            },
        };
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, at), bytes)
        })
    }

    /// Allocate `len` bytes of data space in extents of at most
    /// [`MAX_EXTENT`] bytes, or nothing (ENOSPC) if it is not all there.
    pub(crate) fn reserve_data(&self, w: &mut Writer, len: u64) -> Result<Vec<(u64, u64)>> {
        let mut pieces = Vec::new();
        let mut got = 0;
        while got < len {
            match self.alloc_data_space(w, (len - got).min(MAX_EXTENT)) {
                Ok((s, l)) => {
                    pieces.push((s, l));
                    got += l;
                }
                Err(e) => {
                    for (s, l) in pieces {
                        w.blocks.alloc.release(s, l)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(pieces)
    }

    /// Write `buf` (sector-aligned, at sector-aligned `at`) into the
    /// reserved extents `pieces`, with checksums and file extent items;
    /// returns bytes added.
    fn write_extents(
        &self,
        w: &mut Writer,
        id: InodeId,
        at: u64,
        buf: &[u8],
        pieces: &[(u64, u64)],
    ) -> Result<u64> {
        let geo = self.geometry();
        let ss = geo.sectorsize as u64;
        let nodatasum = self.inode_item(id)?.flags & INODE_NODATASUM != 0;
        let csum_type = self.superblock().csum_type;
        let mut done = 0u64;
        for &(start, len) in pieces {
            let piece = &buf[done as usize..(done + len) as usize];
            // Data reaches the devices before the commit's flush.
            self.tree_reader().volume().write(start, piece)?;
            if !nodatasum {
                let mut sums = Vec::with_capacity((len / ss) as usize * geo.csum_size);
                for sector in piece.chunks(ss as usize) {
                    sums.extend_from_slice(&csum_type.compute(sector)[..geo.csum_size]);
                }
                self.modify_tree(w, CSUM_TREE_OBJECTID, |ed, root| {
                    csum_tree::insert(ed, root, start, &sums, geo.sectorsize, geo.csum_size)
                })?;
            }
            let file_off = at + done;
            let fe = FileExtentItem {
                generation: w.blocks.transid,
                ram_bytes: len,
                compression: COMPRESS_NONE,
                encryption: 0,
                other_encoding: 0,
                extent_type: FILE_EXTENT_REG,
                body: ExtentBody::Regular {
                    disk_bytenr: start,
                    disk_num_bytes: len,
                    offset: 0,
                    num_bytes: len,
                },
            };
            let bytes = fe.to_bytes();
            self.modify_tree(w, id.subvol, |ed, root| {
                ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, file_off), bytes)
            })?;
            let owner = DataOwner {
                root: id.subvol,
                objectid: id.ino,
                offset: file_off,
            };
            w.blocks.refs.change_data(start, len, owner, 1);
            done += len;
        }
        Ok(buf.len() as u64)
    }

    /// Remove the file's extents in `[start, end)`, trimming those that
    /// reach outside it; returns the bytes of real data no longer referenced.
    pub(crate) fn drop_range(
        &self,
        w: &mut Writer,
        id: InodeId,
        start: u64,
        end: u64,
    ) -> Result<u64> {
        let mut removed = 0u64;
        for (key_off, fe) in self.extent_items(id)? {
            let ext_end = key_off.saturating_add(fe.len());
            if ext_end <= start || key_off >= end {
                continue;
            }
            let key = Key::new(id.ino, EXTENT_DATA_KEY, key_off);
            let ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes: _,
            } = fe.body.clone()
            else {
                // Inline extents are dropped whole.
                self.modify_tree(w, id.subvol, |ed, root| ed.delete(root, key))?;
                removed += fe.ram_bytes;
                continue;
            };
            let real = disk_bytenr != 0;
            let owner = DataOwner {
                root: id.subvol,
                objectid: id.ino,
                offset: key_off.wrapping_sub(offset),
            };
            let cut_lo = start.max(key_off);
            let cut_hi = end.min(ext_end);
            if real {
                removed += cut_hi - cut_lo;
            }
            let head = (key_off < start).then(|| {
                let mut h = fe.clone();
                h.body = ExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    num_bytes: start - key_off,
                };
                if !real {
                    h.ram_bytes = start - key_off;
                }
                h
            });
            let tail = (ext_end > end).then(|| {
                let mut t = fe.clone();
                t.body = ExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    offset: offset + (end - key_off),
                    num_bytes: ext_end - end,
                };
                if !real {
                    t.ram_bytes = ext_end - end;
                    t.body = ExtentBody::Regular {
                        disk_bytenr: 0,
                        disk_num_bytes: 0,
                        offset: 0,
                        num_bytes: ext_end - end,
                    };
                }
                t
            });
            let (hb, tb) = (
                head.as_ref().map(|h| h.to_bytes()),
                tail.as_ref().map(|t| t.to_bytes()),
            );
            let keeps_head = hb.is_some();
            let has_tail = tb.is_some();
            self.modify_tree(w, id.subvol, |ed, root| {
                match hb {
                    Some(b) => ed.put(root, key, b)?,
                    None => {
                        ed.delete(root, key)?;
                    }
                }
                if let Some(b) = tb {
                    ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, end), b)?;
                }
                Ok(())
            })?;
            if real {
                let refs_now = keeps_head as i64 + has_tail as i64;
                w.blocks
                    .refs
                    .change_data(disk_bytenr, disk_num_bytes, owner, refs_now - 1);
            }
        }
        Ok(removed)
    }

    /// Drop the reference a file extent item holds (the inode is going away).
    pub(crate) fn drop_extent_ref(
        &self,
        w: &mut Writer,
        id: InodeId,
        key_off: u64,
        item: &[u8],
    ) -> Result<()> {
        let fe = FileExtentItem::parse(item)?;
        if let ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            ..
        } = fe.body
            && disk_bytenr != 0
        {
            let owner = DataOwner {
                root: id.subvol,
                objectid: id.ino,
                offset: key_off.wrapping_sub(offset),
            };
            w.blocks
                .refs
                .change_data(disk_bytenr, disk_num_bytes, owner, -1);
        }
        Ok(())
    }
}

//! Reflinks: [`Filesystem::clone_range`] makes a range of one file share
//! the disk extents of a range of another file (or of the same file), as
//! btrfs's clone does. New file extent items point at the source's
//! extents, each extent gains a data back-reference for its new owner,
//! and no data is copied, except that of inline extents, which live in
//! the metadata of their own file.
//!
//! The rules are btrfs's: sector-aligned offsets, a sector-aligned length
//! except for a range that ends at the source's end of file (its last
//! sector is shared whole, and may only land at or past the end of the
//! destination), no overlap within one file, and the two files must agree
//! on keeping checksums.

use super::write::extent_part;
use crate::alloc::delayed_ref::DataOwner;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, InodeItem, Timespec};
use crate::fs::{Allowed, FileKind, Filesystem, InodeId};
use crate::transaction::Writer;
use crate::{Error, Result};

/// What backs one piece of the source range.
enum Backing {
    /// A disk extent (regular, compressed or preallocated): the item that
    /// maps the piece, already cut to it.
    Extent(FileExtentItem),
    /// Nothing: a hole, explicit or implied.
    Hole,
    /// Bytes of an inline extent (with zeros up to the sector's end),
    /// which are copied.
    Inline(Vec<u8>),
}

/// One piece of the source range.
struct Piece {
    /// Offset from the start of the range.
    at: u64,
    len: u64,
    backing: Backing,
}

impl Filesystem {
    /// Make `[dst_off, dst_off + len)` of regular file `dst` share the
    /// disk extents of `[src_off, src_off + len)` of regular file `src`;
    /// `len` 0 means up to the source's end of file. The destination's
    /// old contents of the range are dropped and it grows if the range
    /// ends past its end; its mtime and ctime are set.
    ///
    /// Both offsets must be multiples of the sector size, and so must
    /// `len` unless the range ends exactly at the source's end of file and
    /// at or past the destination's. Within one file the two ranges must
    /// not overlap. Violations, ranges past the source's end, and files
    /// that disagree on the no-checksum flag are [`Error::Invalid`].
    /// Written data not yet in extents is written back first.
    pub fn clone_range(
        &self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
    ) -> Result<()> {
        self.change("clone", || {
            // No commit is needed for no-COW files: their in-place check
            // counts the new references still pending as delayed refs.
            let mut w = self.writer()?;
            self.clone_locked(&mut w, src, src_off, dst, dst_off, len)?;
            Ok(())
        })
    }

    /// [`Filesystem::clone_range`] inside the transaction.
    fn clone_locked(
        &self,
        w: &mut Writer,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
    ) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let si = clone_file(self, src, false)?;
        let di = clone_file(self, dst, true)?;
        if (si.flags ^ di.flags) & INODE_NODATASUM != 0 {
            return Err(Error::Invalid(format!(
                "clone from inode {} to inode {}: one keeps data checksums and the other does not",
                src.ino, dst.ino
            )));
        }
        if !src_off.is_multiple_of(ss) || !dst_off.is_multiple_of(ss) {
            return Err(Error::Invalid(format!(
                "clone offsets {src_off} and {dst_off} must be multiples of the sector size {ss}"
            )));
        }
        let len = if len == 0 {
            si.size.saturating_sub(src_off)
        } else {
            len
        };
        let src_end = src_off
            .checked_add(len)
            .filter(|&e| e <= si.size)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "clone of {len} bytes at {src_off} reaches past the end of inode {} ({} bytes)",
                    src.ino, si.size
                ))
            })?;
        if len == 0 {
            return Ok(());
        }
        let rlen = len.div_ceil(ss) * ss;
        dst_off
            .checked_add(rlen)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| Error::Invalid("clone past the largest file size".into()))?;
        if !len.is_multiple_of(ss) {
            // Only the source's last sector may be partial, and it must not
            // land inside the destination: its tail past the source's end
            // would show up there.
            if src_end != si.size {
                return Err(Error::Invalid(format!(
                    "clone length {len} must be a multiple of the sector size {ss} unless the range ends at the end of the source"
                )));
            }
            if dst_off + len < di.size {
                return Err(Error::Invalid(format!(
                    "clone of the last, partial sector of inode {} into the middle of inode {}",
                    src.ino, dst.ino
                )));
            }
        }
        if src == dst && src_off < dst_off + rlen && dst_off < src_off + rlen {
            return Err(Error::Invalid(format!(
                "clone within inode {} between overlapping ranges",
                src.ino
            )));
        }

        // Work on what is on disk, checksummed: a clone's extents are
        // never in flight (only their owner's fsync waits for those).
        self.writeback(w, src)?;
        self.finish_in_flight(w, Some(src), true)?;
        if dst != src {
            self.writeback(w, dst)?;
        }
        let now = Timespec::now();
        if dst_off > di.size {
            // The destination first grows to where the range starts, as a
            // truncate would make it: its old last sector zeroed past the
            // end, an inline extent moved out, holes covered.
            // Whole in itself: a clone refused further on (an encoded
            // source extent) leaves a longer file, nothing half done.
            crate::transaction::abort::unit(|| {
                self.truncate_locked(w, dst, dst_off, now, crate::fs::Allowed::Nothing)?;
                self.writeback(w, dst)
            })?;
        }
        if dst_off >= ss && self.inline_at_zero(dst)? {
            // An inline extent only ever starts a file that has nothing
            // else: move it into a regular extent before others join it.
            let mut b = self.read_stored(dst, 0, ss as usize)?;
            b.resize(ss as usize, 0);
            self.delalloc().put(dst, 0, b.into_boxed_slice());
            self.writeback(w, dst)?;
        }
        let transid = w.blocks.transid;
        let pieces = self.clone_pieces(src, src_off, rlen, transid)?;
        let removed = self.drop_range(w, dst, dst_off, dst_off + rlen)?;
        let no_holes = self.superblock().no_holes();
        let mut added = 0;
        let mut copied = Vec::new();
        for p in pieces {
            let at = dst_off + p.at;
            match p.backing {
                Backing::Extent(fe) => {
                    let ExtentBody::Regular {
                        disk_bytenr,
                        disk_num_bytes,
                        offset,
                        ..
                    } = fe.body
                    else {
                        return Err(Error::Invalid("inline extent taken as a disk one".into()));
                    };
                    self.put_extent_item(w, dst, at, &fe)?;
                    let owner = DataOwner {
                        root: dst.subvol,
                        objectid: dst.ino,
                        offset: at.wrapping_sub(offset),
                    };
                    w.blocks
                        .refs
                        .change_data(disk_bytenr, disk_num_bytes, owner, 1);
                    added += p.len;
                }
                Backing::Hole if !no_holes => {
                    let hole = FileExtentItem::hole(transid, p.len);
                    self.put_extent_item(w, dst, at, &hole)?;
                }
                Backing::Hole => {}
                Backing::Inline(bytes) => copied.push((at, bytes)),
            }
        }
        let size = self.inode_item(dst)?.size.max(dst_off + len);
        self.change_inode(w, dst, |i| {
            i.size = size;
            i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(added);
            i.mtime = now;
            i.ctime = now;
        })?;
        if !copied.is_empty() {
            // Inline data is copied: held dirty, then written back as the
            // write path places it (inline again if the file stays small).
            {
                let mut d = self.delalloc();
                for (at, bytes) in copied {
                    for (i, sector) in bytes.chunks(ss as usize).enumerate() {
                        let mut s = sector.to_vec();
                        s.resize(ss as usize, 0);
                        d.put(dst, at / ss + i as u64, s.into_boxed_slice());
                    }
                }
            }
            self.writeback(w, dst)?;
        }
        Ok(())
    }

    /// The pieces of `[off, off + len)` of `src` (sector aligned), in order.
    fn clone_pieces(&self, src: InodeId, off: u64, len: u64, transid: u64) -> Result<Vec<Piece>> {
        let ss = self.geometry().sectorsize as u64;
        let end = off + len;
        let items = self
            .file_extents_overlapping(src, off, end)?
            .collect::<Result<Vec<_>>>()?;
        let mut out = Vec::new();
        let mut cursor = off;
        for (k, fe) in items {
            if fe.encryption != 0 || fe.other_encoding != 0 {
                return Err(Error::Unsupported(format!(
                    "clone of an encrypted or encoded extent of inode {}",
                    src.ino
                )));
            }
            // An inline extent covers its whole sector.
            let covered = match fe.body {
                ExtentBody::Inline(_) => fe.len().div_ceil(ss).max(1) * ss,
                ExtentBody::Regular { .. } => fe.len(),
            };
            let (lo, hi) = (k.max(cursor), k.saturating_add(covered).min(end));
            if lo >= hi {
                continue;
            }
            if lo > cursor {
                out.push(Piece {
                    at: cursor - off,
                    len: lo - cursor,
                    backing: Backing::Hole,
                });
            }
            let backing = match fe.body {
                ExtentBody::Inline(_) => {
                    let mut bytes = self.read_stored(src, lo, (hi - lo) as usize)?;
                    bytes.resize((hi - lo) as usize, 0);
                    Backing::Inline(bytes)
                }
                ExtentBody::Regular { disk_bytenr: 0, .. } => Backing::Hole,
                ExtentBody::Regular { .. } => {
                    let mut piece = extent_part(&fe, lo - k, hi - lo);
                    piece.generation = transid;
                    Backing::Extent(piece)
                }
            };
            out.push(Piece {
                at: lo - off,
                len: hi - lo,
                backing,
            });
            cursor = hi;
        }
        if cursor < end {
            out.push(Piece {
                at: cursor - off,
                len: end - cursor,
                backing: Backing::Hole,
            });
        }
        Ok(out)
    }

    fn inline_at_zero(&self, id: InodeId) -> Result<bool> {
        let item = self
            .fs_tree(id.subvol)?
            .get(&Key::new(id.ino, EXTENT_DATA_KEY, 0))?;
        Ok(match item {
            Some(it) => FileExtentItem::parse(it.data())?.extent_type == FILE_EXTENT_INLINE,
            None => false,
        })
    }

    fn put_extent_item(
        &self,
        w: &mut Writer,
        id: InodeId,
        at: u64,
        fe: &FileExtentItem,
    ) -> Result<()> {
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, at), bytes)
        })
    }
}

/// The inode item of `id`, which must be a regular file, and one whose
/// data may change if it is the destination (`dst`).
fn clone_file(fs: &Filesystem, id: InodeId, dst: bool) -> Result<InodeItem> {
    let (item, what) = if dst {
        (
            fs.inode_item_to_change(id, Allowed::Nothing, "clone into")?,
            "destination",
        )
    } else {
        (fs.inode_item_for_data(id)?, "source")
    };
    match FileKind::from_mode(item.mode) {
        Some(FileKind::File) => Ok(item),
        Some(FileKind::Dir) => Err(Error::IsDir(format!(
            "clone {what}: inode {} in subvolume {}",
            id.ino, id.subvol
        ))),
        _ => Err(Error::Invalid(format!(
            "clone {what}: inode {} in subvolume {} is not a regular file",
            id.ino, id.subvol
        ))),
    }
}

//! Changing a file's size and its allocation: truncate and fallocate, with
//! the file extent items the kernel would leave.
//!
//! - Shrinking drops every extent past the new end rounded up to a sector
//!   and trims the one that straddles it; an inline extent is cut to the
//!   new size. On disk the rest of the last sector keeps its old bytes, as
//!   the kernel leaves them.
//! - Growing (here, by fallocate or by a write past the end) therefore
//!   first zeroes the rest of the old last sector, rewriting it through
//!   the dirty data, and, without the no-holes feature, covers the new
//!   range with explicit hole extents.
//! - `fallocate` preallocates: PREALLOC extents (no checksums, read as
//!   zeros) where the file has holes, the inode gets the PREALLOC flag and
//!   its byte count grows by what was allocated. Punching a hole drops the
//!   whole sectors of the range and zeroes the partial ones; zeroing a
//!   range does the same and preallocates the whole sectors.
//!
//! Both write the inode's dirty data back first where they change
//! extents, so they work on what is on disk.

use crate::alloc::SpaceKind;
use crate::alloc::delayed_ref::DataOwner;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, Timespec};
use crate::fs::{Allowed, FileKind, Filesystem, InodeId};
use crate::transaction::Writer;
use crate::{Error, Result};

/// `fallocate` mode bit: do not change the file size (Linux
/// `FALLOC_FL_KEEP_SIZE`).
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// `fallocate` mode bit: deallocate the range, which then reads as zeros;
/// needs [`FALLOC_FL_KEEP_SIZE`] (Linux `FALLOC_FL_PUNCH_HOLE`).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// `fallocate` mode bit: make the range read as zeros, allocated (Linux
/// `FALLOC_FL_ZERO_RANGE`).
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// What a file extent item holds, for the decisions here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Inline,
    Hole,
    Prealloc,
    Data,
}

/// One file extent item: the file range it covers (an inline extent
/// covers the first sector) and its kind.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    kind: Kind,
    /// Bytes of data an inline extent holds.
    inline_len: u64,
}

/// Whether written data backs the sector holding `at`: zeroing part of
/// it rewrites it, a sector of new data (a hole or preallocated space
/// reads as zeros already).
fn data_at(spans: &[Span], at: u64, sectorsize: u64) -> bool {
    let s = at / sectorsize * sectorsize;
    spans
        .iter()
        .any(|sp| sp.start <= s && s < sp.end && matches!(sp.kind, Kind::Data | Kind::Inline))
}

/// The parts of `[from, to)` that none of `spans` (in file order) covers,
/// each span counted up to the end of its last sector.
fn gaps<'a>(
    spans: impl IntoIterator<Item = &'a Span>,
    from: u64,
    to: u64,
    ss: u64,
) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut cursor = from;
    for s in spans {
        if s.end <= cursor {
            continue;
        }
        if s.start >= to {
            break;
        }
        if s.start > cursor {
            gaps.push((cursor, s.start));
        }
        cursor = cursor.max(s.end.div_ceil(ss).saturating_mul(ss));
    }
    if cursor < to {
        gaps.push((cursor, to));
    }
    gaps
}

impl Filesystem {
    /// Set the size of regular file `id` to `new_size`, as `truncate(2)`.
    pub fn truncate(&self, id: InodeId, new_size: u64) -> Result<()> {
        self.change("truncate", || {
            let item = self.inode_item(id)?;
            let mut w = if new_size > item.size {
                self.writer()?
            } else {
                self.writer_deleting()?
            };
            self.truncate_locked(&mut w, id, new_size, Timespec::now(), Allowed::Nothing)
        })
    }

    /// [`Filesystem::truncate`] inside the caller's hold on the
    /// transaction; sets mtime and ctime to `now` when the size changes.
    /// `allowed`: what the inode's flags let the caller do (see
    /// [`SetAttr::size_through_open_file`](crate::fs::SetAttr)).
    pub(crate) fn truncate_locked(
        &self,
        w: &mut Writer,
        id: InodeId,
        new_size: u64,
        now: Timespec,
        allowed: Allowed,
    ) -> Result<()> {
        self.long_work_ahead();
        let inode = self.regular_file(id, allowed, "truncate")?;
        if new_size > i64::MAX as u64 {
            return Err(Error::Invalid(format!(
                "size {new_size} is past the largest file size"
            )));
        }
        let old = inode.size;
        if new_size == old {
            return Ok(());
        }
        let ss = self.geometry().sectorsize as u64;
        // Growing zeroes the old last sector past the old end (an inline
        // extent moves out with it): room for that sector now, while a
        // commit could still free it. Shrinking writes no data, so a full
        // filesystem takes it, as the kernel's does.
        if new_size > old && !old.is_multiple_of(ss) {
            self.reserve_dirty_space(w, ss)?;
        }
        let (mut removed, mut added) = (0u64, 0u64);
        if new_size < old {
            self.delalloc().discard_from(id, new_size.div_ceil(ss));
            // Dirty data is gone: a failure from here on is half a truncate.
            crate::transaction::abort::note_edit();
            removed += self.drop_range(w, id, new_size.div_ceil(ss) * ss, u64::MAX)?;
            if new_size > 0 && self.spans(id)?.iter().any(|s| s.kind == Kind::Inline) {
                let (r, a) = self.shrink_inline(w, id, new_size)?;
                removed += r;
                added += a;
            }
            // Dirty data past the new end is gone; on disk the rest of the
            // last sector stays as it is (growing zeroes it, as the kernel does).
            self.zero_dirty_tail(id, new_size);
        } else {
            self.zero_tail(w, id, old, true)?;
        }
        self.cover_holes(w, id, new_size)?;
        self.change_inode(w, id, |i| {
            i.size = new_size;
            i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(added);
            i.mtime = now;
            i.ctime = now;
        })?;
        Ok(())
    }

    /// Preallocate, punch or zero `[offset, offset + len)` of regular file
    /// `id`, as `fallocate(2)` with `mode` made of the `FALLOC_FL_*` bits
    /// ([`FALLOC_FL_KEEP_SIZE`], [`FALLOC_FL_PUNCH_HOLE`],
    /// [`FALLOC_FL_ZERO_RANGE`]; 0 allocates and may grow the file).
    pub fn fallocate(&self, id: InodeId, mode: u32, offset: u64, len: u64) -> Result<()> {
        self.change("fallocate", || {
            let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
            if mode & !known != 0 {
                return Err(Error::Unsupported(format!("fallocate mode {mode:#x}")));
            }
            let punch = mode & FALLOC_FL_PUNCH_HOLE != 0;
            let zero = mode & FALLOC_FL_ZERO_RANGE != 0;
            let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
            if punch && (zero || !keep) {
                return Err(Error::Unsupported(
                    "punching a hole needs FALLOC_FL_KEEP_SIZE and nothing else".into(),
                ));
            }
            if len == 0 {
                return Err(Error::Invalid("fallocate of 0 bytes".into()));
            }
            let end = offset
                .checked_add(len)
                .filter(|&e| e <= i64::MAX as u64)
                .ok_or_else(|| Error::Invalid("fallocate past the largest file size".into()))?;
            let mut w = if punch {
                self.writer_deleting()?
            } else {
                self.writer()?
            };
            // An append-only file may gain space, not lose data.
            let allowed = if punch || zero {
                Allowed::Nothing
            } else {
                Allowed::Growth
            };
            self.regular_file(id, allowed, "fallocate")?;
            // Work on the extents on disk: the file's dirty data goes there first.
            self.writeback(&mut w, id)?;
            let now = Timespec::now();
            if punch {
                self.punch_hole(&mut w, id, offset, end, now)
            } else {
                self.allocate(&mut w, id, offset, end, keep, zero, now)
            }
        })
    }

    /// The inode item of `id`, which must be a regular file whose flags
    /// allow `what` (see [`Filesystem::check_fixed`]).
    fn regular_file(
        &self,
        id: InodeId,
        allowed: Allowed,
        what: &str,
    ) -> Result<crate::format::items::InodeItem> {
        let inode = self.inode_item_to_change(id, allowed, what)?;
        match FileKind::from_mode(inode.mode) {
            Some(FileKind::File) => Ok(inode),
            Some(FileKind::Dir) => Err(Error::IsDir(format!("inode {}", id.ino))),
            _ => Err(Error::Invalid(format!(
                "inode {} is not a regular file",
                id.ino
            ))),
        }
    }

    fn punch_hole(
        &self,
        w: &mut Writer,
        id: InodeId,
        offset: u64,
        end: u64,
        now: Timespec,
    ) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let size = self.inode_item(id)?.size;
        // Nothing past the end of file is punched (its last sector included).
        let end = end.min(size.div_ceil(ss) * ss);
        let spans = self.spans(id)?;
        let inline = spans.iter().any(|s| s.kind == Kind::Inline);
        // A hole over the whole first sector drops an inline extent, as
        // the kernel does: nothing is written, so a full filesystem takes
        // it (a shorter one zeroes bytes of it, as in the kernel). Not
        // while a newer copy of the sector waits to be written.
        let inline_whole =
            inline && offset == 0 && end >= ss && self.delalloc().sector(id, 0).is_none();
        // The partial sectors at either end become dirty data: room for
        // them first. A hole of whole sectors writes none, so a full
        // filesystem takes it.
        let partial = match (offset.div_ceil(ss) * ss, end / ss * ss) {
            _ if offset >= end || inline_whole => 0,
            _ if inline => 1,
            (lo, hi) if lo > hi => u64::from(data_at(&spans, offset, ss)),
            (lo, hi) => {
                u64::from(offset < lo && data_at(&spans, offset, ss))
                    + u64::from(hi < end && data_at(&spans, hi, ss))
            }
        };
        if partial > 0 {
            self.reserve_dirty_space(w, partial * ss)?;
        }
        let mut removed = 0;
        if offset < end {
            if inline_whole {
                removed = self.drop_range(w, id, 0, ss)?;
            } else if inline {
                self.zero_bytes(w, id, offset, end.min(ss))?;
            } else {
                let lo = offset.div_ceil(ss) * ss;
                let hi = end / ss * ss;
                if lo > hi {
                    self.zero_bytes(w, id, offset, end)?;
                } else {
                    if offset < lo {
                        self.zero_bytes(w, id, offset, lo)?;
                    }
                    if hi < end {
                        self.zero_bytes(w, id, hi, end)?;
                    }
                    if lo < hi {
                        removed = self.drop_range(w, id, lo, hi)?;
                    }
                }
            }
        }
        self.cover_holes(w, id, size)?;
        self.change_inode(w, id, |i| {
            i.nbytes = i.nbytes.saturating_sub(removed);
            i.mtime = now;
            i.ctime = now;
        })?;
        Ok(())
    }

    /// Plain fallocate (preallocate the holes) or, with `zero`, zero range
    /// (preallocate everything not preallocated yet, zero partial sectors).
    #[allow(clippy::too_many_arguments)]
    fn allocate(
        &self,
        w: &mut Writer,
        id: InodeId,
        offset: u64,
        end: u64,
        keep: bool,
        zero: bool,
        now: Timespec,
    ) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let no_holes = self.superblock().no_holes();
        let old = self.inode_item(id)?.size;
        let new_size = if keep { old } else { old.max(end) };
        let spans = self.spans(id)?;
        let inline = spans.iter().any(|s| s.kind == Kind::Inline);
        // Zeroing a range rewrites the first sector of an inline file whole.
        let from = if zero && inline {
            offset.max(ss)
        } else {
            offset
        };
        let (a0, a1) = if zero {
            (from.div_ceil(ss) * ss, end / ss * ss)
        } else {
            (offset / ss * ss, end.div_ceil(ss) * ss)
        };
        // The parts of [a0, a1) to preallocate: the holes, or, zeroing,
        // everything not preallocated yet.
        let segs = if a0 < a1 {
            let keeps = |s: &&Span| {
                if zero {
                    s.kind == Kind::Prealloc
                } else {
                    s.kind != Kind::Hole
                }
            };
            gaps(spans.iter().filter(keeps), a0, a1, ss)
        } else {
            Vec::new()
        };
        // All the space or nothing, before anything changes. Room first
        // (a commit may free it) for the new extents and for the sectors
        // zeroed at either end, which become dirty data.
        let added: u64 = segs.iter().map(|(a, b)| b - a).sum();
        let last = old / ss * ss;
        // The old last sector is zeroed past the old end when the file
        // grows; zeroing a range preallocates it anew instead when the
        // range holds it whole.
        let edges = [
            zero && inline,
            zero && !offset.is_multiple_of(ss) && data_at(&spans, offset, ss),
            zero && !end.is_multiple_of(ss) && data_at(&spans, end, ss),
            end > old && !old.is_multiple_of(ss) && !(zero && a0 <= last && last + ss <= a1),
        ];
        let edges = edges.iter().filter(|&&e| e).count() as u64 * ss;
        self.reserve_dirty_space(w, added + edges)?;
        // Until the zeroing below is done, a failure gives the space back:
        // the change is refused whole if the zeroing changed nothing.
        let pieces = if added > 0 {
            self.take_data_space(w, added)?
        } else {
            Vec::new()
        };
        let zeroed = (|| {
            if zero {
                if inline {
                    self.zero_bytes(w, id, offset.min(ss), end.min(ss))?;
                }
                // The old last sector reads as zeros past the old end, on
                // disk too, unless it is preallocated anew below.
                let last = old / ss * ss;
                if end > old && !(a0 <= last && last + ss <= a1) {
                    self.zero_tail(w, id, old, true)?;
                }
                if from < end {
                    if a0 > a1 {
                        self.zero_bytes(w, id, from, end)?;
                    } else {
                        if from < a0 {
                            self.zero_bytes(w, id, from, a0)?;
                        }
                        if a1 < end {
                            self.zero_bytes(w, id, a1, end)?;
                        }
                    }
                }
            } else {
                if end > old {
                    self.zero_tail(w, id, old, true)?;
                }
                // Beyond the end of file the kernel first extends the holes.
                if !no_holes && a0 > old.div_ceil(ss) * ss {
                    self.fill_gaps(w, id, old.div_ceil(ss) * ss, a0)?;
                }
            }
            Ok(())
        })();
        if let Err(e) = zeroed {
            for (s, l) in pieces {
                w.blocks.alloc.release(s, l)?;
            }
            return Err(e);
        }
        if added > 0 {
            crate::transaction::abort::note_edit();
        }
        let mut removed = 0;
        if added > 0 {
            let mut pieces = pieces.into_iter();
            let mut piece: Option<(u64, u64)> = None;
            for &(a, b) in &segs {
                removed += self.drop_range(w, id, a, b)?;
                let mut at = a;
                while at < b {
                    let (disk, left) = match piece.take() {
                        Some(p) => p,
                        None => pieces
                            .next()
                            .ok_or_else(|| Error::corrupt("preallocation ran short"))?,
                    };
                    let take = left.min(b - at);
                    self.insert_prealloc(w, id, at, disk, take)?;
                    if take < left {
                        piece = Some((disk + take, left - take));
                    }
                    at += take;
                }
            }
        }
        self.cover_holes(w, id, new_size)?;
        self.change_inode(w, id, |i| {
            i.size = new_size;
            i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(added);
            if added > 0 {
                i.flags |= INODE_PREALLOC;
            }
            i.mtime = now;
            i.ctime = now;
        })?;
        Ok(())
    }

    /// The file extent items of `id`, in file order.
    fn spans(&self, id: InodeId) -> Result<Vec<Span>> {
        let ss = self.geometry().sectorsize as u64;
        let mut out = Vec::new();
        for it in self.fs_tree(id.subvol)?.items_of(id.ino, EXTENT_DATA_KEY)? {
            let it = it?;
            let start = it.key().offset;
            let fe = FileExtentItem::parse(it.data())?;
            let (kind, end) = match &fe.body {
                ExtentBody::Inline(_) => (Kind::Inline, start + ss),
                ExtentBody::Regular {
                    disk_bytenr,
                    num_bytes,
                    ..
                } => {
                    let kind = if *disk_bytenr == 0 {
                        Kind::Hole
                    } else if fe.extent_type == FILE_EXTENT_PREALLOC {
                        Kind::Prealloc
                    } else {
                        Kind::Data
                    };
                    (kind, start.saturating_add(*num_bytes))
                }
            };
            let inline_len = if kind == Kind::Inline {
                fe.ram_bytes
            } else {
                0
            };
            out.push(Span {
                start,
                end,
                kind,
                inline_len,
            });
        }
        Ok(out)
    }

    /// Cut the inline extent of `id` to `new_size` (> 0) bytes; returns
    /// the bytes (removed, added) for the inode's byte count.
    fn shrink_inline(&self, w: &mut Writer, id: InodeId, new_size: u64) -> Result<(u64, u64)> {
        let key = Key::new(id.ino, EXTENT_DATA_KEY, 0);
        let Some(it) = self.fs_tree(id.subvol)?.get(&key)? else {
            return Ok((0, 0));
        };
        let mut fe = FileExtentItem::parse(it.data())?;
        let ExtentBody::Inline(data) = &fe.body else {
            return Ok((0, 0));
        };
        if fe.compression == COMPRESS_NONE {
            let have = data.len() as u64;
            if have <= new_size {
                return Ok((0, 0));
            }
            // The kernel cuts the item in place; its generation stays.
            fe.body = ExtentBody::Inline(data[..new_size as usize].to_vec());
            fe.ram_bytes = new_size;
            let bytes = fe.to_bytes();
            self.modify_tree(w, id.subvol, |ed, root| ed.put(root, key, bytes))?;
            return Ok((have - new_size, 0));
        }
        // A compressed inline extent is stored again, plain.
        let content = self.read_stored(id, 0, new_size as usize)?;
        let removed = self.drop_range(w, id, 0, u64::MAX)?;
        self.insert_inline(w, id, &content)?;
        Ok((removed, content.len() as u64))
    }

    /// Make the bytes of the sector holding `size` (the end of file) past
    /// it zeros, on disk too: the sector is rewritten if data backs it.
    /// With `grow`, an inline extent is always rewritten, as the file it
    /// holds is about to grow (it stays inline only if still small).
    pub(crate) fn zero_tail(
        &self,
        w: &mut Writer,
        id: InodeId,
        size: u64,
        grow: bool,
    ) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        if size.is_multiple_of(ss) {
            return Ok(());
        }
        let idx = size / ss;
        let s = idx * ss;
        let keep = (size - s) as usize;
        if self.zero_dirty_tail(id, size) {
            return Ok(());
        }
        let backed = self.spans(id)?.iter().any(|sp| {
            sp.start <= s
                && s < sp.end
                && match sp.kind {
                    Kind::Inline => grow || sp.inline_len > size,
                    Kind::Data => true,
                    Kind::Hole | Kind::Prealloc => false,
                }
        });
        if !backed {
            return Ok(());
        }
        let mut b = self.read_stored(id, s, keep)?;
        b.resize(ss as usize, 0);
        self.put_dirty_sector(w, id, idx, b)
    }

    /// Zero the bytes past `size` in the dirty sector holding it; false
    /// if that sector is not dirty.
    fn zero_dirty_tail(&self, id: InodeId, size: u64) -> bool {
        let ss = self.geometry().sectorsize as u64;
        let (idx, keep) = (size / ss, (size % ss) as usize);
        let mut d = self.delalloc();
        let Some(b) = d.sector(id, idx) else {
            return false;
        };
        if b[keep..].iter().any(|&x| x != 0) {
            let mut b = b.to_vec();
            b[keep..].fill(0);
            d.put(id, idx, b.into_boxed_slice());
        }
        true
    }

    /// Make `[from, to)` (inside one sector, or the first sector of an
    /// inline file) read as zeros: the sector is rewritten unless it
    /// already does.
    fn zero_bytes(&self, w: &mut Writer, id: InodeId, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let ss = self.geometry().sectorsize as u64;
        let idx = from / ss;
        let s = idx * ss;
        let dirty = self.delalloc().sector(id, idx).map(|b| b.to_vec());
        let was_dirty = dirty.is_some();
        let mut b = match dirty {
            Some(b) => b,
            None => {
                let mut b = self.read_stored(id, s, ss as usize)?;
                b.resize(ss as usize, 0);
                b
            }
        };
        let range = (from - s) as usize..((to - s) as usize).min(ss as usize);
        if b[range.clone()].iter().all(|&x| x == 0) {
            return Ok(());
        }
        b[range].fill(0);
        if was_dirty {
            self.delalloc().put(id, idx, b.into_boxed_slice());
            return Ok(());
        }
        self.put_dirty_sector(w, id, idx, b)
    }

    /// Hold `data` as dirty sector `idx` of `id`, making sure writeback
    /// will find the space for it.
    fn put_dirty_sector(&self, w: &mut Writer, id: InodeId, idx: u64, data: Vec<u8>) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let need = self.delalloc().reserved_bytes() + ss;
        if self.space_free(w, SpaceKind::Data) < need {
            match self.alloc_chunk(w, SpaceKind::Data) {
                Ok(()) | Err(Error::NoSpace(_)) => {}
                Err(e) => return Err(e),
            }
            if self.space_free(w, SpaceKind::Data) < need {
                return Err(Error::NoSpace(format!(
                    "no data space to rewrite a sector of inode {}",
                    id.ino
                )));
            }
        }
        self.delalloc().put(id, idx, data.into_boxed_slice());
        Ok(())
    }

    /// Without no-holes, every sector below the end of file (`size`) is
    /// covered by a file extent item, a hole extent if nothing else. (Dirty
    /// sectors get theirs at writeback, which drops the holes they cover.)
    fn cover_holes(&self, w: &mut Writer, id: InodeId, size: u64) -> Result<()> {
        if self.superblock().no_holes() {
            return Ok(());
        }
        let ss = self.geometry().sectorsize as u64;
        self.fill_gaps(w, id, 0, size.div_ceil(ss) * ss)
    }

    /// Without no-holes: put hole extents where `[from, to)` (sector
    /// aligned) has no file extent item.
    fn fill_gaps(&self, w: &mut Writer, id: InodeId, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let ss = self.geometry().sectorsize as u64;
        for (a, b) in gaps(&self.spans(id)?, from, to, ss) {
            let fe = FileExtentItem::hole(w.blocks.transid, b - a);
            let bytes = fe.to_bytes();
            self.modify_tree(w, id.subvol, |ed, root| {
                ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, a), bytes)
            })?;
        }
        Ok(())
    }

    /// A preallocated extent of `len` bytes at `disk` for file offset `at`.
    fn insert_prealloc(
        &self,
        w: &mut Writer,
        id: InodeId,
        at: u64,
        disk: u64,
        len: u64,
    ) -> Result<()> {
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: len,
            compression: COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_PREALLOC,
            body: ExtentBody::Regular {
                disk_bytenr: disk,
                disk_num_bytes: len,
                offset: 0,
                num_bytes: len,
            },
        };
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, at), bytes)
        })?;
        let owner = DataOwner {
            root: id.subvol,
            objectid: id.ino,
            offset: at,
        };
        w.blocks.refs.change_data(disk, len, owner, 1);
        Ok(())
    }
}

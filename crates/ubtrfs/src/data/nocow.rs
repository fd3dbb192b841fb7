//! Overwrites in place: a file with the NODATACOW flag is rewritten in
//! place where its extent is plain and has no checksums, and any file is
//! written in place where it has a preallocated extent (the kernel's rule:
//! space `fallocate` reserved is used as it is, so a write there needs no
//! new space). Either way the extent must be referenced by this file's
//! items alone and not shared with a snapshot. The checksum question is
//! asked with an early-exit existence check (seed 002), never by
//! collecting the checksums. A reference added in the running transaction
//! (a clone) is still a delayed ref, so pending changes by anyone else
//! count as sharing too. A write into a NODATACOW file checks the extent
//! items it will overwrite first ([`Filesystem::check_nocow_write`]): a
//! damaged one refused only at writeback would fail the commit, and with
//! it every other change.

use crate::alloc::delayed_ref::{DataOwner, DataRef, DelayedRefs};
use crate::alloc::extent_tree::{DataExtentOwners, data_extent_owners};
use crate::csum_tree;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem};
use crate::fs::{Filesystem, InodeId};
use crate::transaction::Writer;
use crate::{Error, Result};
use std::sync::Arc;

/// A piece of a file range: where it can be overwritten in place, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// Logical address to overwrite in place, or `None`: copy on write.
    pub in_place: Option<u64>,
    /// The place is preallocated: written, its item becomes a regular
    /// one and its sectors get checksums.
    pub prealloc: Option<PreallocPart>,
}

/// A preallocated extent's part that a write fills in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreallocPart {
    pub disk_bytenr: u64,
    pub disk_num_bytes: u64,
    /// Offset of the part into the extent.
    pub extent_offset: u64,
}

impl Filesystem {
    /// Cut `[offset, offset + len)` of `id` into segments by extent, each
    /// marked with where it can be written in place: preallocated extents,
    /// and with `nocow` (the file's NODATACOW flag) plain ones too.
    /// `pending` holds the running transaction's reference changes, not
    /// yet in the extent tree.
    pub(crate) fn in_place_segments(
        &self,
        id: InodeId,
        offset: u64,
        len: u64,
        pending: &DelayedRefs,
        nocow: bool,
    ) -> Result<Vec<Segment>> {
        let end = offset + len;
        let last_snapshot = self
            .find_root(id.subvol)?
            .map_or(0, |(_, r)| r.last_snapshot);
        let csums = self.csum_tree()?;
        let extents = self.extent_tree_for_refs()?;
        let mut out: Vec<Segment> = Vec::new();
        // Neighbouring copy-on-write pieces go out as one.
        let mut push = |s: Segment| match out.last_mut() {
            Some(p)
                if p.in_place.is_none() && s.in_place.is_none() && p.offset + p.len == s.offset =>
            {
                p.len += s.len
            }
            _ => out.push(s),
        };
        let mut cursor = offset;
        for item in self.nocow_extents(id, offset, end)? {
            let (k, fe_end, fe) = item?;
            let (lo, hi) = (k.max(cursor), fe_end.min(end));
            if lo >= hi {
                continue;
            }
            if lo > cursor {
                push(Segment {
                    offset: cursor,
                    len: lo - cursor,
                    in_place: None,
                    prealloc: None,
                });
            }
            let prealloc = fe.extent_type == FILE_EXTENT_PREALLOC;
            let mut in_place = None;
            let mut part = None;
            if let ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset: eoff,
                ..
            } = fe.body
                && disk_bytenr != 0
                && (prealloc || (nocow && fe.extent_type == FILE_EXTENT_REG))
                && fe.compression == COMPRESS_NONE
                && fe.encryption == 0
                && fe.generation > last_snapshot
                // A seed is never written: its extents are copied on write.
                && !self.tree_reader().volume().on_seed(disk_bytenr)
            {
                let owner = DataOwner {
                    root: id.subvol,
                    objectid: id.ino,
                    offset: k.wrapping_sub(eoff),
                };
                // Pending changes: this file's own (a preallocated extent
                // split by an earlier write), or another's (a clone).
                let pending_ours = pending
                    .data
                    .get(&disk_bytenr)
                    .map(|d| d.changes.keys().all(|r| *r == DataRef::Root(owner)));
                let recorded = match &extents {
                    Some(t) => data_extent_owners(t, disk_bytenr, disk_num_bytes, owner)?,
                    None => DataExtentOwners::NoItem,
                };
                let sole = match recorded {
                    DataExtentOwners::Item { sole, generation } => {
                        sole && generation > last_snapshot && pending_ours != Some(false)
                    }
                    // Made by the running transaction.
                    DataExtentOwners::NoItem => pending_ours == Some(true),
                };
                let at = disk_bytenr + eoff + (lo - k);
                let summed = sole
                    && match &csums {
                        Some(t) => csum_tree::any_in_range(
                            t,
                            at,
                            hi - lo,
                            self.geometry().sectorsize,
                            self.geometry().csum_size,
                        )?,
                        None => false,
                    };
                if sole && !summed {
                    in_place = Some(at);
                    part = prealloc.then_some(PreallocPart {
                        disk_bytenr,
                        disk_num_bytes,
                        extent_offset: eoff + (lo - k),
                    });
                }
            }
            push(Segment {
                offset: lo,
                len: hi - lo,
                in_place,
                prealloc: part,
            });
            cursor = hi;
        }
        if cursor < end {
            push(Segment {
                offset: cursor,
                len: end - cursor,
                in_place: None,
                prealloc: None,
            });
        }
        Ok(out)
    }

    /// Write `data` into the preallocated `part` that file offset `offset`
    /// of `id` maps to, and make that range of the file regular data: the
    /// preallocated item is cut around it (its pieces keep the extent),
    /// the written range joins a regular neighbour of the same extent that
    /// ends or starts where it does (as the kernel merges them), and its
    /// sectors get checksums unless the file has none.
    ///
    /// With `background`, the writeback thread writes the bytes and their
    /// checksums go in when it is done ([`super::in_flight`]); the range
    /// then stays an item of its own, so a read of it finds all of it in
    /// flight or all of it on disk.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill_prealloc(
        &self,
        w: &mut Writer,
        id: InodeId,
        offset: u64,
        part: PreallocPart,
        data: &Arc<Vec<u8>>,
        range: std::ops::Range<usize>,
        background: bool,
    ) -> Result<()> {
        let len = range.len() as u64;
        let at = part.disk_bytenr + part.extent_offset;
        let geo = self.geometry();
        let summed = self.inode_item(id)?.flags & INODE_NODATASUM == 0;
        let mut sums = Vec::new();
        if background {
            // In flight before the item names it: a reader finds it there.
            self.in_flight.submit(
                self.tree_reader().volume(),
                self.csum_spec(),
                at,
                id,
                Arc::clone(data),
                range.start,
                range.len(),
                summed,
            )?;
        } else {
            let bytes = &data[range];
            if summed {
                self.csum_spec().sums_into(bytes, &mut sums);
            }
            self.tree_reader().volume().write(at, bytes)?;
        }
        let removed = self.drop_range(w, id, offset, offset + len)?;
        // The same extent, continuing: a regular item ending at `offset`
        // and one starting at its end, if they map the bytes around it.
        let same_extent = |fe: &FileExtentItem| match fe.body {
            ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset: eoff,
                num_bytes,
            } if fe.extent_type == FILE_EXTENT_REG
                && fe.compression == COMPRESS_NONE
                && fe.encryption == 0
                && disk_bytenr == part.disk_bytenr
                && disk_num_bytes == part.disk_num_bytes =>
            {
                Some((eoff, num_bytes))
            }
            _ => None,
        };
        let mut start = offset;
        let mut eoff = part.extent_offset;
        let mut num = len;
        let mut before = None;
        let mut after = None;
        let around = offset.saturating_sub(1)..offset.saturating_add(len).saturating_add(1);
        for (k, fe) in self.extent_items_in(id, around.start, around.end)? {
            // A neighbour still in flight stays apart too.
            let joinable = !background
                && same_extent(&fe)
                    .is_some_and(|(e, n)| !self.in_flight.overlaps(part.disk_bytenr + e, n));
            if !joinable {
                continue;
            }
            match same_extent(&fe) {
                Some((e, n)) if k + n == offset && e + n == part.extent_offset => {
                    before = Some(k);
                    start = k;
                    eoff = e;
                    num += n;
                }
                Some((e, n)) if k == offset + len && e == part.extent_offset + len => {
                    after = Some(k);
                    num += n;
                }
                _ => {}
            }
        }
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: part.disk_num_bytes,
            compression: COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr: part.disk_bytenr,
                disk_num_bytes: part.disk_num_bytes,
                offset: eoff,
                num_bytes: num,
            },
        };
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            let key = Key::new(id.ino, EXTENT_DATA_KEY, start);
            if before.is_some() {
                ed.put(root, key, bytes)?;
            } else {
                ed.insert(root, key, bytes)?;
            }
            if let Some(k) = after {
                ed.delete(root, Key::new(id.ino, EXTENT_DATA_KEY, k))?;
            }
            Ok(())
        })?;
        let owner = DataOwner {
            root: id.subvol,
            objectid: id.ino,
            offset: start.wrapping_sub(eoff),
        };
        let items = i64::from(before.is_none()) - i64::from(after.is_some());
        if items != 0 {
            w.blocks
                .refs
                .change_data(part.disk_bytenr, part.disk_num_bytes, owner, items);
        }
        if removed != len {
            self.change_inode(w, id, |i| {
                i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(len)
            })?;
        }
        if summed && !background {
            self.modify_tree(w, CSUM_TREE_OBJECTID, |ed, root| {
                csum_tree::insert(ed, root, at, &sums, geo.sectorsize, geo.csum_size)
            })?;
        }
        Ok(())
    }

    /// Refuse a write of `len` bytes at `offset` into file `id` (no-COW or
    /// preallocated) whose sectors writeback could not place: a damaged extent item
    /// there would fail the commit (and every later one) instead of this
    /// write. Called before the write changes anything.
    pub(crate) fn check_nocow_write(&self, id: InodeId, offset: u64, len: u64) -> Result<()> {
        // Writeback takes whole sectors: check the items it will meet.
        let ss = self.geometry().sectorsize as u64;
        let start = offset / ss * ss;
        let end = offset.saturating_add(len).div_ceil(ss).saturating_mul(ss);
        for item in self.nocow_extents(id, start, end)? {
            item.map_err(|e| match e {
                Error::Corrupt(m) => Error::corrupt(format!(
                    "write of {len} bytes at file offset {offset} refused: {m}"
                )),
                e => e,
            })?;
        }
        Ok(())
    }

    /// The file extent items of `id` reaching into `[offset, end)`, as
    /// (file offset, end, item), each checked to name its disk range
    /// truthfully: an overwrite in place lands inside it. An inline
    /// extent ends at the end of its sector, as dirty data replacing it
    /// comes in whole sectors.
    fn nocow_extents(
        &self,
        id: InodeId,
        offset: u64,
        end: u64,
    ) -> Result<impl Iterator<Item = Result<(u64, u64, FileExtentItem)>> + '_> {
        let ss = self.geometry().sectorsize as u64;
        let items = self.file_extents_overlapping(id, offset, end)?;
        Ok(items.filter_map(move |item| {
            let (k, fe) = match item {
                Ok(it) => it,
                Err(e) => return Some(Err(e)),
            };
            let fe_end = match fe.body {
                ExtentBody::Inline(_) => k.saturating_add(fe.len()).div_ceil(ss).saturating_mul(ss),
                _ => k.saturating_add(fe.len()),
            };
            if fe_end <= offset {
                return None;
            }
            let checked = fe.check_disk_extent(ss).map_err(|e| match e {
                Error::Corrupt(m) => Error::corrupt(format!(
                    "inode {} in subvolume {}, file extent item at file offset {k}: {m}",
                    id.ino, id.subvol
                )),
                e => e,
            });
            Some(checked.map(|()| (k, fe_end, fe)))
        }))
    }

    fn extent_tree_for_refs(&self) -> Result<Option<crate::tree::Tree<'_>>> {
        Ok(self
            .root_ptr(EXTENT_TREE_OBJECTID)?
            .map(|p| self.tree_reader().tree(p)))
    }
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::format::Key;
    use crate::format::consts::{EXTENT_DATA_KEY, INODE_NODATACOW};
    use crate::fs::{InodeId, NewInode};
    use crate::test_fs::TestFs;

    const FILE: NewInode = NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };

    /// A new no-COW file `name` holding `data`, committed.
    fn nocow_file(t: &TestFs, name: &[u8], data: &[u8]) -> InodeId {
        let id = t.fs().create(t.fs().root(), name, FILE).unwrap().id;
        t.fs().set_flags(id, INODE_NODATACOW).unwrap();
        t.fs().write(id, 0, data).unwrap();
        t.fs().commit().unwrap();
        id
    }

    /// The message of a corrupt-metadata error, else a panic.
    fn corrupt<T: std::fmt::Debug>(r: crate::Result<T>) -> String {
        match r {
            Err(Error::Corrupt(m)) => m,
            other => panic!("expected a corrupt-metadata error, got {other:?}"),
        }
    }

    #[test]
    fn extent_reaching_past_its_disk_extent_fails_the_write() {
        let t = TestFs::new();
        let id = nocow_file(&t, b"nocow", &[1u8; 12288]);
        t.skew_extent(id, 0, 8192);
        t.fs().commit().unwrap();
        let before = t.inode(id);
        // An overwrite in place would land in the two sectors after the
        // extent: the write is refused, naming the file and what is wrong.
        let m = corrupt(t.fs().write(id, 0, &[2u8; 12288]));
        for want in [
            format!("inode {} in subvolume {}", id.ino, id.subvol),
            "file offset 0".to_string(),
            "reaches past the end of the extent".to_string(),
        ] {
            assert!(m.contains(&want), "{want:?} is not in {m:?}");
        }
        // So is one into part of a sector.
        corrupt(t.fs().write(id, 4100, &[2u8; 10]));
        // Nothing of them is held or recorded.
        assert!(!t.fs().delalloc().has(id));
        assert_eq!(t.inode(id), before);
        t.fs().commit().unwrap();
        t.fs().commit().unwrap();
        assert_eq!(t.inode(id), before);
    }

    #[test]
    fn failed_read_of_a_part_sector_leaves_nothing_of_a_write() {
        // An ordinary (copy-on-write) file: the write reads the sectors it
        // covers in part, and that read meets the damaged item.
        let t = TestFs::new();
        let id = t.fs().create(t.fs().root(), b"cow", FILE).unwrap().id;
        t.fs().write(id, 0, &[1u8; 12288]).unwrap();
        t.fs().commit().unwrap();
        t.skew_extent(id, 0, 8192);
        t.fs().commit().unwrap();
        let before = t.inode(id);
        // Sector 0 and 2 in part, sector 1 whole.
        corrupt(t.fs().write(id, 100, &[2u8; 8192]));
        assert!(!t.fs().delalloc().has(id), "the whole sector was kept");
        assert_eq!(t.inode(id), before);
        t.fs().commit().unwrap();
    }

    #[test]
    fn a_damaged_preallocated_extent_fails_the_write() {
        let t = TestFs::new();
        let id = t.fs().create(t.fs().root(), b"pre", FILE).unwrap().id;
        t.fs().fallocate(id, 0, 0, 12288).unwrap();
        t.fs().commit().unwrap();
        // Written in place, the last sectors would land past the extent.
        t.skew_extent(id, 0, 8192);
        t.fs().commit().unwrap();
        let before = t.inode(id);
        let m = corrupt(t.fs().write(id, 0, &[7u8; 12288]));
        assert!(m.contains("reaches past the end of the extent"), "{m}");
        // Refused before anything of it was taken: commits go on.
        assert!(!t.fs().delalloc().has(id));
        assert_eq!(t.inode(id), before);
        t.fs().commit().unwrap();
    }

    #[test]
    fn damage_after_the_write_is_still_refused_at_writeback() {
        let t = TestFs::new();
        let id = nocow_file(&t, b"nocow", &[1u8; 12288]);
        t.fs().write(id, 0, &[2u8; 12288]).unwrap();
        t.skew_extent(id, 0, 8192);
        corrupt(t.fs().commit());
    }

    #[test]
    fn damaged_nocow_write_loses_nothing_else() {
        let mut t = TestFs::new();
        // Two extents: the first is damaged below, the second stays good.
        let b = nocow_file(&t, b"b", &[1u8; 12288]);
        t.fs().write(b, 12288, &[3u8; 8192]).unwrap();
        t.fs().commit().unwrap();
        let good = t.extent(b, 0);
        assert!(t.extent(b, 12288).len() == 8192);
        t.skew_extent(b, 0, 8192);
        t.fs().commit().unwrap();
        // One transaction: a new file, an overwrite in place of B's good
        // extent, then the write B's damaged extent refuses.
        let a = t.fs().create(t.fs().root(), b"a", FILE).unwrap().id;
        let a_data = testkit::xorshift_bytes(7, 100_000);
        t.fs().write(a, 0, &a_data).unwrap();
        t.fs().write(b, 16384, &[4u8; 4096]).unwrap();
        let before = t.inode(b);
        corrupt(t.fs().write(b, 4096, &[5u8; 4096]));
        assert_eq!(t.inode(b), before);
        t.fs().commit().unwrap();
        t.reopen().unwrap();
        let fs = t.fs();
        assert!(fs.read(a, 0, a_data.len()).unwrap() == a_data);
        let mut want = vec![3u8; 4096];
        want.extend([4u8; 4096]);
        assert_eq!(fs.read(b, 12288, 8192).unwrap(), want);
        let b_now = t.inode(b);
        assert_eq!(
            (b_now.size, b_now.nbytes, b_now.mtime, b_now.ctime),
            (before.size, before.nbytes, before.mtime, before.ctime)
        );
        // Reads of the damaged extent stay a clear error.
        corrupt(fs.read(b, 0, 4096));
        // With the item mended, B holds its old bytes and the image is
        // consistent: the refused write left nothing behind.
        t.put(
            b.subvol,
            Key::new(b.ino, EXTENT_DATA_KEY, 0),
            good.to_bytes(),
        );
        t.fs().commit().unwrap();
        assert_eq!(t.fs().read(b, 0, 12288).unwrap(), vec![1u8; 12288]);
        if let Err(e) = testkit::btrfs_check_file(t.image(), &[]) {
            panic!("after the refused write: {e:#}");
        }
    }
}

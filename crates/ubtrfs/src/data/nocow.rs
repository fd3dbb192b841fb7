//! No-COW overwrites: a file with the NODATACOW flag is rewritten in place
//! where its extent is plain, referenced once, not shared with a snapshot,
//! and has no checksums. The checksum question is asked with an early-exit
//! existence check (seed 002), never by collecting the checksums. A
//! reference added in the running transaction (a clone) is still a delayed
//! ref, so pending changes count as sharing too. A write into such a file
//! checks the extent items it will overwrite first
//! ([`Filesystem::check_nocow_write`]): a damaged one refused only at
//! writeback would fail the commit, and with it every other change.

use crate::alloc::delayed_ref::DelayedRefs;
use crate::csum_tree;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem};
use crate::fs::{Filesystem, InodeId};
use crate::{Error, Result};

/// A piece of a file range: where it can be overwritten in place, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// Logical address to overwrite in place, or `None`: copy on write.
    pub in_place: Option<u64>,
}

impl Filesystem {
    /// Cut `[offset, offset + len)` of `id` into segments by extent, each
    /// marked with where it can be written in place. `pending` holds the
    /// running transaction's reference changes, not yet in the extent tree.
    pub(crate) fn nocow_segments(
        &self,
        id: InodeId,
        offset: u64,
        len: u64,
        pending: &DelayedRefs,
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
                });
            }
            let mut in_place = None;
            if let ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset: eoff,
                ..
            } = fe.body
                && disk_bytenr != 0
                && fe.extent_type == FILE_EXTENT_REG
                && fe.compression == COMPRESS_NONE
                && fe.encryption == 0
                && fe.generation > last_snapshot
            {
                let refs = match &extents {
                    Some(t) => t
                        .get(&Key::new(disk_bytenr, EXTENT_ITEM_KEY, disk_num_bytes))?
                        .and_then(|it| {
                            it.data()
                                .get(..8)
                                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                        }),
                    None => None,
                };
                let at = disk_bytenr + eoff + (lo - k);
                let summed = match &csums {
                    Some(t) => csum_tree::any_in_range(
                        t,
                        at,
                        hi - lo,
                        self.geometry().sectorsize,
                        self.geometry().csum_size,
                    )?,
                    None => false,
                };
                // Any pending change (a clone's new reference) may share it.
                let untouched = !pending.data.contains_key(&disk_bytenr);
                if refs == Some(1) && untouched && !summed {
                    in_place = Some(at);
                }
            }
            push(Segment {
                offset: lo,
                len: hi - lo,
                in_place,
            });
            cursor = hi;
        }
        if cursor < end {
            push(Segment {
                offset: cursor,
                len: end - cursor,
                in_place: None,
            });
        }
        Ok(out)
    }

    /// Refuse a write of `len` bytes at `offset` into no-COW file `id`
    /// whose sectors writeback could not place: a damaged extent item
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

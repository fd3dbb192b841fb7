//! No-COW overwrites: a file with the NODATACOW flag is rewritten in place
//! where its extent is plain, referenced once, not shared with a snapshot,
//! and has no checksums. The checksum question is asked with an early-exit
//! existence check (seed 002), never by collecting the checksums. A
//! reference added in the running transaction (a clone) is still a delayed
//! ref, so pending changes count as sharing too.

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
    use crate::format::consts::INODE_NODATACOW;
    use crate::fs::NewInode;
    use crate::test_fs::TestFs;

    #[test]
    fn extent_reaching_past_its_disk_extent_is_not_written_in_place() {
        let t = TestFs::new();
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        let id = t.fs().create(t.fs().root(), b"nocow", new).unwrap().id;
        t.fs().set_flags(id, INODE_NODATACOW).unwrap();
        t.fs().write(id, 0, &[1u8; 12288]).unwrap();
        t.fs().commit().unwrap();
        t.skew_extent(id, 0, 8192);
        t.fs().commit().unwrap();
        // An overwrite in place would land in the two sectors after the
        // extent.
        let r = t
            .fs()
            .write(id, 0, &[2u8; 12288])
            .and_then(|_| t.fs().commit());
        match r {
            Err(Error::Corrupt(_)) => {}
            other => panic!("expected a corrupt-metadata error, got {other:?}"),
        }
    }
}

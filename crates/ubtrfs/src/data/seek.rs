//! `SEEK_DATA` / `SEEK_HOLE`: where a file's data and holes are. Inline and
//! written extents and dirty data are data; holes and preallocated
//! (unwritten) extents read as zeros and count as holes, as in the kernel.

use crate::format::consts::*;
use crate::format::items::ExtentBody;
use crate::fs::{Filesystem, InodeId};
use crate::{Error, Result};

/// What to seek for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    /// The next byte at or after the offset that is data.
    Data,
    /// The next byte at or after the offset that is in a hole (the end of
    /// the file counts as a hole).
    Hole,
}

impl Filesystem {
    /// The data ranges `[start, end)` of `id` that overlap `[from, size)`, merged.
    pub fn data_ranges(&self, id: InodeId, from: u64) -> Result<Vec<(u64, u64)>> {
        let size = self.inode_item(id)?.size;
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for item in self.file_extents_overlapping(id, from, u64::MAX)? {
            let (start, fe) = item?;
            let is_data = match fe.body {
                ExtentBody::Inline(_) => true,
                ExtentBody::Regular { disk_bytenr, .. } => {
                    disk_bytenr != 0 && fe.extent_type == FILE_EXTENT_REG
                }
            };
            let end = start.saturating_add(fe.len()).min(size);
            if is_data && end > from.max(start) {
                ranges.push((start.max(from), end));
            }
        }
        let ss = self.geometry().sectorsize as u64;
        {
            let d = self.delalloc();
            for (offset, len) in d.ranges(id, ss) {
                let end = (offset + len).min(size);
                if end > from.max(offset) {
                    ranges.push((offset.max(from), end));
                }
            }
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in ranges {
            match merged.last_mut() {
                Some((_, pe)) if s <= *pe => *pe = (*pe).max(e),
                _ => merged.push((s, e)),
            }
        }
        Ok(merged)
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` from `offset`.
    pub fn seek(&self, id: InodeId, offset: u64, whence: Whence) -> Result<u64> {
        let size = self.inode_item(id)?.size;
        if offset >= size {
            return Err(Error::NoData(format!(
                "offset {offset} is at or past the end of the file ({size})"
            )));
        }
        let ranges = self.data_ranges(id, offset)?;
        Ok(match whence {
            Whence::Data => ranges
                .first()
                .map(|&(s, _)| s)
                .ok_or_else(|| Error::NoData(format!("no data after offset {offset}")))?,
            Whence::Hole => match ranges.first() {
                Some(&(s, e)) if s <= offset => e,
                _ => offset,
            },
        })
    }
}

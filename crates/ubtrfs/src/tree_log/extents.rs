//! File extents during replay: a logged extent replaces whatever the file
//! had in its range, gains its back reference in the extent tree (a new
//! extent item when the kernel had not committed one yet), and brings its
//! data checksums from the log into the checksum tree.

use super::replay::Replay;
use crate::alloc::delayed_ref::DataOwner;
use crate::csum_tree;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem};
use crate::fs::InodeId;
use crate::{Error, Result};

impl Replay<'_> {
    /// Replay the file extent item `data` of inode `ino` at file offset `at`.
    pub(super) fn replay_extent(&mut self, ino: u64, at: u64, data: &[u8]) -> Result<()> {
        let fe = FileExtentItem::parse(data)?;
        let ss = self.fs.geometry().sectorsize as u64;
        // Its checksums are gathered per sector of the extent below.
        fe.check_disk_extent(ss)?;
        let len = match &fe.body {
            ExtentBody::Inline(_) => fe.ram_bytes.div_ceil(ss).saturating_mul(ss),
            ExtentBody::Regular { num_bytes, .. } => *num_bytes,
        };
        let end = at.checked_add(len).ok_or_else(|| {
            Error::corrupt(format!("logged extent of inode {ino} at {at} overflows"))
        })?;
        let key = Key::new(ino, EXTENT_DATA_KEY, at);
        let id = InodeId {
            subvol: self.subvol,
            ino,
        };
        if self.inode(ino)?.is_none() {
            // No inode to hold it (the log did not record one): nothing to do.
            return Ok(());
        }
        let same = self.tree()?.get(&key)?.is_some_and(|it| it.data() == data);
        if same {
            return Ok(());
        }
        self.fs.drop_range(self.w, id, at, end)?;
        self.fixup.insert(ino);
        let hole = matches!(fe.body, ExtentBody::Regular { disk_bytenr: 0, .. });
        if hole && self.no_holes {
            // With no-holes, a logged hole only punches the range.
            return Ok(());
        }
        let bytes = data.to_vec();
        self.edit(|ed, root| ed.put(root, key, bytes))?;
        let ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } = fe.body
        else {
            return Ok(());
        };
        if disk_bytenr == 0 {
            return Ok(());
        }
        let owner = DataOwner {
            root: self.subvol,
            objectid: ino,
            offset: at.wrapping_sub(offset),
        };
        self.w
            .blocks
            .refs
            .change_data(disk_bytenr, disk_num_bytes, owner, 1);
        self.take_claimed(disk_bytenr)?;
        if fe.extent_type != FILE_EXTENT_REG {
            return Ok(());
        }
        // Checksums cover the whole extent when it is compressed, else the
        // part of it this item uses.
        let (start, clen) = if fe.compression != COMPRESS_NONE {
            (disk_bytenr, disk_num_bytes)
        } else {
            (disk_bytenr + offset, num_bytes)
        };
        self.replay_csums(start, clen)
    }

    /// An extent the replay references: if it was set aside as space the
    /// log used but the extent tree did not know, it is allocated now.
    fn take_claimed(&mut self, bytenr: u64) -> Result<()> {
        let Some(len) = self.claimed.remove(&bytenr) else {
            return Ok(());
        };
        let g = self.w.blocks.alloc.group_of(bytenr)?;
        if !g.pinned.remove(bytenr, len) {
            return Err(Error::corrupt(format!(
                "logged data extent {bytenr}+{len} is no longer set aside"
            )));
        }
        g.dirty_free = true;
        Ok(())
    }

    /// Replace the checksums of `[start, start + len)` in the checksum tree
    /// by the log's, if the log has any for that range.
    fn replay_csums(&mut self, start: u64, len: u64) -> Result<()> {
        let geo = self.fs.geometry();
        let (ss, cs) = (geo.sectorsize as u64, geo.csum_size);
        let end = start
            .checked_add(len)
            .ok_or_else(|| Error::corrupt(format!("logged extent {start}+{len} overflows")))?;
        // Per sector, the log's checksum (log items may start before
        // `start`). The extent was checked to be in whole sectors and of a
        // bounded length; a partial last sector still gets its slot.
        let mut sums: Vec<Option<&[u8]>> = vec![None; len.div_ceil(ss) as usize];
        let first = self
            .log
            .range(
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, start),
            )
            .last()
            .map_or(start, |(k, _)| k.offset);
        for (k, data) in self.log.range(
            Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, first),
            Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end.saturating_sub(1)),
        ) {
            for (i, c) in data.chunks_exact(cs).enumerate() {
                let Some(sector) = k.offset.checked_add(i as u64 * ss) else {
                    break;
                };
                if sector >= start
                    && sector < end
                    && let Some(slot) = sums.get_mut(((sector - start) / ss) as usize)
                {
                    *slot = Some(c);
                }
            }
        }
        if sums.iter().all(Option::is_none) {
            return Ok(());
        }
        // Runs of consecutive sectors with checksums.
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (i, s) in sums.iter().enumerate() {
            let Some(c) = s else { continue };
            let at = start + i as u64 * ss;
            match runs.last_mut() {
                Some((s0, v)) if *s0 + (v.len() / cs) as u64 * ss == at => v.extend_from_slice(c),
                _ => runs.push((at, c.to_vec())),
            }
        }
        self.fs.modify_tree(self.w, CSUM_TREE_OBJECTID, |ed, root| {
            csum_tree::delete_range(ed, root, start, len, geo.sectorsize, cs)?;
            for (at, v) in &runs {
                csum_tree::insert(ed, root, *at, v, geo.sectorsize, cs)?;
            }
            Ok(())
        })
    }
}

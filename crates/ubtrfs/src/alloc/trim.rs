//! Trim (`fstrim`, the FITRIM ioctl): tell the devices which of their
//! bytes hold nothing, so an image file gets holes there and an SSD or
//! thin volume can reuse them. Trimmed: the free space of block groups
//! (every copy of it) and the device space no chunk uses.
//!
//! Only what is free for good is trimmed: space freed by the running
//! transaction is pinned until its commit (the last commit's trees may
//! still use it), and the log's blocks are allocated, so neither is in
//! the free space looked at. Each block group is trimmed under the lock
//! of changes, so nothing is allocated there meanwhile.

use crate::format::consts::*;
use crate::fs::Filesystem;
use crate::volume::Profile;
use crate::{Error, Result};

/// Bytes of a superblock copy, never trimmed.
const SUPER_COPY_SIZE: u64 = 4096;

/// What a trim did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Free bytes of block groups trimmed (counted once, whatever the copies).
    pub free_space: u64,
    /// Unallocated device bytes trimmed.
    pub unallocated: u64,
    /// Block groups left alone (RAID5/6, whose parity covers free space).
    pub skipped_groups: u64,
}

impl Trimmed {
    /// All bytes trimmed, as FITRIM reports them.
    pub fn bytes(&self) -> u64 {
        self.free_space + self.unallocated
    }
}

impl Filesystem {
    /// Trim the free space of the block groups in logical range
    /// `[start, start + len)`, in free runs of at least `min_len` bytes,
    /// and, when the range is the whole filesystem, every device's
    /// unallocated space. Devices that take no discard are left as they
    /// are (nothing is trimmed there).
    pub fn trim(&self, start: u64, len: u64, min_len: u64) -> Result<Trimmed> {
        if self.writer.is_none() {
            return Err(Error::ReadOnly("trim of a read-only filesystem".into()));
        }
        let end = start.saturating_add(len);
        let min_len = min_len.max(u64::from(self.geometry().sectorsize));
        let mut done = Trimmed::default();
        let groups: Vec<u64> = {
            let w = self.writer()?;
            w.blocks
                .alloc
                .groups
                .values()
                // Not read-only groups: a seed's (which may still hold
                // the seed's own data there) or one being removed.
                .filter(|g| g.start < end && g.start + g.len > start && !g.read_only)
                .map(|g| g.start)
                .collect()
        };
        for at in groups {
            // One group at a time under the lock: other changes go on
            // between groups.
            let w = self.writer()?;
            let Some(g) = w.blocks.alloc.groups.get(&at) else {
                continue;
            };
            let profile = Profile::from_flags(g.flags)?;
            if matches!(profile, Profile::Raid5 | Profile::Raid6) {
                done.skipped_groups += 1;
                continue;
            }
            let runs: Vec<(u64, u64)> = g
                .free
                .iter()
                .filter_map(|(s, l)| {
                    let (a, b) = (s.max(start), (s + l).min(end));
                    (b > a && b - a >= min_len).then_some((a, b - a))
                })
                .collect();
            for (s, l) in runs {
                if self.discard_logical(s, l)? {
                    done.free_space += l;
                }
            }
            drop(w);
        }
        // Unallocated space lies outside the logical range: trimmed when
        // the whole filesystem is asked for (as fstrim does by default).
        if start > 0 || end < self.total_bytes() {
            return Ok(done);
        }
        let w = self.writer()?;
        let devices = self.device_holes()?;
        for (devid, holes) in devices {
            for (s, l) in holes {
                if l >= min_len && self.discard_physical(devid, s, l)? {
                    done.unallocated += l;
                }
            }
        }
        drop(w);
        Ok(done)
    }

    /// Discard every copy of logical range `[logical, logical + len)`,
    /// inside one chunk; true if every device took it.
    fn discard_logical(&self, logical: u64, len: u64) -> Result<bool> {
        let volume = self.tree_reader().volume();
        let chunk = volume.chunks.lookup(logical)?;
        let mut all = true;
        for mirror in 0..chunk.num_copies() {
            let mut pos = logical;
            while pos < logical + len {
                let want = usize::try_from(logical + len - pos).unwrap_or(usize::MAX);
                let piece = chunk.map(pos, want, mirror)?;
                all &= self.discard_physical(piece.devid, piece.physical, piece.len as u64)?;
                pos += piece.len as u64;
            }
        }
        Ok(all)
    }

    /// Discard `len` bytes at `offset` of device `devid`, never the first
    /// MiB nor a superblock copy; true if the device took it.
    fn discard_physical(&self, devid: u64, offset: u64, len: u64) -> Result<bool> {
        let volume = self.tree_reader().volume();
        let dev = volume
            .devices
            .get(devid)
            .ok_or_else(|| Error::Devices(format!("device {devid} is missing; cannot trim it")))?;
        let mut pieces = vec![(offset.max(1 << 20), (offset + len).min(dev.size()))];
        for &sb in &SUPER_OFFSETS {
            let (lo, hi) = (sb, sb + SUPER_COPY_SIZE);
            pieces = pieces
                .into_iter()
                .flat_map(|(a, b)| {
                    if b <= lo || a >= hi {
                        vec![(a, b)]
                    } else {
                        vec![(a, lo.max(a)), (hi.min(b), b)]
                    }
                })
                .filter(|(a, b)| b > a)
                .collect();
        }
        let mut all = true;
        for (a, b) in pieces {
            all &= dev.discard(a, b - a)?;
        }
        Ok(all)
    }
}

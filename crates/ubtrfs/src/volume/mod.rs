//! The volume layer: the devices of one filesystem and the chunk map that
//! turns logical addresses into device ranges.

pub mod chunk_map;
pub mod dev_stats;
mod devices;
mod parity;

pub use chunk_map::{ChunkMap, Profile};
pub use dev_stats::{DevStat, DeviceStats};
pub use devices::{DeviceSet, scan_device};
pub(crate) use parity::RowParity;

use crate::device::Device;
use crate::{Error, Result};
use std::sync::Arc;

/// The devices of a filesystem plus its chunk map: logical reads.
pub struct Volume {
    /// The devices, by devid.
    pub devices: DeviceSet,
    /// Logical to physical mapping.
    pub chunks: ChunkMap,
    /// RAID5/6 rows being rewritten: one writer (or rebuilding reader) at
    /// a time per row.
    rows: parity::RowLocks,
}

impl Volume {
    /// The volume of `devices` mapped by `chunks`.
    pub fn new(devices: DeviceSet, chunks: ChunkMap) -> Self {
        Volume {
            devices,
            chunks,
            rows: parity::RowLocks::default(),
        }
    }

    /// Whether the chunk holding `logical` lies on a seed device (of a
    /// sprouted filesystem): never written.
    pub fn on_seed(&self, logical: u64) -> bool {
        !self.devices.seeds.is_empty()
            && self
                .chunks
                .lookup(logical)
                .is_ok_and(|c| c.item.stripes.iter().any(|s| self.devices.is_seed(s.devid)))
    }

    /// The device copy `mirror` of `logical` is read from, if the copy is
    /// on one device (not a RAID5/6 rebuild).
    pub fn device_of_copy(&self, logical: u64, mirror: usize) -> Option<u64> {
        let chunk = self.chunks.lookup(logical).ok()?;
        if mirror > 0 && chunk.profile.parity_stripes() > 0 {
            return None;
        }
        chunk.map(logical, 1, mirror).ok().map(|p| p.devid)
    }

    /// Count `stat` against the device copy `mirror` of `logical` was
    /// read from.
    pub fn record_copy_error(&self, logical: u64, mirror: usize, stat: DevStat) {
        if let Some(devid) = self.device_of_copy(logical, mirror) {
            self.devices.stats.record(devid, stat);
        }
    }

    /// Whether one copy of `logical` may be written alone to mend it: a
    /// mirrored chunk (in RAID5/6 a write keeps the row's parity), not on
    /// a seed device.
    pub fn copy_writable_alone(&self, logical: u64) -> bool {
        self.chunks
            .lookup(logical)
            .is_ok_and(|c| c.profile.parity_stripes() == 0)
            && !self.on_seed(logical)
    }

    /// Count the bad data copy `mirror` of `logical` a read found, once
    /// until it is mended (see [`DeviceStats::record_bad_read`]).
    pub fn record_bad_read(&self, logical: u64, mirror: usize) {
        if let Some(devid) = self.device_of_copy(logical, mirror) {
            self.devices.stats.record_bad_read(devid, logical);
        }
    }

    /// Copy `mirror` of `logical` was written over with a good one.
    pub fn copy_mended(&self, logical: u64, mirror: usize) {
        if let Some(devid) = self.device_of_copy(logical, mirror) {
            self.devices.stats.mended(devid, logical);
        }
    }

    /// How many ways there are to read the data at `logical`: its copies
    /// (1 unless mirrored), and in RAID5 one more (rebuilt with P), in
    /// RAID6 two more (rebuilt with P, or with Q), as the kernel counts.
    pub fn num_copies(&self, logical: u64) -> Result<usize> {
        let chunk = self.chunks.lookup(logical)?;
        Ok(match chunk.profile.parity_stripes() {
            0 => chunk.num_copies(),
            parity => 1 + parity as usize,
        })
    }

    /// Read `buf.len()` bytes at `logical` from copy `mirror` (0-based; see
    /// [`Volume::num_copies`]). The range must not cross a chunk boundary.
    /// Copy 0 of RAID5/6 rebuilds only the stripes whose device is missing
    /// or fails the read.
    pub fn read_copy(&self, logical: u64, mirror: usize, buf: &mut [u8]) -> Result<()> {
        let chunk = self.chunks.lookup(logical)?;
        let parity = matches!(chunk.profile, Profile::Raid5 | Profile::Raid6);
        if parity
            && logical
                .checked_add(buf.len() as u64)
                .is_none_or(|e| e > chunk.end())
        {
            return Err(Error::Unmapped(chunk.end()));
        }
        if parity && mirror > 0 {
            if mirror > chunk.profile.parity_stripes() as usize {
                return Err(Error::Invalid(format!(
                    "copy {mirror} of logical {logical}"
                )));
            }
            return self.read_rebuilt(&chunk, logical, buf, mirror == 2);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = logical + done as u64;
            let piece = chunk.map(pos, buf.len() - done, mirror)?;
            let part = &mut buf[done..done + piece.len];
            if parity {
                // Read directly where the device is there and answers; only
                // what is not is rebuilt from the rest of its row.
                let direct = self
                    .devices
                    .get(piece.devid)
                    .map(|dev| dev.read_at(piece.physical, part));
                if !matches!(direct, Some(Ok(()))) {
                    self.read_rebuilt(&chunk, pos, part, false)?;
                }
                done += piece.len;
                continue;
            }
            let dev: &Arc<dyn Device> = self.devices.get(piece.devid).ok_or_else(|| {
                Error::Devices(format!(
                    "device {} holding logical {pos} is missing",
                    piece.devid
                ))
            })?;
            dev.read_at(piece.physical, part)?;
            done += piece.len;
        }
        Ok(())
    }

    /// Write `buf` at `logical` to every copy (to its stripe and the
    /// row's parity, in RAID5/6). The range must not cross a chunk boundary.
    pub fn write(&self, logical: u64, buf: &[u8]) -> Result<()> {
        let chunk = self.chunks.lookup(logical)?;
        if matches!(chunk.profile, Profile::Raid5 | Profile::Raid6) {
            return self.write_parity(&chunk, logical, buf);
        }
        for mirror in 0..chunk.num_copies() {
            self.write_mirror(&chunk, logical, mirror, buf)?;
        }
        Ok(())
    }

    /// Write `buf` at `logical` to copy `mirror` alone (a scrub mending
    /// one bad copy). Mirrored profiles only: in RAID5/6 a write must keep
    /// the row's parity ([`Volume::write`]). The range must not cross a
    /// chunk boundary.
    pub fn write_copy(&self, logical: u64, mirror: usize, buf: &[u8]) -> Result<()> {
        let chunk = self.chunks.lookup(logical)?;
        if matches!(chunk.profile, Profile::Raid5 | Profile::Raid6) {
            return Err(Error::Invalid(format!(
                "one copy of logical {logical} written alone in RAID5/6"
            )));
        }
        self.write_mirror(&chunk, logical, mirror, buf)
    }

    /// Write `buf` at `logical` to copy `mirror` of mirrored `chunk`.
    fn write_mirror(
        &self,
        chunk: &chunk_map::Chunk,
        logical: u64,
        mirror: usize,
        buf: &[u8],
    ) -> Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = logical + done as u64;
            let piece = chunk.map(pos, buf.len() - done, mirror)?;
            let dev = self.devices.get(piece.devid).ok_or_else(|| {
                Error::Devices(format!(
                    "device {} holding copy {mirror} of logical {pos} is missing; cannot write",
                    piece.devid
                ))
            })?;
            dev.write_at(piece.physical, &buf[done..done + piece.len])?;
            done += piece.len;
        }
        Ok(())
    }

    /// [`Device::write_behind`] for every copy of `len` bytes at `logical`
    /// (within one chunk).
    pub fn write_behind(&self, logical: u64, len: usize, wait: bool) -> Result<()> {
        let chunk = self.chunks.lookup(logical)?;
        if matches!(chunk.profile, Profile::Raid5 | Profile::Raid6) {
            return self.parity_write_behind(&chunk, logical, len, wait);
        }
        for mirror in 0..chunk.num_copies() {
            let mut done = 0usize;
            while done < len {
                let pos = logical + done as u64;
                let piece = chunk.map(pos, len - done, mirror)?;
                if let Some(dev) = self.devices.get(piece.devid) {
                    dev.write_behind(piece.physical, piece.len as u64, wait)?;
                }
                done += piece.len;
            }
        }
        Ok(())
    }

    /// Whether copy `mirror` of `logical` is on a device that is present
    /// (for a RAID5/6 rebuild: whether enough devices are).
    pub fn copy_present(&self, logical: u64, mirror: usize) -> bool {
        let Ok(chunk) = self.chunks.lookup(logical) else {
            return false;
        };
        if mirror > 0 && matches!(chunk.profile, Profile::Raid5 | Profile::Raid6) {
            return self.can_rebuild(&chunk, mirror);
        }
        chunk
            .map(logical, 1, mirror)
            .map(|p| self.devices.get(p.devid).is_some())
            .unwrap_or(false)
    }
}

//! Ordered extents: a range of a file on its way to a newly allocated data
//! extent. It carries its checksums until completion puts them, with the
//! file extent item, into the running transaction (seed 000: an fsync can
//! take the checksums from here; reads never look here).
//!
//! Checksums are computed in one of three ways (seed 003): `inline`, in the
//! writing thread before the device write; `offload`, on a worker thread
//! while the data is being written, joined at completion; `auto`, which
//! picks per extent from measured costs.

use crate::Result;
use crate::alloc::delayed_ref::DataOwner;
use crate::csum_tree;
use crate::format::CsumType;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem};
use crate::fs::{Filesystem, InodeId};
use crate::transaction::Writer;
use std::time::Instant;

/// How data checksums are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CsumMode {
    /// In the writing thread, before the write.
    Inline,
    /// On a worker thread, concurrently with the write.
    Offload,
    /// Per extent, from measured checksum and write speeds.
    #[default]
    Auto,
}

/// Running cost estimates for `auto`: nanoseconds per KiB, smoothed.
#[derive(Clone, Copy, Debug, Default)]
pub struct CsumStats {
    /// Checksum cost.
    pub csum_ns_per_kib: f64,
    /// Device write cost.
    pub write_ns_per_kib: f64,
    /// Extents done in each mode (inline, offload).
    pub extents: [u64; 2],
}

impl CsumStats {
    fn learn(old: &mut f64, sample: f64) {
        *old = if *old == 0.0 {
            sample
        } else {
            *old * 0.8 + sample * 0.2
        };
    }

    /// Whether `auto` offloads an extent of `len` bytes: only when there is
    /// a core to spare, the extent is big enough to pay for a thread, and
    /// the checksum is a real share of the write time.
    pub fn offload(&self, len: u64) -> bool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 2 || len < OFFLOAD_MIN {
            return false;
        }
        // Until both costs are known, overlap: it never loses much on big extents.
        if self.csum_ns_per_kib == 0.0 || self.write_ns_per_kib == 0.0 {
            return true;
        }
        self.csum_ns_per_kib * 10.0 > self.write_ns_per_kib
    }
}

/// Extents smaller than this are never offloaded: a thread costs more.
const OFFLOAD_MIN: u64 = 256 << 10;

/// A file range bound for a new data extent.
#[derive(Debug)]
pub struct OrderedExtent {
    /// The file.
    pub id: InodeId,
    /// File offset of the first byte (sector-aligned).
    pub file_offset: u64,
    /// Where the data goes.
    pub disk_bytenr: u64,
    /// The bytes (a whole number of sectors).
    pub data: Vec<u8>,
    /// Checksums, one per sector, once computed.
    pub sums: Option<Vec<u8>>,
    /// How `data` is compressed; `ram_len` is its size uncompressed.
    pub compression: super::compression::Compression,
    /// Bytes of the file the extent covers.
    pub ram_len: u64,
}

impl OrderedExtent {
    /// An ordered extent for `data` at `file_offset`, going to `disk_bytenr`.
    pub fn new(id: InodeId, file_offset: u64, disk_bytenr: u64, data: Vec<u8>) -> Self {
        let ram_len = data.len() as u64;
        OrderedExtent {
            id,
            file_offset,
            disk_bytenr,
            data,
            sums: None,
            compression: super::compression::Compression::None,
            ram_len,
        }
    }

    /// An ordered extent whose `data` is `kind`-compressed (padded to whole
    /// sectors) and covers `ram_len` bytes of the file.
    pub fn compressed(
        id: InodeId,
        file_offset: u64,
        disk_bytenr: u64,
        data: Vec<u8>,
        kind: super::compression::Compression,
        ram_len: u64,
    ) -> Self {
        OrderedExtent {
            compression: kind,
            ram_len,
            ..Self::new(id, file_offset, disk_bytenr, data)
        }
    }
}

fn checksums(data: &[u8], csum_type: CsumType, sectorsize: usize, csum_size: usize) -> Vec<u8> {
    let mut sums = Vec::with_capacity(data.len() / sectorsize * csum_size);
    for sector in data.chunks(sectorsize) {
        sums.extend_from_slice(&csum_type.compute(sector)[..csum_size]);
    }
    sums
}

impl Filesystem {
    /// Write an ordered extent's data, compute its checksums, and complete
    /// it into the running transaction. Returns the bytes it adds to the file.
    pub(crate) fn complete_ordered(&self, w: &mut Writer, mut oe: OrderedExtent) -> Result<u64> {
        let geo = self.geometry();
        let csum_type = self.superblock().csum_type;
        let nodatasum = self.inode_item(oe.id)?.flags & INODE_NODATASUM != 0;
        let len = oe.data.len() as u64;
        let volume = self.tree_reader().volume();
        let (ss, cs) = (geo.sectorsize as usize, geo.csum_size);
        let offload = !nodatasum
            && match w.csum_mode {
                CsumMode::Inline => false,
                CsumMode::Offload => true,
                CsumMode::Auto => w.csum_stats.offload(len),
            };
        let kib = (len as f64 / 1024.0).max(1.0);
        if nodatasum {
            volume.write(oe.disk_bytenr, &oe.data)?;
        } else if offload {
            let data = &oe.data;
            let (sums, write) = std::thread::scope(|s| {
                let worker = s.spawn(move || {
                    let t = Instant::now();
                    let sums = checksums(data, csum_type, ss, cs);
                    (sums, t.elapsed().as_nanos() as f64)
                });
                let t = Instant::now();
                let write = volume.write(oe.disk_bytenr, data);
                let write_ns = t.elapsed().as_nanos() as f64;
                (worker.join(), write.map(|_| write_ns))
            });
            let write_ns = write?;
            let (sums, csum_ns) =
                sums.map_err(|_| crate::Error::Invalid("checksum worker failed".into()))?;
            CsumStats::learn(&mut w.csum_stats.write_ns_per_kib, write_ns / kib);
            CsumStats::learn(&mut w.csum_stats.csum_ns_per_kib, csum_ns / kib);
            oe.sums = Some(sums);
            w.csum_stats.extents[1] += 1;
        } else {
            let t = Instant::now();
            oe.sums = Some(checksums(&oe.data, csum_type, ss, cs));
            CsumStats::learn(
                &mut w.csum_stats.csum_ns_per_kib,
                t.elapsed().as_nanos() as f64 / kib,
            );
            let t = Instant::now();
            volume.write(oe.disk_bytenr, &oe.data)?;
            CsumStats::learn(
                &mut w.csum_stats.write_ns_per_kib,
                t.elapsed().as_nanos() as f64 / kib,
            );
            w.csum_stats.extents[0] += 1;
        }
        // Completion: the items that make the extent part of the file.
        if let Some(sums) = &oe.sums {
            self.modify_tree(w, CSUM_TREE_OBJECTID, |ed, root| {
                csum_tree::insert(
                    ed,
                    root,
                    oe.disk_bytenr,
                    sums,
                    geo.sectorsize,
                    geo.csum_size,
                )
            })?;
        }
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: oe.ram_len,
            compression: oe.compression.to_disk(),
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr: oe.disk_bytenr,
                disk_num_bytes: len,
                offset: 0,
                num_bytes: oe.ram_len,
            },
        };
        let bytes = fe.to_bytes();
        let id = oe.id;
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(
                root,
                Key::new(id.ino, EXTENT_DATA_KEY, oe.file_offset),
                bytes,
            )
        })?;
        let owner = DataOwner {
            root: id.subvol,
            objectid: id.ino,
            offset: oe.file_offset,
        };
        w.blocks.refs.change_data(oe.disk_bytenr, len, owner, 1);
        Ok(oe.ram_len)
    }

    /// Compress new data extents with `kind` (at `level`), like the
    /// `compress=` mount option; `None` writes them plain.
    pub fn set_compression(
        &self,
        kind: Option<(super::compression::Compression, Option<i32>)>,
    ) -> Result<()> {
        let mut w = self.writer()?;
        w.compress = kind.filter(|(k, _)| *k != super::compression::Compression::None);
        Ok(())
    }

    /// Choose how data checksums are computed.
    pub fn set_csum_mode(&self, mode: CsumMode) -> Result<()> {
        self.writer()?.csum_mode = mode;
        Ok(())
    }

    /// Cost estimates and per-mode counts of the checksum computation.
    pub fn csum_stats(&self) -> Result<CsumStats> {
        Ok(self.writer()?.csum_stats)
    }
}

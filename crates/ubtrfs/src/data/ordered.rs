//! Ordered extents: a range of a file on its way to a newly allocated data
//! extent. It carries its checksums until completion puts them, with the
//! file extent item, into the running transaction (seed 000: an fsync can
//! take the checksums from here; reads never look here).
//!
//! Checksums are computed in one of three ways (seed 003): `inline`, in the
//! writing thread before the device write; `offload`, on the checksum pool
//! ([`super::csum_pool`]) while the data is being written, joined at
//! completion; `auto`, which picks per piece of an extent whichever of the
//! two measured the shorter time from start to "written and summed",
//! probing the other now and then so it follows changes in load. Either
//! way the checksums exist before the extent completes, and completion
//! alone puts them in the checksum tree.

pub use super::csum_pool::PoolLoad;
use super::csum_pool::{self, CsumSpec};
use crate::Result;
use crate::alloc::delayed_ref::DataOwner;
use crate::csum_tree;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem};
use crate::fs::{Filesystem, InodeId};
use crate::transaction::Writer;
use std::sync::Arc;
use std::time::Instant;

/// How data checksums are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CsumMode {
    /// In the writing thread, before the write.
    Inline,
    /// On the checksum pool, concurrently with the write; joined at completion.
    Offload,
    /// Per piece of an extent, whichever of the two measured faster lately.
    #[default]
    Auto,
}

/// Where one piece of an ordered extent had its checksums computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the writing thread, then the device write.
    Inline,
    /// On the pool while the writing thread writes, then helps and waits.
    Offload,
}

impl Placement {
    fn index(self) -> usize {
        match self {
            Placement::Inline => 0,
            Placement::Offload => 1,
        }
    }

    fn other(self) -> Self {
        match self {
            Placement::Inline => Placement::Offload,
            Placement::Offload => Placement::Inline,
        }
    }
}

/// Why `auto` chose a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Too few measurements of this mode for pieces of this size yet.
    Warmup,
    /// It measured faster lately (offloading: or at most 5 % slower).
    Faster,
    /// A periodic look at the mode that measured slower, in case things changed.
    Probe,
    /// Every pool worker already has work queued: offloading would only wait.
    PoolBusy,
}

/// One measured piece of an ordered extent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Bytes of data.
    pub len: usize,
    /// Nanoseconds the writing thread spent hashing (inline: all of it;
    /// offloaded: the chunks it took over after its write).
    pub hash_ns: u64,
    /// Nanoseconds of the device write.
    pub write_ns: u64,
    /// Offloaded: nanoseconds waited at completion for workers still hashing.
    pub wait_ns: u64,
    /// Nanoseconds from the start of the piece until its data was written
    /// and its checksums were ready: what `auto` minimises.
    pub total_ns: u64,
    /// Offloaded: chunks of the piece the writing thread hashed itself, and
    /// chunks in all (a pool slow to start shows as a high share).
    pub helped: (usize, usize),
}

/// Pieces of up to these sizes are measured separately (fixed costs such
/// as waking a worker weigh more on small pieces); the last class runs up
/// to [`PIECE`].
const CLASS_LIMITS: [usize; 3] = [16 << 10, 64 << 10, 256 << 10];
const N_CLASSES: usize = CLASS_LIMITS.len() + 1;
/// Samples of each mode before `auto` trusts its estimate of a class.
const WARMUP: u32 = 3;
/// Weight of a new sample in the running estimate.
const ALPHA: f64 = 0.25;
/// Share of the time `auto` may lose to probing the slower mode.
const PROBE_BUDGET: f64 = 0.01;
/// How much slower offloading may measure per piece and still be chosen,
/// as a share of the whole cycle of a piece (the piece and the gap to the
/// next one).
const OFFLOAD_TIE: f64 = 0.05;
/// A longer pause between two pieces is idleness, not work between them.
pub const GAP_MAX_NS: u64 = 20_000_000;
/// Bounds of the probe interval, in pieces of one class.
const PROBE_MIN: u32 = 8;
const PROBE_MAX: u32 = 256;
/// Ordered extents are written and checksummed in pieces of at most this
/// size, each placed by `auto` on its own: a 128 MiB extent teaches it as
/// much as many small ones, and adapts mid-way.
pub const PIECE: usize = 1 << 20;

/// `auto`'s view of one size class.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassCost {
    /// Estimated end-to-end nanoseconds per KiB, inline and offloaded.
    pub ns_per_kib: [f64; 2],
    /// Samples taken of each.
    pub samples: [u32; 2],
    /// Nanoseconds per KiB from the end of a piece to the start of the
    /// next (the other work of the system: tree updates, commits, FUSE
    /// requests, the application), whatever the mode; smoothed.
    pub gap_ns_per_kib: f64,
    /// Pieces since the slower mode was last probed.
    since_probe: u32,
}

/// Measured costs of checksumming and writing, and the `auto` decision
/// that follows from them. Deterministic: the same samples and pool loads
/// give the same choices.
#[derive(Clone, Copy, Debug, Default)]
pub struct CsumStats {
    /// Per size class, the end-to-end cost of each mode.
    pub classes: [ClassCost; N_CLASSES],
    /// Inline hashing, nanoseconds per KiB (smoothed).
    pub csum_ns_per_kib: f64,
    /// Device writes, nanoseconds per KiB (smoothed).
    pub write_ns_per_kib: f64,
    /// Offloaded pieces: nanoseconds per KiB spent helping and waiting
    /// after the device write (smoothed).
    pub finish_ns_per_kib: f64,
    /// Pieces done in each mode (inline, offloaded).
    pub extents: [u64; 2],
    /// Offloaded pieces: share of the chunks the writing thread hashed
    /// itself (smoothed; 1 means the workers never got to them).
    pub helped_share: f64,
    /// Pieces `auto` placed as a probe of the slower mode.
    pub probes: u64,
    /// Pieces `auto` kept inline because the pool was saturated.
    pub busy: u64,
    /// Size and end of the last piece, for its gap to the next.
    last_piece: Option<(usize, Instant)>,
}

fn class_of(len: usize) -> usize {
    CLASS_LIMITS
        .iter()
        .position(|&l| len <= l)
        .unwrap_or(CLASS_LIMITS.len())
}

fn smooth(old: &mut f64, sample: f64) {
    *old = if *old == 0.0 {
        sample
    } else {
        *old * (1.0 - ALPHA) + sample * ALPHA
    };
}

impl CsumStats {
    /// Where `auto` puts the checksums of a piece of `len` bytes, given
    /// how busy the pool is.
    pub fn choose(&mut self, len: usize, load: PoolLoad) -> (Placement, Reason) {
        let (p, why) = self.decide(len, load);
        match why {
            Reason::Probe => self.probes += 1,
            Reason::PoolBusy => self.busy += 1,
            _ => {}
        }
        (p, why)
    }

    fn decide(&mut self, len: usize, load: PoolLoad) -> (Placement, Reason) {
        if load.saturated() {
            return (Placement::Inline, Reason::PoolBusy);
        }
        let c = &mut self.classes[class_of(len)];
        for p in [Placement::Inline, Placement::Offload] {
            if c.samples[p.index()] < WARMUP && c.samples[p.index()] <= c.samples[p.other().index()]
            {
                return (p, Reason::Warmup);
            }
        }
        let [inline, offload] = c.ns_per_kib;
        // Near-ties go to offload: the piece's own time misses what the mode
        // does to the work between pieces, and there offloading won or tied
        // in every setup of seed 003 and in bench/fsync-matrix.sh (a worker
        // that hashes lets the writer return sooner; with help-out the
        // writer never idles). Inline must be clearly faster to be chosen.
        // Only a difference that is a real share of the whole cycle counts:
        // small fsync'd pieces spend most of their cycle between pieces,
        // where a waiting worker's CPU stays awake for the next request.
        let (best, ratio) = if offload <= inline + (inline + c.gap_ns_per_kib) * OFFLOAD_TIE {
            (Placement::Offload, inline / offload.max(f64::MIN_POSITIVE))
        } else {
            (Placement::Inline, offload / inline.max(f64::MIN_POSITIVE))
        };
        // Probe the slower mode often when it is close (it may overtake
        // soon), rarely when it is far behind: each probe costs `ratio - 1`
        // of a piece, so at most PROBE_BUDGET of the time goes to probes.
        let interval = ((ratio - 1.0) / PROBE_BUDGET)
            .ceil()
            .clamp(PROBE_MIN as f64, PROBE_MAX as f64) as u32;
        c.since_probe += 1;
        if c.since_probe > interval {
            c.since_probe = 0;
            return (best.other(), Reason::Probe);
        }
        (best, Reason::Faster)
    }

    /// Learn the gap between a piece of `len` bytes and the next one.
    pub fn observe_gap(&mut self, len: usize, gap_ns: u64) {
        if gap_ns > GAP_MAX_NS {
            return;
        }
        let kib = (len as f64 / 1024.0).max(1.0 / 1024.0);
        let g = &mut self.classes[class_of(len)].gap_ns_per_kib;
        // `smooth` treats 0 as "no estimate yet"; keep it nonzero.
        smooth(g, (gap_ns as f64 / kib).max(1e-9));
    }

    /// Learn from a piece done with `placement`.
    pub fn observe(&mut self, placement: Placement, s: &Sample) {
        let kib = (s.len as f64 / 1024.0).max(1.0 / 1024.0);
        let i = placement.index();
        let c = &mut self.classes[class_of(s.len)];
        let x = s.total_ns as f64 / kib;
        let est = &mut c.ns_per_kib[i];
        if c.samples[i] == 0 {
            *est = x;
        } else if c.samples[i] < WARMUP {
            // Noise on a shared machine only ever adds time: the fastest
            // of the first few samples is the best first guess.
            *est = est.min(x);
        } else {
            // A sample far above the estimate (the thread was preempted)
            // moves it by a bounded step, not at once.
            *est = *est * (1.0 - ALPHA) + x.min(*est * 2.0) * ALPHA;
        }
        c.samples[i] = c.samples[i].saturating_add(1);
        self.extents[i] += 1;
        smooth(&mut self.write_ns_per_kib, s.write_ns as f64 / kib);
        match placement {
            Placement::Inline => smooth(&mut self.csum_ns_per_kib, s.hash_ns as f64 / kib),
            Placement::Offload => {
                smooth(
                    &mut self.finish_ns_per_kib,
                    (s.hash_ns + s.wait_ns) as f64 / kib,
                );
                if s.helped.1 > 0 {
                    let share = s.helped.0 as f64 / s.helped.1 as f64;
                    // `smooth` treats 0 as "no estimate yet"; keep it nonzero.
                    smooth(&mut self.helped_share, share.max(1e-9));
                }
            }
        }
    }
}

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

impl Filesystem {
    /// Write an ordered extent's data, compute its checksums, and complete
    /// it into the running transaction. Returns the bytes it adds to the file.
    pub(crate) fn complete_ordered(&self, w: &mut Writer, mut oe: OrderedExtent) -> Result<u64> {
        let nodatasum = self.inode_item(oe.id)?.flags & INODE_NODATASUM != 0;
        let len = oe.data.len() as u64;
        if nodatasum {
            self.tree_reader()
                .volume()
                .write(oe.disk_bytenr, &oe.data)?;
        } else {
            let spec = self.csum_spec();
            // Shared with the pool while it hashes; nothing reads it after.
            let data = Arc::new(std::mem::take(&mut oe.data));
            oe.sums = Some(self.write_with_sums(w, oe.disk_bytenr, &data, spec)?);
        }
        self.insert_ordered_items(w, &oe, len)
    }

    /// Completion: the items that make `oe` (of `len` bytes on disk) part
    /// of its file, and its checksums if it has them. Returns the bytes
    /// it adds to the file.
    pub(crate) fn insert_ordered_items(
        &self,
        w: &mut Writer,
        oe: &OrderedExtent,
        len: u64,
    ) -> Result<u64> {
        let geo = self.geometry();
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

    /// How this filesystem's data checksums are computed.
    pub(crate) fn csum_spec(&self) -> CsumSpec {
        CsumSpec {
            csum_type: self.superblock().csum_type,
            sectorsize: self.geo.sectorsize as usize,
            csum_size: self.geo.csum_size,
        }
    }

    /// Complete `data[part]`, bound for `disk_bytenr` at
    /// `file_offset` of `id`, into the running transaction now and leave
    /// its write and checksums to the writeback thread
    /// ([`super::in_flight`]). Returns the bytes it adds to the file.
    pub(crate) fn complete_ordered_later(
        &self,
        w: &mut Writer,
        id: InodeId,
        file_offset: u64,
        disk_bytenr: u64,
        data: &Arc<Vec<u8>>,
        part: std::ops::Range<usize>,
    ) -> Result<u64> {
        let ram_len = part.len() as u64;
        self.complete_compressed_later(
            w,
            id,
            file_offset,
            disk_bytenr,
            data,
            part,
            super::compression::Compression::None,
            ram_len,
        )
    }

    /// [`Filesystem::complete_ordered_later`] for data compressed with
    /// `kind`: `data[part]` are the bytes on disk, `ram_len` the bytes of
    /// the file they hold.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn complete_compressed_later(
        &self,
        w: &mut Writer,
        id: InodeId,
        file_offset: u64,
        disk_bytenr: u64,
        data: &Arc<Vec<u8>>,
        part: std::ops::Range<usize>,
        kind: super::compression::Compression,
        ram_len: u64,
    ) -> Result<u64> {
        let len = part.len();
        let nodatasum = self.inode_item(id)?.flags & INODE_NODATASUM != 0;
        let oe = OrderedExtent::compressed(id, file_offset, disk_bytenr, Vec::new(), kind, ram_len);
        let added = self.insert_ordered_items(w, &oe, len as u64)?;
        self.in_flight.submit(
            self.tree_reader().volume(),
            self.csum_spec(),
            disk_bytenr,
            id,
            Arc::clone(data),
            part.start,
            len,
            !nodatasum,
        )?;
        Ok(added)
    }

    /// Wait for the extents the writeback thread is writing for `owner`
    /// (every file's if `None`) and put their checksums into the running
    /// transaction; with `wait` false, only of those written already.
    pub(crate) fn finish_in_flight(
        &self,
        w: &mut Writer,
        owner: Option<InodeId>,
        wait: bool,
    ) -> Result<()> {
        if self.in_flight.is_idle() {
            return Ok(());
        }
        let geo = self.geometry();
        // A failed background write leaves extents in the trees whose
        // data is not on disk: the transaction is not whole.
        let finished = self
            .in_flight
            .finish(owner, wait)
            .map_err(crate::Error::after_change)?;
        for f in finished {
            if let Some(b) = f.buffer {
                self.delalloc().recycle(b);
            }
            if f.sums.is_empty() {
                continue;
            }
            // Each extent's checksums are whole in themselves.
            crate::transaction::abort::unit(|| {
                self.modify_tree(w, CSUM_TREE_OBJECTID, |ed, root| {
                    csum_tree::insert(ed, root, f.logical, &f.sums, geo.sectorsize, geo.csum_size)
                })
            })?;
        }
        Ok(())
    }

    /// Write `data` at `disk_bytenr` and return its checksums, piece by
    /// piece, each piece placed by the writer's checksum mode.
    fn write_with_sums(
        &self,
        w: &mut Writer,
        disk_bytenr: u64,
        data: &Arc<Vec<u8>>,
        spec: CsumSpec,
    ) -> Result<Vec<u8>> {
        let volume = self.tree_reader().volume();
        let mut sums = Vec::with_capacity(data.len().div_ceil(spec.sectorsize) * spec.csum_size);
        let mut at = 0;
        while at < data.len() {
            let end = (at + PIECE).min(data.len());
            let piece = &data[at..end];
            let pos = disk_bytenr + at as u64;
            if let Some((len, end)) = w.csum_stats.last_piece.take() {
                let gap = end.elapsed().as_nanos() as u64;
                w.csum_stats.observe_gap(len, gap);
            }
            let placement = match w.csum_mode {
                CsumMode::Inline => Placement::Inline,
                CsumMode::Offload => Placement::Offload,
                CsumMode::Auto => w.csum_stats.choose(piece.len(), pool_load()).0,
            };
            let t = Instant::now();
            let mut s = Sample {
                len: piece.len(),
                ..Sample::default()
            };
            match placement {
                Placement::Inline => {
                    spec.sums_into(piece, &mut sums);
                    s.hash_ns = t.elapsed().as_nanos() as u64;
                    volume.write(pos, piece)?;
                    s.total_ns = t.elapsed().as_nanos() as u64;
                    s.write_ns = s.total_ns - s.hash_ns;
                }
                Placement::Offload => {
                    let ticket = csum_pool::pool().submit(Arc::clone(data), at..end, spec);
                    let written = volume.write(pos, piece);
                    s.write_ns = t.elapsed().as_nanos() as u64;
                    // Always join, even after a failed write: the workers
                    // hold the data until the job is done.
                    let (piece_sums, fin) = ticket.finish();
                    s.total_ns = t.elapsed().as_nanos() as u64;
                    written?;
                    sums.extend_from_slice(
                        &piece_sums.ok_or_else(|| {
                            crate::Error::Invalid("a checksum worker failed".into())
                        })?,
                    );
                    s.hash_ns = fin.help_ns;
                    s.wait_ns = fin.wait_ns;
                    s.helped = (fin.helped, fin.chunks);
                }
            }
            w.csum_stats.observe(placement, &s);
            w.csum_stats.last_piece = Some((piece.len(), Instant::now()));
            let st = &w.csum_stats;
            if (st.extents[0] + st.extents[1]).is_multiple_of(256) {
                tracing::debug!(
                    "checksum pieces inline/offloaded {:?}, probes {}, busy {}; \
                     per KiB: hash {:.0} ns, write {:.0} ns, offload finish {:.0} ns; \
                     classes (inline, offload, gap ns/KiB): {:?}",
                    st.extents,
                    st.probes,
                    st.busy,
                    st.csum_ns_per_kib,
                    st.write_ns_per_kib,
                    st.finish_ns_per_kib,
                    st.classes.map(|c| (
                        c.ns_per_kib[0] as u64,
                        c.ns_per_kib[1] as u64,
                        c.gap_ns_per_kib as u64
                    )),
                );
            }
            at = end;
        }
        Ok(sums)
    }

    /// Compress new data extents with `kind` (at `level`), like the
    /// `compress=` mount option; `None` writes them plain.
    pub fn set_compression(
        &self,
        kind: Option<(super::compression::Compression, Option<i32>)>,
    ) -> Result<()> {
        let mut w = self.lock_writer()?;
        w.compress = kind.filter(|(k, _)| *k != super::compression::Compression::None);
        self.delalloc().set_max_run(if w.compress.is_some() {
            super::write::COMPRESS_JOB
        } else {
            super::write::MAX_EXTENT
        });
        Ok(())
    }

    /// Whether compression tries every new extent (`compress-force`), or
    /// writes data that looks incompressible plain without trying (the
    /// default, `compress`). Either way an extent that does not shrink
    /// by a sector is written plain.
    pub fn set_compress_force(&self, force: bool) -> Result<()> {
        self.lock_writer()?.compress_force = force;
        Ok(())
    }

    /// Copy dirty runs into compression jobs instead of lending them, for
    /// tests of that path.
    #[doc(hidden)]
    pub fn set_lend_runs(&self, on: bool) -> Result<()> {
        self.lock_writer()?.lend_runs = on;
        Ok(())
    }

    /// Give every new regular file `flags` (of `INODE_NODATACOW` and
    /// `INODE_NODATASUM`, with no-COW bringing no-checksum), as the
    /// kernel's `nodatacow` and `nodatasum` mount options do.
    pub fn set_new_file_flags(&self, flags: u64) -> Result<()> {
        use crate::format::consts::{INODE_NODATACOW, INODE_NODATASUM};
        if flags & !(INODE_NODATACOW | INODE_NODATASUM) != 0 {
            return Err(crate::Error::Invalid(format!("new file flags {flags:#x}")));
        }
        let flags = if flags & INODE_NODATACOW != 0 {
            flags | INODE_NODATASUM
        } else {
            flags
        };
        self.lock_writer()?.new_file_flags = flags;
        Ok(())
    }

    /// Choose how data checksums are computed.
    pub fn set_csum_mode(&self, mode: CsumMode) -> Result<()> {
        self.lock_writer()?.csum_mode = mode;
        Ok(())
    }

    /// Cost estimates, per-mode counts and `auto`'s state.
    pub fn csum_stats(&self) -> Result<CsumStats> {
        let w = self
            .writer
            .as_ref()
            .ok_or_else(|| crate::Error::ReadOnly("the filesystem was opened read-only".into()))?;
        Ok(w.lock().unwrap_or_else(|e| e.into_inner()).csum_stats)
    }
}

/// How busy the pool is; a pool not started yet is idle.
fn pool_load() -> PoolLoad {
    csum_pool::pool().load()
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: PoolLoad = PoolLoad {
        workers: 1,
        active: 0,
        queued: 0,
    };

    /// Drive `auto` over `n` pieces of `len` bytes whose end-to-end time in
    /// each placement is `cost(placement, step)` nanoseconds per KiB.
    fn drive(
        st: &mut CsumStats,
        len: usize,
        n: usize,
        cost: impl Fn(Placement, usize) -> u64,
    ) -> Vec<(Placement, Reason)> {
        (0..n)
            .map(|step| {
                let (p, why) = st.choose(len, IDLE);
                let total_ns = cost(p, step) * (len as u64 / 1024);
                st.observe(
                    p,
                    &Sample {
                        len,
                        total_ns,
                        ..Sample::default()
                    },
                );
                (p, why)
            })
            .collect()
    }

    fn count(v: &[(Placement, Reason)], p: Placement) -> usize {
        v.iter().filter(|(q, _)| *q == p).count()
    }

    #[test]
    fn warmup_alternates_then_follows_the_faster_mode() {
        for (inline, offload, winner) in [
            (300, 100, Placement::Offload),
            (100, 300, Placement::Inline),
            (100, 100, Placement::Offload),
            (100, 104, Placement::Offload),
            (100, 110, Placement::Inline),
        ] {
            let mut st = CsumStats::default();
            let v = drive(&mut st, PIECE, 200, |p, _| match p {
                Placement::Inline => inline,
                Placement::Offload => offload,
            });
            let warm: Vec<_> = v.iter().take(6).map(|(p, _)| *p).collect();
            assert_eq!(
                warm,
                [Placement::Inline, Placement::Offload].repeat(3),
                "warmup alternates"
            );
            assert!(v[..6].iter().all(|(_, r)| *r == Reason::Warmup));
            assert!(v[6..].iter().all(|(_, r)| *r != Reason::Warmup));
            for (p, r) in &v[6..] {
                match r {
                    Reason::Faster => assert_eq!(*p, winner),
                    Reason::Probe => assert_ne!(*p, winner),
                    r => panic!("unexpected reason {r:?}"),
                }
            }
            assert!(count(&v[6..], winner) >= 190 - 6 - 24);
        }
    }

    #[test]
    fn probes_cost_at_most_the_budget() {
        // The slower mode costs 3x: each probe loses 2 pieces' worth, so
        // probes come every 200 pieces (2 / PROBE_BUDGET).
        let mut st = CsumStats::default();
        let v = drive(&mut st, PIECE, 6 + 2010, |p, _| match p {
            Placement::Inline => 300,
            Placement::Offload => 100,
        });
        let probes = v.iter().filter(|(_, r)| *r == Reason::Probe).count();
        assert_eq!(probes, 10);
        assert_eq!(st.probes, 10);
        // Close modes (2 % apart) are probed often, at the shortest interval.
        let mut st = CsumStats::default();
        let v = drive(&mut st, PIECE, 6 + 90, |p, _| match p {
            Placement::Inline => 102,
            Placement::Offload => 100,
        });
        let probes = v.iter().filter(|(_, r)| *r == Reason::Probe).count();
        assert_eq!(probes, 90 / (PROBE_MIN as usize + 1));
        // A far slower mode is still probed, at the longest interval.
        let mut st = CsumStats::default();
        let v = drive(
            &mut st,
            PIECE,
            6 + 2 * (PROBE_MAX as usize + 1),
            |p, _| match p {
                Placement::Inline => 10_000,
                Placement::Offload => 100,
            },
        );
        assert_eq!(v.iter().filter(|(_, r)| *r == Reason::Probe).count(), 2);
    }

    #[test]
    fn follows_a_change_in_conditions() {
        // Offload is faster at first (idle cores); then other work takes
        // the cores and waiting for a worker gets slow: `auto` moves inline.
        let mut st = CsumStats::default();
        let v = drive(&mut st, PIECE, 1000, |p, step| match (p, step < 300) {
            (Placement::Inline, _) => 200,
            (Placement::Offload, true) => 120,
            (Placement::Offload, false) => 600,
        });
        assert!(count(&v[100..300], Placement::Offload) > 190);
        // Within a few pieces of the change it has switched...
        assert!(count(&v[320..1000], Placement::Inline) > 640);
        // ...and when offloading gets cheap again, a probe finds out.
        let v2 = drive(&mut st, PIECE, 600, |p, _| match p {
            Placement::Inline => 200,
            Placement::Offload => 120,
        });
        assert!(count(&v2[300..], Placement::Offload) > 280);
    }

    #[test]
    fn one_slow_sample_does_not_flip_a_clear_choice() {
        let mut st = CsumStats::default();
        drive(&mut st, PIECE, 50, |p, _| match p {
            Placement::Inline => 150,
            Placement::Offload => 100,
        });
        // A preempted piece: 100x the usual time.
        let v = drive(&mut st, PIECE, 20, |p, step| match (p, step) {
            (Placement::Offload, 0) => 10_000,
            (Placement::Inline, _) => 150,
            (Placement::Offload, _) => 100,
        });
        assert!(
            v.iter()
                .all(|(p, r)| *p == Placement::Offload || *r == Reason::Probe)
        );
        assert!(count(&v, Placement::Offload) >= 19);
    }

    #[test]
    fn size_classes_are_learned_apart() {
        // Small pieces: waking a worker costs more than it saves. Big
        // pieces: overlapping the hash with the write wins.
        let mut st = CsumStats::default();
        for _ in 0..100 {
            drive(&mut st, 8 << 10, 1, |p, _| match p {
                Placement::Inline => 100,
                Placement::Offload => 400,
            });
            drive(&mut st, PIECE, 1, |p, _| match p {
                Placement::Inline => 300,
                Placement::Offload => 100,
            });
        }
        assert_eq!(st.choose(8 << 10, IDLE).0, Placement::Inline);
        assert_eq!(st.choose(PIECE, IDLE).0, Placement::Offload);
        assert!(st.classes[class_of(8 << 10)].samples[0] > 80);
        assert!(st.classes[class_of(PIECE)].samples[1] > 80);
    }

    #[test]
    fn a_saturated_pool_keeps_pieces_inline() {
        let mut st = CsumStats::default();
        drive(&mut st, PIECE, 20, |p, _| match p {
            Placement::Inline => 300,
            Placement::Offload => 100,
        });
        let busy = PoolLoad {
            workers: 2,
            active: 2,
            queued: 2,
        };
        assert_eq!(
            st.choose(PIECE, busy),
            (Placement::Inline, Reason::PoolBusy)
        );
        assert_eq!(st.busy, 1);
        let none = PoolLoad::default();
        assert_eq!(
            st.choose(PIECE, none),
            (Placement::Inline, Reason::PoolBusy)
        );
        // Workers busy with chunks of a job nobody waits on to queue still
        // take new work: not saturated.
        let working = PoolLoad {
            workers: 1,
            active: 1,
            queued: 0,
        };
        assert_eq!(st.choose(PIECE, working).0, Placement::Offload);
    }

    #[test]
    fn a_small_difference_in_a_long_cycle_goes_to_offload() {
        // Inline is 20 % faster per piece.
        let cost = |p: Placement, _| match p {
            Placement::Inline => 100,
            Placement::Offload => 120,
        };
        let mut st = CsumStats::default();
        drive(&mut st, 4096, 30, cost);
        assert_eq!(st.choose(4096, IDLE), (Placement::Inline, Reason::Faster));
        // But the work between pieces takes 1000 ns per KiB: the 20 ns
        // difference is 2 % of the cycle.
        for _ in 0..20 {
            st.observe_gap(4096, 4 * 1000);
        }
        assert_eq!(st.choose(4096, IDLE), (Placement::Offload, Reason::Faster));
        // Idle pauses are not work: they do not move the estimate.
        let g = st.classes[class_of(4096)].gap_ns_per_kib;
        st.observe_gap(4096, GAP_MAX_NS + 1);
        assert_eq!(st.classes[class_of(4096)].gap_ns_per_kib, g);
        // Back-to-back pieces (no gap): the piece alone decides.
        for _ in 0..60 {
            st.observe_gap(4096, 0);
        }
        let v = drive(&mut st, 4096, 20, cost);
        assert!(
            v.iter()
                .all(|(p, r)| *p == Placement::Inline || *r == Reason::Probe)
        );
    }

    #[test]
    fn observe_keeps_the_parts_of_the_time() {
        let mut st = CsumStats::default();
        st.observe(
            Placement::Inline,
            &Sample {
                len: 1 << 20,
                hash_ns: 1024 * 50,
                write_ns: 1024 * 100,
                wait_ns: 0,
                total_ns: 1024 * 150,
                helped: (0, 0),
            },
        );
        st.observe(
            Placement::Offload,
            &Sample {
                len: 1 << 20,
                hash_ns: 1024 * 10,
                write_ns: 1024 * 100,
                wait_ns: 1024 * 20,
                total_ns: 1024 * 130,
                helped: (2, 8),
            },
        );
        assert_eq!(st.csum_ns_per_kib, 50.0);
        assert_eq!(st.finish_ns_per_kib, 30.0);
        assert_eq!(st.write_ns_per_kib, 100.0);
        assert_eq!(st.helped_share, 0.25);
        assert_eq!(st.extents, [1, 1]);
        let c = st.classes[class_of(1 << 20)];
        assert_eq!(c.ns_per_kib, [150.0, 130.0]);
    }
}

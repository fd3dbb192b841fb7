//! The write path (DESIGN.md layer 8). A write lands in the inode's dirty
//! sectors (delayed allocation, [`super::delalloc`]); writeback turns each
//! contiguous run into ordered extents: space is allocated, checksums are
//! computed (inline, offloaded or as `auto` decides, seed 003), the data is
//! written, and completion puts the file extent and checksum items into
//! the running transaction. Small files live inline in their extent item.
//! Every commit writes back all dirty data first, so a committed inode
//! never records a size its extents do not back.

use super::compress_jobs::{CompressWith, Compressed, compress_range};
use super::compression::Compression;
use super::delalloc::DirtyRun;
use super::ordered::OrderedExtent;
use crate::alloc::SpaceKind;
use crate::alloc::delayed_ref::DataOwner;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, Timespec};
use crate::fs::{Allowed, FileKind, Filesystem, InodeId};
use crate::transaction::Writer;
use crate::{Error, Result};
use std::sync::Arc;

/// Files up to this size are stored inline, like the kernel's default
/// `max_inline`.
pub const MAX_INLINE: u64 = 2048;

/// Metadata a written range adds at writeback besides its bytes or
/// checksums: an item's header and the extent item (a generous bound).
const DELALLOC_ITEM_METADATA: u64 = 128;
/// Largest data extent the kernel creates.
pub(crate) const MAX_EXTENT: u64 = MAX_EXTENT_SIZE;
/// Dirty data beyond this is handed to the writeback thread.
const DIRTY_LIMIT: u64 = 16 << 20;
/// Data the writeback thread may have queued before writers wait for it
/// ([`Filesystem::throttle_writes`], before any lock is taken).
const IN_FLIGHT_LIMIT: u64 = 32 << 20;
/// Past this, a write waits for the writeback thread even while it holds
/// the change lock (a caller that never throttles).
const IN_FLIGHT_HARD_LIMIT: u64 = 512 << 20;
/// Dirty data being compressed off the change lock before writers wait
/// ([`Filesystem::throttle_writes`]); a caller that never throttles waits
/// past the hard limit.
const COMPRESSING_LIMIT: u64 = 32 << 20;
const COMPRESSING_HARD_LIMIT: u64 = 256 << 20;
/// A write shorter than this, to a file with no dirty data of its own
/// anywhere, is let past a full backlog (up to [`SMALL_WRITE_SLACK`]
/// times it): one small write (the page an fsync sends first) is not part
/// of the stream that made the backlog, and waiting for that stream was
/// most of such an fsync's time.
pub const SMALL_WRITE: usize = 64 << 10;
const SMALL_WRITE_SLACK: u64 = 4;
/// Bytes of such writes let past a full backlog before they wait like any
/// other: many small files written at once are a stream of their own.
const SMALL_WRITE_BUDGET: u64 = 4 << 20;
/// Most dirty data one compression job takes.
pub(crate) const COMPRESS_JOB: u64 = 16 << 20;
/// Most data chunks one write may add.
const MAX_NEW_CHUNKS: usize = 64;

impl Filesystem {
    /// Write `data` at `offset` of file `id`; returns the bytes written.
    /// The data is held dirty until writeback (at the latest, the commit).
    /// As with `write(2)`, the immutable and append-only flags are checked
    /// when the file is opened for writing
    /// ([`Filesystem::check_open_for_write`]), not here: a file made
    /// immutable while open still takes writes, as in the kernel, and a
    /// writeback cache may send an append's pages in any order.
    pub fn write(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_data(id, offset, data, true)
    }

    /// [`Filesystem::write`], leaving the modification and change times
    /// as they are: for a caller that keeps them itself and sets them
    /// when it sees fit (a FUSE mount under the kernel's writeback cache).
    pub fn write_keep_times(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_data(id, offset, data, false)
    }

    fn write_data(&self, id: InodeId, offset: u64, data: &[u8], touch: bool) -> Result<usize> {
        self.change("write", || {
            if data.is_empty() {
                return Ok(0);
            }
            let mut w = self.writer()?;
            w.check_writable(id.subvol)?;
            // The immutable and append-only flags were the opener's to check.
            let inode = self.inode_item_to_change(id, Allowed::Anything, "write")?;
            match FileKind::from_mode(inode.mode) {
                Some(FileKind::File) => {}
                Some(FileKind::Dir) => return Err(Error::IsDir(format!("inode {}", id.ino))),
                _ => {
                    return Err(Error::Invalid(format!(
                        "write to inode {} that is not a regular file",
                        id.ino
                    )));
                }
            }
            let end = offset
                .checked_add(data.len() as u64)
                .filter(|&e| e <= i64::MAX as u64)
                .ok_or_else(|| Error::Invalid("write past the largest file size".into()))?;
            if inode.flags & (INODE_NODATACOW | INODE_PREALLOC) != 0 {
                // Writeback may write these sectors in place: a damaged
                // extent there fails this write, not the commit.
                self.check_nocow_write(id, offset, data.len() as u64)?;
            }
            let ss = self.geometry().sectorsize as u64;
            if offset > inode.size && !inode.size.is_multiple_of(ss) {
                // The old last sector may hold stale bytes past the end (the
                // kernel leaves them when it shrinks a file): zero them first.
                // (A size on a sector boundary has none: nothing to reserve,
                // so a full filesystem still takes writes into space
                // preallocated past the end.)
                self.reserve_dirty_space(&mut w, ss)?;
                self.zero_tail(&mut w, id, inode.size, true)?;
            }
            let new_size = inode.size.max(end);
            let ss = self.geometry().sectorsize as u64;
            let first = offset / ss;
            let last = (end - 1) / ss;
            // The sectors this write makes dirty, and whether the file
            // outgrows its inline extent (which moves to sector 0 of its
            // data). Reserving may commit, which writes dirty sectors back
            // (and an inline extent's moved sector): they count again then.
            let mut tries = 0;
            // Sectors written where the file has room of its own (a
            // preallocated or no-COW extent) need no new space: when space
            // is short they are marked so and not reserved (as the kernel
            // does; a snapshot or clone, which could share that room,
            // writes them back first).
            let may_in_place = inode.flags & (INODE_NODATACOW | INODE_PREALLOC) != 0;
            let mut own = Vec::new();
            let (uninline, new_sectors) = loop {
                let uninline = (new_size > MAX_INLINE || new_size >= ss) && self.has_inline(id)?;
                let new_sectors = {
                    let d = self.delalloc();
                    (first..=last)
                        .filter(|&i| d.sector(id, i).is_none())
                        .count() as u64
                        + u64::from(uninline && first > 0 && d.sector(id, 0).is_none())
                };
                own.clear();
                if may_in_place && !self.dirty_space_fits(&w, new_sectors * ss) {
                    own = self.new_sectors_in_place(&w, id, first, last, inode.flags)?;
                }
                let to_reserve = new_sectors.saturating_sub(own.len() as u64);
                let transid = w.blocks.transid;
                self.reserve_dirty_space(&mut w, to_reserve * ss)?;
                tries += 1;
                if w.blocks.transid == transid || tries == 3 {
                    break (uninline, new_sectors);
                }
            };
            // What writing it back will take of metadata: a small file's data
            // itself (an inline extent), else an extent item and checksums.
            let metadata = if new_size <= MAX_INLINE {
                data.len() as u64 + DELALLOC_ITEM_METADATA
            } else {
                new_sectors * 4 + DELALLOC_ITEM_METADATA
            };
            self.reserve_delalloc_metadata(&mut w, metadata)?;
            // Sectors the write covers in part keep their other bytes (dirty
            // ones, or from disk): read first, so a failed read (a damaged
            // extent) leaves nothing of the write behind.
            let (full_lo, full_hi) = (offset.div_ceil(ss), end / ss);
            let span = ((last - first + 1) * ss) as usize;
            if span <= SMALL_WRITE && !(uninline && first > 0) {
                // A small write (a small file's whole data, often) goes in as
                // one buffer, its partial sectors filled in: one allocation,
                // not one per partial sector and one more for the rest.
                let mut buf = vec![0u8; span];
                let edges: &[u64] = if first == last {
                    &[first]
                } else {
                    &[first, last]
                };
                for &idx in edges {
                    if (full_lo..full_hi).contains(&idx) {
                        continue;
                    }
                    let at = ((idx - first) * ss) as usize;
                    self.old_sector_into(id, idx, inode.size, &mut buf[at..at + ss as usize])?;
                }
                let at = (offset - first * ss) as usize;
                buf[at..at + data.len()].copy_from_slice(data);
                self.delalloc().put_run(id, first, buf, ss);
            } else {
                self.put_large(id, offset, data, &inode, uninline, ss)?;
            }
            // Only files with room of their own have sectors going in place:
            // other writes take no lock more for this.
            if may_in_place {
                let mut d = self.delalloc();
                if !own.is_empty() {
                    d.mark_unreserved(id, &own);
                }
                // Its partial sectors going in place wait for the rest
                // (see `Delalloc::take_runs_holding_edges`).
                let open = |at: u64, idx: u64| {
                    (!at.is_multiple_of(ss) && d.is_unreserved(id, idx)).then_some(idx)
                };
                let edges = [open(offset, first), open(end, last)];
                d.set_open_edges(id, edges);
            }
            // The data is in: from here on a failure leaves it past the
            // size the inode says.
            crate::transaction::abort::note_edit();
            let now = Timespec::now();
            self.change_inode(&mut w, id, |i| {
                i.size = new_size;
                if touch {
                    i.mtime = now;
                    i.ctime = now;
                }
            })?;
            // The write itself is whole; handing dirty data on below may
            // fail on its own.
            crate::transaction::abort::op_whole();
            // Data that compression jobs hold is on its way already; finished
            // ones become extents (their memory is freed) without waiting for
            // the next writeback.
            let mut held = self.compress_jobs.held();
            if held > 0 {
                self.apply_compressed(&mut w, None, false)?;
                held = self.compress_jobs.held();
            }
            if self.delalloc().bytes().saturating_sub(held) > DIRTY_LIMIT {
                self.writeback_background(&mut w)?;
            }
            Ok(data.len())
        })
    }

    /// The dirty sectors of a write longer than [`SMALL_WRITE`] (or one
    /// that moves an inline extent to sector 0): its whole sectors in one
    /// copy into the run they extend, each partial one apart.
    fn put_large(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        inode: &crate::format::items::InodeItem,
        uninline: bool,
        ss: u64,
    ) -> Result<()> {
        let end = offset + data.len() as u64;
        let (first, last) = (offset / ss, (end - 1) / ss);
        let (full_lo, full_hi) = (offset.div_ceil(ss), end / ss);
        let mut sectors = Vec::new();
        if uninline && first > 0 {
            sectors.push(0);
        }
        sectors.extend((first..=last).filter(|&i| i < full_lo || i >= full_hi));
        sectors.dedup();
        let mut partial = Vec::with_capacity(sectors.len());
        for idx in sectors {
            let s = idx * ss;
            let mut buf = vec![0u8; ss as usize];
            self.old_sector_into(id, idx, inode.size, &mut buf)?;
            let lo = s.max(offset);
            let hi = (s + ss).min(end);
            if lo < hi {
                buf[(lo - s) as usize..(hi - s) as usize]
                    .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            }
            partial.push((idx, buf));
        }
        if full_lo < full_hi {
            let from = (full_lo * ss - offset) as usize;
            let to = (full_hi * ss - offset) as usize;
            self.delalloc()
                .put_sectors(id, full_lo, &data[from..to], ss);
        }
        for (idx, buf) in partial {
            self.delalloc().put(id, idx, buf.into_boxed_slice());
        }
        Ok(())
    }

    /// The bytes sector `idx` of `id` holds before a write (of a file
    /// `size` bytes long) into `dst`, one sector of zeros: its dirty copy,
    /// else what is stored.
    fn old_sector_into(&self, id: InodeId, idx: u64, size: u64, dst: &mut [u8]) -> Result<()> {
        let s = idx * dst.len() as u64;
        let d = self.delalloc();
        match d.sector(id, idx) {
            Some(b) => dst.copy_from_slice(b),
            // Wholly past the old end: nothing there to keep (as in the
            // kernel, which zeroes such a page rather than read it).
            None if s >= size => {}
            None => {
                drop(d);
                let b = self.read_stored(id, s, dst.len())?;
                let n = b.len().min(dst.len());
                dst[..n].copy_from_slice(&b[..n]);
            }
        }
        Ok(())
    }

    /// Wait, holding nothing, while the writeback thread has more than its
    /// share of data queued, before a write of `len` bytes to file `id`. A
    /// server calls it before it takes its own lock for a write, so a
    /// stream of writes is slowed to the device's pace without holding up
    /// everybody else. A small write to a file with nothing dirty, queued
    /// or compressing waits only for a far larger backlog, up to a budget
    /// of such writes: like the kernel's dirty throttling, the writer that
    /// makes the backlog pays for it, not the one beside it.
    pub fn throttle_writes(&self, id: InodeId, len: usize) {
        use std::sync::atomic::Ordering;
        if self.in_flight.has_room(IN_FLIGHT_LIMIT)
            && self.compress_jobs.has_room(COMPRESSING_LIMIT)
        {
            self.small_write_slack.store(0, Ordering::Relaxed);
            return;
        }
        let bystander = len < SMALL_WRITE
            && !self.delalloc().has(id)
            && !self.in_flight.has(id)
            && !self.compress_jobs.has(id)
            && self
                .small_write_slack
                .fetch_add(len as u64, Ordering::Relaxed)
                .saturating_add(len as u64)
                <= SMALL_WRITE_BUDGET;
        let slack = if bystander { SMALL_WRITE_SLACK } else { 1 };
        self.in_flight.wait_for_room(IN_FLIGHT_LIMIT * slack);
        self.compress_jobs.wait_for_room(COMPRESSING_LIMIT * slack);
        if !bystander {
            // Room again: the next small writes have their budget back.
            self.small_write_slack.store(0, Ordering::Relaxed);
        }
    }

    /// Whether [`Filesystem::throttle_writes`] would wait now. A server
    /// may hand a large write that would to a thread of its own, keeping
    /// its other threads for requests that need no room (an fsync, a
    /// read, a small write).
    pub fn writes_must_wait(&self) -> bool {
        !self.in_flight.has_room(IN_FLIGHT_LIMIT) || !self.compress_jobs.has_room(COMPRESSING_LIMIT)
    }

    /// Hand every inode's dirty data to the writeback thread: its extents
    /// join the running transaction now, their data goes to the device
    /// while the caller goes on.
    fn writeback_background(&self, w: &mut Writer) -> Result<()> {
        // Checksums of what is written already go in now, in small steps.
        self.finish_in_flight(w, None, false)?;
        self.apply_compressed(w, None, false)?;
        self.in_flight.wait_for_room(IN_FLIGHT_HARD_LIMIT);
        self.compress_jobs.wait_for_room(COMPRESSING_HARD_LIMIT);
        let ss = self.geometry().sectorsize as u64;
        let ids = self.delalloc().inodes();
        let mut compressed = Vec::new();
        for id in ids {
            if let Some(with) = self.compression_for(w, id)?
                && self.inode_item(id)?.size > MAX_INLINE
            {
                self.queue_compression(w, id, with, true)?;
                compressed.push((id, with));
                continue;
            }
            let mut runs = {
                let mut d = self.delalloc();
                let max = d.max_run();
                d.take_runs_holding_edges(id, ss, max)
            };
            crate::transaction::abort::unit(|| self.writeback_taken(w, id, &mut runs, true))?;
        }
        // Runs left to grow at the ends of files are still too many: take
        // those too, but for their last partial 128 KiB.
        if self
            .delalloc()
            .bytes()
            .saturating_sub(self.compress_jobs.held())
            > DIRTY_LIMIT
        {
            for (id, with) in compressed {
                self.queue_compression(w, id, with, false)?;
            }
        }
        Ok(())
    }

    /// Hand the dirty data of `id` that no job holds yet to compression
    /// jobs ([`super::compress_jobs`]): whole runs are lent without a
    /// copy, other stretches copied. A stretch that ends at the end of
    /// the file is left to grow if `leave_tail` and it is shorter than a
    /// whole run (a stream fills it; a job of part of a run would cut the
    /// run, a copy), else but for its last, partial 128 KiB. Stretches
    /// shorter than a compressed extent are written back here and now:
    /// jobs are for streams.
    fn queue_compression(
        &self,
        w: &mut Writer,
        id: InodeId,
        with: CompressWith,
        leave_tail: bool,
    ) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let size = self.inode_item(id)?.size;
        let covered = self.compress_jobs.covered(id);
        // Dirty runs (each taken whole or from its start: cutting one
        // copies what follows), less what jobs hold.
        let mut free = self.delalloc().ranges(id, ss);
        for &(c, clen) in &covered {
            let mut next = Vec::with_capacity(free.len() + 1);
            for (s, len) in free {
                let (e, ce) = (s + len, c + clen);
                if ce <= s || c >= e {
                    next.push((s, len));
                    continue;
                }
                if s < c {
                    next.push((s, c - s));
                }
                if ce < e {
                    next.push((ce, e - ce));
                }
            }
            free = next;
        }
        let free: Vec<(u64, u64)> = free.into_iter().map(|(s, len)| (s, s + len)).collect();
        let mut small = Vec::new();
        let max_run = self.delalloc().max_run();
        for (s, e) in free {
            let mut end = e;
            let at_eof = e >= size.div_ceil(ss) * ss;
            // A partial last sector is rewritten by the next append, which
            // would copy a lent run: left to grow as well.
            if at_eof && leave_tail && (e - s < max_run || !size.is_multiple_of(ss)) {
                continue;
            }
            if at_eof && e - s > MAX_COMPRESSED_RAM {
                end = s + (e - s) / MAX_COMPRESSED_RAM * MAX_COMPRESSED_RAM;
            }
            if end - s < MAX_COMPRESSED_RAM {
                if end > s {
                    small.push((s, end));
                }
                continue;
            }
            let mut at = s;
            while at < end {
                let n = (end - at).min(COMPRESS_JOB);
                let lent = w.lend_runs.then(|| self.delalloc().lend_run(id, at, n));
                let bytes = match lent.flatten() {
                    Some(run) => run,
                    None => {
                        let mut bytes = self.compress_jobs.buffer();
                        if !self.delalloc().copy_range_into(id, at, n, &mut bytes) {
                            break;
                        }
                        Arc::new(bytes)
                    }
                };
                if !self
                    .compress_jobs
                    .submit(id, at, bytes, with, self.geometry().sectorsize)
                {
                    small.push((at, end));
                    break;
                }
                at += n;
            }
        }
        let mut runs = Vec::new();
        for (s, e) in small {
            let mut d = self.delalloc();
            if let Some(data) = d.copy_range(id, s, e - s) {
                d.take_range(id, s, e - s);
                runs.push(DirtyRun { offset: s, data });
            }
        }
        self.writeback_taken(w, id, &mut runs, true)
    }

    /// Turn finished compression jobs of `owner` (every file's if `None`)
    /// into extents; with `wait`, wait for unfinished ones. A job whose
    /// bytes are no longer the dirty ones (written over, truncated) is
    /// dropped: the newer bytes stay dirty.
    pub(crate) fn apply_compressed(
        &self,
        w: &mut Writer,
        owner: Option<InodeId>,
        wait: bool,
    ) -> Result<()> {
        for done in self.compress_jobs.take(owner, wait) {
            // Each job's extent is whole in itself.
            crate::transaction::abort::unit(|| self.apply_compressed_job(w, done))?;
        }
        Ok(())
    }

    /// [`Filesystem::apply_compressed`] of one finished job.
    fn apply_compressed_job(&self, w: &mut Writer, done: super::compress_jobs::Done) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        {
            let len = done.input.len() as u64;
            // A failed compression leaves the bytes dirty: the next
            // writeback compresses them again and reports what fails.
            let Ok(c) = done.out else {
                return Ok(());
            };
            let id = done.id;
            {
                let mut d = self.delalloc();
                if !d.matches(id, done.offset, &done.input) {
                    drop(d);
                    self.recycle_job_input(done.input);
                    return Ok(());
                }
                d.take_range(id, done.offset, len);
            }
            let mut data = Vec::new();
            let r = match self.place_compressed(w, id, done.offset, len, c, true) {
                Ok(true) => {
                    self.recycle_job_input(done.input);
                    Ok(())
                }
                Ok(false) => {
                    data = Arc::unwrap_or_clone(done.input);
                    self.cow_range_plain(w, id, done.offset, &mut data, true)
                }
                Err(e) => {
                    data = Arc::unwrap_or_clone(done.input);
                    Err(e)
                }
            };
            if r.is_err() && !data.is_empty() {
                self.delalloc().put_sectors(id, done.offset / ss, &data, ss);
            }
            r?;
            if !self.superblock().no_holes() {
                let size = self.inode_item(id)?.size;
                self.fill_holes(w, id, size)?;
            }
        }
        Ok(())
    }

    /// Keep the buffer a finished job held, once nobody else holds it:
    /// for new dirty runs first (a lent run's came from there), else for
    /// later jobs' copies.
    fn recycle_job_input(&self, input: Arc<Vec<u8>>) {
        if let Ok(buf) = Arc::try_unwrap(input)
            && let Some(buf) = self.delalloc().recycle(buf)
        {
            self.compress_jobs.recycle(buf);
        }
    }

    /// Make sure `more` bytes of dirty data can be written back later:
    /// every dirty sector needs a new one on disk (copy-on-write).
    /// Count `more` bytes of metadata the dirty data will take at
    /// writeback. When the free metadata space would no longer hold all of
    /// it and the reserve, the dirty data is written back (a commit) to
    /// see what it really takes, then a chunk is added; ENOSPC only if it
    /// still would not: a commit must never run out of space half-way.
    pub(crate) fn reserve_delalloc_metadata(&self, w: &mut Writer, more: u64) -> Result<()> {
        let reserve = self.metadata_reserve();
        let enough = |w: &Writer, extra: u64| {
            self.space_free(w, SpaceKind::Metadata) >= extra + w.delalloc_metadata + more
        };
        if !enough(w, 2 * reserve) {
            if w.delalloc_metadata > 0 {
                self.commit_locked(w)?;
            }
            // A commit that brought little back would come again a few
            // writes later: grow now (see `reserve_metadata`).
            if !enough(w, 3 * reserve) {
                match self.alloc_chunk(w, SpaceKind::Metadata) {
                    Ok(()) | Err(Error::NoSpace(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            if !enough(w, reserve) {
                return Err(Error::NoSpace(
                    "metadata space for the written data is down to its reserve".into(),
                ));
            }
        }
        w.delalloc_metadata += more;
        Ok(())
    }

    /// Whether `more` bytes of dirty data fit the free data space now,
    /// without a commit or a new chunk.
    fn dirty_space_fits(&self, w: &Writer, more: u64) -> bool {
        self.space_free(w, SpaceKind::Data) >= self.delalloc().reserved_bytes() + more
    }

    /// Which of sectors `first..=last` of `id`, not dirty yet, lie where a
    /// write goes in place ([`Filesystem::in_place_segments`]).
    fn new_sectors_in_place(
        &self,
        w: &Writer,
        id: InodeId,
        first: u64,
        last: u64,
        flags: u64,
    ) -> Result<Vec<u64>> {
        let ss = self.geometry().sectorsize as u64;
        let nocow = flags & INODE_NODATACOW != 0;
        let segs = self.in_place_segments(
            id,
            first * ss,
            (last - first + 1) * ss,
            &w.blocks.refs,
            nocow,
        )?;
        let d = self.delalloc();
        Ok(segs
            .iter()
            .filter(|s| s.in_place.is_some())
            .flat_map(|s| s.offset / ss..(s.offset + s.len).div_ceil(ss))
            .filter(|&i| d.sector(id, i).is_none())
            .collect())
    }

    pub(crate) fn reserve_dirty_space(&self, w: &mut Writer, more: u64) -> Result<()> {
        let enough = |fs: &Self, w: &Writer| fs.dirty_space_fits(w, more);
        if enough(self, w) {
            return Ok(());
        }
        // Space freed since the last commit is pinned until the next one:
        // when that would do, commit rather than take a new chunk (the
        // device would fill with data chunks that metadata then lacks),
        // as the kernel commits before it grows or says ENOSPC.
        let short = (self.delalloc().reserved_bytes() + more)
            .saturating_sub(self.space_free(w, SpaceKind::Data));
        let freed_by_commit =
            w.blocks.alloc.pinned_bytes(SpaceKind::Data) + w.blocks.refs.data_bytes_dropping();
        if freed_by_commit >= short {
            self.commit_locked(w)?;
            if enough(self, w) {
                return Ok(());
            }
        }
        // A large write may need more than one new chunk.
        for _ in 0..MAX_NEW_CHUNKS {
            if enough(self, w) {
                break;
            }
            match self.alloc_chunk(w, SpaceKind::Data) {
                Ok(()) => {}
                Err(Error::NoSpace(_)) => break,
                Err(e) => return Err(e),
            }
        }
        if enough(self, w) {
            return Ok(());
        }
        // Last, whatever the estimate says: a commit before ENOSPC.
        if w.is_dirty() {
            self.commit_locked(w)?;
            if enough(self, w) {
                return Ok(());
            }
        }
        Err(Error::NoSpace(format!(
            "no data space for {more} more bytes of dirty data"
        )))
    }

    /// Write back every inode's dirty data.
    pub(crate) fn writeback_all(&self, w: &mut Writer) -> Result<()> {
        self.apply_compressed(w, None, true)?;
        let ids = self.delalloc().inodes();
        for id in ids {
            self.writeback(w, id)?;
        }
        Ok(())
    }

    /// Write back the dirty data of `id` as ordered extents (or inline).
    ///
    /// The data leaves the dirty set first and moves into the ordered
    /// extents without a copy; if writeback fails, what was not yet
    /// written goes back. (The caller holds the write state, so no write
    /// comes in between; a reader running meanwhile may see the old data.)
    pub(crate) fn writeback(&self, w: &mut Writer, id: InodeId) -> Result<()> {
        // A file written back is whole in itself: a commit that stops
        // at the next one for want of space leaves nothing half done.
        crate::transaction::abort::unit(|| {
            self.apply_compressed(w, Some(id), true)?;
            let ss = self.geometry().sectorsize as u64;
            let mut runs = {
                let mut d = self.delalloc();
                let max = d.max_run();
                d.take_runs(id, ss, max)
            };
            self.writeback_taken(w, id, &mut runs, false)
        })
    }

    /// Write back `runs`, taken out of the dirty set of `id`; what was not
    /// written goes back if writeback fails. New extents are written by
    /// the writeback thread if `background`.
    fn writeback_taken(
        &self,
        w: &mut Writer,
        id: InodeId,
        runs: &mut [DirtyRun],
        background: bool,
    ) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let ss = self.geometry().sectorsize as u64;
        let r = self.writeback_runs(w, id, runs, background);
        if r.is_err() {
            let mut d = self.delalloc();
            for run in runs.iter().filter(|r| !r.data.is_empty()) {
                d.put_sectors(id, run.offset / ss, &run.data, ss);
            }
        }
        r
    }

    /// [`Filesystem::writeback`] of `runs`, taken out of the dirty set;
    /// each run's data is emptied once it is handed to an ordered extent.
    fn writeback_runs(
        &self,
        w: &mut Writer,
        id: InodeId,
        runs: &mut [DirtyRun],
        background: bool,
    ) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let inode = self.inode_item(id)?;
        let size = inode.size;
        if size <= MAX_INLINE
            && size < ss
            && runs.len() == 1
            && runs[0].offset == 0
            && !self.has_regular(id)?
        {
            let content = &runs[0].data[..size as usize];
            let removed = self.drop_range(w, id, 0, u64::MAX)?;
            self.insert_inline(w, id, content)?;
            self.change_inode(w, id, |i| {
                i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(size)
            })?;
        } else {
            let nocow = inode.flags & INODE_NODATACOW != 0;
            // Only a file that was ever preallocated has such extents.
            let in_place = nocow || inode.flags & INODE_PREALLOC != 0;
            if nocow {
                // Bytes rewritten in place must not race an older write
                // of the same extent. (Preallocated space is written in
                // place once: it is a regular extent after.)
                self.finish_in_flight(w, Some(id), true)?;
            }
            for run in runs.iter_mut() {
                let len = run.data.len() as u64;
                let segs = if in_place {
                    self.in_place_segments(id, run.offset, len, &w.blocks.refs, nocow)?
                } else {
                    vec![super::nocow::Segment {
                        offset: run.offset,
                        len,
                        in_place: None,
                        prealloc: None,
                    }]
                };
                if let [seg] = &segs[..]
                    && seg.in_place.is_none()
                    && seg.len == len
                {
                    // The whole run goes to new extents: hand its data over.
                    self.cow_range(w, id, run.offset, &mut run.data, background && !nocow)?;
                    continue;
                }
                let data = Arc::new(std::mem::take(&mut run.data));
                let placed = segs.into_iter().try_for_each(|seg| {
                    let from = (seg.offset - run.offset) as usize;
                    let range = from..from + seg.len as usize;
                    let bytes = &data[range.clone()];
                    match (seg.in_place, seg.prealloc) {
                        // Preallocated: written, the extent becomes data.
                        (Some(_), Some(part)) => self.fill_prealloc(
                            w,
                            id,
                            seg.offset,
                            part,
                            &data,
                            range,
                            background && !nocow,
                        ),
                        // The extent stays; only its bytes change.
                        (Some(at), None) => self.tree_reader().volume().write(at, bytes),
                        (None, _) => self.cow_range(w, id, seg.offset, &mut bytes.to_vec(), false),
                    }
                });
                if let Err(e) = placed {
                    // The caller puts the run back as dirty data.
                    run.data = Arc::unwrap_or_clone(data);
                    return Err(e);
                }
                run.data = Vec::new();
            }
            if !self.superblock().no_holes() {
                self.fill_holes(w, id, size)?;
            }
        }
        Ok(())
    }

    /// Write `data` at `offset` into new extents, replacing what was there;
    /// by the writeback thread if `background`. Once space is reserved,
    /// `data` is taken (left empty).
    fn cow_range(
        &self,
        w: &mut Writer,
        id: InodeId,
        offset: u64,
        data: &mut Vec<u8>,
        background: bool,
    ) -> Result<()> {
        if let Some(with) = self.compression_for(w, id)? {
            let ss = self.geometry().sectorsize;
            let c = compress_range(data, offset, with, ss, false)?;
            if self.place_compressed(w, id, offset, data.len() as u64, c, background)? {
                *data = Vec::new();
                return Ok(());
            }
        }
        self.cow_range_plain(w, id, offset, data, background)
    }

    /// [`Filesystem::cow_range`] without compression.
    fn cow_range_plain(
        &self,
        w: &mut Writer,
        id: InodeId,
        offset: u64,
        data: &mut Vec<u8>,
        background: bool,
    ) -> Result<()> {
        let len = data.len() as u64;
        let pieces = self.reserve_data(w, len)?;
        let data = std::mem::take(data);
        let removed = self.drop_range(w, id, offset, offset + len)?;
        let mut added = 0;
        let mut done = 0usize;
        if background {
            let data = std::sync::Arc::new(data);
            for (disk, plen) in pieces {
                let file_offset = offset + done as u64;
                added += self.complete_ordered_later(
                    w,
                    id,
                    file_offset,
                    disk,
                    &data,
                    done..done + plen as usize,
                )?;
                done += plen as usize;
            }
            self.change_inode(w, id, |i| {
                i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(added)
            })?;
            return Ok(());
        }
        let single = pieces.len() == 1;
        let mut data = Some(data);
        for (disk, plen) in pieces {
            // One piece (the usual case) takes the buffer as it is.
            let bytes = match data.take() {
                Some(d) if single => d,
                Some(d) => {
                    let piece = d[done..done + plen as usize].to_vec();
                    data = Some(d);
                    piece
                }
                None => Vec::new(),
            };
            let oe = OrderedExtent::new(id, offset + done as u64, disk, bytes);
            added += self.complete_ordered(w, oe)?;
            done += plen as usize;
        }
        self.change_inode(w, id, |i| {
            i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(added)
        })?;
        Ok(())
    }

    /// How new extents of `id` are compressed, if at all: never for a
    /// no-COW, no-checksum or ever preallocated file; the inode's
    /// no-compress flag wins, unless the mount forces compression (as in
    /// the kernel); then the algorithm of its compression
    /// property (`btrfs.compression`, which comes with the compress
    /// flag), else the filesystem's setting (the mount option), else zlib
    /// for the compress flag, as in the kernel.
    fn compression_for(&self, w: &Writer, id: InodeId) -> Result<Option<CompressWith>> {
        let flags = self.inode_item(id)?.flags;
        // A file ever preallocated is written as the kernel writes it, in
        // place where it can be and plain where it cannot.
        if flags & (INODE_NODATACOW | INODE_NODATASUM | INODE_PREALLOC) != 0 {
            return Ok(None);
        }
        let forced = w.compress_force && w.compress.is_some();
        if flags & INODE_NOCOMPRESS != 0 && !forced {
            return Ok(None);
        }
        let prop = if flags & INODE_COMPRESS != 0 {
            self.compression_prop(id)?
        } else {
            None
        };
        let (kind, level) = match (prop, w.compress) {
            // The mount's level goes with its own algorithm only.
            (Some(k), Some((mk, ml))) => (k, if k == mk { ml } else { None }),
            (Some(k), None) => (k, None),
            (None, Some(c)) => c,
            (None, None) if flags & INODE_COMPRESS != 0 => (Compression::Zlib, None),
            (None, None) => return Ok(None),
        };
        Ok(Some(CompressWith {
            kind,
            level,
            force: w.compress_force,
        }))
    }

    /// Put `c`, the compressed form of the `len` file bytes at `offset`
    /// of `id` ([`compress_range`]), into new extents in place of what was
    /// there; their data is written by the writeback thread if
    /// `background`, else now. Returns false, having changed nothing,
    /// when the free data space is enough in total but too fragmented for
    /// the compressed extents: the caller writes the bytes plain then
    /// rather than take a new chunk (which could fill the device with data
    /// chunks while freed space waits for a commit).
    fn place_compressed(
        &self,
        w: &mut Writer,
        id: InodeId,
        offset: u64,
        len: u64,
        c: Compressed,
        background: bool,
    ) -> Result<bool> {
        let ss = self.geometry().sectorsize as u64;
        let total = c.data.len() as u64;
        // One stretch for all pieces when there is one: one write.
        let places: Vec<u64> = match w.blocks.alloc.alloc(SpaceKind::Data, total, ss) {
            Some(at) => c.pieces.iter().map(|p| at + p.at as u64).collect(),
            None => {
                // All space first: a writeback that cannot finish changes
                // nothing.
                let mut places = Vec::with_capacity(c.pieces.len());
                let mut new_chunks = false;
                let plain_fits = self.space_free(w, SpaceKind::Data) >= len;
                let release = |w: &mut Writer, places: &[u64]| -> Result<()> {
                    for (&at, p) in places.iter().zip(&c.pieces) {
                        w.blocks.alloc.release(at, p.disk_len as u64)?;
                    }
                    Ok(())
                };
                for p in &c.pieces {
                    let plen = p.disk_len as u64;
                    let got = match w.blocks.alloc.alloc(SpaceKind::Data, plen, ss) {
                        Some(at) => Ok(at),
                        // A long plain piece may fit no chunk whole: the
                        // plain path splits it.
                        None if p.kind == Compression::None || (!new_chunks && plain_fits) => {
                            release(w, &places)?;
                            return Ok(false);
                        }
                        None => {
                            new_chunks = true;
                            self.alloc_exact(w, plen)
                        }
                    };
                    match got {
                        Ok(at) => places.push(at),
                        Err(e) => {
                            release(w, &places)?;
                            return Err(e);
                        }
                    }
                }
                places
            }
        };
        // The space is held: a failure before its extents are in leaves it
        // held, and the data taken.
        crate::transaction::abort::note_edit();
        // A kernel that cannot read LZO or zstd must refuse the filesystem,
        // not fail its reads: as the kernel, say the filesystem has them.
        for p in &c.pieces {
            match p.kind {
                Compression::Lzo => w.add_incompat(INCOMPAT_COMPRESS_LZO),
                Compression::Zstd => w.add_incompat(INCOMPAT_COMPRESS_ZSTD),
                _ => {}
            }
        }
        let contiguous = places
            .iter()
            .zip(&c.pieces)
            .all(|(&at, p)| at == places[0] + p.at as u64);
        let removed = self.drop_range(w, id, offset, offset + len)?;
        let mut added = 0;
        if background && contiguous {
            let nodatasum = self.inode_item(id)?.flags & INODE_NODATASUM != 0;
            for (p, &disk) in c.pieces.iter().zip(&places) {
                let oe = OrderedExtent::compressed(
                    id,
                    p.file_offset,
                    disk,
                    Vec::new(),
                    p.kind,
                    p.ram_len,
                );
                added += self.insert_ordered_items(w, &oe, p.disk_len as u64)?;
            }
            self.in_flight.submit(
                self.tree_reader().volume(),
                self.csum_spec(),
                places[0],
                id,
                Arc::new(c.data),
                0,
                total as usize,
                !nodatasum,
            )?;
        } else if background {
            let data = Arc::new(c.data);
            for (p, &disk) in c.pieces.iter().zip(&places) {
                added += self.complete_compressed_later(
                    w,
                    id,
                    p.file_offset,
                    disk,
                    &data,
                    p.at..p.at + p.disk_len,
                    p.kind,
                    p.ram_len,
                )?;
            }
        } else {
            for (p, &disk) in c.pieces.iter().zip(&places) {
                let bytes = c.data[p.at..p.at + p.disk_len].to_vec();
                let oe =
                    OrderedExtent::compressed(id, p.file_offset, disk, bytes, p.kind, p.ram_len);
                added += self.complete_ordered(w, oe)?;
            }
        }
        self.change_inode(w, id, |i| {
            i.nbytes = i.nbytes.saturating_sub(removed).saturating_add(added)
        })?;
        Ok(true)
    }

    /// `len` contiguous bytes of data space, adding a chunk if needed.
    fn alloc_exact(&self, w: &mut Writer, len: u64) -> Result<u64> {
        let ss = self.geometry().sectorsize as u64;
        if let Some(at) = w.blocks.alloc.alloc(SpaceKind::Data, len, ss) {
            return Ok(at);
        }
        self.alloc_chunk(w, SpaceKind::Data)?;
        w.blocks
            .alloc
            .alloc(SpaceKind::Data, len, ss)
            .ok_or_else(|| Error::NoSpace(format!("no data space for a {len}-byte extent")))
    }

    /// Without the no-holes feature every gap between extents up to the end
    /// of the file has an explicit hole extent.
    fn fill_holes(&self, w: &mut Writer, id: InodeId, size: u64) -> Result<()> {
        let ss = self.geometry().sectorsize as u64;
        let mut cursor = 0;
        let mut gaps = Vec::new();
        for (off, fe) in self.extent_items(id)? {
            if off > cursor {
                gaps.push((cursor, off - cursor));
            }
            cursor = cursor.max(off + fe.len().div_ceil(ss) * ss);
        }
        let end = size.div_ceil(ss) * ss;
        if end > cursor {
            gaps.push((cursor, end - cursor));
        }
        for (at, len) in gaps {
            self.insert_hole(w, id, at, len)?;
        }
        Ok(())
    }

    fn extent_items(&self, id: InodeId) -> Result<Vec<(u64, FileExtentItem)>> {
        self.extent_items_in(id, 0, u64::MAX)
    }

    /// The file extent items of `id` that reach into `[start, end)`: the
    /// search starts at the one covering `start`, so the cost follows the
    /// range, not the size of the file.
    pub(super) fn extent_items_in(
        &self,
        id: InodeId,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, FileExtentItem)>> {
        let mut out = Vec::new();
        for item in self.file_extents_overlapping(id, start, end)? {
            let (off, fe) = item?;
            if off.saturating_add(fe.len()) > start {
                out.push((off, fe));
            }
        }
        Ok(out)
    }

    fn has_inline(&self, id: InodeId) -> Result<bool> {
        Ok(self
            .fs_tree(id.subvol)?
            .get(&Key::new(id.ino, EXTENT_DATA_KEY, 0))?
            .map(|it| FileExtentItem::parse(it.data()))
            .transpose()?
            .is_some_and(|fe| fe.extent_type == FILE_EXTENT_INLINE))
    }

    fn has_regular(&self, id: InodeId) -> Result<bool> {
        Ok(self
            .extent_items(id)?
            .iter()
            .any(|(_, fe)| matches!(fe.body, ExtentBody::Regular { disk_bytenr, .. } if disk_bytenr != 0)))
    }

    pub(crate) fn insert_inline(&self, w: &mut Writer, id: InodeId, content: &[u8]) -> Result<()> {
        let fe = FileExtentItem {
            generation: w.blocks.transid,
            ram_bytes: content.len() as u64,
            compression: COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_INLINE,
            body: ExtentBody::Inline(content.to_vec()),
        };
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, 0), bytes)
        })
    }

    fn insert_hole(&self, w: &mut Writer, id: InodeId, at: u64, len: u64) -> Result<()> {
        let fe = FileExtentItem::hole(w.blocks.transid, len);
        let bytes = fe.to_bytes();
        self.modify_tree(w, id.subvol, |ed, root| {
            ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, at), bytes)
        })
    }

    /// Allocate `len` bytes of data space in extents of at most
    /// [`MAX_EXTENT`] bytes, or nothing (ENOSPC) if it is not all there.
    pub(crate) fn reserve_data(&self, w: &mut Writer, len: u64) -> Result<Vec<(u64, u64)>> {
        let pieces = self.take_data_space(w, len)?;
        // The space is held: a failure before its extents are in leaves it
        // held (all of it is given back below, when it is not all there).
        crate::transaction::abort::note_edit();
        Ok(pieces)
    }

    /// [`Self::reserve_data`] for a caller that gives the space back
    /// itself if it fails before the space is used.
    pub(crate) fn take_data_space(&self, w: &mut Writer, len: u64) -> Result<Vec<(u64, u64)>> {
        let mut pieces = Vec::new();
        let mut got = 0;
        while got < len {
            match self.alloc_data_space(w, (len - got).min(MAX_EXTENT)) {
                Ok((s, l)) => {
                    pieces.push((s, l));
                    got += l;
                }
                Err(e) => {
                    for (s, l) in pieces {
                        w.blocks.alloc.release(s, l)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(pieces)
    }

    /// Remove the file's extents in `[start, end)`, trimming those that
    /// reach outside it; returns the bytes of real data no longer referenced.
    pub(crate) fn drop_range(
        &self,
        w: &mut Writer,
        id: InodeId,
        start: u64,
        end: u64,
    ) -> Result<u64> {
        let mut removed = 0u64;
        for (key_off, fe) in self.extent_items_in(id, start, end)? {
            let ext_end = key_off.saturating_add(fe.len());
            if ext_end <= start || key_off >= end {
                continue;
            }
            let key = Key::new(id.ino, EXTENT_DATA_KEY, key_off);
            let ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes: _,
            } = fe.body.clone()
            else {
                // Inline extents are dropped whole.
                self.modify_tree(w, id.subvol, |ed, root| ed.delete(root, key))?;
                removed += fe.ram_bytes;
                continue;
            };
            let real = disk_bytenr != 0;
            let owner = DataOwner {
                root: id.subvol,
                objectid: id.ino,
                offset: key_off.wrapping_sub(offset),
            };
            let cut_lo = start.max(key_off);
            let cut_hi = end.min(ext_end);
            if real {
                removed += cut_hi - cut_lo;
            }
            let head = (key_off < start).then(|| extent_part(&fe, 0, start - key_off));
            let tail = (ext_end > end).then(|| extent_part(&fe, end - key_off, ext_end - end));
            let (hb, tb) = (
                head.as_ref().map(|h| h.to_bytes()),
                tail.as_ref().map(|t| t.to_bytes()),
            );
            let keeps_head = hb.is_some();
            let has_tail = tb.is_some();
            self.modify_tree(w, id.subvol, |ed, root| {
                match hb {
                    Some(b) => ed.put(root, key, b)?,
                    None => {
                        ed.delete(root, key)?;
                    }
                }
                if let Some(b) = tb {
                    ed.insert(root, Key::new(id.ino, EXTENT_DATA_KEY, end), b)?;
                }
                Ok(())
            })?;
            if real {
                let refs_now = keeps_head as i64 + has_tail as i64;
                w.blocks
                    .refs
                    .change_data(disk_bytenr, disk_num_bytes, owner, refs_now - 1);
            }
        }
        Ok(removed)
    }

    /// Drop the reference a file extent item holds (the inode is going away).
    pub(crate) fn drop_extent_ref(
        &self,
        w: &mut Writer,
        id: InodeId,
        key_off: u64,
        item: &[u8],
    ) -> Result<()> {
        let fe = FileExtentItem::parse(item)?;
        if let ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            ..
        } = fe.body
            && disk_bytenr != 0
        {
            let owner = DataOwner {
                root: id.subvol,
                objectid: id.ino,
                offset: key_off.wrapping_sub(offset),
            };
            w.blocks
                .refs
                .change_data(disk_bytenr, disk_num_bytes, owner, -1);
        }
        Ok(())
    }
}

/// The part `[skip, skip + len)` of the regular file extent item `fe`: the
/// same disk extent, seen from `skip` bytes further in. A part of a hole is
/// a hole as the kernel writes one: offset 0, `ram_bytes` its length (a
/// split kernel hole may carry an offset). An inline item cannot be cut and
/// comes back whole.
pub(super) fn extent_part(fe: &FileExtentItem, skip: u64, len: u64) -> FileExtentItem {
    let mut part = fe.clone();
    if let ExtentBody::Regular {
        disk_bytenr,
        disk_num_bytes,
        offset,
        ..
    } = fe.body
    {
        if disk_bytenr == 0 {
            part.ram_bytes = len;
            part.body = ExtentBody::Regular {
                disk_bytenr: 0,
                disk_num_bytes: 0,
                offset: 0,
                num_bytes: len,
            };
        } else {
            part.body = ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset: offset + skip,
                num_bytes: len,
            };
        }
    }
    part
}

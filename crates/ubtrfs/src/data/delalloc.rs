//! Delayed allocation: written data held in memory per inode, in runs of
//! contiguous whole sectors, until writeback turns them into ordered
//! extents.
//!
//! A run grows in place as writes extend it, so a streaming writer costs
//! one copy into memory, and writeback takes the runs out without copying
//! them again. A whole run can be lent to a compression job without a
//! copy: a run is shared, and a change to a shared run copies it first,
//! so what the job holds never changes under it.

use super::write::MAX_EXTENT;
use crate::fs::InodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Dirty sectors of every inode.
#[derive(Debug, Default)]
pub struct Delalloc {
    /// Per inode: runs by the index of their first sector. Runs never
    /// overlap; adjacent ones may stay apart (a run only grows at its end).
    files: BTreeMap<InodeId, BTreeMap<u64, Arc<Vec<u8>>>>,
    bytes: u64,
    /// Dirty sectors that go in place (into a preallocated or no-COW
    /// extent of their own) and so took no data space when written, by
    /// index; they leave with their data.
    unreserved: BTreeMap<InodeId, BTreeSet<u64>>,
    unreserved_count: u64,
    /// Per inode: the sectors its last write covered in part, kept back
    /// from background writeback while they go in place
    /// ([`Delalloc::take_runs_holding_edges`]).
    open_edges: BTreeMap<InodeId, [Option<u64>; 2]>,
    /// Sector size, learnt from the first sector stored.
    sectorsize: u64,
    /// Buffers of long runs already written, kept for new long runs: fresh
    /// memory costs a page fault and a zeroed page per 4 KiB written.
    spare: Vec<Vec<u8>>,
    /// Longest run (0: [`MAX_EXTENT`]). Compressed writeback takes runs
    /// a job at a time: shorter runs are then taken whole, not cut (a
    /// cut copies what follows).
    max_run: usize,
}

/// Runs this long take a spare buffer (or room for a whole extent).
const LONG_RUN: usize = 1 << 20;
/// Spare buffers kept at most.
const SPARES: usize = 4;

/// A run of contiguous dirty sectors of one inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyRun {
    /// File offset of the first byte (sector-aligned).
    pub offset: u64,
    /// The bytes, a whole number of sectors.
    pub data: Vec<u8>,
}

impl Delalloc {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes held that will take new data space at writeback: all but
    /// those marked [`Delalloc::mark_unreserved`].
    pub fn reserved_bytes(&self) -> u64 {
        self.bytes
            .saturating_sub(self.unreserved_count * self.sectorsize)
    }

    /// Note that dirty sectors `indexes` of `id` go in place and took no
    /// space. A sector not dirty is left out.
    pub fn mark_unreserved(&mut self, id: InodeId, indexes: &[u64]) {
        let dirty: Vec<u64> = indexes
            .iter()
            .copied()
            .filter(|&i| self.run_of(id, i).is_some())
            .collect();
        if dirty.is_empty() {
            return;
        }
        let set = self.unreserved.entry(id).or_default();
        for i in dirty {
            if set.insert(i) {
                self.unreserved_count += 1;
            }
        }
    }

    /// Whether dirty sector `index` of `id` is marked
    /// [`Delalloc::mark_unreserved`].
    pub fn is_unreserved(&self, id: InodeId, index: u64) -> bool {
        self.unreserved
            .get(&id)
            .is_some_and(|set| set.contains(&index))
    }

    /// Note the sectors the last write to `id` covered in part (its
    /// first and last, when it starts or ends inside them).
    pub fn set_open_edges(&mut self, id: InodeId, edges: [Option<u64>; 2]) {
        if edges == [None, None] {
            self.open_edges.remove(&id);
        } else {
            self.open_edges.insert(id, edges);
        }
    }

    /// [`Delalloc::take_runs`], but for the sectors the last write to
    /// `id` covered in part, where they go in place: those stay dirty,
    /// with their marks. The rest of such a sector often comes with the
    /// very next request (the kernel cuts a FUSE write from a buffer that
    /// is not page-aligned at the buffer's page boundaries); written in
    /// place before it, the sector would be a regular extent, and the
    /// rest would need new space, which a full filesystem does not have.
    pub fn take_runs_holding_edges(
        &mut self,
        id: InodeId,
        sectorsize: u64,
        max: u64,
    ) -> Vec<DirtyRun> {
        let held: Vec<(u64, Vec<u8>)> = self
            .open_edges
            .get(&id)
            .into_iter()
            .flatten()
            .flatten()
            .copied()
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .filter(|&k| self.is_unreserved(id, k))
            .filter_map(|k| self.sector(id, k).map(|b| (k, b.to_vec())))
            .collect();
        let edges = self.open_edges.get(&id).copied();
        let mut runs = self.take_runs(id, sectorsize, max);
        if let Some(edges) = edges {
            self.open_edges.insert(id, edges);
        }
        for (k, data) in held {
            let at = k * sectorsize;
            let Some(i) = runs
                .iter()
                .position(|r| r.offset <= at && at < r.offset + r.data.len() as u64)
            else {
                continue;
            };
            let mut run = runs.remove(i);
            let rel = (at - run.offset) as usize;
            let tail = run.data.split_off(rel + sectorsize as usize);
            run.data.truncate(rel);
            if !tail.is_empty() {
                runs.insert(
                    i,
                    DirtyRun {
                        offset: at + sectorsize,
                        data: tail,
                    },
                );
            }
            if !run.data.is_empty() {
                runs.insert(i, run);
            }
            self.put(id, k, data.into_boxed_slice());
            self.mark_unreserved(id, &[k]);
        }
        runs
    }

    /// Forget the marks of `id`'s sectors in `range` (they left).
    fn unmark(&mut self, id: InodeId, range: std::ops::Range<u64>) {
        let Some(set) = self.unreserved.get_mut(&id) else {
            return;
        };
        let gone: Vec<u64> = set.range(range).copied().collect();
        for i in &gone {
            set.remove(i);
        }
        self.unreserved_count -= gone.len() as u64;
        if set.is_empty() {
            self.unreserved.remove(&id);
        }
    }

    /// The longest a run grows.
    pub fn max_run(&self) -> u64 {
        if self.max_run == 0 {
            MAX_EXTENT
        } else {
            self.max_run as u64
        }
    }

    /// Let runs grow to `bytes` (a whole number of sectors) at most.
    pub fn set_max_run(&mut self, bytes: u64) {
        self.max_run = bytes.min(MAX_EXTENT) as usize;
    }

    /// Whether `id` has dirty data.
    pub fn has(&self, id: InodeId) -> bool {
        self.files.contains_key(&id)
    }

    /// Inodes with dirty data.
    pub fn inodes(&self) -> Vec<InodeId> {
        self.files.keys().copied().collect()
    }

    /// The run of `id` holding sector `index`, as (first sector, bytes).
    fn run_of(&self, id: InodeId, index: u64) -> Option<(u64, &[u8])> {
        let ss = self.sectorsize;
        let (&start, run) = self.files.get(&id)?.range(..=index).next_back()?;
        ((index - start) * ss < run.len() as u64).then_some((start, &run[..]))
    }

    /// The dirty sector `index` of `id`, if any.
    pub fn sector(&self, id: InodeId, index: u64) -> Option<&[u8]> {
        let ss = self.sectorsize as usize;
        let (start, run) = self.run_of(id, index)?;
        let at = (index - start) as usize * ss;
        Some(&run[at..at + ss])
    }

    /// Store sector `index` of `id`.
    pub fn put(&mut self, id: InodeId, index: u64, data: Box<[u8]>) {
        self.put_sectors(id, index, &data, data.len() as u64);
    }

    /// Store `data`, whole sectors of `sectorsize` bytes, as the dirty
    /// sectors of `id` from sector `index` on.
    pub fn put_sectors(&mut self, id: InodeId, index: u64, data: &[u8], sectorsize: u64) {
        if self.sectorsize == 0 {
            self.sectorsize = sectorsize;
        }
        let ss = self.sectorsize as usize;
        let max = self.max_run() as usize;
        let Delalloc {
            files,
            bytes,
            spare,
            ..
        } = self;
        let file = files.entry(id).or_default();
        let n = data.len() / ss;
        let mut i = 0;
        while i < n {
            let idx = index + i as u64;
            // Sectors up to the next run (or the end of the data).
            let gap = file
                .range(idx + 1..)
                .next()
                .map_or(n - i, |(&next, _)| ((next - idx) as usize).min(n - i));
            let (start, taken) = match file.range_mut(..=idx).next_back() {
                // The run holding these sectors is overwritten.
                Some((&start, run)) if ((idx - start) as usize) * ss < run.len() => {
                    let at = (idx - start) as usize * ss;
                    let k = ((run.len() - at) / ss).min(n - i);
                    Arc::make_mut(run)[at..at + k * ss]
                        .copy_from_slice(&data[i * ss..(i + k) * ss]);
                    i += k;
                    continue;
                }
                // One ending just before grows, up to the largest extent, so
                // writeback can usually hand runs over without cutting them.
                Some((&start, run))
                    if ((idx - start) as usize) * ss == run.len() && run.len() + ss <= max =>
                {
                    let k = gap.min((max - run.len()) / ss);
                    let add = &data[i * ss..(i + k) * ss];
                    let run = Arc::make_mut(run);
                    if run.capacity() - run.len() < add.len() && run.len() >= LONG_RUN {
                        // A stream: room for the whole extent at once, not
                        // a copy per doubling; a spare buffer if there is one.
                        match spare.pop() {
                            Some(mut b) => {
                                b.extend_from_slice(run);
                                *run = b;
                            }
                            None => run.reserve_exact(max - run.len()),
                        }
                    }
                    run.extend_from_slice(add);
                    (start, k)
                }
                _ => {
                    let k = gap.min(max / ss);
                    let add = &data[i * ss..(i + k) * ss];
                    let run = match spare.pop() {
                        Some(mut b) if add.len() >= LONG_RUN => {
                            b.extend_from_slice(add);
                            b
                        }
                        other => {
                            spare.extend(other);
                            add.to_vec()
                        }
                    };
                    file.insert(idx, Arc::new(run));
                    (idx, k)
                }
            };
            *bytes += (taken * ss) as u64;
            i += taken;
            // A run that now reaches the next one takes it in (writes that
            // arrive out of order leave the later one short): cheaper now
            // than joining two long runs at writeback.
            let end = idx + taken as u64;
            let fits = match (file.get(&start), file.get(&end)) {
                (Some(a), Some(b)) => a.len() + b.len() <= max,
                _ => false,
            };
            if fits && let Some(next) = file.remove(&end) {
                if let Some(run) = file.get_mut(&start) {
                    Arc::make_mut(run).extend_from_slice(&next);
                }
                if let Ok(next) = Arc::try_unwrap(next) {
                    keep_spare(spare, next, max);
                }
            }
        }
    }

    /// Store `data`, whole sectors, as the dirty sectors of `id` from
    /// sector `index` on, like [`Delalloc::put_sectors`], keeping `data`
    /// itself as the run where no run holds, ends at or starts right after
    /// those sectors (a small file written at once): no copy.
    pub fn put_run(&mut self, id: InodeId, index: u64, data: Vec<u8>, sectorsize: u64) {
        if self.sectorsize == 0 {
            self.sectorsize = sectorsize;
        }
        let ss = self.sectorsize;
        let n = data.len() as u64 / ss;
        let alone = data.len() as u64 <= self.max_run()
            && self.files.get(&id).is_none_or(|file| {
                let before = file
                    .range(..=index)
                    .next_back()
                    .is_some_and(|(&s, run)| s + run.len() as u64 / ss >= index);
                let after = file.range(index + 1..=index + n).next().is_some();
                !before && !after
            });
        if !alone {
            self.put_sectors(id, index, &data, ss);
            return;
        }
        self.bytes += n * ss;
        self.files
            .entry(id)
            .or_default()
            .insert(index, Arc::new(data));
    }

    /// Keep `buf`, the buffer of a run that was written, for a new run;
    /// gives it back if it is not kept.
    pub fn recycle(&mut self, buf: Vec<u8>) -> Option<Vec<u8>> {
        let max = self.max_run() as usize;
        keep_spare(&mut self.spare, buf, max)
    }

    /// Give the spare buffers' memory back.
    pub fn drop_spares(&mut self) {
        self.spare = Vec::new();
    }

    /// Copy the dirty bytes of `id` overlapping `[offset, offset + out.len())`
    /// over `out`.
    pub fn overlay(&self, id: InodeId, offset: u64, out: &mut [u8], sectorsize: u64) {
        let Some(f) = self.files.get(&id) else { return };
        let end = offset + out.len() as u64;
        // Runs do not overlap, so their ends are in order too: walk back
        // from the last run starting before `end` to the first ending after `offset`.
        for (&idx, run) in f.range(..end.div_ceil(sectorsize)).rev() {
            let s = idx * sectorsize;
            let e = s + run.len() as u64;
            if e <= offset {
                break;
            }
            let lo = s.max(offset);
            let hi = e.min(end);
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&run[(lo - s) as usize..(hi - s) as usize]);
            }
        }
    }

    /// The runs of `id`, contiguous sectors joined, each at most `max`
    /// bytes (a long stretch is cut every `max` bytes from its start).
    pub fn runs(&self, id: InodeId, sectorsize: u64, max: u64) -> Vec<DirtyRun> {
        let Some(f) = self.files.get(&id) else {
            return Vec::new();
        };
        let runs = f.iter().map(|(&idx, run)| DirtyRun {
            offset: idx * sectorsize,
            data: run.to_vec(),
        });
        join_and_cut(runs, max)
    }

    /// The dirty byte ranges of `id` as `(offset, length)`, in order, without
    /// their data (SEEK_DATA/SEEK_HOLE only need where they are).
    pub fn ranges(&self, id: InodeId, sectorsize: u64) -> Vec<(u64, u64)> {
        let Some(f) = self.files.get(&id) else {
            return Vec::new();
        };
        f.iter()
            .map(|(&idx, run)| (idx * sectorsize, run.len() as u64))
            .collect()
    }

    /// Like [`Delalloc::runs`], taking the data out of the inode's dirty
    /// set (nothing is copied unless runs must be joined or cut).
    pub fn take_runs(&mut self, id: InodeId, sectorsize: u64, max: u64) -> Vec<DirtyRun> {
        self.open_edges.remove(&id);
        let Some(f) = self.files.remove(&id) else {
            return Vec::new();
        };
        self.unmark(id, 0..u64::MAX);
        let runs: Vec<DirtyRun> = f
            .into_iter()
            .map(|(idx, data)| DirtyRun {
                offset: idx * sectorsize,
                data: Arc::unwrap_or_clone(data),
            })
            .collect();
        self.bytes -= runs.iter().map(|r| r.data.len() as u64).sum::<u64>();
        join_and_cut(runs.into_iter(), max)
    }

    /// A copy of the dirty bytes of `id` at `[offset, offset + len)`
    /// (sector-aligned), if all of them are dirty.
    pub fn copy_range(&self, id: InodeId, offset: u64, len: u64) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(len as usize);
        self.copy_range_into(id, offset, len, &mut out)
            .then_some(out)
    }

    /// [`Delalloc::copy_range`] into `out` (emptied first); false if not
    /// all of the range is dirty.
    pub fn copy_range_into(&self, id: InodeId, offset: u64, len: u64, out: &mut Vec<u8>) -> bool {
        out.clear();
        out.reserve(len as usize);
        self.for_each_piece(id, offset, len, |piece| out.extend_from_slice(piece))
    }

    /// The run of `id` that starts at `offset` and is `len` bytes long,
    /// shared: lent to a compression job without a copy.
    pub fn lend_run(&self, id: InodeId, offset: u64, len: u64) -> Option<Arc<Vec<u8>>> {
        let ss = self.sectorsize;
        if ss == 0 || !offset.is_multiple_of(ss) {
            return None;
        }
        let run = self.files.get(&id)?.get(&(offset / ss))?;
        (run.len() as u64 == len).then(|| Arc::clone(run))
    }

    /// Whether the dirty bytes of `id` from `offset` (sector-aligned) on
    /// are `data`, every one of them dirty.
    pub fn matches(&self, id: InodeId, offset: u64, data: &[u8]) -> bool {
        // A lent run still in place is the same bytes: a change would
        // have copied it.
        if self.sectorsize > 0
            && offset.is_multiple_of(self.sectorsize)
            && let Some(run) = self
                .files
                .get(&id)
                .and_then(|f| f.get(&(offset / self.sectorsize)))
            && std::ptr::eq(run.as_ptr(), data.as_ptr())
            && run.len() == data.len()
        {
            return true;
        }
        let mut at = 0;
        let mut same = true;
        let whole = self.for_each_piece(id, offset, data.len() as u64, |piece| {
            same = same && data[at..at + piece.len()] == *piece;
            at += piece.len();
        });
        whole && same
    }

    /// Call `f` with the dirty bytes of `id` at `[offset, offset + len)`
    /// in order, run by run; false (having stopped) at the first sector
    /// that is not dirty.
    fn for_each_piece(&self, id: InodeId, offset: u64, len: u64, mut f: impl FnMut(&[u8])) -> bool {
        let ss = self.sectorsize;
        if len == 0 {
            return true;
        }
        if ss == 0 || !offset.is_multiple_of(ss) {
            return false;
        }
        let Some(file) = self.files.get(&id) else {
            return false;
        };
        let (mut pos, end) = (offset, offset + len);
        while pos < end {
            let Some((&idx, run)) = file.range(..=pos / ss).next_back() else {
                return false;
            };
            let (s, e) = (idx * ss, idx * ss + run.len() as u64);
            if e <= pos {
                return false;
            }
            let hi = e.min(end);
            f(&run[(pos - s) as usize..(hi - s) as usize]);
            pos = hi;
        }
        true
    }

    /// Forget the dirty bytes of `id` at `[offset, offset + len)`
    /// (sector-aligned); the runs around keep the rest.
    pub fn take_range(&mut self, id: InodeId, offset: u64, len: u64) {
        let ss = self.sectorsize;
        if ss == 0 || len == 0 {
            return;
        }
        let (lo, hi) = (offset / ss, (offset + len).div_ceil(ss));
        // The sectors leave: so do their marks.
        self.unmark(id, lo..hi);
        let Some(file) = self.files.get_mut(&id) else {
            return;
        };
        let first = file.range(..=lo).next_back().map_or(lo, |(&k, _)| k);
        let keys: Vec<u64> = file.range(first..hi).map(|(&k, _)| k).collect();
        for k in keys {
            let Some(run) = file.remove(&k) else {
                continue;
            };
            let n = run.len() as u64 / ss;
            if k + n <= lo {
                file.insert(k, run);
                continue;
            }
            let (cut_lo, cut_hi) = (lo.max(k), hi.min(k + n));
            self.bytes -= (cut_hi - cut_lo) * ss;
            if cut_lo == k && cut_hi == k + n {
                // The whole run: nothing to copy.
                continue;
            }
            let (head_end, tail_at) = (((cut_lo - k) * ss) as usize, ((cut_hi - k) * ss) as usize);
            let (head, tail) = match Arc::try_unwrap(run) {
                Ok(mut run) => {
                    let tail = run.split_off(tail_at);
                    run.truncate(head_end);
                    (run, tail)
                }
                // Shared (lent): copy only what stays.
                Err(run) => (run[..head_end].to_vec(), run[tail_at..].to_vec()),
            };
            if !tail.is_empty() {
                file.insert(cut_hi, Arc::new(tail));
            }
            if !head.is_empty() {
                file.insert(k, Arc::new(head));
            }
        }
        if file.is_empty() {
            self.files.remove(&id);
        }
    }

    /// Forget the dirty data of `id` from sector `from_index` on.
    pub fn discard_from(&mut self, id: InodeId, from_index: u64) {
        self.unmark(id, from_index..u64::MAX);
        let ss = self.sectorsize as usize;
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        let gone = f.split_off(&from_index);
        let mut freed: u64 = gone.values().map(|b| b.len() as u64).sum();
        if let Some((&start, run)) = f.range_mut(..from_index).next_back() {
            let keep = (from_index - start) as usize * ss;
            if run.len() > keep {
                freed += (run.len() - keep) as u64;
                match Arc::get_mut(run) {
                    Some(r) => r.truncate(keep),
                    // Shared (lent): copy only what stays.
                    None => *run = Arc::new(run[..keep].to_vec()),
                }
            }
        }
        self.bytes -= freed;
        if f.is_empty() {
            self.files.remove(&id);
        }
    }

    /// Forget all dirty data of `id`.
    pub fn discard(&mut self, id: InodeId) {
        self.open_edges.remove(&id);
        self.discard_from(id, 0);
    }
}

/// Keep `buf` among the spare buffers if it is a long run's and there is
/// room; else give it back.
fn keep_spare(spare: &mut Vec<Vec<u8>>, mut buf: Vec<u8>, max_run: usize) -> Option<Vec<u8>> {
    if buf.capacity() >= max_run / 2 && buf.capacity() >= LONG_RUN && spare.len() < SPARES {
        buf.clear();
        spare.push(buf);
        return None;
    }
    Some(buf)
}

/// Join runs (in order, not overlapping) that touch, then cut each stretch
/// into pieces of at most `max` bytes from its start.
fn join_and_cut(runs: impl Iterator<Item = DirtyRun>, max: u64) -> Vec<DirtyRun> {
    let max = max.max(1) as usize;
    let mut joined: Vec<DirtyRun> = Vec::new();
    // Where the stretch of contiguous runs the last one belongs to starts.
    let mut stretch = 0;
    for r in runs {
        match joined.last_mut() {
            Some(last) if last.offset + last.data.len() as u64 == r.offset => {
                // A run ending at a cut point needs no joining (the usual
                // case: runs stop growing at the largest extent).
                let cut = ((r.offset - stretch) as usize).is_multiple_of(max);
                if cut && last.data.len() <= max {
                    joined.push(r);
                } else {
                    last.data.extend_from_slice(&r.data);
                }
            }
            _ => {
                stretch = r.offset;
                joined.push(r);
            }
        }
    }
    let mut out = Vec::with_capacity(joined.len());
    for mut r in joined {
        // Cut from the back, so each piece is copied once at most.
        let mut tail = Vec::new();
        while r.data.len() > max {
            let at = (r.data.len() - 1) / max * max;
            let piece = r.data.split_off(at);
            tail.push(DirtyRun {
                offset: r.offset + at as u64,
                data: piece,
            });
        }
        out.push(r);
        out.extend(tail.into_iter().rev());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sectors_marked_unreserved_leave_with_their_data() {
        let id = InodeId {
            subvol: 5,
            ino: 257,
        };
        let ss = 4;
        let mut d = Delalloc::default();
        d.put_sectors(id, 0, &[1u8; 40], ss);
        assert_eq!(d.reserved_bytes(), 40);
        // Sector 12 is not dirty: not marked.
        d.mark_unreserved(id, &[1, 2, 3, 5, 12]);
        d.mark_unreserved(id, &[2]);
        assert_eq!(d.reserved_bytes(), 24);
        // Rewritten, a sector stays marked.
        d.put_sectors(id, 2, &[2u8; 4], ss);
        assert_eq!(d.reserved_bytes(), 24);
        d.take_range(id, 8, 8);
        assert_eq!((d.bytes(), d.reserved_bytes()), (32, 24));
        d.discard_from(id, 5);
        assert_eq!((d.bytes(), d.reserved_bytes()), (12, 8));
        let runs = d.take_runs(id, ss, 1 << 20);
        assert_eq!(runs.iter().map(|r| r.data.len()).sum::<usize>(), 12);
        assert_eq!((d.bytes(), d.reserved_bytes()), (0, 0));
        // Put back after a failed writeback, they count as reserved.
        d.put_sectors(id, 0, &[1u8; 8], ss);
        assert_eq!(d.reserved_bytes(), 8);
    }

    #[test]
    fn sectors_a_write_covered_in_part_are_held_back_while_in_place() {
        let id = InodeId {
            subvol: 5,
            ino: 257,
        };
        let ss = 4;
        let mut d = Delalloc::default();
        d.put_sectors(id, 0, &[1u8; 40], ss);
        d.mark_unreserved(id, &[0, 4, 9]);
        // Sector 2 is not marked (it took space): it goes.
        d.set_open_edges(id, [Some(4), Some(9)]);
        let runs = d.take_runs_holding_edges(id, ss, 1 << 20);
        let got: Vec<(u64, usize)> = runs.iter().map(|r| (r.offset, r.data.len())).collect();
        assert_eq!(got, vec![(0, 16), (20, 16)]);
        assert_eq!((d.bytes(), d.reserved_bytes()), (8, 0));
        assert_eq!(d.sector(id, 4), Some(&[1u8; 4][..]));
        // Still held by the next background pass, gone with a full one.
        assert!(d.take_runs_holding_edges(id, ss, 1 << 20).is_empty());
        assert_eq!(d.take_runs(id, ss, 1 << 20).len(), 2);
        assert_eq!((d.bytes(), d.reserved_bytes()), (0, 0));
        d.put_sectors(id, 0, &[1u8; 8], ss);
        assert_eq!(d.take_runs_holding_edges(id, ss, 1 << 20).len(), 1);
    }

    #[test]
    fn runs_overlay_and_discard() {
        let id = InodeId {
            subvol: 5,
            ino: 257,
        };
        let mut d = Delalloc::default();
        for i in [0u64, 1, 2, 5, 6] {
            d.put(id, i, vec![i as u8; 4].into_boxed_slice());
        }
        assert_eq!(d.bytes(), 20);
        let runs = d.runs(id, 4, 8);
        assert_eq!(
            runs.iter()
                .map(|r| (r.offset, r.data.len()))
                .collect::<Vec<_>>(),
            vec![(0, 8), (8, 4), (20, 8)]
        );
        assert_eq!(d.ranges(id, 4), vec![(0, 12), (20, 8)]);
        let mut out = vec![9u8; 10];
        d.overlay(id, 6, &mut out, 4);
        assert_eq!(out, vec![1, 1, 2, 2, 2, 2, 9, 9, 9, 9]);
        d.discard_from(id, 2);
        assert_eq!(d.bytes(), 8);
        d.discard(id);
        assert!(!d.has(id));
    }

    /// Random sector writes, overlays, cuts and takes agree with a plain
    /// map of sectors.
    #[test]
    fn a_run_put_alone_is_kept_without_a_copy() {
        let id = InodeId {
            subvol: 5,
            ino: 301,
        };
        let ss = 8u64;
        let mut d = Delalloc::default();
        let buf = vec![3u8; 3 * ss as usize];
        let at = buf.as_ptr();
        d.put_run(id, 10, buf, ss);
        let run = d.lend_run(id, 10 * ss, 3 * ss).expect("one run");
        assert_eq!(run.as_ptr(), at, "the buffer itself is the run");
        drop(run);
        // Ones that touch it (end where it starts, start where it ends)
        // join it as with put_sectors.
        d.put_run(id, 8, vec![4u8; 2 * ss as usize], ss);
        assert_eq!(d.ranges(id, ss), vec![(8 * ss, 5 * ss)]);
        d.put_run(id, 13, vec![5u8; ss as usize], ss);
        assert_eq!(d.ranges(id, ss), vec![(8 * ss, 6 * ss)]);
        assert_eq!(d.bytes(), 6 * ss);
        assert_eq!(d.sector(id, 13), Some(&[5u8; 8][..]));
    }

    #[test]
    fn matches_a_sector_map() {
        let id = InodeId {
            subvol: 5,
            ino: 300,
        };
        let ss = 8u64;
        let mut x: u64 = 77;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for round in 0..200u64 {
            let mut d = Delalloc::default();
            let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let mut lent: Vec<(u64, Vec<u8>, Arc<Vec<u8>>)> = Vec::new();
            for step in 0..40u64 {
                let idx = rnd(64);
                let n = 1 + rnd(6) as usize;
                let data: Vec<u8> = (0..n * ss as usize)
                    .map(|i| (step * 7 + i as u64 / ss) as u8)
                    .collect();
                let how = rnd(4);
                if how == 0 {
                    d.put(id, idx, data[..ss as usize].to_vec().into_boxed_slice());
                    model.insert(idx, data[..ss as usize].to_vec());
                } else if how == 1 {
                    d.put_run(id, idx, data.clone(), ss);
                    for (i, s) in data.chunks(ss as usize).enumerate() {
                        model.insert(idx + i as u64, s.to_vec());
                    }
                } else {
                    d.put_sectors(id, idx, &data, ss);
                    for (i, s) in data.chunks(ss as usize).enumerate() {
                        model.insert(idx + i as u64, s.to_vec());
                    }
                }
                if rnd(8) == 0 {
                    // A range taken out (as compressed writeback does),
                    // after checking it holds what the model says.
                    let (at, n) = (rnd(64), 1 + rnd(8));
                    let want: Option<Vec<u8>> = (at..at + n)
                        .map(|i| model.get(&i).cloned())
                        .collect::<Option<Vec<_>>>()
                        .map(|v| v.concat());
                    assert_eq!(d.copy_range(id, at * ss, n * ss), want);
                    if let Some(w) = &want {
                        assert!(d.matches(id, at * ss, w));
                        let mut other = w.clone();
                        other[0] ^= 1;
                        assert!(!d.matches(id, at * ss, &other));
                    }
                    d.take_range(id, at * ss, n * ss);
                    model.retain(|&k, _| k < at || k >= at + n);
                }
                if rnd(6) == 0 {
                    // A whole run lent to a job: what the job holds never
                    // changes, and it matches only while nothing changed.
                    let runs = d.ranges(id, ss);
                    if !runs.is_empty() {
                        let (at, len) = runs[rnd(runs.len() as u64) as usize];
                        let run = d.lend_run(id, at, len).expect("a whole run is lent");
                        assert!(d.lend_run(id, at, len + ss).is_none());
                        assert!(d.matches(id, at, &run));
                        lent.push((at, run.to_vec(), run));
                    }
                }
                for (at, was, run) in &lent {
                    assert_eq!(&run[..], &was[..], "round {round}: a lent run changed");
                    let same = d.copy_range(id, *at, was.len() as u64).as_ref() == Some(was);
                    assert_eq!(d.matches(id, *at, run), same, "round {round}");
                }
                if rnd(10) == 0 {
                    lent.clear();
                }
                if rnd(10) == 0 {
                    let from = rnd(70);
                    d.discard_from(id, from);
                    model.retain(|&k, _| k < from);
                }
                assert_eq!(d.bytes(), model.len() as u64 * ss);
                for i in 0..72 {
                    assert_eq!(
                        d.sector(id, i),
                        model.get(&i).map(|v| &v[..]),
                        "round {round}"
                    );
                }
                let (off, len) = (rnd(600), rnd(100) as usize);
                let mut got = vec![0xee; len];
                d.overlay(id, off, &mut got, ss);
                let mut want = vec![0xee; len];
                for (i, b) in want.iter_mut().enumerate() {
                    let at = off + i as u64;
                    if let Some(s) = model.get(&(at / ss)) {
                        *b = s[(at % ss) as usize];
                    }
                }
                assert_eq!(got, want);
            }
            // Runs: contiguous sectors joined, cut every `max` bytes.
            let max = ss * (1 + rnd(5));
            let mut want: Vec<DirtyRun> = Vec::new();
            for (&i, s) in &model {
                match want.last_mut() {
                    Some(r)
                        if r.offset + r.data.len() as u64 == i * ss
                            && (r.data.len() as u64) < max =>
                    {
                        r.data.extend_from_slice(s)
                    }
                    _ => want.push(DirtyRun {
                        offset: i * ss,
                        data: s.clone(),
                    }),
                }
            }
            assert_eq!(d.runs(id, ss, max), want);
            assert_eq!(d.take_runs(id, ss, max), want);
            assert_eq!(d.bytes(), 0);
            assert!(!d.has(id));
        }
    }
}

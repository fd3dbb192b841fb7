//! Ordered extents whose data a writeback thread is writing (DESIGN.md
//! layer 8). When dirty data piles up under a stream of writes, writeback
//! puts the file extent items into the running transaction at once and
//! leaves the data write and its checksums to a thread of its own: the
//! change lock is then not held while the data goes to the device, and
//! an fsync of another file does not wait for it.
//!
//! Until an extent is finished, reads of its range are served from its
//! buffer. Its checksum items go into the tree when a lock holder
//! finishes it: an fsync of its file, a clone, at the latest the commit,
//! which waits for every one, so a commit never names data that is not
//! on disk. A failed write fails that commit.

use super::csum_pool::CsumSpec;
use crate::fs::InodeId;
use crate::volume::Volume;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Bytes of data written at a time (checksummed just before).
const PIECE: usize = 1 << 20;

/// One extent's data on its way to the device.
struct Entry {
    /// The file that wrote it (an fsync of it waits for the extent).
    owner: InodeId,
    data: Arc<Vec<u8>>,
    /// Where in `data` the extent's bytes start.
    at: usize,
    len: usize,
    /// Whether checksums are computed (not for `nodatasum` files).
    sums: bool,
    /// Set by the writeback thread: the checksums, or why the write failed.
    outcome: Option<Result<Vec<u8>>>,
}

#[derive(Default)]
struct State {
    /// By logical address.
    extents: BTreeMap<u64, Entry>,
    /// How many of `extents` each file owns (a write asks for its file's
    /// on every call: a lookup, not a scan).
    owners: HashMap<InodeId, usize>,
    /// Extents not yet taken by the thread, oldest first.
    queue: VecDeque<u64>,
    /// Bytes queued or being written.
    unwritten: u64,
    /// The first failed write, kept: the transaction that names its
    /// extent can never commit.
    failed: Option<String>,
    stop: bool,
}

impl State {
    /// One extent of `owner` is out of `extents`.
    fn forget_owner(&mut self, owner: InodeId) {
        if let Some(n) = self.owners.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                self.owners.remove(&owner);
            }
        }
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Notified when an extent is written and when work is queued.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(g).unwrap_or_else(|e| e.into_inner())
    }
}

/// A finished extent, for its checksum items.
pub(crate) struct Finished {
    /// Logical address of the extent.
    pub logical: u64,
    /// One checksum per sector (empty for a `nodatasum` file).
    pub sums: Vec<u8>,
    /// The data's buffer, once no other extent shares it.
    pub buffer: Option<Vec<u8>>,
}

/// The extents being written in the background, and the thread that
/// writes them.
#[derive(Default)]
pub(crate) struct InFlight {
    shared: Arc<Shared>,
    /// Whether any extent is in flight: every data read asks, and most
    /// find none without taking the lock.
    any: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Where and how extents are written, from the first submission.
    io: std::sync::OnceLock<(Arc<Volume>, CsumSpec)>,
}

impl InFlight {
    /// Queue `data[at..at + len]` for the device at `logical`, with
    /// checksums if `sums`. The thread starts on first use.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &self,
        volume: &Arc<Volume>,
        spec: CsumSpec,
        logical: u64,
        owner: InodeId,
        data: Arc<Vec<u8>>,
        at: usize,
        len: usize,
        sums: bool,
    ) -> Result<()> {
        {
            let _ = self.io.set((Arc::clone(volume), spec));
            let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
            if t.is_none() {
                let shared = Arc::clone(&self.shared);
                let volume = Arc::clone(volume);
                let handle = std::thread::Builder::new()
                    .name("writeback".into())
                    .spawn(move || run(&shared, &volume, spec))
                    .map_err(|e| Error::Invalid(format!("starting the writeback thread: {e}")))?;
                *t = Some(handle);
            }
        }
        let mut s = self.shared.lock();
        let replaced = s.extents.insert(
            logical,
            Entry {
                owner,
                data,
                at,
                len,
                sums,
                outcome: None,
            },
        );
        *s.owners.entry(owner).or_default() += 1;
        if let Some(old) = replaced {
            s.forget_owner(old.owner);
        }
        s.queue.push_back(logical);
        s.unwritten += len as u64;
        self.any.store(true, Ordering::Release);
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Whether nothing is in flight and no write has failed.
    pub fn is_idle(&self) -> bool {
        let s = self.shared.lock();
        s.extents.is_empty() && s.failed.is_none()
    }

    /// Whether any data in flight lies in `[logical, logical + len)`.
    pub fn overlaps(&self, logical: u64, len: u64) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let s = self.shared.lock();
        s.extents
            .range(..logical.saturating_add(len))
            .next_back()
            .is_some_and(|(&start, e)| start + e.len as u64 > logical)
    }

    /// Whether inode `owner` has data in flight, or a write failed.
    pub fn has(&self, owner: InodeId) -> bool {
        let s = self.shared.lock();
        s.failed.is_some() || s.owners.contains_key(&owner)
    }

    /// Whether at most `limit` bytes are queued or being written.
    pub fn has_room(&self, limit: u64) -> bool {
        self.shared.lock().unwritten <= limit
    }

    /// Wait until at most `limit` bytes are queued or being written.
    pub fn wait_for_room(&self, limit: u64) {
        let mut s = self.shared.lock();
        while s.unwritten > limit {
            s = self.shared.wait(s);
        }
    }

    /// Fill `buf` with the data at `logical` if one extent in flight holds
    /// all of it; returns whether it did.
    pub fn read(&self, logical: u64, buf: &mut [u8]) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let s = self.shared.lock();
        let Some((&start, e)) = s.extents.range(..=logical).next_back() else {
            return false;
        };
        let skip = (logical - start) as usize;
        if skip + buf.len() > e.len {
            return false;
        }
        let from = e.at + skip;
        buf.copy_from_slice(&e.data[from..from + buf.len()]);
        true
    }

    /// Wait for the extents of `owner` (all of them if `None`) to be
    /// written, and take them out; with `wait` false, only those written
    /// already. Once a write has failed, every call fails.
    pub fn finish(&self, owner: Option<InodeId>, wait: bool) -> Result<Vec<Finished>> {
        let mut s = self.shared.lock();
        if let Some(why) = &s.failed {
            return Err(Error::Devices(format!(
                "an earlier background data write failed: {why}"
            )));
        }
        let wanted: Vec<u64> = s
            .extents
            .iter()
            .filter(|(_, e)| owner.is_none_or(|o| e.owner == o))
            .filter(|(_, e)| wait || e.outcome.is_some())
            .map(|(&l, _)| l)
            .collect();
        let mut done = Vec::with_capacity(wanted.len());
        let mut failed = None;
        for logical in wanted {
            // One the thread has not taken yet is written here, rather than
            // after everything queued before it (another file's stream).
            if let Some(at) = s.queue.iter().position(|&l| l == logical)
                && let Some((volume, spec)) = self.io.get()
            {
                s.queue.remove(at);
                s = write_queued(&self.shared, s, logical, volume, *spec);
            }
            while s.extents.get(&logical).is_some_and(|e| e.outcome.is_none()) {
                s = self.shared.wait(s);
            }
            let Some(e) = s.extents.remove(&logical) else {
                continue;
            };
            s.forget_owner(e.owner);
            match e.outcome {
                Some(Ok(sums)) => done.push(Finished {
                    logical,
                    sums,
                    buffer: Arc::try_unwrap(e.data).ok(),
                }),
                Some(Err(err)) => {
                    s.failed.get_or_insert_with(|| err.to_string());
                    failed.get_or_insert(err);
                }
                None => {}
            }
        }
        self.any.store(!s.extents.is_empty(), Ordering::Release);
        match failed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }
}

impl Drop for InFlight {
    /// Stop the thread after the extent it is writing: what is still
    /// queued belongs to a transaction that was never committed.
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        let t = self.thread.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = t.take() {
            let _ = t.join();
        }
    }
}

/// The writeback thread: take the oldest queued extent, checksum and write
/// it piece by piece, record the outcome.
fn run(shared: &Shared, volume: &Volume, spec: CsumSpec) {
    let mut s = shared.lock();
    loop {
        if s.stop {
            return;
        }
        let Some(logical) = s.queue.pop_front() else {
            s = shared.wait(s);
            continue;
        };
        s = write_queued(shared, s, logical, volume, spec);
    }
}

/// Write extent `logical`, just taken out of the queue, on this thread and
/// record the outcome; `s` is released meanwhile.
fn write_queued<'a>(
    shared: &'a Shared,
    s: MutexGuard<'a, State>,
    logical: u64,
    volume: &Volume,
    spec: CsumSpec,
) -> MutexGuard<'a, State> {
    let Some(e) = s.extents.get(&logical) else {
        return s;
    };
    let (data, at, len, want) = (Arc::clone(&e.data), e.at, e.len, e.sums);
    drop(s);
    let outcome = write_extent(volume, spec, logical, &data[at..at + len], want).map_err(|e| {
        Error::Devices(format!(
            "background data write at logical {logical}: {}",
            chain(&e)
        ))
    });
    // Dropped first, so whoever finishes the extent can reuse the buffer.
    drop(data);
    let mut s = shared.lock();
    s.unwritten -= len as u64;
    if let Some(e) = s.extents.get_mut(&logical) {
        e.outcome = Some(outcome);
    }
    shared.changed.notify_all();
    s
}

fn write_extent(
    volume: &Volume,
    spec: CsumSpec,
    logical: u64,
    data: &[u8],
    want: bool,
) -> Result<Vec<u8>> {
    let mut sums = Vec::new();
    if want {
        sums.reserve(data.len().div_ceil(spec.sectorsize) * spec.csum_size);
    }
    // A long extent's pieces start their writeout at once and the one
    // before is waited for: a stream does not pile up in a cache that every
    // fsync's flush would then have to write, and is paced by the device.
    // (Short ones, many small files, are left to the cache.)
    let behind = data.len() >= PIECE;
    let mut before: Option<(u64, usize)> = None;
    for (i, piece) in data.chunks(PIECE).enumerate() {
        if want {
            spec.sums_into(piece, &mut sums);
        }
        let at = logical + (i * PIECE) as u64;
        volume.write(at, piece)?;
        if !behind {
            continue;
        }
        volume.write_behind(at, piece.len(), false)?;
        if let Some((b, n)) = before.replace((at, piece.len())) {
            volume.write_behind(b, n, true)?;
        }
    }
    if let Some((b, n)) = before {
        volume.write_behind(b, n, true)?;
    }
    Ok(sums)
}

/// An error and its causes on one line (an I/O error names only its device).
fn chain(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        msg.push_str(": ");
        msg.push_str(&c.to_string());
        cause = c.source();
    }
    msg
}

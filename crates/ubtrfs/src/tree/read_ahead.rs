//! Forward readahead of tree leaves: blocks a scan will want next are read
//! on a thread of its own while the scan works on the block it has.
//!
//! Only the cache is filled, and only where nothing is cached yet: a block
//! rewritten since its read began is not replaced by the old one. Every
//! use still checks a cached block against the pointer leading to it, and
//! one that does not match is read again from disk (the new block at a
//! rewritten address may have been evicted before the old one came in).

use super::node_cache::{AddrMap, NodeCache};
use crate::format::CsumType;
use crate::format::key::Key;
use crate::format::node::{Expect, Node};
use crate::volume::Volume;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

/// What the readahead thread reads from and fills.
pub(super) struct Target {
    pub volume: Arc<Volume>,
    pub cache: Arc<NodeCache>,
    pub dirty: Arc<RwLock<AddrMap<Arc<Node>>>>,
    pub super_generation: Arc<AtomicU64>,
    pub csum_type: CsumType,
    pub fsids: Arc<[[u8; 16]]>,
    pub nodesize: usize,
}

/// Blocks waiting to be read ahead, at most: a scan that outruns the
/// thread reads for itself, and what it left behind is not worth reading.
const QUEUE_MAX: usize = 64;

/// The readahead thread of one tree reader; stopped and joined on drop,
/// so the devices it holds are closed when the reader is.
pub(super) struct ReadAhead {
    tx: Mutex<Option<Sender<Expect>>>,
    /// Addresses queued and not yet read (so a block is queued once).
    queued: Arc<Mutex<HashSet<u64>>>,
    /// Blocks read ahead and not used yet: the first use of one moves the
    /// window on, so a scan that keeps finding its blocks read keeps
    /// having the next ones read.
    unused: Arc<Mutex<HashSet<u64>>>,
    /// How many `unused` holds (set under its lock): most lookups find it
    /// zero and take no lock.
    unused_len: Arc<AtomicUsize>,
    /// The last leaves read cold, or read ahead and used: a cold read of
    /// the leaf after one of them is a walk in key order.
    recent: Mutex<[ColdRead; RECENT]>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Start the thread. Without a thread (the system refuses one) asking
    /// does nothing.
    pub fn new(target: Target) -> Self {
        let (tx, rx) = channel();
        let queued = Arc::new(Mutex::new(HashSet::new()));
        let unused = Arc::new(Mutex::new(HashSet::new()));
        let unused_len = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let shared = Shared {
                queued: queued.clone(),
                unused: unused.clone(),
                unused_len: unused_len.clone(),
                stop: stop.clone(),
            };
            std::thread::Builder::new()
                .name("ubtrfs-readahead".into())
                .spawn(move || work(rx, target, shared))
                .ok()
        };
        ReadAhead {
            tx: Mutex::new(thread.is_some().then_some(tx)),
            queued,
            unused,
            unused_len,
            recent: Mutex::new([ColdRead::NONE; RECENT]),
            stop,
            thread,
        }
    }

    /// Whether blocks are queued and not read yet.
    pub fn busy(&self) -> bool {
        !self
            .queued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Note a leaf read cold: the one under pointer `slot` of `parent`.
    /// Returns whether it follows another leaf read cold: the slot before
    /// under the same parent or, for the first slot, the last slot of
    /// another parent whose keys all come before this one's (a walk
    /// crossing into the next parent). A lookup here and there reads one
    /// leaf; a walk in key order reads the next: only that is worth
    /// reading ahead for (on a disk that seeks, leaves read for nothing
    /// cost a seek each).
    pub fn cold_read(&self, parent: &Node, slot: usize) -> bool {
        self.walked(parent, slot)
    }

    /// Note that a leaf read ahead, under pointer `slot` of `parent`, is
    /// used for the first time: a walk reached it, and the cold read of
    /// the first leaf under the next parent follows it.
    pub fn used_ahead(&self, parent: &Node, slot: usize) {
        // Only a last slot can be followed by a cold read (the first slot
        // under the next parent): others would push slower walks' cold
        // reads out of the ring.
        if slot + 1 == parent.nritems() {
            self.walked(parent, slot);
        }
    }

    /// Remember a leaf a walk may have reached; whether it follows one
    /// remembered before.
    fn walked(&self, parent: &Node, slot: usize) -> bool {
        let here = ColdRead {
            parent: parent.header.bytenr,
            owner: parent.header.owner,
            slot,
            last: slot + 1 == parent.nritems(),
            key: parent.key(slot),
        };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let follows = recent.iter().any(|r| {
            if slot > 0 {
                r.parent == here.parent && r.slot.checked_add(1) == Some(slot)
            } else {
                r.last && r.owner == here.owner && r.parent != here.parent && r.key < here.key
            }
        });
        recent.rotate_right(1);
        recent[0] = here;
        follows
    }

    /// Whether `bytenr` was read ahead and is used now for the first time.
    pub fn first_use(&self, bytenr: u64) -> bool {
        if self.unused_len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut unused = self.unused.lock().unwrap_or_else(|e| e.into_inner());
        let first = unused.remove(&bytenr);
        self.unused_len.store(unused.len(), Ordering::Relaxed);
        first
    }

    /// Read these blocks soon (those already queued are skipped).
    pub fn ask(&self, blocks: impl Iterator<Item = Expect>) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else { return };
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        for e in blocks {
            if queued.len() >= QUEUE_MAX {
                return;
            }
            if queued.insert(e.bytenr) && tx.send(e).is_err() {
                // The thread is gone: nothing queued will be read.
                queued.clear();
                return;
            }
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's side of [`ReadAhead`].
struct Shared {
    queued: Arc<Mutex<HashSet<u64>>>,
    unused: Arc<Mutex<HashSet<u64>>>,
    unused_len: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

/// A leaf read cold or used first after being read ahead: under which
/// pointer of which parent.
#[derive(Clone, Copy)]
struct ColdRead {
    parent: u64,
    /// The tree (subvolumes' trees share the ring).
    owner: u64,
    slot: usize,
    /// The parent's last pointer.
    last: bool,
    /// The pointer's key (the leaf's first).
    key: Key,
}

impl ColdRead {
    const NONE: ColdRead = ColdRead {
        parent: u64::MAX,
        owner: 0,
        slot: usize::MAX,
        last: false,
        key: Key::new(0, 0, 0),
    };
}

/// Cold leaf reads remembered to tell walks in key order (walks interleave:
/// a directory's entries and its files' inodes, in each of several processes).
const RECENT: usize = 16;

/// Blocks remembered as read ahead and unused, at most (a scan that
/// stopped leaves them behind).
const UNUSED_MAX: usize = 256;

fn work(rx: Receiver<Expect>, t: Target, s: Shared) {
    while let Ok(e) = rx.recv() {
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        if read_one(&t, &e) {
            let mut unused = s.unused.lock().unwrap_or_else(|e| e.into_inner());
            if unused.len() >= UNUSED_MAX {
                unused.clear();
            }
            unused.insert(e.bytenr);
            s.unused_len.store(unused.len(), Ordering::Relaxed);
        }
        s.queued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&e.bytenr);
    }
}

/// Read and verify one block into the cache (whether it was put there);
/// any failure is left for the reader that needs the block to meet and
/// report.
fn read_one(t: &Target, e: &Expect) -> bool {
    let dirty = t
        .dirty
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&e.bytenr);
    if dirty || t.cache.get(e.bytenr).is_some() || !t.volume.copy_present(e.bytenr, 0) {
        return false;
    }
    let mut buf = vec![0u8; t.nodesize].into_boxed_slice();
    if t.volume.read_copy(e.bytenr, 0, &mut buf).is_err() {
        return false;
    }
    let generation = t.super_generation.load(Ordering::Relaxed);
    match Node::parse(buf, t.csum_type, &t.fsids, e, generation) {
        Ok(node) => t.cache.insert_if_absent(e.bytenr, Arc::new(node)),
        Err(_) => false,
    }
}

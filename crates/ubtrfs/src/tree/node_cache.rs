//! A bounded cache of verified tree blocks, by logical address.

use crate::format::node::Node;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

/// Hashes block addresses for the block maps: much cheaper than the
/// default SipHash on the hot read path. A crafted image could only make
/// lookups slower, never wrong.
#[derive(Clone, Copy, Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, x: u64) {
        // Addresses are multiples of the node size: fold the high bits of
        // the product into the low ones the table indexes by.
        let h = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

/// A map keyed by block address.
pub type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// Holds up to a fixed number of blocks; the oldest insert is evicted first.
pub struct NodeCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

struct Inner {
    map: AddrMap<Arc<Node>>,
    order: VecDeque<u64>,
}

impl NodeCache {
    /// A cache of at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        NodeCache {
            inner: Mutex::new(Inner {
                map: AddrMap::default(),
                order: VecDeque::new(),
            }),
            capacity: capacity.max(16),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the map inconsistent: recover it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached block at `bytenr`.
    pub fn get(&self, bytenr: u64) -> Option<Arc<Node>> {
        self.lock().map.get(&bytenr).cloned()
    }

    /// Cache `node` at `bytenr`.
    pub fn insert(&self, bytenr: u64, node: Arc<Node>) {
        let mut inner = self.lock();
        if inner.map.insert(bytenr, node).is_none() {
            inner.order.push_back(bytenr);
        }
        self.evict(&mut inner);
    }

    /// Drop the oldest blocks until at most `capacity` are held.
    fn evict(&self, inner: &mut Inner) {
        while inner.map.len() > self.capacity {
            match inner.order.pop_front() {
                Some(old) => {
                    inner.map.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Cache `node` at `bytenr` unless a block is cached there already:
    /// a block read ahead must not replace one put there since the read
    /// began (the address may have been rewritten meanwhile).
    /// Whether it was cached.
    pub fn insert_if_absent(&self, bytenr: u64, node: Arc<Node>) -> bool {
        let mut inner = self.lock();
        if inner.map.contains_key(&bytenr) {
            return false;
        }
        inner.map.insert(bytenr, node);
        inner.order.push_back(bytenr);
        self.evict(&mut inner);
        true
    }

    /// Whether a block is cached at `bytenr`.
    pub fn contains(&self, bytenr: u64) -> bool {
        self.lock().map.contains_key(&bytenr)
    }

    /// Forget the block at `bytenr` if it is still `node`.
    pub fn remove_if(&self, bytenr: u64, node: &Arc<Node>) {
        let mut inner = self.lock();
        if inner.map.get(&bytenr).is_some_and(|n| Arc::ptr_eq(n, node)) {
            inner.map.remove(&bytenr);
        }
    }

    /// Forget the block at `bytenr`.
    pub fn remove(&self, bytenr: u64) {
        // The address stays in the eviction queue; evicting it later is harmless.
        self.lock().map.remove(&bytenr);
    }

    /// Drop every cached block.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.map.clear();
        inner.order.clear();
    }
}

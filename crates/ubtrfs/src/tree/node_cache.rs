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
    /// Each block with the number of the insert that put it there.
    map: AddrMap<(Arc<Node>, u64)>,
    /// Inserts, oldest first: (address, insert number). An entry whose
    /// number is not its address's in `map` any more is stale (the block
    /// was removed or replaced since) and evicts nothing.
    order: VecDeque<(u64, u64)>,
    next: u64,
}

impl NodeCache {
    /// A cache of at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        NodeCache {
            inner: Mutex::new(Inner {
                map: AddrMap::default(),
                order: VecDeque::new(),
                next: 0,
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
        self.lock().map.get(&bytenr).map(|(n, _)| n.clone())
    }

    /// Whether a block is cached at `bytenr`.
    pub fn contains(&self, bytenr: u64) -> bool {
        self.lock().map.contains_key(&bytenr)
    }

    /// Cache `node` at `bytenr`.
    pub fn insert(&self, bytenr: u64, node: Arc<Node>) {
        let mut inner = self.lock();
        self.put(&mut inner, bytenr, node);
    }

    /// Cache `node` at `bytenr` unless a block is cached there already:
    /// a block read ahead must not replace one put there since the read
    /// began (the address may have been rewritten meanwhile). Whether it
    /// was cached.
    pub fn insert_if_absent(&self, bytenr: u64, node: Arc<Node>) -> bool {
        let mut inner = self.lock();
        if inner.map.contains_key(&bytenr) {
            return false;
        }
        self.put(&mut inner, bytenr, node);
        true
    }

    fn put(&self, inner: &mut Inner, bytenr: u64, node: Arc<Node>) {
        let seq = inner.next;
        inner.next += 1;
        inner.map.insert(bytenr, (node, seq));
        inner.order.push_back((bytenr, seq));
        while inner.map.len() > self.capacity {
            let Some((old, seq)) = inner.order.pop_front() else {
                break;
            };
            if inner.map.get(&old).is_some_and(|(_, s)| *s == seq) {
                inner.map.remove(&old);
            }
        }
        // Addresses removed and cached again (every block a commit rewrites
        // in place) leave stale entries behind: drop them before they
        // outnumber the blocks.
        if inner.order.len() > 2 * inner.map.len() + 64 {
            let Inner { map, order, .. } = inner;
            order.retain(|(b, seq)| map.get(b).is_some_and(|(_, s)| s == seq));
        }
    }

    /// Forget the block at `bytenr` if it is still `node`.
    pub fn remove_if(&self, bytenr: u64, node: &Arc<Node>) {
        let mut inner = self.lock();
        if inner
            .map
            .get(&bytenr)
            .is_some_and(|(n, _)| Arc::ptr_eq(n, node))
        {
            inner.map.remove(&bytenr);
        }
    }

    /// Forget the block at `bytenr`.
    pub fn remove(&self, bytenr: u64) {
        // Its entry in the eviction queue goes stale.
        self.lock().map.remove(&bytenr);
    }

    /// Drop every cached block.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.map.clear();
        inner.order.clear();
    }

    /// Entries in the eviction queue, stale ones included.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.lock().order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::node::{Body, Header};

    fn node(bytenr: u64) -> Arc<Node> {
        let header = Header {
            csum: [0; 32],
            fsid: [0; 16],
            bytenr,
            flags: 0,
            chunk_tree_uuid: [0; 16],
            generation: 1,
            owner: 5,
            nritems: 0,
            level: 0,
        };
        Arc::new(Node::build(&header, &Body::Leaf(Vec::new()), 4096).unwrap())
    }

    #[test]
    fn blocks_removed_and_cached_again_neither_grow_the_queue_nor_evict_early() {
        let cache = NodeCache::new(16);
        for b in 0..16u64 {
            cache.insert(b * 4096, node(b * 4096));
        }
        // A commit's rewrites: the same addresses removed and cached again,
        // many times over. The queue stays bounded.
        for _ in 0..1000 {
            for b in 0..8u64 {
                cache.remove(b * 4096);
                cache.insert(b * 4096, node(b * 4096));
            }
        }
        assert!(
            cache.queued() <= 2 * 16 + 64 + 1,
            "{} queued",
            cache.queued()
        );
        for b in 0..16u64 {
            assert!(cache.contains(b * 4096), "block {b} lost");
        }
        // Block 0 was cached again after 8..16: those go first, not it (its
        // first insert's stale entry evicts nothing).
        for b in 16..24u64 {
            cache.insert(b * 4096, node(b * 4096));
        }
        for b in 0..8u64 {
            assert!(cache.contains(b * 4096), "block {b} evicted early");
        }
        for b in 8..16u64 {
            assert!(!cache.contains(b * 4096), "block {b} outlived newer ones");
        }
    }
}

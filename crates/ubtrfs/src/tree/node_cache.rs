//! A bounded cache of verified tree blocks, by logical address.

use crate::format::node::Node;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Holds up to a fixed number of blocks; the oldest insert is evicted first.
pub struct NodeCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

struct Inner {
    map: HashMap<u64, Arc<Node>>,
    order: VecDeque<u64>,
}

impl NodeCache {
    /// A cache of at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        NodeCache {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
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
        while inner.map.len() > self.capacity {
            match inner.order.pop_front() {
                Some(old) => {
                    inner.map.remove(&old);
                }
                None => break,
            }
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

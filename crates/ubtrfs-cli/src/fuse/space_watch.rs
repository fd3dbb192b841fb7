//! Opens for writing bypass the page cache while the filesystem is nearly
//! full, so that a write that does not fit gets `ENOSPC` from write(2), as
//! on kernel btrfs.
//!
//! Under the writeback cache a write(2) only dirties the kernel's pages;
//! the mount sees the data at writeback, too late to refuse it to the
//! writer (the error comes back from fsync or close, which many programs
//! never look at, and the file keeps a hole where the data was to go).
//! The kernel holds at most its dirty limit for this mount in those pages
//! (`/sys/class/bdi/MAJ:MIN/max_bytes`, which it derives from the memory
//! and `vm.dirty_*`). While more data space than that is free, cached
//! writes fit; below it, a new write-only open gets `FOPEN_DIRECT_IO`, so
//! each write(2) reaches the mount and is answered with its outcome. The
//! margin is at most a quarter of the filesystem, so that on a machine
//! with much memory a small filesystem is not "nearly full" from the
//! start. Files opened before, or for reading too, keep their cache.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;
use ubtrfs::fs::Filesystem;

/// The margin when the kernel's dirty limit cannot be read.
const DEFAULT_MARGIN: u64 = 64 << 20;
/// Added to the kernel's limit: its throttling lets writers overshoot a
/// little.
const SLACK: u64 = 8 << 20;
/// How long a free-space figure is used before it is read again, in
/// nanoseconds (reading it takes the writer's lock, if free).
const RECHECK_NS: u64 = 10_000_000;
/// How old a figure may grow while the writer stays busy before an open
/// waits for it.
const STALE_NS: u64 = 100_000_000;

/// Whether data space is tight, read now and then.
pub(super) struct SpaceWatch {
    /// Free data space below which opens for writing bypass the cache.
    margin: AtomicU64,
    started: Instant,
    /// When the figure was last read (ns after `started`, plus one; 0:
    /// never).
    checked: AtomicU64,
    tight: AtomicBool,
}

impl Default for SpaceWatch {
    fn default() -> Self {
        SpaceWatch {
            margin: AtomicU64::new(DEFAULT_MARGIN),
            started: Instant::now(),
            checked: AtomicU64::new(0),
            tight: AtomicBool::new(false),
        }
    }
}

impl SpaceWatch {
    /// Take the kernel's dirty limit for the mount's device `dev`, once
    /// mounted.
    pub fn learn_dirty_limit(&self, dev: (u32, u32)) {
        let path = format!("/sys/class/bdi/{}:{}/max_bytes", dev.0, dev.1);
        let limit = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        match limit {
            Some(bytes) => self.margin.store(bytes + SLACK, Ordering::Relaxed),
            None => tracing::debug!("{path} unreadable: free-space margin {DEFAULT_MARGIN}"),
        }
    }

    /// The free data space below which opens bypass the cache.
    pub fn margin(&self) -> u64 {
        self.margin.load(Ordering::Relaxed)
    }

    /// Whether a new open for writing should bypass the page cache: the
    /// free data space is below the margin. The figure is read again when
    /// [`RECHECK_NS`] old if the writer is free (a commit holds it), and
    /// waited for once [`STALE_NS`] old.
    pub fn tight(&self, fs: &Filesystem) -> bool {
        let now = self.started.elapsed().as_nanos() as u64 + 1;
        let last = self.checked.load(Ordering::Relaxed);
        let age = now.saturating_sub(last);
        if last == 0 || age >= RECHECK_NS {
            let free = match fs.data_free_if_idle() {
                Some(free) => Some(free),
                None if last == 0 || age >= STALE_NS => Some(fs.statfs().free_bytes),
                None => None,
            };
            if let Some(free) = free {
                // At most a quarter of the filesystem (see the module).
                let margin = self.margin().min(fs.total_bytes() / 4);
                self.tight.store(free < margin, Ordering::Relaxed);
                self.checked.store(now, Ordering::Relaxed);
            }
        }
        self.tight.load(Ordering::Relaxed)
    }
}

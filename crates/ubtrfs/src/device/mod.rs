//! The device layer: a block device is anything that reads and writes bytes
//! at offsets, flushes its cache, and can write with FUA.

mod file;
mod memory;
pub mod recording;
mod seed;

pub use file::FileDevice;
pub use memory::MemDevice;
pub use recording::RecordingDevice;
pub use seed::SeedDevice;

use crate::Result;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A block device: a regular file or a block-device node.
pub trait Device: Send + Sync {
    /// The path the device was opened from, for messages.
    fn path(&self) -> &Path;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Read the size again (an image file grown or shrunk since it was
    /// opened, before a resize) and return it.
    fn refresh_size(&self) -> Result<u64> {
        Ok(self.size())
    }
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Write all of `buf` at `offset` (volatile until [`Device::flush`]).
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;
    /// Write `buf` at `offset` and make it durable before returning (FUA).
    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<()>;
    /// I/O counters of this device.
    fn counters(&self) -> &Counters;
    /// Start writing out what a cache between us and the device holds of
    /// `len` bytes at `offset` (the page cache, for a file); with `wait`,
    /// wait until it is written. Pacing, not durability: only
    /// [`Device::flush`] makes writes durable.
    fn write_behind(&self, offset: u64, len: u64, wait: bool) -> Result<()> {
        let _ = (offset, len, wait);
        Ok(())
    }
    /// Tell the device that `len` bytes at `offset` hold nothing anyone
    /// will read (TRIM): a file gets a hole there, a block device a
    /// discard. Returns whether the device took it; one that cannot
    /// says false and keeps the bytes.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        let _ = (offset, len);
        Ok(false)
    }
}

/// Counts of the I/O a device has done, so tests can assert them.
#[derive(Debug, Default)]
pub struct Counters {
    /// Read calls.
    pub reads: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Plain write calls.
    pub writes: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// Cache flushes.
    pub flushes: AtomicU64,
    /// FUA writes.
    pub fua_writes: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value of a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

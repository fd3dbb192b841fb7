//! A device that records every write, flush and FUA write in order: the
//! user-space twin of dm-log-writes, for crash tests that replay every
//! prefix of what reached the disk.

use super::{Counters, Device};
use crate::Result;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One operation as the device saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A write that is volatile until the next flush.
    Write { offset: u64, data: Vec<u8> },
    /// A cache flush: every earlier write is durable.
    Flush,
    /// A write that is durable when it completes.
    Fua { offset: u64, data: Vec<u8> },
}

/// Passes everything to an inner device and logs it.
pub struct RecordingDevice {
    inner: Arc<dyn Device>,
    log: Mutex<Vec<Op>>,
}

impl RecordingDevice {
    /// Record the operations on `inner`.
    pub fn new(inner: Arc<dyn Device>) -> Self {
        RecordingDevice {
            inner,
            log: Mutex::new(Vec::new()),
        }
    }

    /// The operations so far.
    pub fn log(&self) -> Vec<Op> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn push(&self, op: Op) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(op);
    }
}

/// Where a power cut may leave a device that did `ops`, with every write
/// before a flush or a FUA write on it: the lengths of the prefixes of
/// `ops` that end with a flush or a FUA write, and all of `ops`.
pub fn cut_points(ops: &[Op]) -> Vec<usize> {
    ops.iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, Op::Flush | Op::Fua { .. }))
        .map(|(i, _)| i + 1)
        .chain([ops.len()])
        .collect()
}

/// Apply `ops` to the image `base` (writes, FUA writes; flushes do nothing).
pub fn replay(base: &mut [u8], ops: &[Op]) {
    for op in ops {
        match op {
            Op::Write { offset, data } | Op::Fua { offset, data } => {
                let o = *offset as usize;
                base[o..o + data.len()].copy_from_slice(data);
            }
            Op::Flush => {}
        }
    }
}

impl Device for RecordingDevice {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn refresh_size(&self) -> Result<u64> {
        self.inner.refresh_size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.inner.write_at(offset, buf)?;
        self.push(Op::Write {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()?;
        self.push(Op::Flush);
        Ok(())
    }

    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.inner.write_fua(offset, buf)?;
        self.push(Op::Fua {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn counters(&self) -> &Counters {
        self.inner.counters()
    }

    // Not recorded: a discarded range may read back as anything, so a
    // replay that keeps the old bytes is one of the possible outcomes.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        self.inner.discard(offset, len)
    }
}

//! A seed device under a filesystem sprouted from it: read, never
//! written. The seed stays a filesystem of its own (and may seed others),
//! so every write, discard and flush aimed at it is refused here, below
//! every path that could reach it (commits, scrub's mending, trim).

use super::{Counters, Device};
use crate::{Error, Result};
use std::path::Path;
use std::sync::Arc;

/// `inner`, read-only.
pub struct SeedDevice {
    inner: Arc<dyn Device>,
}

impl SeedDevice {
    /// Wrap `inner`, a seed device.
    pub fn new(inner: Arc<dyn Device>) -> Self {
        SeedDevice { inner }
    }

    fn refuse(&self) -> Error {
        Error::ReadOnly(format!(
            "{} is a seed device: it is only read",
            self.inner.path().display()
        ))
    }
}

impl Device for SeedDevice {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, _offset: u64, _buf: &[u8]) -> Result<()> {
        Err(self.refuse())
    }
    // Nothing written, nothing to make durable.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn write_fua(&self, _offset: u64, _buf: &[u8]) -> Result<()> {
        Err(self.refuse())
    }
    fn counters(&self) -> &Counters {
        self.inner.counters()
    }
    fn discard(&self, _offset: u64, _len: u64) -> Result<bool> {
        Err(self.refuse())
    }
}

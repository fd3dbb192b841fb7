//! A device held in memory: for tests, fuzzing and image building.

use super::{Counters, Device};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Bytes in memory, behaving like a disk whose cache never loses anything.
#[derive(Debug)]
pub struct MemDevice {
    name: PathBuf,
    data: Mutex<Vec<u8>>,
    counters: Counters,
    /// The ranges asked to be written behind, as (offset, length).
    behind: Mutex<Vec<(u64, u64)>>,
}

impl MemDevice {
    /// A device holding `data`; `name` appears in messages.
    pub fn new(name: impl Into<PathBuf>, data: Vec<u8>) -> Self {
        MemDevice {
            name: name.into(),
            data: Mutex::new(data),
            counters: Counters::default(),
            behind: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// The ranges [`Device::write_behind`] was asked for so far, as
    /// (offset, length); taken out.
    pub fn take_written_behind(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut *self.behind.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Device for MemDevice {
    fn path(&self) -> &Path {
        &self.name
    }

    fn size(&self) -> u64 {
        self.lock().len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let data = self.lock();
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= data.len() as u64);
        let Some(end) = end else {
            return Err(Error::ShortRead {
                path: self.name.clone(),
                offset,
                len: buf.len(),
                size: data.len() as u64,
            });
        };
        buf.copy_from_slice(&data[offset as usize..end as usize]);
        Counters::add(&self.counters.reads, 1);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut data = self.lock();
        // An offset from damaged metadata may be anywhere up to 2^64.
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= data.len() as u64);
        let Some(end) = end else {
            return Err(Error::NoSpace(format!(
                "{}: write of {} bytes at {offset} past the end of the device",
                self.name.display(),
                buf.len()
            )));
        };
        data[offset as usize..end as usize].copy_from_slice(buf);
        Counters::add(&self.counters.writes, 1);
        Counters::add(&self.counters.write_bytes, buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Counters::add(&self.counters.flushes, 1);
        Ok(())
    }

    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_at(offset, buf)?;
        Counters::add(&self.counters.fua_writes, 1);
        Ok(())
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn write_behind(&self, offset: u64, len: u64, _wait: bool) -> Result<()> {
        self.behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((offset, len));
        Ok(())
    }

    /// Zeroes the range, as a thinly provisioned device reads it back.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        let mut data = self.lock();
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= data.len() as u64)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: discard of {len} bytes at {offset} past the end",
                    self.name.display()
                ))
            })?;
        data[offset as usize..end as usize].fill(0);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_end_are_errors() {
        let d = MemDevice::new("m", vec![0; 4096]);
        assert!(d.write_at(4090, &[1; 6]).is_ok());
        assert!(matches!(d.write_at(4091, &[1; 6]), Err(Error::NoSpace(_))));
        assert!(matches!(
            d.write_at(u64::MAX - 1, &[1; 4]),
            Err(Error::NoSpace(_))
        ));
        assert_eq!(d.snapshot()[4090..], [1; 6]);
    }
}

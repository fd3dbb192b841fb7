//! A device backed by a regular file or a block-device node.

use super::{Counters, Device};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

/// `BLKDISCARD`, `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// How long opening waits for another holder's lock to go away.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// A regular file or block device opened with `pread`/`pwrite`.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    /// Read at open, and again by [`Device::refresh_size`].
    size: std::sync::atomic::AtomicU64,
    counters: Counters,
}

impl FileDevice {
    /// A write must stay inside the device: past the end of a regular
    /// file it would silently grow the image.
    fn check_write(&self, offset: u64, len: usize) -> Result<()> {
        let size = self.size();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(Error::WritePastEnd {
                path: self.path.clone(),
                offset,
                len,
                size,
            });
        }
        Ok(())
    }

    /// Open `path` read-only.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path.as_ref(), false)
    }

    /// Open `path` for reading and writing.
    pub fn open_read_write(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, write: bool) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.read(true).write(write);
        let is_block = std::fs::metadata(path)
            .map_err(io)?
            .file_type()
            .is_block_device();
        if write && is_block {
            // The kernel refuses O_EXCL on a block device it has mounted.
            use std::os::unix::fs::OpenOptionsExt;
            opts.custom_flags(libc::O_EXCL);
        }
        let file = opts.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                Error::Devices(format!("{}: device is busy (mounted?)", path.display()))
            } else {
                io(e)
            }
        })?;
        // One writer or many readers per device among ubtrfs processes.
        let lock = if write { libc::LOCK_EX } else { libc::LOCK_SH };
        use std::os::fd::AsRawFd;
        // A lock just released can linger for a moment: a child forked by
        // another thread of the releasing process holds a copy of the
        // descriptor until its exec closes it. So wait briefly before
        // calling the device busy.
        let mut waited = std::time::Duration::ZERO;
        loop {
            // SAFETY: flock on a file descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                if waited < LOCK_WAIT {
                    std::thread::sleep(LOCK_POLL);
                    waited += LOCK_POLL;
                    continue;
                }
                return Err(Error::Devices(format!(
                    "{} is already in use by another ubtrfs process{}",
                    path.display(),
                    if write { "" } else { " that writes to it" }
                )));
            }
            return Err(io(err));
        }
        let size = measure(&file, path)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size: size.into(),
            counters: Counters::default(),
        })
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// The size of `file`, a block device or a regular file.
fn measure(file: &File, path: &Path) -> Result<u64> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = file.metadata().map_err(io)?;
    if meta.file_type().is_block_device() {
        block_device_size(file).map_err(io)
    } else if meta.is_file() {
        Ok(meta.len())
    } else {
        Err(Error::Devices(format!(
            "{}: not a regular file or block device",
            path.display()
        )))
    }
}

fn block_device_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    // Seeking to the end of a block device reports its size without an ioctl.
    let mut f = file;
    let size = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(size)
}

impl Device for FileDevice {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn refresh_size(&self) -> Result<u64> {
        let size = measure(&self.file, &self.path)?;
        self.size.store(size, std::sync::atomic::Ordering::Relaxed);
        Ok(size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.size())
        {
            return Err(Error::ShortRead {
                path: self.path.clone(),
                offset,
                len: buf.len(),
                size: self.size(),
            });
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io(e))?;
        Counters::add(&self.counters.reads, 1);
        Counters::add(&self.counters.read_bytes, buf.len() as u64);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.check_write(offset, buf.len())?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io(e))?;
        Counters::add(&self.counters.writes, 1);
        Counters::add(&self.counters.write_bytes, buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| self.io(e))?;
        Counters::add(&self.counters.flushes, 1);
        Ok(())
    }

    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<()> {
        // A file has no FUA: a write followed by fdatasync gives the same guarantee.
        self.check_write(offset, buf.len())?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io(e))?;
        self.file.sync_data().map_err(|e| self.io(e))?;
        Counters::add(&self.counters.fua_writes, 1);
        Counters::add(&self.counters.write_bytes, buf.len() as u64);
        Ok(())
    }

    fn write_behind(&self, offset: u64, len: u64, wait: bool) -> Result<()> {
        use std::os::fd::AsRawFd;
        let flags = if wait {
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER
        } else {
            libc::SYNC_FILE_RANGE_WRITE
        };
        // SAFETY: a plain system call on a descriptor we own; no memory is passed.
        let r = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), offset as i64, len as i64, flags)
        };
        if r != 0 {
            return Err(self.io(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        use std::os::fd::AsRawFd;
        if offset.checked_add(len).is_none_or(|end| end > self.size()) {
            return Err(Error::Invalid(format!(
                "{}: discard of {len} bytes at {offset} past the end",
                self.path.display()
            )));
        }
        let fd = self.file.as_raw_fd();
        let is_block = self
            .file
            .metadata()
            .map_err(|e| self.io(e))?
            .file_type()
            .is_block_device();
        let r = if is_block {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s from the pointer given.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: a plain system call on a descriptor we own.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as i64,
                    len as i64,
                )
            }
        };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => Ok(false),
            _ => Err(self.io(e)),
        }
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that would reach past the end of an image is refused by
    /// name (a chunk placed past the end of a truncated image), and the
    /// image does not grow; writes inside it go through.
    #[test]
    fn writes_past_the_end_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::File::create(&path).unwrap().set_len(8192).unwrap();
        let dev = FileDevice::open_read_write(&path).unwrap();
        dev.write_at(4096, &[1; 4096]).unwrap();
        for (at, len) in [(8000u64, 1000usize), (8192, 1), (u64::MAX, 1)] {
            let e = dev.write_at(at, &vec![2; len]).unwrap_err();
            assert!(
                matches!(e, Error::WritePastEnd { offset, size: 8192, .. } if offset == at),
                "{e:?}"
            );
            assert!(
                e.to_string().contains("truncated, or the wrong device"),
                "{e}"
            );
            assert!(dev.write_fua(at, &vec![2; len]).is_err());
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192);
    }
}

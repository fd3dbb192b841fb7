//! `copy_file_range`: extents are shared (a reflink, through
//! [`ubtrfs::fs::Filesystem::clone_range`]) where btrfs's clone rules
//! allow it, and bytes are copied otherwise (and for no-COW files).
//!
//! A request may be answered short, as `copy_file_range(2)` allows; the
//! caller asks again for the rest. That keeps the shared part whole: an
//! unaligned head is copied up to the next sector boundary (when both
//! offsets are equally misaligned), then the next request shares the
//! aligned rest, and a tail shorter than a sector is copied on its own.
//! Before the request the kernel has written back both files' dirty pages
//! in the ranges; after it, it drops the destination's cached pages there
//! and takes the new size.
//!
//! The `FICLONE`/`FICLONERANGE` ioctls never get here: the kernel answers
//! them itself (`EOPNOTSUPP`), since FUSE has no request for them.

use super::control::Counter;
use super::{FuseFs, errno};
use fuser::{Errno, INodeNo};
use ubtrfs::format::consts::INODE_NODATASUM;
use ubtrfs::fs::{Filesystem, InodeId};

/// One `copy_file_range` request.
pub(super) struct Copy {
    pub src: INodeNo,
    pub src_off: u64,
    pub dst: INodeNo,
    pub dst_off: u64,
    pub len: u64,
}

/// Most bytes one request copies when it cannot share extents: the lock
/// is not held for long.
const MAX_BYTE_COPY: u64 = 8 << 20;
/// Bytes read and written at a time when copying.
const COPY_CHUNK: u64 = 1 << 20;

impl FuseFs {
    /// Share or copy; returns the bytes done (0 at the source's end).
    pub(super) fn do_copy_file_range(&self, c: Copy) -> Result<u32, Errno> {
        let (src, dst) = (self.inode_of(c.src), self.inode_of(c.dst));
        let ss = self.sectorsize;
        let (done, shared) = self.served.write(|fs| {
            let s = fs.stat(src).map_err(errno)?;
            let d = fs.stat(dst).map_err(errno)?;
            if c.src_off >= s.size || c.len == 0 {
                return Ok((0, false));
            }
            // The reply holds 32 bits.
            let len = c
                .len
                .min(s.size - c.src_off)
                .min(u64::from(u32::MAX) / ss * ss);
            // Files that disagree on checksums cannot share extents.
            let same_sums = (s.flags ^ d.flags) & INODE_NODATASUM == 0;
            let share = if same_sums {
                shareable(&c, len, s.size, d.size, ss)
            } else {
                0
            };
            // The destination's times are the kernel's (see `keeping_times`).
            self.keeping_times(fs, dst, || {
                if share > 0 {
                    fs.clone_range(src, c.src_off, dst, c.dst_off, share)
                        .map_err(errno)?;
                    return Ok((share, true));
                }
                let misaligned = c.src_off % ss;
                let n = if misaligned == c.dst_off % ss && misaligned != 0 {
                    // Up to the boundary; the rest can then be shared.
                    len.min(ss - misaligned)
                } else {
                    len.min(MAX_BYTE_COPY)
                };
                copy_bytes(fs, src, c.src_off, dst, c.dst_off, n)?;
                Ok((n, false))
            })
        })?;
        if shared {
            self.stats.count(Counter::Reflinked);
        }
        if done > 0 {
            self.served.note_changed(c.dst);
        }
        u32::try_from(done).map_err(|_| Errno::EOVERFLOW)
    }
}

/// How much of the `len` bytes of `c` can be shared from the start (0 if
/// none): both offsets sector aligned, and a whole number of sectors,
/// except that a range ending at the source's end of file may end with a
/// partial sector if it does not land before the destination's end.
fn shareable(c: &Copy, len: u64, src_size: u64, dst_size: u64, ss: u64) -> u64 {
    if !c.src_off.is_multiple_of(ss) || !c.dst_off.is_multiple_of(ss) {
        return 0;
    }
    if len.is_multiple_of(ss) || (c.src_off + len == src_size && c.dst_off + len >= dst_size) {
        return len;
    }
    len / ss * ss
}

/// Copy `n` bytes through the library (the source's end was checked).
fn copy_bytes(
    fs: &Filesystem,
    src: InodeId,
    src_off: u64,
    dst: InodeId,
    dst_off: u64,
    n: u64,
) -> Result<(), Errno> {
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(COPY_CHUNK) as usize;
        let data = fs.read(src, src_off + done, chunk).map_err(errno)?;
        if data.is_empty() {
            return Err(Errno::EIO);
        }
        fs.write(dst, dst_off + done, &data).map_err(errno)?;
        done += data.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(src_off: u64, dst_off: u64) -> Copy {
        Copy {
            src: INodeNo(2),
            src_off,
            dst: INodeNo(3),
            dst_off,
            len: 0,
        }
    }

    #[test]
    fn what_is_shared() {
        let ss = 4096;
        // Aligned, whole sectors.
        assert_eq!(shareable(&copy(0, 8192), 65536, 1 << 20, 0, ss), 65536);
        // Unaligned offsets: nothing.
        assert_eq!(shareable(&copy(100, 8192), 65536, 1 << 20, 0, ss), 0);
        assert_eq!(shareable(&copy(0, 100), 65536, 1 << 20, 0, ss), 0);
        // A partial last sector at the source's end, past the destination's.
        assert_eq!(shareable(&copy(4096, 0), 5000, 9096, 0, ss), 5000);
        assert_eq!(shareable(&copy(4096, 0), 5000, 9096, 5000, ss), 5000);
        // Landing before the destination's end: the whole sectors only.
        assert_eq!(shareable(&copy(4096, 0), 5000, 9096, 9000, ss), 4096);
        // Not at the source's end either.
        assert_eq!(shareable(&copy(0, 0), 5000, 100_000, 0, ss), 4096);
        assert_eq!(shareable(&copy(0, 0), 100, 100_000, 0, ss), 0);
    }
}

//! What the mount tells about itself: counters of the requests it served
//! and who serves it, read with an ioctl on any file or directory of the
//! mount ([`UBTRFS_IOC_SERVER_INFO`]). `ubtrfs umount` uses it to find the
//! process to wait for; tests use the counters to see how the kernel talks
//! to the mount (how big its writes are, whether `ls -l` costs lookups).

use std::sync::atomic::{AtomicU64, Ordering};

/// `_IOR('u', 0xe0, [u64; INFO_WORDS])`: fills [`INFO_WORDS`] little-endian
/// `u64`s, indexed by the `INFO_*` constants. The kernel passes it to the
/// mount (a restricted FUSE ioctl: its size is in the number).
pub const UBTRFS_IOC_SERVER_INFO: u32 =
    (2 << 30) | (((INFO_WORDS * 8) as u32) << 16) | ((b'u' as u32) << 8) | 0xe0;

/// Words of the reply.
pub const INFO_WORDS: usize = 16;
/// Word 0: this magic number, so a caller knows the mount is ubtrfs.
pub const INFO_MAGIC: usize = 0;
/// Word 1: the id of the process serving the mount.
pub const INFO_PID: usize = 1;
/// Word 2: bit 0, the kernel keeps a writeback cache; bit 1, it leaves
/// killing set-user-ID bits to the mount (`FUSE_HANDLE_KILLPRIV_V2`);
/// bit 2, the mount is read-write; bit 3, the kernel enforces POSIX ACLs
/// (`FUSE_POSIX_ACL`).
pub const INFO_FLAGS: usize = 2;
/// The rest: request counters, see [`Counter`].
const FIRST_COUNTER: usize = 3;

/// The magic of word [`INFO_MAGIC`]: "ubtrfs" and a format number.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ubtrfs\x00\x01");

/// [`INFO_FLAGS`] bits.
pub const FLAG_WRITEBACK_CACHE: u64 = 1;
pub const FLAG_KILLPRIV_V2: u64 = 2;
pub const FLAG_READ_WRITE: u64 = 4;
pub const FLAG_POSIX_ACL: u64 = 8;
/// Requests come over io_uring.
pub const FLAG_URING: u64 = 16;

/// Request counters, each a word of the reply (from word 3 on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    Lookup,
    Getattr,
    Readdir,
    Readdirplus,
    Read,
    Write,
    /// Bytes of the largest write request.
    MaxWrite,
    /// Bytes of the largest read request.
    MaxRead,
    Getxattr,
    CopyFileRange,
    /// `copy_file_range` requests answered by sharing extents.
    Reflinked,
    Setattr,
    /// ioctls other than this one.
    Ioctl,
}

const COUNTERS: usize = Counter::Ioctl as usize + 1;
const _: () = assert!(FIRST_COUNTER + COUNTERS <= INFO_WORDS);

/// The counters of one mount.
#[derive(Debug, Default)]
pub struct Stats {
    words: [AtomicU64; COUNTERS],
}

impl Stats {
    /// Count one request.
    pub fn count(&self, c: Counter) {
        self.words[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Raise a maximum to `v`.
    pub fn max(&self, c: Counter, v: u64) {
        self.words[c as usize].fetch_max(v, Ordering::Relaxed);
    }

    /// The ioctl's reply.
    pub fn reply(&self, flags: u64) -> [u8; INFO_WORDS * 8] {
        let mut words = [0u64; INFO_WORDS];
        words[INFO_MAGIC] = MAGIC;
        words[INFO_PID] = u64::from(std::process::id());
        words[INFO_FLAGS] = flags;
        for (i, w) in self.words.iter().enumerate() {
            words[FIRST_COUNTER + i] = w.load(Ordering::Relaxed);
        }
        let mut out = [0u8; INFO_WORDS * 8];
        for (chunk, w) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// Word index of a counter in the reply.
#[cfg(test)]
fn word_of(c: Counter) -> usize {
    FIRST_COUNTER + c as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_layout() {
        assert_eq!(UBTRFS_IOC_SERVER_INFO, 0x8080_75e0);
        let s = Stats::default();
        s.count(Counter::Write);
        s.count(Counter::Write);
        s.max(Counter::MaxWrite, 4096);
        s.max(Counter::MaxWrite, 100);
        let r = s.reply(FLAG_READ_WRITE);
        let word = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(word(INFO_MAGIC), MAGIC);
        assert_eq!(word(INFO_PID), u64::from(std::process::id()));
        assert_eq!(word(INFO_FLAGS), FLAG_READ_WRITE);
        assert_eq!(word(word_of(Counter::Write)), 2);
        assert_eq!(word(word_of(Counter::MaxWrite)), 4096);
        assert_eq!(word(word_of(Counter::Lookup)), 0);
    }
}

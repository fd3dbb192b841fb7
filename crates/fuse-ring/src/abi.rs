//! The FUSE wire format: request headers and arguments, reply structures.
//!
//! Layouts are those of the kernel's FUSE protocol 7.4x, in host byte
//! order. Requests arrive split as the ring delivers them: the fixed
//! per-operation argument (`fuse_write_in`, ...) apart from the rest
//! (names, data), which [`crate::RingEntry::request`] hands out as
//! `arg` and `payload`.

use std::time::Duration;

/// Operation codes of the requests that can arrive over the ring.
#[allow(missing_docs)]
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// Size of `fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// Size of `fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// Size of `fuse_attr`.
pub const ATTR_LEN: usize = 88;
/// Size of `fuse_entry_out`.
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
/// Size of `fuse_attr_out`.
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
/// Size of `fuse_open_out`.
pub const OPEN_OUT_LEN: usize = 16;
/// Size of `fuse_statx_out` (its `fuse_statx` is laid out as `struct statx`).
pub const STATX_OUT_LEN: usize = 32 + 256;
/// `STATX_BASIC_STATS | STATX_BTIME`: what a statx reply fills in.
pub const STATX_MASK: u32 = 0x7ff | 0x800;

/// `fuse_in_header`: who asks what of which inode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InHeader {
    /// Length of the whole request as `/dev/fuse` would carry it.
    pub len: u32,
    /// One of [`opcode`].
    pub opcode: u32,
    /// The request's id; the reply must carry it back.
    pub unique: u64,
    /// The inode the request is about (FUSE's numbering).
    pub nodeid: u64,
    /// The caller's file-system user id.
    pub uid: u32,
    /// The caller's file-system group id.
    pub gid: u32,
    /// The caller's thread-group id.
    pub pid: u32,
    /// Bytes of extensions at the end of the arguments.
    pub total_extlen: u16,
}

impl InHeader {
    /// Reads the header at the start of `buf` (zeros where it is short).
    pub fn parse(buf: &[u8]) -> InHeader {
        let a = Args(buf);
        InHeader {
            len: a.u32(0),
            opcode: a.u32(4),
            unique: a.u64(8),
            nodeid: a.u64(16),
            uid: a.u32(24),
            gid: a.u32(28),
            pid: a.u32(32),
            total_extlen: a.u16(36),
        }
    }

    /// Writes it as `fuse_in_header` (for tests and tools).
    pub fn encode(&self) -> [u8; IN_HEADER_LEN] {
        let mut b = [0u8; IN_HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_ne_bytes());
        b[4..8].copy_from_slice(&self.opcode.to_ne_bytes());
        b[8..16].copy_from_slice(&self.unique.to_ne_bytes());
        b[16..24].copy_from_slice(&self.nodeid.to_ne_bytes());
        b[24..28].copy_from_slice(&self.uid.to_ne_bytes());
        b[28..32].copy_from_slice(&self.gid.to_ne_bytes());
        b[32..36].copy_from_slice(&self.pid.to_ne_bytes());
        b[36..38].copy_from_slice(&self.total_extlen.to_ne_bytes());
        b
    }
}

/// A fixed argument structure; fields past its end read as zero, as an
/// older kernel's shorter structure means.
#[derive(Clone, Copy, Debug)]
pub struct Args<'a>(pub &'a [u8]);

impl Args<'_> {
    fn bytes<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut b = [0u8; N];
        if let Some(s) = self.0.get(at..at + N) {
            b.copy_from_slice(s);
        }
        b
    }
    /// The `u16` at byte `at`.
    pub fn u16(&self, at: usize) -> u16 {
        u16::from_ne_bytes(self.bytes(at))
    }
    /// The `u32` at byte `at`.
    pub fn u32(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.bytes(at))
    }
    /// The `u64` at byte `at`.
    pub fn u64(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.bytes(at))
    }
    /// The `i64` at byte `at`.
    pub fn i64(&self, at: usize) -> i64 {
        i64::from_ne_bytes(self.bytes(at))
    }
}

/// Splits a NUL-terminated name off the front of `buf`: the name without
/// its NUL and what follows; `None` without a NUL.
pub fn split_name(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = buf.iter().position(|&b| b == 0)?;
    Some((&buf[..nul], &buf[nul + 1..]))
}

/// A time as FUSE carries it: seconds since the epoch and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Time {
    /// Seconds since 1970 (negative before).
    pub secs: i64,
    /// Nanoseconds, below 10^9.
    pub nanos: u32,
}

/// `fuse_attr`: what `stat(2)` shows of an inode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attr {
    /// Inode number (FUSE's).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks in use.
    pub blocks: u64,
    /// Last access.
    pub atime: Time,
    /// Last data change.
    pub mtime: Time,
    /// Last status change.
    pub ctime: Time,
    /// Creation (btrfs' otime); only a statx reply carries it.
    pub btime: Time,
    /// File type bits and permissions, as `st_mode`.
    pub mode: u32,
    /// Number of names.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device node.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
    /// `FUSE_ATTR_*` flags (submount, DAX): 0 for a plain filesystem.
    pub flags: u32,
}

/// Builds reply arguments in the wire layout.
#[derive(Default, Debug)]
pub struct Out(pub Vec<u8>);

impl Out {
    /// An empty reply body with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Out {
        Out(Vec::with_capacity(n))
    }
    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// Appends a `fuse_attr`.
    pub fn attr(&mut self, a: &Attr) -> &mut Self {
        self.u64(a.ino).u64(a.size).u64(a.blocks);
        self.u64(a.atime.secs as u64)
            .u64(a.mtime.secs as u64)
            .u64(a.ctime.secs as u64);
        self.u32(a.atime.nanos)
            .u32(a.mtime.nanos)
            .u32(a.ctime.nanos);
        self.u32(a.mode)
            .u32(a.nlink)
            .u32(a.uid)
            .u32(a.gid)
            .u32(a.rdev);
        self.u32(a.blksize).u32(a.flags)
    }
    /// Appends a `fuse_entry_out`: the name's inode and how long both the
    /// name and the attributes may be cached.
    pub fn entry(&mut self, nodeid: u64, generation: u64, ttl: Duration, a: &Attr) -> &mut Self {
        self.u64(nodeid).u64(generation);
        self.u64(ttl.as_secs()).u64(ttl.as_secs());
        self.u32(ttl.subsec_nanos()).u32(ttl.subsec_nanos());
        self.attr(a)
    }
    /// Appends a `fuse_attr_out`.
    pub fn attr_out(&mut self, ttl: Duration, a: &Attr) -> &mut Self {
        self.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0);
        self.attr(a)
    }
    /// Appends a `fuse_statx_out`: the attributes with the birth time.
    pub fn statx_out(&mut self, ttl: Duration, a: &Attr) -> &mut Self {
        self.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0);
        self.u64(0).u64(0);
        let start = self.0.len();
        self.u32(STATX_MASK).u32(a.blksize).u64(0);
        self.u32(a.nlink).u32(a.uid).u32(a.gid);
        self.u16(a.mode as u16).u16(0);
        self.u64(a.ino).u64(a.size).u64(a.blocks).u64(0);
        for t in [a.atime, a.btime, a.ctime, a.mtime] {
            self.u64(t.secs as u64).u32(t.nanos).u32(0);
        }
        // The device number as the kernel encodes it in `fuse_attr.rdev`.
        let major = (a.rdev & 0xfff00) >> 8;
        let minor = (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00);
        self.u32(major).u32(minor).u32(0).u32(0);
        self.0.resize(start + 256, 0);
        self
    }
    /// Appends a `fuse_open_out`.
    pub fn open(&mut self, fh: u64, open_flags: u32) -> &mut Self {
        self.u64(fh).u32(open_flags).u32(0)
    }
    /// Appends a `fuse_dirent` (name padded to 8 bytes); `false` and
    /// nothing appended when it would pass `limit` bytes in all.
    pub fn dirent(&mut self, ino: u64, off: u64, kind: u32, name: &[u8], limit: usize) -> bool {
        let len = 24 + name.len();
        let padded = len.next_multiple_of(8);
        if self.0.len() + padded > limit {
            return false;
        }
        self.u64(ino).u64(off).u32(name.len() as u32).u32(kind);
        self.0.extend_from_slice(name);
        self.0.resize(self.0.len() + padded - len, 0);
        true
    }
    /// Appends a `fuse_direntplus`: an entry as [`Out::entry`] and then a
    /// dirent; `false` and nothing appended past `limit`.
    pub fn direntplus(
        &mut self,
        entry: (u64, u64, Duration, &Attr),
        off: u64,
        kind: u32,
        name: &[u8],
        limit: usize,
    ) -> bool {
        let padded = (24 + name.len()).next_multiple_of(8);
        if self.0.len() + ENTRY_OUT_LEN + padded > limit {
            return false;
        }
        let (nodeid, generation, ttl, attr) = entry;
        self.entry(nodeid, generation, ttl, attr);
        self.dirent(attr.ino, off, kind, name, usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = InHeader {
            len: 57,
            opcode: opcode::LOOKUP,
            unique: 0x1122_3344_5566_7788,
            nodeid: 1,
            uid: 1000,
            gid: 100,
            pid: 4242,
            total_extlen: 0,
        };
        assert_eq!(InHeader::parse(&h.encode()), h);
        // A short buffer reads as zeros, not as a panic.
        assert_eq!(InHeader::parse(&[1, 0]), InHeader::default());
    }

    #[test]
    fn layouts_have_the_kernel_sizes() {
        let a = Attr::default();
        assert_eq!(Out::default().attr(&a).0.len(), ATTR_LEN);
        assert_eq!(
            Out::default().entry(1, 0, Duration::ZERO, &a).0.len(),
            ENTRY_OUT_LEN
        );
        assert_eq!(
            Out::default().attr_out(Duration::ZERO, &a).0.len(),
            ATTR_OUT_LEN
        );
        assert_eq!(Out::default().open(0, 0).0.len(), OPEN_OUT_LEN);
        assert_eq!(
            Out::default().statx_out(Duration::ZERO, &a).0.len(),
            STATX_OUT_LEN
        );
    }

    #[test]
    fn statx_fields_sit_where_struct_statx_has_them() {
        let a = Attr {
            ino: 7,
            size: 4097,
            btime: Time {
                secs: 1_700_000_000,
                nanos: 5,
            },
            mode: 0o100644,
            // major 8, minor 300, as `new_encode_dev` packs them
            rdev: (300 & 0xff) | (8 << 8) | ((300 & !0xff) << 12),
            ..Attr::default()
        };
        let o = Out::default()
            .statx_out(Duration::from_secs(2), &a)
            .0
            .clone();
        let sx = Args(&o[32..]);
        assert_eq!(Args(&o).u64(0), 2);
        assert_eq!(sx.u32(0), STATX_MASK);
        assert_eq!(sx.u16(28), 0o100644);
        assert_eq!(sx.u64(32), 7);
        assert_eq!(sx.u64(40), 4097);
        assert_eq!(sx.i64(80), 1_700_000_000);
        assert_eq!(sx.u32(88), 5);
        assert_eq!((sx.u32(128), sx.u32(132)), (8, 300));
    }

    #[test]
    fn dirents_are_padded_and_bounded() {
        let mut o = Out::default();
        assert!(o.dirent(5, 1, 8, b"abc", 4096));
        assert_eq!(o.0.len(), 32);
        assert_eq!(Args(&o.0).u64(0), 5);
        assert_eq!(Args(&o.0).u32(16), 3);
        assert_eq!(&o.0[24..27], b"abc");
        assert!(!o.dirent(6, 2, 8, b"defgh", 40));
        assert_eq!(o.0.len(), 32);
        let a = Attr {
            ino: 9,
            ..Attr::default()
        };
        assert!(o.direntplus((9, 0, Duration::from_secs(1), &a), 3, 8, b"x", 4096));
        assert_eq!(o.0.len(), 32 + ENTRY_OUT_LEN + 32);
        assert_eq!(Args(&o.0[32 + ENTRY_OUT_LEN..]).u64(0), 9);
    }

    #[test]
    fn names_split_at_nul() {
        assert_eq!(
            split_name(b"old\0new\0"),
            Some((&b"old"[..], &b"new\0"[..]))
        );
        assert_eq!(split_name(b"no-nul"), None);
    }
}

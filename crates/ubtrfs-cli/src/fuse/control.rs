//! What the mount tells about itself: counters of the requests it served
//! and who serves it, read with an ioctl on any file or directory of the
//! mount ([`UBTRFS_IOC_SERVER_INFO`]). `ubtrfs umount` uses it to find the
//! process to wait for; tests use the counters to see how the kernel talks
//! to the mount (how big its writes are, whether `ls -l` costs lookups).

use std::sync::atomic::{AtomicU64, Ordering};
use ubtrfs::format::Key;
use ubtrfs::fs::{DeviceUsage, SpaceInfo, Usage};
use ubtrfs::scrub::{ScrubCursor, ScrubPhase, ScrubReport};

/// `_IOR('u', 0xe0, [u64; INFO_WORDS])`: fills [`INFO_WORDS`] little-endian
/// `u64`s, indexed by the `INFO_*` constants. The kernel passes it to the
/// mount (a restricted FUSE ioctl: its size is in the number).
pub const UBTRFS_IOC_SERVER_INFO: u32 =
    (2 << 30) | (((INFO_WORDS * 8) as u32) << 16) | ((b'u' as u32) << 8) | 0xe0;

/// `_IOWR('u', 0xe1, [u8; LIST_SIZE])`: the subvolumes, as `ubtrfs
/// subvolume list` shows them. In: the id to list after (a `u64`, 0 from
/// the start). Out: a `u32` count, then per subvolume, in id order, as many
/// as fit: id, parent id, generation and flags (bit 0: read-only; bit 1:
/// the path was too long for the reply and is cut) as
/// `u64`s, the path's length as a `u32` and the path from the top level.
/// Ask again after the last id until the count is 0. Root only, as the
/// kernel's tree search is.
pub const UBTRFS_IOC_SUBVOL_LIST: u32 =
    (3 << 30) | ((LIST_SIZE as u32) << 16) | ((b'u' as u32) << 8) | 0xe1;
/// Size of the list ioctl's buffer.
pub const LIST_SIZE: usize = 8192;
/// Bytes of a listed subvolume before its path (four `u64`s, a `u32`).
pub const LISTED_HEADER: usize = 36;

/// One subvolume of [`UBTRFS_IOC_SUBVOL_LIST`]'s reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedSubvol {
    pub id: u64,
    pub parent: u64,
    pub generation: u64,
    pub readonly: bool,
    /// From the top level, without a leading '/'.
    pub path: Vec<u8>,
}

/// `_IOWR('u', 0xe2, [u8; SCRUB_SIZE])`: one step of a scrub
/// ([`ubtrfs::fs::Filesystem::scrub_step`]). In: flags (bit 0: mend bad
/// copies), then the cursor's phase (0 superblocks, 1 tree blocks, 2 data,
/// 3 done, 4 RAID5/6 parity) and key's objectid, type and offset, as `u64`s. Out: the
/// cursor moved on, in the same form; the bytes in use; the step's counts
/// in the order of [`ubtrfs::scrub::ScrubReport`]'s fields; then a `u32`
/// count of the places with no good copy and each as a `u32` length and
/// its text, as many as fit. Root only, as the kernel's scrub is.
pub const UBTRFS_IOC_SCRUB: u32 =
    (3 << 30) | ((SCRUB_SIZE as u32) << 16) | ((b'u' as u32) << 8) | 0xe2;
/// Size of the scrub ioctl's buffer.
pub const SCRUB_SIZE: usize = 4096;

fn phase_number(p: ScrubPhase) -> u64 {
    match p {
        ScrubPhase::Supers => 0,
        ScrubPhase::TreeBlocks => 1,
        ScrubPhase::Data => 2,
        ScrubPhase::Done => 3,
        ScrubPhase::Parity => 4,
    }
}

fn phase_of(n: u64) -> Option<ScrubPhase> {
    Some(match n {
        0 => ScrubPhase::Supers,
        1 => ScrubPhase::TreeBlocks,
        2 => ScrubPhase::Data,
        3 => ScrubPhase::Done,
        4 => ScrubPhase::Parity,
        _ => return None,
    })
}

fn words(buf: &[u8]) -> impl Fn(usize) -> Option<u64> + '_ {
    move |i: usize| {
        Some(u64::from_le_bytes(
            buf.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    }
}

fn cursor_words(c: &ScrubCursor) -> [u64; 4] {
    [
        phase_number(c.phase),
        c.next.objectid,
        u64::from(c.next.item_type),
        c.next.offset,
    ]
}

fn cursor_at(word: &dyn Fn(usize) -> Option<u64>, at: usize) -> Option<ScrubCursor> {
    Some(ScrubCursor {
        phase: phase_of(word(at)?)?,
        next: Key::new(
            word(at + 1)?,
            u8::try_from(word(at + 2)?).ok()?,
            word(at + 3)?,
        ),
    })
}

/// The request of one scrub step: whether to mend, and where to go on.
pub fn encode_scrub_request(repair: bool, cursor: &ScrubCursor) -> Vec<u8> {
    let mut out = vec![0u8; SCRUB_SIZE];
    for (i, w) in std::iter::once(u64::from(repair))
        .chain(cursor_words(cursor))
        .enumerate()
    {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Unpack [`encode_scrub_request`]; `None` if it makes no sense.
pub fn decode_scrub_request(buf: &[u8]) -> Option<(bool, ScrubCursor)> {
    let word = words(buf);
    let repair = match word(0)? {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some((repair, cursor_at(&word, 1)?))
}

/// The reply of one scrub step.
pub fn encode_scrub_reply(cursor: &ScrubCursor, in_use: u64, r: &ScrubReport) -> Vec<u8> {
    let mut out = Vec::with_capacity(SCRUB_SIZE);
    let counts = [
        r.tree_blocks,
        r.tree_bytes,
        r.data_bytes,
        r.tree_errors,
        r.csum_errors,
        r.read_errors,
        r.missing_copies,
        r.super_errors,
        r.corrected,
        r.uncorrectable,
        r.parity_errors,
        r.parity_bytes,
    ];
    for w in cursor_words(cursor)
        .into_iter()
        .chain([in_use])
        .chain(counts)
    {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut n = 0u32;
    for at in &r.uncorrectable_at {
        if out.len() + 4 + at.len() > SCRUB_SIZE {
            break;
        }
        out.extend_from_slice(&(at.len() as u32).to_le_bytes());
        out.extend_from_slice(at.as_bytes());
        n += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
    out
}

/// Unpack [`encode_scrub_reply`]: the cursor, the bytes in use and the
/// step's report; `None` if it is cut short.
pub fn decode_scrub_reply(buf: &[u8]) -> Option<(ScrubCursor, u64, ScrubReport)> {
    let word = words(buf);
    let cursor = cursor_at(&word, 0)?;
    let c = |i: usize| word(5 + i);
    let mut r = ScrubReport {
        tree_blocks: c(0)?,
        tree_bytes: c(1)?,
        data_bytes: c(2)?,
        tree_errors: c(3)?,
        csum_errors: c(4)?,
        read_errors: c(5)?,
        missing_copies: c(6)?,
        super_errors: c(7)?,
        corrected: c(8)?,
        uncorrectable: c(9)?,
        parity_errors: c(10)?,
        parity_bytes: c(11)?,
        uncorrectable_at: Vec::new(),
    };
    let mut at = 17 * 8;
    let n = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?);
    at += 4;
    for _ in 0..n {
        let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?) as usize;
        at += 4;
        r.uncorrectable_at
            .push(String::from_utf8_lossy(buf.get(at..at + len)?).into_owned());
        at += len;
    }
    Some((cursor, word(4)?, r))
}

/// `_IOR('u', 0xe3, [u8; SPACE_SIZE])`: the space of each block group
/// type and profile, as `ubtrfs filesystem df` shows it: a `u32` count,
/// then flags, total and used bytes as `u64`s for each.
pub const UBTRFS_IOC_SPACE_INFO: u32 =
    (2 << 30) | ((SPACE_SIZE as u32) << 16) | ((b'u' as u32) << 8) | 0xe3;
/// Size of the space ioctl's buffer: room for 40 kinds.
pub const SPACE_SIZE: usize = 4 + 40 * 24;

/// Pack `spaces` (at most 40) into a reply.
pub fn encode_space(spaces: &[SpaceInfo]) -> Vec<u8> {
    let spaces = &spaces[..spaces.len().min(40)];
    let mut out = (spaces.len() as u32).to_le_bytes().to_vec();
    for s in spaces {
        for w in [s.flags, s.total, s.used] {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    out
}

/// Unpack [`encode_space`]; `None` if it is cut short.
pub fn decode_space(buf: &[u8]) -> Option<Vec<SpaceInfo>> {
    let n = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let word = |i: usize| {
        Some(u64::from_le_bytes(
            buf.get(4 + i * 8..12 + i * 8)?.try_into().ok()?,
        ))
    };
    (0..n.min(40))
        .map(|k| {
            Some(SpaceInfo {
                flags: word(3 * k)?,
                total: word(3 * k + 1)?,
                used: word(3 * k + 2)?,
            })
        })
        .collect()
}

/// `_IOR('u', 0xe5, u64)`: the default subvolume's id (anyone may ask).
pub const UBTRFS_IOC_DEFAULT_SUBVOL: u32 = (2 << 30) | (8 << 16) | ((b'u' as u32) << 8) | 0xe5;

/// `_IOR('u', 0xe4, [u8; USAGE_SIZE])`: what `ubtrfs filesystem usage`
/// shows: the spaces as [`encode_space`] packs them, statfs's available
/// bytes, then a `u32` count of devices, each with its id, size used,
/// size, flags (bit 0: present, bit 1: a seed), a `u32` count of (flags, bytes) pairs
/// of its chunks, those, and its path (`u32` length, bytes).
pub const UBTRFS_IOC_USAGE: u32 =
    (2 << 30) | ((USAGE_SIZE as u32) << 16) | ((b'u' as u32) << 8) | 0xe4;
/// Size of the usage ioctl's buffer.
pub const USAGE_SIZE: usize = 8192;

/// Pack `u` into a reply (as many devices as fit).
pub fn encode_usage(u: &Usage) -> Vec<u8> {
    let mut out = encode_space(&u.spaces);
    out.extend_from_slice(&u.statfs_free.to_le_bytes());
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut n = 0u32;
    for d in &u.devices {
        let mut rec = Vec::new();
        let present = u64::from(d.path.is_some()) | (u64::from(d.seed) << 1);
        for w in [d.devid, d.total_bytes, d.device_size, present] {
            rec.extend_from_slice(&w.to_le_bytes());
        }
        rec.extend_from_slice(&(d.allocated.len() as u32).to_le_bytes());
        for &(f, b) in &d.allocated {
            rec.extend_from_slice(&f.to_le_bytes());
            rec.extend_from_slice(&b.to_le_bytes());
        }
        use std::os::unix::ffi::OsStrExt;
        let path = d
            .path
            .as_deref()
            .map_or(&[][..], |p| p.as_os_str().as_bytes());
        let path = &path[..path.len().min(1024)];
        rec.extend_from_slice(&(path.len() as u32).to_le_bytes());
        rec.extend_from_slice(path);
        if out.len() + rec.len() > USAGE_SIZE {
            break;
        }
        out.extend_from_slice(&rec);
        n += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
    out
}

/// Unpack [`encode_usage`]; `None` if it is cut short.
pub fn decode_usage(buf: &[u8]) -> Option<Usage> {
    let spaces = decode_space(buf)?;
    let mut at = 4 + spaces.len() * 24;
    let u64_at = |at: usize| Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?));
    let statfs_free = u64_at(at)?;
    at += 8;
    let n = u32_at(at)?;
    at += 4;
    let mut devices = Vec::new();
    for _ in 0..n {
        let (devid, total_bytes, device_size, present) = (
            u64_at(at)?,
            u64_at(at + 8)?,
            u64_at(at + 16)?,
            u64_at(at + 24)?,
        );
        at += 32;
        let pairs = u32_at(at)? as usize;
        at += 4;
        let mut allocated = Vec::new();
        for _ in 0..pairs {
            allocated.push((u64_at(at)?, u64_at(at + 8)?));
            at += 16;
        }
        let len = u32_at(at)? as usize;
        at += 4;
        let path = buf.get(at..at + len)?;
        at += len;
        use std::os::unix::ffi::OsStrExt;
        devices.push(DeviceUsage {
            devid,
            path: (present & 1 != 0)
                .then(|| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(path))),
            total_bytes,
            device_size,
            allocated,
            seed: present & 2 != 0,
        });
    }
    Some(Usage {
        spaces,
        devices,
        statfs_free,
    })
}

/// Pack `subvols` (in id order, all above the asked id) into a reply.
pub fn encode_list(subvols: &[ListedSubvol]) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    let mut n = 0u32;
    for s in subvols {
        let mut path = &s.path[..];
        let mut flags = u64::from(s.readonly);
        if out.len() + LISTED_HEADER + path.len() > LIST_SIZE {
            if n > 0 {
                break;
            }
            // Alone and still too long: its path is cut (flag bit 1), so
            // the list goes on.
            path = &path[..LIST_SIZE - 4 - LISTED_HEADER];
            flags |= 2;
        }
        for w in [s.id, s.parent, s.generation, flags] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path);
        n += 1;
    }
    out[..4].copy_from_slice(&n.to_le_bytes());
    out
}

/// Unpack a reply of [`UBTRFS_IOC_SUBVOL_LIST`]; `None` if it is cut short.
pub fn decode_list(buf: &[u8]) -> Option<Vec<ListedSubvol>> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?));
    let n = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?);
    let mut at = 4;
    let mut out = Vec::new();
    for _ in 0..n {
        let (id, parent, generation, flags) = (
            u64_at(at)?,
            u64_at(at + 8)?,
            u64_at(at + 16)?,
            u64_at(at + 24)?,
        );
        let len =
            u32::from_le_bytes(buf.get(at + 32..at + LISTED_HEADER)?.try_into().ok()?) as usize;
        let path = buf
            .get(at + LISTED_HEADER..at + LISTED_HEADER + len)?
            .to_vec();
        at += LISTED_HEADER + len;
        let mut path = path;
        if flags & 2 != 0 {
            path.extend_from_slice("…".as_bytes());
        }
        out.push(ListedSubvol {
            id,
            parent,
            generation,
            readonly: flags & 1 != 0,
            path,
        });
    }
    Some(out)
}

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
    fn space_round_trips() {
        assert_eq!(UBTRFS_IOC_SPACE_INFO, 0x83c4_75e3);
        let spaces: Vec<SpaceInfo> = (0..3)
            .map(|i| SpaceInfo {
                flags: 1 << i,
                total: 8 << (20 + i),
                used: 4096 * i,
            })
            .collect();
        let b = encode_space(&spaces);
        assert!(b.len() <= SPACE_SIZE);
        assert_eq!(decode_space(&b), Some(spaces));
        assert_eq!(decode_space(&b[..20]), None);
    }

    #[test]
    fn usage_round_trips() {
        assert_eq!(UBTRFS_IOC_USAGE, 0x8000_75e4 | ((USAGE_SIZE as u32) << 16));
        let u = Usage {
            spaces: vec![SpaceInfo {
                flags: 1,
                total: 8 << 20,
                used: 4096,
            }],
            devices: vec![
                DeviceUsage {
                    devid: 1,
                    path: Some("/a/disk.img".into()),
                    total_bytes: 1 << 30,
                    device_size: (1 << 30) + 4096,
                    allocated: vec![(1, 8 << 20), (4 | 32, 64 << 20)],
                    seed: false,
                },
                DeviceUsage {
                    devid: 3,
                    path: None,
                    total_bytes: 2 << 30,
                    device_size: 0,
                    allocated: vec![],
                    seed: true,
                },
            ],
            statfs_free: 12345,
        };
        let b = encode_usage(&u);
        assert!(b.len() <= USAGE_SIZE);
        assert_eq!(decode_usage(&b), Some(u));
        assert_eq!(decode_usage(&b[..b.len() - 1]), None);
    }

    #[test]
    fn scrub_steps_round_trip_through_their_buffers() {
        assert_eq!(UBTRFS_IOC_SCRUB, 0xd000_75e2);
        let cursor = ScrubCursor {
            phase: ScrubPhase::Data,
            next: Key::new(u64::MAX - 9, 128, 1 << 40),
        };
        let req = encode_scrub_request(true, &cursor);
        assert_eq!(req.len(), SCRUB_SIZE);
        assert_eq!(decode_scrub_request(&req), Some((true, cursor)));
        let mut bad = req.clone();
        bad[8] = 9; // no such phase
        assert_eq!(decode_scrub_request(&bad), None);
        let report = ScrubReport {
            tree_blocks: 1,
            tree_bytes: 2,
            data_bytes: 3,
            tree_errors: 4,
            csum_errors: 5,
            read_errors: 6,
            missing_copies: 7,
            super_errors: 8,
            corrected: 9,
            uncorrectable: 500,
            parity_errors: 10,
            parity_bytes: 11,
            uncorrectable_at: (0..500).map(|i| format!("data sector {i}")).collect(),
        };
        let reply = encode_scrub_reply(&cursor, 77, &report);
        assert!(reply.len() <= SCRUB_SIZE);
        let (c, in_use, r) = decode_scrub_reply(&reply).unwrap();
        assert_eq!((c, in_use), (cursor, 77));
        assert_eq!((r.parity_errors, r.parity_bytes), (10, 11));
        // As many places as fit, the counts whole.
        assert_eq!(r.uncorrectable, 500);
        assert!(r.uncorrectable_at.len() > 100 && r.uncorrectable_at.len() < 500);
        assert_eq!(
            r.uncorrectable_at[..],
            report.uncorrectable_at[..r.uncorrectable_at.len()]
        );
        assert_eq!(decode_scrub_reply(&reply[..100]), None);
    }

    #[test]
    fn subvolume_lists_round_trip_a_page_at_a_time() {
        assert_eq!(UBTRFS_IOC_SUBVOL_LIST, 0xe000_75e1);
        let all: Vec<ListedSubvol> = (0..500u64)
            .map(|i| ListedSubvol {
                id: 256 + i,
                parent: 5 + i % 3,
                generation: i * 7,
                readonly: i % 2 == 0,
                path: format!("dir{}/sub-{i}", i % 10).into_bytes(),
            })
            .collect();
        let mut got = Vec::new();
        let mut after = 0;
        loop {
            let rest: Vec<_> = all.iter().filter(|s| s.id > after).cloned().collect();
            let page = encode_list(&rest);
            assert!(page.len() <= LIST_SIZE);
            let d = decode_list(&page).unwrap();
            if d.is_empty() {
                break;
            }
            after = d.last().unwrap().id;
            got.extend(d);
        }
        assert_eq!(got, all);
        assert_eq!(decode_list(&encode_list(&all)[..100]), None);
        // A path longer than the reply is cut, and marked.
        let long = ListedSubvol {
            id: 900,
            parent: 5,
            generation: 1,
            readonly: false,
            path: vec![b'a'; LIST_SIZE],
        };
        let d = decode_list(&encode_list(&[long])).unwrap();
        assert_eq!(d.len(), 1);
        assert!(d[0].path.ends_with("…".as_bytes()) && d[0].path.len() < LIST_SIZE);
    }

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

//! The commit's I/O discipline (seed 004): dirty blocks, one flush per
//! device, the primary superblock with FUA, then the mirrors; and images
//! the writer commits pass `btrfs check` and mount in the kernel.

use std::path::{Path, PathBuf};
use std::process::Command;
use ubtrfs::device::Counters;
use ubtrfs::fs::{Filesystem, NewInode};

fn mkfs(dir: &Path, args: &[&str], n: usize, size: u64) -> Vec<PathBuf> {
    let imgs: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("d{i}.img"))).collect();
    for p in &imgs {
        std::fs::File::create(p).unwrap().set_len(size).unwrap();
    }
    let out = Command::new("mkfs.btrfs")
        .arg("-q")
        .arg("-f")
        .args(args)
        .args(&imgs)
        .output()
        .expect("mkfs.btrfs runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    imgs
}

fn check(imgs: &[PathBuf]) {
    let out = testkit::output_of(
        Command::new("btrfs")
            .args(["check", "--readonly"])
            .arg(&imgs[0]),
    )
    .expect("btrfs check runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("no error found"),
        "btrfs check:\n{text}"
    );
}

/// (writes, flushes, fua writes) of every device so far.
fn io(fs: &Filesystem) -> Vec<(u64, u64, u64)> {
    fs.tree_reader()
        .volume()
        .devices
        .iter()
        .map(|(_, d)| {
            let c = d.counters();
            (
                Counters::get(&c.writes),
                Counters::get(&c.flushes),
                Counters::get(&c.fua_writes),
            )
        })
        .collect()
}

fn file(mode: u32) -> NewInode {
    NewInode {
        mode: libc::S_IFREG | mode,
        uid: 0,
        gid: 0,
        rdev: 0,
    }
}

#[test]
fn a_commit_flushes_once_then_writes_the_superblock_with_fua() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let before = io(&fs);
    // Nothing changed: a commit does no I/O at all.
    fs.commit().unwrap();
    assert_eq!(io(&fs), before);
    let f = fs.create(fs.root(), b"f", file(0o644)).unwrap();
    fs.write(f.id, 0, &vec![1u8; 100_000]).unwrap();
    let mid = io(&fs);
    fs.commit().unwrap();
    let after = io(&fs);
    let (w0, f0, u0) = mid[0];
    let (w1, f1, u1) = after[0];
    assert_eq!(f1 - f0, 1, "one flush per commit");
    assert_eq!(u1 - u0, 1, "the primary superblock is the one FUA write");
    // Writeback of the file (one data extent, single profile), the tree
    // blocks (DUP metadata: two copies each), then one superblock mirror.
    let blocks = w1 - w0 - 1 - 1;
    assert!(blocks >= 2 && blocks % 2 == 0, "{blocks} tree block writes");
    drop(fs);
    check(&imgs);
}

#[test]
fn two_devices_each_get_one_flush_and_one_fua() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["-d", "raid1", "-m", "raid1"], 2, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let f = fs.create(fs.root(), b"f", file(0o600)).unwrap();
    fs.write(f.id, 4096, b"mirrored").unwrap();
    let mid = io(&fs);
    fs.commit().unwrap();
    let after = io(&fs);
    for (m, a) in mid.iter().zip(&after) {
        assert_eq!(a.1 - m.1, 1);
        assert_eq!(a.2 - m.2, 1);
    }
    drop(fs);
    check(&imgs);
    // One device alone (a degraded read) still has the data.
    let fs = Filesystem::open(&imgs[..1]).unwrap();
    let id = fs.resolve_path(b"/f").unwrap();
    let mut want = vec![0u8; 4096];
    want.extend_from_slice(b"mirrored");
    assert_eq!(fs.read_all(id).unwrap(), want);
}

#[test]
fn uncommitted_changes_are_not_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 300 << 20);
    {
        let fs = Filesystem::open_read_write(&imgs).unwrap();
        fs.mkdir(fs.root(), b"kept", 0o755, 0, 0).unwrap();
        fs.commit().unwrap();
        fs.mkdir(fs.root(), b"lost", 0o755, 0, 0).unwrap();
        // Seen before the commit, by this process.
        assert!(fs.resolve_path(b"/lost").is_ok());
        // Dropped without a commit: a crash at this point.
    }
    check(&imgs);
    let fs = Filesystem::open(&imgs).unwrap();
    assert!(fs.resolve_path(b"/kept").is_ok());
    assert!(fs.resolve_path(b"/lost").is_err());
}

#[test]
fn filling_the_disk_gives_enospc_and_deleting_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 256 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let root = fs.root();
    let chunk = vec![0x5au8; 8 << 20];
    let mut n = 0;
    let err = loop {
        let f = fs
            .create(root, format!("f{n}").as_bytes(), file(0o644))
            .unwrap();
        if let Err(e) = fs.write(f.id, 0, &chunk) {
            break e;
        }
        n += 1;
        assert!(n < 100, "a 256 MiB filesystem took {n} files of 8 MiB");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    // Small files until metadata or data runs out.
    let mut small = 0;
    while fs
        .create(root, format!("s{small}").as_bytes(), file(0o644))
        .and_then(|f| fs.write(f.id, 0, b"x"))
        .is_ok()
    {
        small += 1;
        if small > 200_000 {
            break;
        }
    }
    fs.commit().unwrap();
    for i in 0..n {
        fs.unlink(root, format!("f{i}").as_bytes()).unwrap();
    }
    fs.commit().unwrap();
    let f = fs.create(root, b"again", file(0o644)).unwrap();
    fs.write(f.id, 0, &chunk).unwrap();
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
    let fs = Filesystem::open(&imgs).unwrap();
    assert_eq!(
        fs.read_all(fs.resolve_path(b"/again").unwrap()).unwrap(),
        chunk
    );
    assert!(fs.resolve_path(b"/f0").is_err());
}

#[test]
fn a_second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let err = Filesystem::open_read_write(&imgs)
        .err()
        .expect("second writer refused");
    assert!(err.to_string().contains("already in use"), "{err}");
    assert!(
        Filesystem::open(&imgs).is_err(),
        "a reader would see a half-written transaction"
    );
    drop(fs);
    assert!(Filesystem::open(&imgs).is_ok());
}

/// Space a transaction freed comes back only with its commit: a file
/// rewritten again and again between commits (each rewrite made durable
/// by fsync, which logs and does not commit) would fill the disk with
/// pinned extents. The writer commits to get them back before it says
/// ENOSPC, as the kernel does.
#[test]
fn rewrites_between_commits_reuse_freed_space() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["-m", "single", "-d", "single"], 1, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let f = fs.create(fs.root(), b"f", file(0o644)).unwrap().id;
    let len = 64 << 20;
    fs.write(f, 0, &vec![0u8; len]).unwrap();
    fs.commit().unwrap();
    // 16 rewrites: 1 GiB written into a 300 MiB device.
    for round in 1..=16u8 {
        fs.write(f, 0, &vec![round; len])
            .unwrap_or_else(|e| panic!("rewrite {round}: {e}"));
        fs.fsync(f, false)
            .unwrap_or_else(|e| panic!("fsync {round}: {e}"));
    }
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
    let fs = Filesystem::open(&imgs).unwrap();
    let data = fs.read_all(f).unwrap();
    assert_eq!(data.len(), len);
    assert!(
        data.iter().all(|&b| b == 16),
        "the last rewrite is what stays"
    );
}

/// Filling the disk: writes fail with ENOSPC saying so, never a panic,
/// and what was committed before stays readable; the filesystem still
/// commits and passes `btrfs check`.
#[test]
fn a_full_disk_says_enospc_and_keeps_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["-m", "single", "-d", "single"], 1, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let kept = fs.create(fs.root(), b"kept", file(0o644)).unwrap().id;
    fs.write(kept, 0, &vec![7u8; 10 << 20]).unwrap();
    fs.commit().unwrap();
    let big = fs.create(fs.root(), b"big", file(0o644)).unwrap().id;
    let chunk = vec![9u8; 8 << 20];
    let mut err = None;
    for i in 0..64u64 {
        if let Err(e) = fs
            .write(big, i * chunk.len() as u64, &chunk)
            .and_then(|_| fs.fsync(big, false).map(|_| ()))
        {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("512 MiB fit on a 300 MiB device");
    assert!(
        matches!(err, ubtrfs::Error::NoSpace(_)),
        "not ENOSPC: {err:?}"
    );
    assert!(err.to_string().contains("space"), "{err}");
    // Refused before anything changed: the filesystem goes on.
    assert!(!err.is_after_change(), "{err:?}");
    assert_eq!(fs.aborted(), None);
    // What did fit can still be committed.
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
    let fs = Filesystem::open(&imgs).unwrap();
    assert_eq!(fs.read_all(kept).unwrap(), vec![7u8; 10 << 20]);
}

/// A write that does not fit, with the disk nearly full, is refused or
/// cut short, and the filesystem goes on taking changes: past the end of
/// a small (inline) file, whose last sector and inline data move first;
/// past the end of a file whose last sector is partly used; into the
/// middle of a file; a long write. Each time the rest still commits.
#[test]
fn writes_that_do_not_fit_leave_the_filesystem_whole() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["-m", "single", "-d", "single"], 1, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let small = fs.create(fs.root(), b"small", file(0o644)).unwrap().id;
    fs.write(small, 0, &[1u8; 100]).unwrap();
    let tail = fs.create(fs.root(), b"tail", file(0o644)).unwrap().id;
    fs.write(tail, 0, &[2u8; 10_000]).unwrap();
    let mid = fs.create(fs.root(), b"mid", file(0o644)).unwrap().id;
    fs.write(mid, 0, &[3u8; 1 << 20]).unwrap();
    fs.commit().unwrap();
    // Fill up to within 1 MiB of full, committed.
    let fill = fs.create(fs.root(), b"fill", file(0o644)).unwrap().id;
    let chunk = vec![9u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let left = fs.statfs().free_bytes;
        if left <= 2 << 20 {
            break;
        }
        let n = (left - (1 << 20)).min(chunk.len() as u64) as usize;
        fs.write(fill, at, &chunk[..n]).unwrap();
        at += n as u64;
        if at.is_multiple_of(32 << 20) {
            fs.commit().unwrap();
        }
    }
    fs.commit().unwrap();
    let big = vec![5u8; 3 << 20];
    for (what, id, offset) in [
        ("past an inline file's end", small, 1u64 << 20),
        ("past a partly used last sector", tail, 1 << 20),
        ("into the middle", mid, 4096),
        (
            "a new file",
            fs.create(fs.root(), b"new", file(0o644)).unwrap().id,
            0,
        ),
    ] {
        match fs.write(id, offset, &big) {
            Ok(n) => assert!(n <= big.len(), "{what}: {n}"),
            Err(e) => assert!(matches!(e, ubtrfs::Error::NoSpace(_)), "{what}: {e:?}"),
        }
        assert_eq!(fs.aborted(), None, "{what}");
        fs.commit()
            .unwrap_or_else(|e| panic!("{what}: commit: {e:?}"));
    }
    drop(fs);
    check(&imgs);
}

/// A write past the end of a small (inline) file when the disk is full
/// but for one freed MiB: reserving room for it commits (the last try
/// before ENOSPC), which writes the file's dirty last sector back inline;
/// the write then counts the sector its data moves to again. It once did
/// not, took 4 KiB more than there was, and the next commit ran out of
/// space half-way, which stopped the filesystem.
#[test]
fn reserving_for_a_write_counts_again_after_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["-m", "single", "-d", "single"], 1, 300 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let z = fs.create(fs.root(), b"z", file(0o644)).unwrap().id;
    fs.write(z, 0, &[1u8; 100]).unwrap();
    let mib = fs.create(fs.root(), b"mib", file(0o644)).unwrap().id;
    fs.write(mib, 0, &vec![2u8; 1 << 20]).unwrap();
    fs.commit().unwrap();
    // Everything else full, committed.
    let fill = fs.create(fs.root(), b"fill", file(0o644)).unwrap().id;
    let mut at = 0u64;
    for step in [1u64 << 20, 4096] {
        let buf = vec![9u8; step as usize];
        while fs.write(fill, at, &buf).is_ok() {
            at += step;
            if at.is_multiple_of(16 << 20) {
                fs.commit().unwrap();
            }
        }
        fs.commit().unwrap();
    }
    // One MiB free, and a change since the commit (so that there is
    // something to commit).
    fs.unlink(fs.root(), b"mib").unwrap();
    fs.commit().unwrap();
    fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap();
    let data = vec![5u8; (1 << 20) - 48];
    let first = fs.write(z, 1 << 20, &data);
    assert!(
        matches!(first, Ok(_) | Err(ubtrfs::Error::NoSpace(_))),
        "{first:?}"
    );
    let second = fs.write(z, (2 << 20) - 48, &vec![6u8; (1 << 20) + 48]);
    assert!(
        matches!(second, Ok(_) | Err(ubtrfs::Error::NoSpace(_))),
        "{second:?}"
    );
    assert_eq!(fs.aborted(), None);
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
}

/// Mixed block groups (`mkfs --mixed`, data and metadata in the same
/// groups) filled to the end with small (inline) and larger files: writes
/// are refused with ENOSPC while the filesystem goes on, every commit has
/// room for the metadata it needs, space freed is taken again, and new
/// chunks are mixed too.
#[test]
fn mixed_block_groups_fill_up_and_commit() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["--mixed"], 1, 200 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let mut made = Vec::new();
    let mut refused = 0;
    for i in 0..100_000u32 {
        let name = format!("f{i}");
        let len = if i % 3 == 0 {
            1500
        } else {
            40_000 + (i as usize % 7) * 4096
        };
        let r = fs
            .create(fs.root(), name.as_bytes(), file(0o644))
            .and_then(|st| {
                fs.write(st.id, 0, &vec![(i % 251) as u8; len])
                    .map(|_| st.id)
            });
        match r {
            Ok(id) => made.push((id, len, (i % 251) as u8)),
            Err(e) => {
                assert!(matches!(e, ubtrfs::Error::NoSpace(_)), "{name}: {e:?}");
                assert_eq!(fs.aborted(), None);
                refused += 1;
                if refused > 20 {
                    break;
                }
            }
        }
        if i % 500 == 0 {
            fs.commit().unwrap();
        }
    }
    assert!(refused > 20, "200 MiB never filled");
    fs.commit().unwrap();
    // Half of it goes, and as much comes back.
    for (i, _) in made.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        fs.unlink(fs.root(), format!("f{i}").as_bytes()).ok();
    }
    fs.commit().unwrap();
    let big = fs.create(fs.root(), b"big", file(0o644)).unwrap().id;
    fs.write(big, 0, &vec![7u8; 40 << 20]).unwrap();
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "chunk"])
        .arg(&imgs[0])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let types: Vec<&str> = text
        .split("type ")
        .skip(1)
        .filter_map(|t| t.split_whitespace().next())
        .filter(|t| *t != "0") // device items' type
        .collect();
    assert!(types.len() > 2, "{text}");
    for t in types {
        assert!(
            t.starts_with("DATA|METADATA") || t.starts_with("SYSTEM"),
            "a chunk that is not mixed: {t}"
        );
    }
    let fs = Filesystem::open(&imgs).unwrap();
    assert_eq!(fs.read_all(big).unwrap(), vec![7u8; 40 << 20]);
}

/// `fallocate` at the very edge of a full filesystem, over a range that
/// holds the file's last, partly written sector and reaches past the end:
/// that sector's tail must be zeroed on disk, which takes a sector of new
/// space besides the preallocation. Asked for a little less each time,
/// every call is refused whole (ENOSPC, nothing changed) until one fits;
/// none may fail half-way. (It did, once the preallocation took the last
/// free byte: the filesystem then took no more changes.)
#[test]
fn fallocate_on_a_full_filesystem_fits_or_changes_nothing() {
    use ubtrfs::data::FALLOC_FL_ZERO_RANGE;
    for (mkfs_args, mode) in [
        (&["--mixed"][..], 0),
        (&[][..], 0),
        (&["--mixed"][..], FALLOC_FL_ZERO_RANGE),
    ] {
        let what = format!("mkfs {mkfs_args:?}, mode {mode:#x}");
        let dir = tempfile::tempdir().unwrap();
        let imgs = mkfs(dir.path(), mkfs_args, 1, 128 << 20);
        let fs = Filesystem::open_read_write(&imgs).unwrap();
        let head: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 199) as u8 + 1).collect();
        let t = fs.create(fs.root(), b"t", file(0o644)).unwrap().id;
        fs.write(t, 0, &head).unwrap();
        let fill = vec![9u8; 1 << 20];
        for i in 0.. {
            let f = fs.create(fs.root(), format!("f{i}").as_bytes(), file(0o644));
            match f.and_then(|st| fs.write(st.id, 0, &fill)) {
                Ok(_) => {}
                Err(ubtrfs::Error::NoSpace(_)) => break,
                Err(e) => panic!("{what}: filling: {e:?}"),
            }
        }
        fs.commit().unwrap();
        // From past what is free down to nothing, a sector less each time.
        let free = fs.statfs().free_bytes;
        let mut len = free + (2 << 20);
        let mut fitted = None;
        while len > 0 {
            match fs.fallocate(t, mode, 2 * 4096 + 50, len) {
                Ok(()) => {
                    fitted = Some(len);
                    break;
                }
                Err(ubtrfs::Error::NoSpace(_)) => {}
                Err(e) => panic!("{what}: fallocate of {len} bytes: {e:?}"),
            }
            assert_eq!(fs.aborted(), None, "{what}: fallocate of {len} bytes");
            len -= 4096;
        }
        let fitted = fitted.unwrap_or_else(|| panic!("{what}: no fallocate fitted"));
        assert_eq!(fs.aborted(), None, "{what}");
        fs.commit().unwrap();
        let mut want = head.clone();
        want.resize((2 * 4096 + 50 + fitted) as usize, 0);
        if mode == FALLOC_FL_ZERO_RANGE {
            want[2 * 4096 + 50..].fill(0);
        }
        assert_eq!(fs.read_all(t).unwrap(), want, "{what}");
        drop(fs);
        check(&imgs);
    }
}

/// A filesystem full to the last sector still takes what writes no data:
/// a hole punched in whole sectors, a file cut shorter (anywhere, the
/// rest of its last sector stays on disk as it is), and growing a file
/// whose size is on a sector boundary, as kernel btrfs takes them, and
/// holes or zeroed ranges whose partial sectors are preallocated or
/// sparse. A hole with a partial sector of data at an end, which must be
/// written, is refused whole.
#[test]
fn a_full_filesystem_takes_holes_and_truncates_that_write_nothing() {
    use ubtrfs::data::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 128 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8 + 1).collect();
    let t = fs.create(fs.root(), b"t", file(0o644)).unwrap().id;
    fs.write(t, 0, &data).unwrap();
    // Preallocated and sparse: partial sectors there read as zeros already.
    let pre = fs.create(fs.root(), b"pre", file(0o644)).unwrap().id;
    fs.fallocate(pre, 0, 0, 64 << 10).unwrap();
    let sparse = fs.create(fs.root(), b"sparse", file(0o644)).unwrap().id;
    fs.truncate(sparse, 64 << 10).unwrap();
    // Inline: a hole over all its data drops the inline extent, one over
    // part of it rewrites it.
    let inline = fs.create(fs.root(), b"inline", file(0o644)).unwrap().id;
    fs.write(inline, 0, &[7u8; 100]).unwrap();
    // Less than a sector: zeroed in place, the inline extent kept, as the
    // kernel keeps it.
    let short = fs.create(fs.root(), b"short", file(0o644)).unwrap().id;
    fs.write(short, 0, &[7u8; 100]).unwrap();
    fs.commit().unwrap();
    fs.fallocate(short, punch, 0, 100).unwrap();
    fs.commit().unwrap();
    let fill = fs.create(fs.root(), b"fill", file(0o644)).unwrap().id;
    let mut at = 0u64;
    for piece in [1u64 << 20, 4096] {
        loop {
            match fs.write(fill, at, &vec![5u8; piece as usize]) {
                Ok(_) => at += piece,
                Err(ubtrfs::Error::NoSpace(_)) => break,
                Err(e) => panic!("filling: {e:?}"),
            }
        }
    }
    fs.commit().unwrap();
    assert!(
        matches!(fs.write(fill, at, &[1]), Err(ubtrfs::Error::NoSpace(_))),
        "not full"
    );
    let mut want = data.clone();
    // A hole with a partial sector at its start needs that sector written.
    assert!(matches!(
        fs.fallocate(t, punch, 100, 8192),
        Err(ubtrfs::Error::NoSpace(_))
    ));
    assert!(matches!(
        fs.fallocate(inline, punch, 10, 20),
        Err(ubtrfs::Error::NoSpace(_))
    ));
    fs.fallocate(inline, punch, 0, 4096).unwrap();
    fs.fallocate(t, punch, 64 << 10, 128 << 10).unwrap();
    want[64 << 10..192 << 10].fill(0);
    for f in [pre, sparse] {
        fs.fallocate(f, punch, 5000, 10_000).unwrap();
    }
    fs.fallocate(pre, ubtrfs::data::FALLOC_FL_ZERO_RANGE, 20_000, 10_000)
        .unwrap();
    fs.truncate(t, 512 << 10).unwrap();
    fs.truncate(t, 300_001).unwrap();
    want.truncate(300_001);
    assert_eq!(fs.aborted(), None);
    fs.commit().unwrap();
    assert_eq!(fs.read_all(t).unwrap(), want);
    // Growing from a size on a sector boundary zeroes nothing.
    fs.truncate(t, 200 << 10).unwrap();
    fs.truncate(t, 400 << 10).unwrap();
    want.truncate(200 << 10);
    want.resize(400 << 10, 0);
    fs.commit().unwrap();
    assert_eq!(fs.read_all(t).unwrap(), want);
    for f in [pre, sparse] {
        assert_eq!(fs.read_all(f).unwrap(), vec![0u8; 64 << 10]);
    }
    assert_eq!(fs.read_all(inline).unwrap(), vec![0u8; 100]);
    assert_eq!(fs.stat(inline).unwrap().nbytes, 0);
    assert_eq!(fs.read_all(short).unwrap(), vec![0u8; 100]);
    assert_eq!(fs.stat(short).unwrap().nbytes, 100);
    drop(fs);
    check(&imgs);
}

/// A clone past the end of a file whose last sector is partial (or
/// inline), on a full filesystem: growing the file to the range first
/// needs a sector of data space, and reserving it commits first. Refused
/// then, the clone is a plain ENOSPC: the filesystem goes on, and what
/// the commit wrote and what came after stay. (It stopped the filesystem
/// once: a refusal after a commit was taken for a failure half-way.)
#[test]
fn a_clone_past_the_end_refused_on_a_full_filesystem_changes_nothing() {
    for (mkfs_args, dst_len) in [(&["--mixed"][..], 5000), (&[][..], 5000), (&[][..], 100)] {
        let what = format!("mkfs {mkfs_args:?}, destination of {dst_len} bytes");
        let dir = tempfile::tempdir().unwrap();
        let imgs = mkfs(dir.path(), mkfs_args, 1, 128 << 20);
        let fs = Filesystem::open_read_write(&imgs).unwrap();
        let src = fs.create(fs.root(), b"src", file(0o644)).unwrap().id;
        fs.write(src, 0, &vec![3u8; 1 << 20]).unwrap();
        let dst = fs.create(fs.root(), b"dst", file(0o644)).unwrap().id;
        fs.write(dst, 0, &vec![4u8; dst_len]).unwrap();
        fs.commit().unwrap();
        let fill = fs.create(fs.root(), b"fill", file(0o644)).unwrap().id;
        let mut at = 0u64;
        for piece in [1u64 << 20, 4096] {
            while fs.write(fill, at, &vec![5u8; piece as usize]).is_ok() {
                at += piece;
            }
        }
        fs.commit().unwrap();
        // Something for the clone's reserving to commit.
        fs.mkdir(fs.root(), b"newdir", 0o755, 0, 0).unwrap();
        match fs.clone_range(src, 0, dst, 64 << 10, 1 << 20) {
            Ok(()) | Err(ubtrfs::Error::NoSpace(_)) => {}
            Err(e) => panic!("{what}: {e:?}"),
        }
        assert_eq!(fs.aborted(), None, "{what}");
        fs.mkdir(fs.root(), b"after", 0o755, 0, 0).unwrap();
        fs.commit().unwrap();
        drop(fs);
        check(&imgs);
        let fs = Filesystem::open(&imgs).unwrap();
        assert!(fs.resolve_path(b"/newdir").is_ok(), "{what}");
        assert!(fs.resolve_path(b"/after").is_ok(), "{what}");
        let got = fs.read_all(dst).unwrap();
        assert!(got[..dst_len] == vec![4u8; dst_len][..], "{what}");
    }
}

/// Metadata filled to the end with small (inline) files, then every tenth
/// removed: each removal copies tree blocks whose old copies stay pinned
/// until a commit, so removals must commit when the reserve runs low
/// instead of running out half-way (which stopped the filesystem).
#[test]
fn removing_files_from_full_metadata_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 128 << 20);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let data = vec![4u8; 2000];
    let mut n = 0u32;
    loop {
        let name = format!("f{n}");
        let r = fs
            .create(fs.root(), name.as_bytes(), file(0o644))
            .and_then(|st| fs.write(st.id, 0, &data));
        match r {
            Ok(_) => n += 1,
            Err(e) => {
                assert!(matches!(e, ubtrfs::Error::NoSpace(_)), "{name}: {e:?}");
                break;
            }
        }
    }
    assert!(n > 5000, "only {n} files");
    for i in (0..n).step_by(10) {
        fs.unlink(fs.root(), format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("unlink f{i} of {n}: {e:?}"));
    }
    assert_eq!(fs.aborted(), None);
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
}

/// Chunk items of each type ("DATA", "METADATA", ...) in an image.
fn chunks(img: &Path, kind: &str) -> usize {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "chunk"])
        .arg(img)
        .output()
        .expect("btrfs inspect-internal runs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("type {kind}|")))
        .count()
}

/// What fsx does to a small file through a compressing mount, many times
/// over between commits: compressed rewrites, fsync (which logs and does
/// not commit), preallocation, hole punching, truncation. Space each round
/// frees waits for a commit; the writer must commit to get it back rather
/// than take new chunks, and the log must not keep every version of
/// itself, or the device fills with chunks it does not need (a 1 GiB image
/// ran out of space this way with a 4 MiB file on it).
#[test]
fn churn_between_commits_takes_no_new_chunks() {
    use ubtrfs::data::compression::Compression;
    use ubtrfs::data::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 1 << 30);
    let (data0, meta0) = (chunks(&imgs[0], "DATA"), chunks(&imgs[0], "METADATA"));
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    fs.set_compression(Some((Compression::Zstd, None))).unwrap();
    let f = fs.create(fs.root(), b"f", file(0o644)).unwrap().id;
    let size: u64 = 4 << 20;
    let mut rng = testkit::Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut rand = move |n: u64| rng.range(0, n - 1);
    // 3000 rounds of up to 128 KiB: ~190 MiB written, far more than the
    // data chunk mkfs made, into a file that never passes 4 MiB.
    for round in 0..3000u64 {
        let off = rand(size / 4096) * 4096;
        let len = (1 + rand(32)) * 4096;
        // Half compressible (runs of one byte), half not.
        let buf: Vec<u8> = (0..len)
            .map(|i| {
                if i % 8192 < 4096 {
                    round as u8
                } else {
                    rand(256) as u8
                }
            })
            .collect();
        fs.write(f, off, &buf)
            .unwrap_or_else(|e| panic!("write {round}: {e}"));
        match round % 10 {
            3 => fs.fallocate(f, 0, off, len).unwrap(),
            5 => fs
                .fallocate(f, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, off, len / 2)
                .unwrap(),
            7 => fs.truncate(f, rand(size) + 1).unwrap(),
            _ => {}
        }
        fs.fsync(f, round % 2 == 0)
            .unwrap_or_else(|e| panic!("fsync {round}: {e}"));
    }
    fs.commit().unwrap();
    // Small rewrites, each fsynced: ~4 MiB of data, but every fsync
    // rewrites the log's blocks (~64 MiB of metadata if none came back).
    for round in 0..1000u64 {
        let off = rand(size / 4096) * 4096;
        fs.write(f, off, &[round as u8; 4096]).unwrap();
        fs.fsync(f, false)
            .unwrap_or_else(|e| panic!("small fsync {round}: {e}"));
    }
    fs.commit().unwrap();
    drop(fs);
    check(&imgs);
    assert_eq!(chunks(&imgs[0], "DATA"), data0, "data chunks added");
    assert_eq!(chunks(&imgs[0], "METADATA"), meta0, "metadata chunks added");
}

/// `bytes_used` of the device, as the superblock's dev item says.
fn device_bytes_used(img: &Path) -> u64 {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(img)
        .output()
        .expect("btrfs inspect-internal runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("dev_item.bytes_used"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dev_item.bytes_used in:\n{text}"))
}

/// Chunks that a big file needed go back to the device once it is
/// deleted (the kernel removes unused block groups too): the chunk, dev
/// extent and block group items go, the device's used bytes shrink, and
/// the space serves new chunks again.
#[test]
fn chunks_emptied_by_deletion_go_back_to_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 1 << 30);
    let used0 = device_bytes_used(&imgs[0]);
    for round in 0..2u8 {
        let fs = Filesystem::open_read_write(&imgs).unwrap();
        let name = format!("big{round}");
        let f = fs
            .create(fs.root(), name.as_bytes(), file(0o644))
            .unwrap()
            .id;
        let piece = vec![round + 1; 8 << 20];
        for i in 0..75u64 {
            fs.write(f, i * piece.len() as u64, &piece).unwrap();
        }
        fs.commit().unwrap();
        drop(fs);
        check(&imgs);
        let (data_full, used_full) = (chunks(&imgs[0], "DATA"), device_bytes_used(&imgs[0]));
        assert!(data_full >= 3, "600 MiB took {data_full} data chunks");
        let fs = Filesystem::open_read_write(&imgs).unwrap();
        fs.unlink(fs.root(), name.as_bytes()).unwrap();
        // The first commit frees the extents; the next removes the groups.
        fs.commit().unwrap();
        fs.commit().unwrap();
        drop(fs);
        check(&imgs);
        let (data, used) = (chunks(&imgs[0], "DATA"), device_bytes_used(&imgs[0]));
        assert_eq!(data, 1, "round {round}: data chunks left after deleting");
        assert!(
            used < used_full && used <= used0 + (128 << 20),
            "round {round}: device bytes used {used} (full {used_full}, at mkfs {used0})"
        );
    }
    // The kernel agrees: it mounts the image and writes into the space.
    testkit::require_privileged!();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let k = testkit::Mount::single(&imgs[0], &mnt, "rw").expect("kernel mount");
    std::fs::write(mnt.join("after"), vec![5u8; 300 << 20]).unwrap();
    k.unmount().unwrap();
    check(&imgs);
}

/// Small random writes, each fsync'd (logged), beside new files, on a
/// fresh image (whose first metadata chunk is small): metadata grows by
/// a chunk rather than by a commit every few writes. Each commit that
/// brought back little space used to come again some writes later, dozens
/// a second, every one dropping the log that the next fsync had to build
/// again from scratch.
#[test]
fn fsyncs_beside_creates_do_not_commit_again_and_again() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &["-m", "single", "-d", "single"], 1, 4 << 30);
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    let new = |mode| NewInode {
        mode,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    let top = fs.root();
    let f = fs.create(top, b"f", new(libc::S_IFREG | 0o644)).unwrap().id;
    fs.write(f, 0, &vec![7u8; 64 << 20]).unwrap();
    fs.commit().unwrap();
    let d = fs.create(top, b"d", new(libc::S_IFDIR | 0o755)).unwrap().id;
    // The primary superblock's generation (offset 0x48 of the copy at 64 KiB).
    let generation = || {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        let f = std::fs::File::open(&imgs[0]).unwrap();
        f.read_exact_at(&mut b, 0x1_0000 + 0x48).unwrap();
        u64::from_le_bytes(b)
    };
    let before = generation();
    let mut x = 1u64;
    for i in 0..10_000u64 {
        // xorshift: a random 4 KiB block of the file.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        fs.write(f, (x % 16384) * 4096, &[i as u8; 4096]).unwrap();
        fs.fsync(f, false).unwrap();
        fs.create(d, format!("n{i}").as_bytes(), new(libc::S_IFREG | 0o644))
            .unwrap();
    }
    let commits = generation() - before;
    assert!(commits < 10, "{commits} commits for 10,000 logged fsyncs");
    drop(fs);
    check(&imgs);
}

/// A filesystem whose metadata UUID differs from its fsid (`btrfstune
/// -m`): its device items carry the metadata UUID, and it grows new data
/// and metadata chunks on its device like any other (a check that took a
/// device item's id for a seed's once left it no room).
#[test]
fn a_filesystem_with_a_metadata_uuid_takes_new_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = mkfs(dir.path(), &[], 1, 600 << 20);
    let out = Command::new("btrfstune")
        .arg("-m")
        .arg(&imgs[0])
        .output()
        .expect("btrfstune runs");
    assert!(out.status.success(), "{out:?}");
    let fs = Filesystem::open_read_write(&imgs).unwrap();
    assert_ne!(fs.superblock().fsid, fs.superblock().tree_fsid());
    let f = fs.create(fs.root(), b"f", file(0o644)).unwrap().id;
    let data: Vec<u8> = (0..(64u32 << 20)).map(|i| (i % 241) as u8).collect();
    fs.write(f, 0, &data).unwrap();
    for i in 0..3000 {
        fs.create(fs.root(), format!("n{i}").as_bytes(), file(0o644))
            .unwrap();
    }
    fs.commit().unwrap();
    assert_eq!(fs.read_all(f).unwrap(), data);
    drop(fs);
    check(&imgs);
}

//! Writes into preallocated space go where `fallocate` put it, as in the
//! kernel: the written range of a PREALLOC extent becomes a regular item
//! of the same extent (merged with a regular neighbour of that extent),
//! with checksums, and needs no new data space, so a full filesystem still
//! takes writes into space preallocated before it filled up. Extents
//! shared with a snapshot or a clone are copied on write instead.

use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use testkit::*;
use ubtrfs::data::FALLOC_FL_KEEP_SIZE;
use ubtrfs::format::consts::{
    EXTENT_DATA_KEY, FILE_EXTENT_PREALLOC, FILE_EXTENT_REG, INODE_NODATACOW,
};
use ubtrfs::format::items::{ExtentBody, FileExtentItem};
use ubtrfs::fs::{Filesystem, InodeId, NewInode};

const K: u64 = 1024;
const M: u64 = 1 << 20;

fn file() -> NewInode {
    NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    }
}

fn image(dir: &Path, size: u64) -> PathBuf {
    let img = dir.join("d.img");
    mkfs_file(&img, size, &["-m", "single", "-d", "single"]).unwrap();
    img
}

/// `btrfs check`, and `ubtrfs check` of what is on disk.
fn check(img: &Path) {
    if let Err(e) = btrfs_check_file(img, &[]) {
        panic!("btrfs check: {e:#}");
    }
    let report = Filesystem::open_without_log_replay(&[img])
        .unwrap()
        .check(&mut |_| {})
        .unwrap();
    assert!(report.clean(), "ubtrfs check: {report:?}");
}

/// One file extent item, with its disk extent named by the order in which
/// the file first meets it (the kernel and ubtrfs place extents apart).
#[derive(Debug, PartialEq, Eq)]
struct Piece {
    at: u64,
    kind: &'static str,
    len: u64,
    extent: usize,
    extent_offset: u64,
}

fn layout(fs: &Filesystem, id: InodeId) -> Vec<Piece> {
    let mut disks: Vec<u64> = Vec::new();
    fs.tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, EXTENT_DATA_KEY)
        .unwrap()
        .map(|it| {
            let it = it.unwrap();
            let fe = FileExtentItem::parse(it.data()).unwrap();
            let kind = match fe.extent_type {
                FILE_EXTENT_REG => "regular",
                FILE_EXTENT_PREALLOC => "prealloc",
                _ => "inline",
            };
            let ExtentBody::Regular {
                disk_bytenr,
                offset,
                num_bytes,
                ..
            } = fe.body
            else {
                panic!("inline extent at {}", it.key().offset);
            };
            let extent = match disks.iter().position(|&d| d == disk_bytenr) {
                Some(i) => i,
                None => {
                    disks.push(disk_bytenr);
                    disks.len() - 1
                }
            };
            Piece {
                at: it.key().offset,
                kind,
                len: num_bytes,
                extent,
                extent_offset: offset,
            }
        })
        .collect()
}

/// Deterministic bytes.
fn bytes(len: u64, seed: u64) -> Vec<u8> {
    xorshift_bytes(seed, len as usize)
}

/// The writes of the layout test: (file offset, length), each followed
/// by an fsync so it is written back on its own.
const WRITES: [(u64, u64); 6] = [
    (128 * K, 64 * K),
    (0, 4 * K),
    // Joins the regular piece before it.
    (4 * K, 4 * K),
    (M - 8 * K, 8 * K),
    // Joins the piece before it, then one joins both sides.
    (192 * K, 4 * K),
    (124 * K, 4 * K),
];

fn expected_contents() -> (Vec<u8>, Vec<u8>) {
    let mut f = vec![0u8; M as usize];
    for (i, &(at, len)) in WRITES.iter().enumerate() {
        f[at as usize..(at + len) as usize].copy_from_slice(&bytes(len, i as u64 + 1));
    }
    (f, bytes(100, 99))
}

#[test]
fn preallocated_extents_are_filled_in_place_as_the_kernel_fills_them() {
    require_privileged!();
    let t = TestDir::new("prealloc-layout").unwrap();

    // The kernel first.
    let kimg = t.join("kernel.img");
    mkfs_file(&kimg, 300 << 20, &["-m", "single", "-d", "single"]).unwrap();
    {
        let m = Mount::single(&kimg, &t.join("kmnt"), "").unwrap();
        let f = std::fs::File::create(m.path().join("f")).unwrap();
        assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, M as i64) }, 0);
        let k = std::fs::File::create(m.path().join("k")).unwrap();
        let keep = FALLOC_FL_KEEP_SIZE as i32;
        assert_eq!(
            unsafe { libc::fallocate(k.as_raw_fd(), keep, 0, 512 * K as i64) },
            0
        );
        let sync = std::process::Command::new("sync")
            .arg("-f")
            .arg(m.path())
            .status();
        assert!(sync.unwrap().success());
        for (i, &(at, len)) in WRITES.iter().enumerate() {
            f.write_all_at(&bytes(len, i as u64 + 1), at).unwrap();
            f.sync_all().unwrap();
        }
        k.write_all_at(&bytes(100, 99), 0).unwrap();
        k.sync_all().unwrap();
        drop((f, k));
        m.unmount().unwrap();
    }
    let kfs = Filesystem::open(&[&kimg]).unwrap();
    let (kf, kk) = (
        kfs.resolve_path(b"/f").unwrap(),
        kfs.resolve_path(b"/k").unwrap(),
    );
    let want = (layout(&kfs, kf), layout(&kfs, kk));
    let contents = expected_contents();
    assert_eq!(kfs.read_all(kf).unwrap(), contents.0);
    drop(kfs);

    // The same through the library.
    let img = image(t.path(), 300 << 20);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let f = fs.create(fs.root(), b"f", file()).unwrap().id;
    fs.fallocate(f, 0, 0, M).unwrap();
    let k = fs.create(fs.root(), b"k", file()).unwrap().id;
    fs.fallocate(k, FALLOC_FL_KEEP_SIZE, 0, 512 * K).unwrap();
    fs.commit().unwrap();
    let used = fs.statfs().free_bytes;
    for (i, &(at, len)) in WRITES.iter().enumerate() {
        fs.write(f, at, &bytes(len, i as u64 + 1)).unwrap();
        fs.fsync(f, false).unwrap();
    }
    fs.write(k, 0, &bytes(100, 99)).unwrap();
    fs.fsync(k, false).unwrap();
    fs.commit().unwrap();
    assert_eq!((layout(&fs, f), layout(&fs, k)), want);
    // No new data extent was taken for any of it.
    assert_eq!(fs.statfs().free_bytes, used);
    assert_eq!(fs.read_all(f).unwrap(), contents.0);
    assert_eq!(fs.read_all(k).unwrap(), contents.1);
    drop(fs);
    check(&img);
    // The kernel reads it back, checksums and all.
    let m = Mount::single(&img, &t.join("mnt"), "ro").unwrap();
    assert!(std::fs::read(m.path().join("f")).unwrap() == contents.0);
    assert!(std::fs::read(m.path().join("k")).unwrap() == contents.1);
}

/// Fill the data space of `fs` with file `fill` until what is left is
/// less than a MiB, committed.
fn fill_up(fs: &Filesystem, fill: InodeId) {
    let chunk = vec![9u8; M as usize];
    let mut at = 0u64;
    loop {
        match fs.write(fill, at, &chunk) {
            Ok(n) => at += n as u64,
            Err(ubtrfs::Error::NoSpace(_)) => break,
            Err(e) => panic!("filling: {e:?}"),
        }
        if at.is_multiple_of(32 * M) {
            fs.commit().unwrap();
        }
    }
    fs.commit().unwrap();
    assert!(
        fs.write(fill, at, &chunk).is_err(),
        "the filesystem is not full"
    );
    fs.commit().unwrap();
}

#[test]
fn a_full_filesystem_takes_writes_into_space_preallocated_before() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 300 << 20);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let pre = fs.create(fs.root(), b"pre", file()).unwrap().id;
    fs.fallocate(pre, 0, 0, 8 * M).unwrap();
    let kept = fs.create(fs.root(), b"kept", file()).unwrap().id;
    fs.fallocate(kept, FALLOC_FL_KEEP_SIZE, 0, 2 * M).unwrap();
    // A no-COW file is overwritten in place as well.
    let nocow = fs.create(fs.root(), b"nocow", file()).unwrap().id;
    fs.set_flags(nocow, INODE_NODATACOW).unwrap();
    fs.write(nocow, 0, &bytes(4 * M, 5)).unwrap();
    fs.commit().unwrap();
    let fill = fs.create(fs.root(), b"fill", file()).unwrap().id;
    fill_up(&fs, fill);

    // Unaligned pieces, then the rest of the preallocation.
    let mut want = vec![0u8; 8 * M as usize];
    let mut put = |at: u64, len: u64, seed: u64| {
        let b = bytes(len, seed);
        fs.write(pre, at, &b)
            .unwrap_or_else(|e| panic!("write of {len} at {at}: {e:?}"));
        want[at as usize..(at + len) as usize].copy_from_slice(&b);
    };
    put(100, 5000, 1);
    // A sector written in two parts (as a FUSE write from a buffer that
    // is not page-aligned arrives), the second after the first went in.
    put(20_000, 1000, 8);
    put(21_000, 500, 9);
    put(M + 10, 3 * M, 2);
    put(5 * M, 3 * M, 3);
    // Past the end first: kept beyond its size, as KEEP_SIZE leaves it.
    let kept_data = bytes(2 * M, 4);
    fs.write(kept, M, &kept_data[M as usize..]).unwrap();
    fs.write(kept, 0, &kept_data[..M as usize]).unwrap();
    let nocow_data = bytes(4 * M, 6);
    fs.write(nocow, 0, &nocow_data).unwrap();
    assert_eq!(fs.aborted(), None);
    fs.commit().unwrap();
    // Past the preallocation there is no room.
    assert!(matches!(
        fs.write(pre, 8 * M, &bytes(4 * M, 7)),
        Err(ubtrfs::Error::NoSpace(_))
    ));
    fs.commit().unwrap();
    assert_eq!(fs.read(pre, 0, 8 * M as usize).unwrap(), want);
    drop(fs);
    check(&img);
    let fs = Filesystem::open(&[&img]).unwrap();
    let read = |name: &[u8], len: u64| {
        let id = fs.resolve_path(name).unwrap();
        fs.read(id, 0, len as usize).unwrap()
    };
    assert!(read(b"/pre", 8 * M) == want);
    assert!(read(b"/kept", 2 * M) == kept_data);
    assert!(read(b"/nocow", 4 * M) == nocow_data);
}

/// A stream into space preallocated before the filesystem filled, cut
/// into requests that start and end inside sectors (as FUSE cuts a write
/// from a buffer that is not page-aligned), longer than what is held
/// dirty: the background writeback in between must not write a sector
/// in place before its second part came, or that part would need space
/// the filesystem does not have.
#[test]
fn a_full_filesystem_takes_a_stream_cut_inside_sectors_into_preallocated_space() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 300 << 20);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let pre = fs.create(fs.root(), b"pre", file()).unwrap().id;
    let len = 48 * M;
    fs.fallocate(pre, 0, 0, len).unwrap();
    fs.commit().unwrap();
    let fill = fs.create(fs.root(), b"fill", file()).unwrap().id;
    fill_up(&fs, fill);
    let want = bytes(len, 11);
    let mut at = 0;
    while at < len {
        let to = ((at + 16) / M * M + M - 16).min(len);
        let n = fs
            .write(pre, at, &want[at as usize..to as usize])
            .unwrap_or_else(|e| panic!("write at {at}: {e:?}"));
        assert_eq!(n as u64, to - at);
        at = to;
    }
    assert_eq!(fs.aborted(), None);
    fs.commit().unwrap();
    assert!(fs.read(pre, 0, len as usize).unwrap() == want);
    drop(fs);
    check(&img);
}

#[test]
fn shared_preallocated_extents_are_copied_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 300 << 20);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let a = fs.create(fs.root(), b"a", file()).unwrap().id;
    fs.fallocate(a, 0, 0, M).unwrap();
    let b = fs.create(fs.root(), b"b", file()).unwrap().id;
    fs.fallocate(b, 0, 0, M).unwrap();
    fs.commit().unwrap();
    // A clone of A, not yet committed, and a snapshot holding B.
    let c = fs.create(fs.root(), b"c", file()).unwrap().id;
    fs.clone_range(a, 0, c, 0, M).unwrap();
    fs.write(a, 64 * K, &bytes(64 * K, 1)).unwrap();
    fs.commit().unwrap();
    let snap = fs
        .create_snapshot(fs.root().subvol, fs.root(), b"snap", false)
        .unwrap();
    fs.write(b, 0, &bytes(8 * K, 2)).unwrap();
    // After a commit, the clone's reference is in the extent tree.
    fs.write(a, 512 * K, &bytes(4 * K, 3)).unwrap();
    fs.commit().unwrap();
    let first = |id: InodeId| layout(&fs, id)[0].extent;
    let disk_of = |id: InodeId, at: u64| -> u64 {
        let it = fs
            .tree_by_id(id.subvol)
            .unwrap()
            .get_le(&ubtrfs::format::Key::new(id.ino, EXTENT_DATA_KEY, at))
            .unwrap()
            .unwrap();
        match FileExtentItem::parse(it.data()).unwrap().body {
            ExtentBody::Regular { disk_bytenr, .. } => disk_bytenr,
            ExtentBody::Inline(_) => 0,
        }
    };
    let _ = first;
    // The writes went to new extents, not into the shared ones.
    assert_ne!(disk_of(a, 64 * K), disk_of(c, 64 * K));
    assert_ne!(disk_of(a, 512 * K), disk_of(c, 512 * K));
    let snap_b = InodeId {
        subvol: snap.subvol,
        ino: b.ino,
    };
    assert_ne!(disk_of(b, 0), disk_of(snap_b, 0));
    assert!(fs.read(c, 0, M as usize).unwrap().iter().all(|&x| x == 0));
    assert!(
        fs.read(snap_b, 0, M as usize)
            .unwrap()
            .iter()
            .all(|&x| x == 0)
    );
    assert_eq!(
        fs.read(a, 64 * K, 64 * K as usize).unwrap(),
        bytes(64 * K, 1)
    );
    assert_eq!(fs.read(b, 0, 8 * K as usize).unwrap(), bytes(8 * K, 2));
    drop(fs);
    check(&img);
}

#[test]
fn a_logged_write_into_preallocated_space_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 300 << 20);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let f = fs.create(fs.root(), b"f", file()).unwrap().id;
    fs.fallocate(f, 0, 0, 4 * M).unwrap();
    fs.commit().unwrap();
    let mut want = vec![0u8; 4 * M as usize];
    for (i, (at, len)) in [(M, 64 * K), (M + 64 * K, 4 * K), (3 * M, 100)]
        .into_iter()
        .enumerate()
    {
        let b = bytes(len, i as u64);
        fs.write(f, at, &b).unwrap();
        fs.fsync(f, false).unwrap();
        want[at as usize..(at + len) as usize].copy_from_slice(&b);
    }
    // Gone without a commit: the log brings the writes back.
    drop(fs);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let f = fs.resolve_path(b"/f").unwrap();
    assert!(fs.read_all(f).unwrap() == want);
    fs.commit().unwrap();
    drop(fs);
    check(&img);
}

/// A stream into preallocated space, larger than what is held dirty: the
/// writeback thread writes it in place while writes go on, reads find it
/// meanwhile, and no new data extent is taken.
#[test]
fn a_stream_into_preallocated_space_is_written_in_place_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 512 << 20);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let f = fs.create(fs.root(), b"f", file()).unwrap().id;
    let len = 160 * M;
    fs.fallocate(f, 0, 0, len).unwrap();
    fs.commit().unwrap();
    let free = fs.statfs().free_bytes;
    let data = bytes(len, 11);
    for (i, piece) in data.chunks(M as usize).enumerate() {
        fs.write(f, i as u64 * M, piece).unwrap();
        // Reads of what was written so far, some of it still in flight.
        if i % 16 == 15 {
            let upto = (i as u64 + 1) * M;
            assert!(fs.read(f, 0, upto as usize).unwrap() == data[..upto as usize]);
        }
    }
    assert!(fs.read_all(f).unwrap() == data);
    fs.commit().unwrap();
    assert_eq!(fs.statfs().free_bytes, free, "new data extents were taken");
    let pieces = layout(&fs, f);
    assert!(pieces.iter().all(|p| p.kind == "regular"), "{pieces:?}");
    drop(fs);
    check(&img);
    let fs = Filesystem::open(&[&img]).unwrap();
    assert!(fs.read_all(fs.resolve_path(b"/f").unwrap()).unwrap() == data);
}

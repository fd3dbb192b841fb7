//! Copies of tree blocks and data sectors: where each lies on which
//! device, and damaging one on purpose.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use testkit::{Mount, TestDir};
use ubtrfs::format::consts::EXTENT_DATA_KEY;
use ubtrfs::format::items::{ExtentBody, FileExtentItem};
use ubtrfs::format::{Key, consts::FS_TREE_OBJECTID};
use ubtrfs::fs::Filesystem;

/// Where copy `mirror` of `len` bytes at `logical` lies: device path and offset.
pub fn place(fs: &Filesystem, devices: &[PathBuf], logical: u64, mirror: usize) -> (PathBuf, u64) {
    let volume = fs.tree_reader().volume();
    let piece = volume
        .chunks
        .lookup(logical)
        .unwrap()
        .map(logical, 1, mirror)
        .unwrap();
    let path = volume
        .devices
        .get(piece.devid)
        .unwrap()
        .path()
        .to_path_buf();
    assert!(
        devices.contains(&path),
        "{} not among {devices:?}",
        path.display()
    );
    (path, piece.physical)
}

/// Flip a byte 100 bytes into copy `mirror` of `logical`.
pub fn damage(fs: &Filesystem, devices: &[PathBuf], logical: u64, mirror: usize) {
    let (path, at) = place(fs, devices, logical, mirror);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at + 100).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], at + 100).unwrap();
}

/// The logical address of the data of the file `/f`, and two leaves of the
/// filesystem tree.
pub fn targets(devices: &[PathBuf]) -> (u64, u64, u64) {
    let fs = Filesystem::open(devices).unwrap();
    let id = fs.lookup(fs.root(), b"f").unwrap().id;
    let data = fs
        .tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, EXTENT_DATA_KEY)
        .unwrap()
        .find_map(
            |it| match FileExtentItem::parse(it.unwrap().data()).unwrap().body {
                ExtentBody::Regular {
                    disk_bytenr,
                    offset: 0,
                    ..
                } => Some(disk_bytenr),
                _ => None,
            },
        )
        .expect("the file's extent");
    let leaves = fs
        .tree_by_id(FS_TREE_OBJECTID)
        .unwrap()
        .leaves(Key::new(0, 0, 0), Key::new(u64::MAX, u8::MAX, u64::MAX))
        .unwrap();
    assert!(leaves.len() >= 2, "the tree has {} leaves", leaves.len());
    // In RAID5/6 the two leaves must be in different stripe rows: two
    // damaged columns of one RAID5 row cannot both be rebuilt.
    let chunks = &fs.tree_reader().volume().chunks;
    let row = |b: u64| {
        let c = chunks.lookup(b).unwrap();
        let parity = c.profile.parity_stripes();
        if parity == 0 {
            return (b, 0);
        }
        let data = c.item.stripes.len() as u64 - parity;
        (c.logical, (b - c.logical) / (c.item.stripe_len * data))
    };
    let first = leaves[0].header.bytenr;
    let last = leaves
        .iter()
        .rev()
        .map(|l| l.header.bytenr)
        .find(|&b| row(b) != row(first))
        .expect("a leaf in another stripe row");
    (data, first, last)
}

/// The length of the file `/f` [`make`] writes.
pub const FILE_LEN: usize = 1 << 20;

/// What [`make`] writes into `/f`.
pub fn contents() -> Vec<u8> {
    testkit::xorshift_bytes(7, FILE_LEN)
}

/// A filesystem of `ndev` 300 MiB images with `profile` for data and
/// metadata, written by the kernel: `/f` ([`contents`]) and enough small
/// files for the filesystem tree to have several leaves.
pub fn make(t: &TestDir, profile: &str, ndev: usize) -> Vec<PathBuf> {
    let devices: Vec<PathBuf> = (0..ndev)
        .map(|i| super::new_image(t, &format!("{profile}-{i}.img"), 300 << 20))
        .collect();
    let mut mkfs = Command::new("mkfs.btrfs");
    mkfs.args(["-q", "-f", "-d", profile, "-m", profile])
        .args(&devices);
    let out = mkfs.output().unwrap();
    assert!(
        out.status.success(),
        "mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Mount::new(&devices, &t.join("kernel"), "").unwrap();
    std::fs::write(m.path().join("f"), contents()).unwrap();
    for i in 0..400 {
        std::fs::write(m.path().join(format!("small-{i}")), format!("{i}\n")).unwrap();
    }
    m.unmount().unwrap();
    devices
}

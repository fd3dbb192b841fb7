//! Every chunk profile: the kernel writes a multi-device filesystem, the
//! library reads it back, byte for byte, through lookups and ranged reads.

use std::path::{Path, PathBuf};
use testkit::xorshift_bytes as bytes;
use ubtrfs::fs::{FileKind, Filesystem};

/// The files every image gets: (path, content).
fn files() -> Vec<(String, Vec<u8>)> {
    let sizes = [
        0usize, 1, 100, 2000, 4095, 4096, 4097, 65536, 65537, 200_000, 3_000_000,
    ];
    let mut out = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        out.push((format!("/d{}/f{i}", i % 3), bytes(i as u64 + 1, n)));
    }
    // The longest name btrfs allows.
    out.push((format!("/{}", "n".repeat(255)), bytes(99, 777)));
    out
}

fn make_image(dir: &Path, profile: &str, meta: &str, ndev: usize) -> Vec<PathBuf> {
    let args = ["-d", profile, "-m", meta];
    testkit::mkfs_devices_with_files(dir, ndev, 320 << 20, &args, &files()).unwrap()
}

fn check(profile: &str, meta: &str, ndev: usize) {
    let dir = tempfile::tempdir().unwrap();
    let imgs = make_image(dir.path(), profile, meta, ndev);
    // Devices in reverse order: matching is by devid, not by position.
    let rev: Vec<&PathBuf> = imgs.iter().rev().collect();
    let fs = Filesystem::open(&rev).unwrap_or_else(|e| panic!("{profile}/{meta}: open: {e}"));
    assert!(fs.warnings().is_empty(), "{:?}", fs.warnings());
    for (path, data) in files() {
        let id = fs
            .resolve_path(path.as_bytes())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let st = fs.stat(id).unwrap();
        assert_eq!(st.kind, FileKind::File);
        assert_eq!(st.size, data.len() as u64, "{profile}: size of {path}");
        assert!(
            fs.read_all(id).unwrap() == data,
            "{profile}/{meta}: content of {path}"
        );
        // Ranged reads that straddle sector and stripe boundaries.
        for (off, len) in [(1u64, 10usize), (4090, 20), (65530, 70000), (131_000, 5)] {
            let got = fs.read(id, off, len).unwrap();
            let lo = (off as usize).min(data.len());
            let hi = (off as usize + len).min(data.len());
            assert_eq!(got, &data[lo..hi], "{profile}: {path} at {off}+{len}");
        }
    }
    let names: Vec<Vec<u8>> = fs
        .read_dir(fs.root(), 0)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 4, "root entries: {names:?}");
    assert!(fs.resolve_path(b"/d0/missing").is_err());
}

#[test]
fn single_and_dup() {
    check("single", "dup", 1);
    check("dup", "single", 1);
}

#[test]
fn raid0_and_raid1() {
    check("raid0", "raid1", 2);
    check("raid1", "raid0", 2);
}

#[test]
fn raid10() {
    check("raid10", "raid10", 4);
}

#[test]
fn raid1c3_and_raid1c4() {
    check("raid1c3", "raid1c4", 4);
}

#[test]
fn raid5_and_raid6() {
    check("raid5", "raid1", 3);
    check("raid6", "raid1c3", 4);
}

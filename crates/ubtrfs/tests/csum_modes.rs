//! The data checksum modes of seed 003 (inline, offloaded to the pool,
//! auto) write the same bytes and the same checksums: for every checksum
//! algorithm, images written in each mode read back through ubtrfs (which
//! verifies every sector) and pass `btrfs check --check-data-csum`.

use std::path::{Path, PathBuf};
use ubtrfs::data::ordered::CsumMode;
use ubtrfs::fs::{Filesystem, NewInode};

fn mkfs(dir: &Path, csum: &str) -> PathBuf {
    let img = dir.join(format!("{csum}.img"));
    testkit::mkfs_file(&img, 256 << 20, &["--csum", csum]).unwrap();
    img
}

fn file() -> NewInode {
    NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    }
}

/// Deterministic bytes that differ per file and per position.
fn bytes(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn every_mode_writes_checksums_the_kernel_tools_accept() {
    let dir = tempfile::tempdir().unwrap();
    for csum in ["crc32c", "xxhash", "sha256", "blake2"] {
        for mode in [CsumMode::Inline, CsumMode::Offload, CsumMode::Auto] {
            let img = mkfs(dir.path(), csum);
            // A big file (several pieces of an ordered extent and a partial
            // one), a 64 KiB one, and one written a sector at a time.
            let files: Vec<(&[u8], Vec<u8>)> = vec![
                (b"big", bytes(1, (5 << 20) + 3 * 4096)),
                (b"mid", bytes(2, 64 << 10)),
                (b"small", bytes(3, 5 * 4096)),
            ];
            {
                let fs = Filesystem::open_read_write(&[&img]).unwrap();
                fs.set_csum_mode(mode).unwrap();
                for (name, data) in &files {
                    let st = fs.create(fs.root(), name, file()).unwrap();
                    let step = if *name == b"small" { 4096 } else { 1 << 20 };
                    for (i, piece) in data.chunks(step).enumerate() {
                        fs.write(st.id, (i * step) as u64, piece).unwrap();
                    }
                    // A commit per file: ordered extents of several sizes.
                    fs.commit().unwrap();
                }
                let stats = fs.csum_stats().unwrap();
                let [inline, offloaded] = stats.extents;
                match mode {
                    CsumMode::Inline => assert!(inline > 0 && offloaded == 0, "{stats:?}"),
                    CsumMode::Offload => assert!(inline == 0 && offloaded > 0, "{stats:?}"),
                    // Auto's warmup tries both on the big file's pieces.
                    CsumMode::Auto => assert!(inline > 0 && offloaded > 0, "{stats:?}"),
                }
            }
            let fs = Filesystem::open(&[&img]).unwrap();
            for (name, data) in &files {
                let id = fs.lookup(fs.root(), name).unwrap().id;
                assert!(
                    fs.read_all(id).unwrap() == *data,
                    "{csum} {mode:?}: {} reads back different",
                    String::from_utf8_lossy(name)
                );
            }
            drop(fs);
            testkit::btrfs_check_file(&img, &["--check-data-csum"]).unwrap();
            std::fs::remove_file(&img).unwrap();
        }
    }
}

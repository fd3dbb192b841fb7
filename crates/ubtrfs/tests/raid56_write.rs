//! Writing to RAID5 and RAID6 filesystems the kernel made.
//!
//! mkfs.btrfs makes the filesystem on 3 (RAID5) or 4 (RAID6) image files,
//! data and metadata both parity profiles, and the kernel writes some
//! files. The library then adds files of every size (inline, part of a
//! stripe, several rows), rewrites the middle of a file the kernel wrote
//! (a read-modify-write of rows shared with the kernel's data), and
//! writes until a new data chunk has to be made. The judges: `btrfs
//! check`; the kernel reading every file back; the kernel's scrub, which
//! recomputes every row's P (and Q) and must find no error; and the
//! kernel reading every file again with one device (RAID5) or two
//! (RAID6) missing, which only parity can rebuild.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::xorshift_bytes as bytes;
use testkit::{Mount, TestDir};
use ubtrfs::format::consts::{CHUNK_ITEM_KEY, FIRST_CHUNK_TREE_OBJECTID};
use ubtrfs::fs::{Filesystem, NewInode};

fn run(cmd: &mut Command) -> String {
    testkit::run(cmd).unwrap_or_else(|e| panic!("{e:#}"))
}

fn image(devices: &[PathBuf]) -> testkit::corpus::Image {
    testkit::corpus::Image {
        devices: devices.to_vec(),
        source: None,
        mkfs: testkit::MkfsOptions::default(),
        mount_options: String::new(),
        builder: testkit::corpus::Builder::Kernel,
    }
}

fn chunks(fs: &Filesystem) -> usize {
    fs.tree_by_id(3)
        .unwrap()
        .items_of(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY)
        .unwrap()
        .count()
}

/// Every regular file under `dir`, by name, with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn raid56_writes(profile: &str, ndev: usize, missing: usize) {
    testkit::require_privileged!();
    let t = TestDir::new(&format!("raid56-write-{profile}")).unwrap();
    let devices: Vec<PathBuf> = (0..ndev)
        .map(|i| t.sparse_file(format!("disk{i}.img"), 400 << 20).unwrap())
        .collect();
    run(Command::new("mkfs.btrfs")
        .args(["-f", "-q", "-d", profile, "-m", profile])
        .args(&devices));
    let mnt = t.join("mnt");
    let mut want = BTreeMap::new();
    {
        let m = Mount::new(&devices, &mnt, "").unwrap();
        for (i, len) in [(0u64, 3000usize), (1, 200_000), (2, 1 << 20)] {
            let data = bytes(i, len);
            std::fs::write(m.path().join(format!("kernel{i}")), &data).unwrap();
            want.insert(format!("kernel{i}"), data);
        }
        m.unmount().unwrap();
    }

    let fs = Filesystem::open_read_write(&devices).unwrap();
    let new = NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    let put = |want: &mut BTreeMap<String, Vec<u8>>, name: &str, data: Vec<u8>| {
        let id = fs.create(fs.root(), name.as_bytes(), new).unwrap().id;
        fs.write(id, 0, &data).unwrap();
        want.insert(name.to_string(), data);
    };
    // Inline, inside one stripe, across stripes, across rows, unaligned.
    for (i, len) in [100usize, 5000, 70_000, 300_000, 3 << 20, 1_234_567]
        .into_iter()
        .enumerate()
    {
        put(&mut want, &format!("lib{i}"), bytes(100 + i as u64, len));
    }
    fs.commit().unwrap();
    // The middle of a file the kernel wrote: rows shared with its data.
    let k = fs.lookup(fs.root(), b"kernel1").unwrap().id;
    let patch = bytes(50, 30_000);
    fs.write(k, 70_000, &patch).unwrap();
    want.get_mut("kernel1").unwrap()[70_000..100_000].copy_from_slice(&patch);
    fs.commit().unwrap();
    // Until a data chunk is added: chunks of parity profiles are made too.
    let before = chunks(&fs);
    let mut n = 0;
    while chunks(&fs) == before {
        assert!(n < 40, "no new chunk after {n} files of 16 MiB");
        put(&mut want, &format!("big{n}"), bytes(1000 + n, 16 << 20));
        fs.commit().unwrap();
        n += 1;
    }
    drop(fs);

    // First, read-only, without `missing` devices: their stripes come back
    // from parity only (a read-write mount or a scrub would rewrite parity
    // it finds wrong).
    run(Command::new("btrfs").args(["device", "scan", "--forget"]));
    let m = Mount::new(&devices[missing..], &mnt, "ro,degraded").unwrap();
    assert!(
        files(m.path()) == want,
        "with {missing} device(s) missing, the kernel rebuilds other bytes"
    );
    m.unmount().unwrap();

    testkit::corpus::btrfs_check(&image(&devices))
        .unwrap_or_else(|e| panic!("btrfs check after ubtrfs wrote {profile}: {e:#}"));
    let m = Mount::new(&devices, &mnt, "").unwrap();
    assert!(files(m.path()) == want, "the kernel reads other bytes");
    let scrub = Command::new("btrfs")
        .args(["scrub", "start", "-B"])
        .arg(m.path())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&scrub.stdout),
        String::from_utf8_lossy(&scrub.stderr)
    );
    assert!(
        scrub.status.success() && said.contains("no errors found"),
        "scrub of {profile} written by ubtrfs:\n{said}"
    );
    m.unmount().unwrap();
}

#[test]
fn raid5_written_by_ubtrfs_scrubs_clean_and_survives_a_lost_device() {
    raid56_writes("raid5", 3, 1);
}

#[test]
fn raid6_written_by_ubtrfs_scrubs_clean_and_survives_two_lost_devices() {
    raid56_writes("raid6", 4, 2);
}

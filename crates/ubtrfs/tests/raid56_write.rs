//! Writing to RAID5 and RAID6 filesystems the kernel made.
//!
//! mkfs.btrfs makes the filesystem on 3 (RAID5) or 4 (RAID6) image files,
//! data and metadata both parity profiles, and the kernel writes some
//! files. The library then adds files of every size (inline, part of a
//! stripe, several rows), rewrites the middle of a file the kernel wrote
//! and writes until a new data chunk has to be made. The judge of parity
//! is reading without devices: for every way to lose one device (RAID5)
//! or two (RAID6), the kernel (mounted read-only and degraded) and ubtrfs
//! read every file back, which only right parity allows. Then `btrfs
//! check`, the kernel reading every file with all devices, and its scrub
//! (data checksums; scrub rewrites wrong parity without counting it). At
//! last a damaged sector is repaired from parity when its checksum fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::xorshift_bytes as bytes;
use testkit::{Mount, TestDir};
use ubtrfs::format::consts::{CHUNK_ITEM_KEY, EXTENT_DATA_KEY, FIRST_CHUNK_TREE_OBJECTID};
use ubtrfs::format::items::{ExtentBody, FileExtentItem};
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
    // Free space as the kernel counts it for a new filesystem: the parity
    // share of unallocated device space is not free for data.
    let kernel_free = {
        let m = Mount::new(&devices, &mnt, "").unwrap();
        let out = run(Command::new("stat")
            .args(["-f", "-c", "%a %S"])
            .arg(m.path()));
        m.unmount().unwrap();
        let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        v[0] * v[1]
    };
    {
        let fs = Filesystem::open_read_write(&devices).unwrap();
        let ours = fs.statfs().free_bytes;
        assert!(
            ours.abs_diff(kernel_free) <= kernel_free / 50,
            "{profile}: {ours} bytes free, the kernel says {kernel_free}"
        );
    }
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
    // The middle of a file the kernel wrote (copy on write: its new blocks
    // go wherever the allocator puts them, often into rows partly written).
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

    // Every way to lose `missing` devices: the stripes they held (data, P
    // and Q of every rotation) come back from the rest. ubtrfs reads it all
    // back, and so does the kernel, read-only (a read-write mount or a
    // scrub would quietly rewrite parity it finds wrong).
    let mut losses: Vec<Vec<usize>> = (0..ndev).map(|a| vec![a]).collect();
    if missing == 2 {
        losses = (0..ndev)
            .flat_map(|a| (a + 1..ndev).map(move |b| vec![a, b]))
            .collect();
    }
    for gone in &losses {
        let present: Vec<PathBuf> = (0..ndev)
            .filter(|i| !gone.contains(i))
            .map(|i| devices[i].clone())
            .collect();
        let fs = Filesystem::open(&present).unwrap();
        for (name, data) in &want {
            let id = fs.lookup(fs.root(), name.as_bytes()).unwrap().id;
            assert!(
                fs.read_all(id).unwrap() == *data,
                "{name} read by ubtrfs without devices {gone:?} differs"
            );
        }
        drop(fs);
        let m = Mount::new(&present, &mnt, "ro,degraded").unwrap();
        assert!(
            files(m.path()) == want,
            "the kernel reads other bytes without devices {gone:?}"
        );
        m.unmount().unwrap();
    }

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

    // A sector of lib4 damaged on its device: the read fails its checksum
    // and the sector is rebuilt from the rest of the row.
    let fs = Filesystem::open(&devices).unwrap();
    let id = fs.lookup(fs.root(), b"lib4").unwrap().id;
    let extent = fs
        .tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, EXTENT_DATA_KEY)
        .unwrap()
        .find_map(|it| {
            let it = it.unwrap();
            match FileExtentItem::parse(it.data()).unwrap().body {
                ExtentBody::Regular {
                    disk_bytenr,
                    offset,
                    ..
                } if it.key().offset == 0 => Some(disk_bytenr + offset),
                _ => None,
            }
        })
        .expect("lib4 starts with a regular extent");
    let at = extent + 8192;
    let volume = fs.tree_reader().volume().clone();
    let piece = volume.chunks.lookup(at).unwrap().map(at, 4096, 0).unwrap();
    drop(fs);
    let dev = &devices[piece.devid as usize - 1];
    let f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xa5; 4096], piece.physical).unwrap();
    f.sync_all().unwrap();
    let mut direct = vec![0u8; 4096];
    volume.read_copy(at, 0, &mut direct).unwrap();
    assert_eq!(direct, vec![0xa5; 4096], "the damage is not where lib4 is");
    let fs = Filesystem::open(&devices).unwrap();
    let id = fs.lookup(fs.root(), b"lib4").unwrap().id;
    assert!(
        fs.read_all(id).unwrap() == want["lib4"],
        "lib4 not repaired"
    );
}

#[test]
fn raid5_written_by_ubtrfs_reads_back_without_any_one_device() {
    raid56_writes("raid5", 3, 1);
}

#[test]
fn raid6_written_by_ubtrfs_reads_back_without_any_two_devices() {
    raid56_writes("raid6", 4, 2);
}

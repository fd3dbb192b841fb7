//! A filesystem the kernel wrote with the old free-space cache
//! (`space_cache=v1`: no free-space tree, a cache inode per block group in
//! the root tree), as disks made before 5.15 are: ubtrfs writes it after
//! moving it to the free-space tree at open, as the kernel's
//! `space_cache=v2` mount does (the tree built from the extent tree, the
//! feature flags set, the cache generation 0, the cache inodes gone with
//! their extents). `btrfs check` (which compares the free-space tree with
//! the extent tree) is clean, and the kernel reads and writes it after.

use std::path::Path;
use std::process::Command;

use testkit::xorshift_bytes as bytes;
use testkit::{Mount, TestDir};
use ubtrfs::fs::{Filesystem, NewInode};

fn dump(args: &[&str], img: &Path) -> String {
    testkit::run(
        Command::new("btrfs")
            .args(["inspect-internal"])
            .args(args)
            .arg(img),
    )
    .unwrap()
}

/// A superblock field's value, from `btrfs inspect-internal dump-super`.
fn super_field(img: &Path, name: &str) -> String {
    let text = dump(&["dump-super"], img);
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(name)).then(|| w.next().unwrap_or("").to_string())
        })
        .unwrap_or_else(|| panic!("no {name} in dump-super:\n{text}"))
}

fn check(img: &Path) {
    testkit::btrfs_check_file(img, &[]).unwrap();
}

#[test]
fn a_filesystem_with_the_v1_space_cache_is_written() {
    testkit::require_privileged!();
    let t = TestDir::new("space-cache-v1").unwrap();
    let img = t.join("v1.img");
    // Block groups of 100 MiB or more get a cache inode: a 3 GiB image.
    std::fs::File::create(&img)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    testkit::run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-R", "^free-space-tree"])
            .arg(&img),
    )
    .unwrap();
    let mnt = t.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    {
        let m = Mount::new(&[&img], &mnt, "space_cache=v1").unwrap();
        for i in 0..30u64 {
            std::fs::write(m.path().join(format!("f{i}")), bytes(i, 1_000_000)).unwrap();
        }
        testkit::run(Command::new("sync").arg("-f").arg(m.path())).unwrap();
        std::fs::remove_file(m.path().join("f1")).unwrap();
        m.unmount().unwrap();
    }
    // What is to be moved away is there.
    assert_eq!(super_field(&img, "compat_ro_flags"), "0x0");
    assert_ne!(super_field(&img, "cache_generation"), "0");
    let root = dump(&["dump-tree", "-t", "root"], &img);
    assert!(root.contains("FREE_SPACE UNTYPED"), "no v1 cache:\n{root}");

    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let new = fs
        .create(
            fs.root(),
            b"new",
            NewInode {
                mode: libc::S_IFREG | 0o644,
                uid: 0,
                gid: 0,
                rdev: 0,
            },
        )
        .unwrap()
        .id;
    fs.write(new, 0, &bytes(100, 3_000_000)).unwrap();
    fs.unlink(fs.root(), b"f2").unwrap();
    fs.commit().unwrap();
    drop(fs);

    assert_eq!(super_field(&img, "compat_ro_flags"), "0x3");
    assert_eq!(super_field(&img, "cache_generation"), "0");
    let root = dump(&["dump-tree", "-t", "root"], &img);
    assert!(
        !root.contains("FREE_SPACE UNTYPED"),
        "v1 cache left:\n{root}"
    );
    assert!(root.contains("FREE_SPACE_TREE ROOT_ITEM"), "{root}");
    check(&img);

    let m = Mount::new(&[&img], &mnt, "").unwrap();
    assert!(std::fs::read(m.path().join("new")).unwrap() == bytes(100, 3_000_000));
    assert!(std::fs::read(m.path().join("f7")).unwrap() == bytes(7, 1_000_000));
    assert!(!m.path().join("f2").exists());
    std::fs::write(m.path().join("k"), bytes(200, 500_000)).unwrap();
    m.unmount().unwrap();
    check(&img);
}

/// A v1 image the kernel left with a log to replay (a file fsync'd, the
/// image copied while mounted): the free-space tree is made by the first
/// commit, after the replay has set the log's blocks aside (made at open,
/// its blocks once landed on the log's and the replay failed).
#[test]
fn a_v1_image_with_a_log_is_replayed_then_moved() {
    testkit::require_privileged!();
    let t = TestDir::new("space-cache-v1-log").unwrap();
    let (src, img) = (t.join("src.img"), t.join("v1.img"));
    std::fs::File::create(&src)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    testkit::run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-R", "^free-space-tree"])
            .arg(&src),
    )
    .unwrap();
    let mnt = t.join("mnt");
    {
        let m = Mount::new(&[&src], &mnt, "space_cache=v1,commit=300").unwrap();
        let mut f = std::fs::File::create(m.path().join("x")).unwrap();
        std::io::Write::write_all(&mut f, b"hello\n").unwrap();
        f.sync_all().unwrap();
        drop(f);
        testkit::run(
            Command::new("cp")
                .arg("--sparse=always")
                .arg(&src)
                .arg(&img),
        )
        .unwrap();
        m.unmount().unwrap();
    }
    assert_ne!(super_field(&img, "log_root"), "0", "no log to replay");
    let fs = Filesystem::open(&[&img]).unwrap();
    assert_eq!(
        fs.read_all(fs.resolve_path(b"/x").unwrap()).unwrap(),
        b"hello\n"
    );
    drop(fs);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    assert_eq!(
        fs.read_all(fs.resolve_path(b"/x").unwrap()).unwrap(),
        b"hello\n"
    );
    fs.commit().unwrap();
    drop(fs);
    assert_eq!(super_field(&img, "log_root"), "0");
    assert_eq!(super_field(&img, "compat_ro_flags"), "0x3");
    check(&img);
    let m = Mount::new(&[&img], &mnt, "").unwrap();
    assert_eq!(std::fs::read(m.path().join("x")).unwrap(), b"hello\n");
    m.unmount().unwrap();
}

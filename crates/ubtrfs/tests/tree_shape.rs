//! The shape of the trees ubtrfs writes and how it reads them: keys that
//! arrive in increasing order (new inodes) leave full leaves behind, as
//! the kernel's trees do, and a walk through a cold tree finds the leaves
//! after the one it reads already read ahead.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use ubtrfs::fs::{Filesystem, NewInode, Stat};

const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};

/// Files created, in one directory, in one transaction.
const FILES: usize = 3000;

fn image_with_files(dir: &Path) -> (PathBuf, Vec<Stat>) {
    let img = dir.join("fs.img");
    // 16 KiB nodes whatever the page size: the counts below depend on it.
    testkit::mkfs_file(
        &img,
        256 << 20,
        &["-m", "single", "-d", "single", "-n", "16384"],
    )
    .unwrap();
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let made = (0..FILES)
        .map(|i| {
            fs.create(fs.root(), format!("file{i:05}").as_bytes(), FILE)
                .unwrap()
        })
        .collect();
    fs.commit().unwrap();
    drop(fs);
    (img, made)
}

/// Free bytes of each leaf of the default subvolume's tree, as
/// `btrfs inspect-internal dump-tree` reports them, in key order.
fn leaf_free_space(img: &Path) -> Vec<u64> {
    let out = testkit::output_of(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "5"])
            .arg(img),
    )
    .expect("btrfs inspect-internal runs");
    assert!(out.status.success(), "dump-tree failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("leaf ") && l.contains(" free space "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let at = w
                .iter()
                .position(|&x| x == "free")
                .expect("free space field");
            w[at + 2].parse().expect("a number of free bytes")
        })
        .collect()
}

fn check(img: &Path) {
    let out = testkit::output_of(Command::new("btrfs").args(["check", "--readonly"]).arg(img))
        .expect("btrfs check runs");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "btrfs check:\n{text}");
}

#[test]
fn files_created_in_order_leave_full_leaves() {
    let dir = testkit::TestDir::new("tree-shape-fill").unwrap();
    let (img, _) = image_with_files(dir.path());
    check(&img);
    let free = leaf_free_space(&img);
    // 3,000 empty files take about 1.3 MB of items: some 80 full 16 KiB
    // leaves. Cut in halves they took about 130 leaves, each half empty.
    let leaves = free.len();
    let mean_free = free.iter().sum::<u64>() as f64 / leaves as f64;
    assert!(
        mean_free < 16384.0 * 0.2,
        "{leaves} leaves, {mean_free:.0} bytes free in each on average"
    );
}

fn settle(fs: &Filesystem) {
    let start = Instant::now();
    while fs.tree_reader().reading_ahead() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "readahead never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_walk_through_a_cold_tree_finds_the_next_leaves_read() {
    let dir = testkit::TestDir::new("tree-shape-readahead").unwrap();
    let (img, made) = image_with_files(dir.path());
    let ids: Vec<_> = made.iter().map(|st| st.id).collect();
    let fs = Filesystem::open(&[&img]).unwrap();
    // A single lookup reads nothing ahead (on a disk that seeks, leaves
    // read for nothing cost a seek each): the inode a leaf or two later
    // is read by its own lookup.
    let reader = fs.tree_reader();
    fs.stat(ids[0]).unwrap();
    settle(&fs);
    let alone = reader.blocks_read();
    fs.stat(ids[100]).unwrap();
    settle(&fs);
    assert_eq!(
        reader.blocks_read() - alone,
        1,
        "a single lookup had leaves read ahead for it"
    );
    // A leaf read cold after the one before it is a walk in key order:
    // from here on, leaves are read ahead.
    for id in &ids[..150] {
        fs.stat(*id).unwrap();
    }
    settle(&fs);
    // The inodes after these are in the leaves that follow, about 70 to
    // a leaf; 8 leaves are read ahead, and each leaf used for the first
    // time moves that window on. So, walked in steps of 450 inodes
    // (less than the window), with the thread let finish in between,
    // the stats wait for no read. Without readahead each step reads 6 or 7.
    for step in ids[150..].chunks(450).take(5) {
        let before = reader.blocks_read();
        for id in step {
            fs.stat(*id).unwrap();
        }
        let read = reader.blocks_read() - before;
        assert_eq!(read, 0, "stats of inodes read ahead read blocks themselves");
        settle(&fs);
    }
    // And what they read is what was written.
    for st in &made {
        assert_eq!(&fs.stat(st.id).unwrap(), st);
    }
}

//! The shape of the trees ubtrfs writes and how it reads them: keys that
//! arrive in increasing order (new inodes) leave full leaves behind, as
//! the kernel's trees do; leaves that grow in their middle (directory
//! entries) share items with a neighbour before they split; and a walk
//! through a cold tree finds the leaves after the one it reads already
//! read ahead.

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

/// A new 256 MiB image in `dir` with nodes of `nodesize` bytes whatever
/// the page size (the counts below depend on it).
fn new_image(dir: &Path, nodesize: &str) -> PathBuf {
    let img = dir.join("fs.img");
    let mut args = vec!["-m", "single", "-d", "single", "-n", nodesize];
    if nodesize == "4096" {
        args.extend(["-s", "4096"]);
    }
    testkit::mkfs_file(&img, 256 << 20, &args).unwrap();
    img
}

fn image_with_files(dir: &Path) -> (PathBuf, Vec<Stat>) {
    let img = new_image(dir, "16384");
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

/// The default subvolume's tree as `btrfs inspect-internal dump-tree`
/// prints it.
fn dump_fs_tree(img: &Path) -> String {
    let out = testkit::output_of(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "5"])
            .arg(img),
    )
    .expect("btrfs inspect-internal runs");
    assert!(out.status.success(), "dump-tree failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Free bytes of each leaf of the default subvolume's tree, in key order.
fn leaf_free_space(img: &Path) -> Vec<u64> {
    dump_fs_tree(img)
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

#[test]
fn directory_entries_share_leaves_with_their_neighbours() {
    // Directories first, then each one's files (as `bench/smallfiles.c`
    // makes them): a directory's entries go in the middle of the tree,
    // by name hash, before the next directories' items.
    let dir = testkit::TestDir::new("tree-shape-dirs").unwrap();
    let img = new_image(dir.path(), "16384");
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let dirs: Vec<_> = (0..30)
        .map(|d| {
            let mode = NewInode {
                mode: libc::S_IFDIR | 0o755,
                ..FILE
            };
            fs.create(fs.root(), format!("dir{d:02}").as_bytes(), mode)
                .unwrap()
                .id
        })
        .collect();
    for (d, &dir) in dirs.iter().enumerate() {
        for i in (d..FILES).step_by(dirs.len()) {
            fs.create(dir, format!("file{i:05}").as_bytes(), FILE)
                .unwrap();
        }
    }
    fs.commit().unwrap();
    drop(fs);
    check(&img);
    let free = leaf_free_space(&img);
    let leaves = free.len();
    let mean_free = free.iter().sum::<u64>() as f64 / leaves as f64;
    // Cut in halves: 83 leaves, 3,252 bytes free in each on average; the
    // kernel's btrfs leaves about 500 free pushing items into neighbours.
    assert!(
        mean_free < 16384.0 * 0.1,
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

/// The first key under each level-1 node of the default subvolume's
/// tree, as `btrfs inspect-internal dump-tree` prints them: objectid and
/// whether the item is an inode item.
fn level_one_first_keys(img: &Path) -> Vec<(u64, bool)> {
    let text = dump_fs_tree(img);
    let mut firsts = Vec::new();
    let mut in_level_one = false;
    for line in text.lines() {
        if line.starts_with("node ") && line.contains(" level ") {
            in_level_one = line.contains(" level 1 ");
        } else if in_level_one && let Some(rest) = line.trim_start().strip_prefix("key (") {
            let mut words = rest.split_whitespace();
            let obj = words.next().unwrap_or_default();
            let inode_item = words.next() == Some("INODE_ITEM");
            firsts.push((
                obj.parse().expect("an objectid in a pointer key"),
                inode_item,
            ));
            in_level_one = false;
        }
    }
    firsts
}

#[test]
fn a_walk_crossing_into_the_next_parent_reads_one_leaf_itself() {
    // 4 KiB nodes: about 120 leaves under each level-1 node, so 6,000
    // inodes span several.
    let dir = testkit::TestDir::new("tree-shape-crossing").unwrap();
    let img = new_image(dir.path(), "4096");
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let ids: Vec<_> = (0..6000)
        .map(|i| {
            fs.create(fs.root(), format!("f{i:05}").as_bytes(), FILE)
                .unwrap()
                .id
        })
        .collect();
    fs.commit().unwrap();
    drop(fs);
    let (from, to) = (ids[100].ino, ids[ids.len() - 1].ino);
    // Parents the walk below enters after its start: those whose first
    // key comes after the inode item of `from` and not after that of
    // `to` (an inode item is the first item of its inode).
    let crossings = level_one_first_keys(&img)
        .into_iter()
        .filter(|&(obj, inode_item)| {
            (obj > from || obj == from && !inode_item) && (obj < to || obj == to && inode_item)
        })
        .count();
    assert!(crossings >= 2, "the inodes span {crossings} parents");

    let fs = Filesystem::open(&[&img]).unwrap();
    let reader = fs.tree_reader();
    for id in &ids[..=100] {
        fs.stat(*id).unwrap();
    }
    settle(&fs);
    // The thread is let finish every 60 inodes (fewer than the 8 leaves
    // read ahead hold) and after every stat that read a block. Where the
    // walk enters the next parent, whose leaves were not read ahead, it
    // reads that level-1 node and its first leaf; that leaf follows the
    // last under the old parent, so readahead starts again at once (not
    // after a second leaf read cold).
    let mut read = 0;
    for step in ids[101..].chunks(60) {
        for id in step {
            let before = reader.blocks_read();
            fs.stat(*id).unwrap();
            let n = reader.blocks_read() - before;
            if n > 0 {
                read += n;
                settle(&fs);
            }
        }
        settle(&fs);
    }
    assert_eq!(
        read,
        2 * crossings as u64,
        "blocks read by the walk itself, entering {crossings} parents"
    );
}

#[test]
fn leaves_shared_with_neighbours_in_snapshotted_trees_pass_btrfs_check() {
    // Sharing copies a neighbour: in a tree with snapshots that block,
    // its parent and the leaf may all be shared with other trees, and
    // their references must come out as the kernel counts them.
    for nodesize in ["4096", "16384"] {
        let dir = testkit::TestDir::new(&format!("tree-shape-snap-{nodesize}")).unwrap();
        let img = new_image(dir.path(), nodesize);
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let dir_mode = NewInode {
            mode: libc::S_IFDIR | 0o755,
            ..FILE
        };
        let subvol = fs.root().subvol;
        for d in 0..20 {
            let id = fs
                .create(fs.root(), format!("d{d:02}").as_bytes(), dir_mode)
                .unwrap()
                .id;
            for i in 0..60 {
                let f = fs.create(id, format!("f{i:04}").as_bytes(), FILE).unwrap();
                // Inline and regular extents.
                let len = if (i + d) % 3 == 0 { 9000 } else { 300 };
                fs.write(f.id, 0, &vec![i as u8; len]).unwrap();
            }
        }
        fs.commit().unwrap();
        fs.create_snapshot(subvol, fs.root(), b"snap", false)
            .unwrap();
        // New names in the middle of both trees' directory leaves.
        for round in 0..3 {
            for d in 0..20 {
                for base in ["", "/snap"] {
                    let id = fs
                        .resolve_path(format!("{base}/d{d:02}").as_bytes())
                        .unwrap();
                    for i in 0..25 {
                        let f = fs
                            .create(id, format!("g{round}-{i:04}").as_bytes(), FILE)
                            .unwrap();
                        let len = if i % 2 == 0 { 9000 } else { 500 };
                        fs.write(f.id, 0, &vec![i as u8; len]).unwrap();
                    }
                }
            }
            fs.commit().unwrap();
        }
        // Large xattrs grow leaves of files in a new snapshot, its source
        // and the old snapshot.
        for round in 0..3 {
            let name = format!("s{round}");
            fs.create_snapshot(subvol, fs.root(), name.as_bytes(), false)
                .unwrap();
            for base in [String::new(), format!("/{name}"), "/snap".into()] {
                for k in 0..40 {
                    let (d, i) = ((k * 7 + round) % 20, (k * 13 + round * 5) % 60);
                    let id = fs
                        .resolve_path(format!("{base}/d{d:02}/f{i:04}").as_bytes())
                        .unwrap();
                    let value = vec![7u8; 1100 + 37 * k];
                    fs.set_xattr(id, format!("user.x{round}").as_bytes(), &value, 0)
                        .unwrap();
                }
            }
            fs.commit().unwrap();
        }
        drop(fs);
        check(&img);
    }
}

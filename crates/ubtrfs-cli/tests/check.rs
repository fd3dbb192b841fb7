//! `ubtrfs check` against `btrfs check --readonly`, the oracle: both find
//! nothing on filesystems the kernel made in several layouts and on one
//! ubtrfs wrote through its mount; and both find each damage done on
//! purpose to a copy of a good image (an item changed or removed, its
//! leaf rewritten with a good checksum, as a bug would write it), with
//! `ubtrfs check` naming the part of the filesystem that is wrong.

mod common;

use common::ubtrfs;
use std::path::{Path, PathBuf};
use std::process::Command;
use testkit::{Mount, TestDir, require_privileged};
use ubtrfs::format::Key;
use ubtrfs::format::consts::*;
use ubtrfs::format::node::{Body, Node};
use ubtrfs::fs::Filesystem;

/// Files of every kind, hard links, xattrs, preallocated and partly
/// overwritten extents, reflinks, compressed data, a sparse file, a
/// no-COW directory, subvolumes and snapshots (of a subvolume and of the
/// top level, which keeps entries of the nested ones), deletions, and a
/// directory big enough for several leaves.
const POPULATE: &str = r#"
set -e
mkdir -p a/b/c d
for i in $(seq 1 300); do echo "file $i" > a/f$i; done
head -c 3M /dev/urandom > big
yes hello | head -c 2M > comp
ln a/f1 a/b/hard1; ln a/f1 d/hard2
ln -s /some/where sym
mknod fifo p
setfattr -n user.x -v yes a/f2
fallocate -l 1M pre
dd if=/dev/urandom of=part bs=4k count=10 2>/dev/null
dd if=/dev/urandom of=part bs=4k count=2 seek=3 conv=notrunc 2>/dev/null
$CLONE big big.clone
$SUBVOL create sv
cp big sv/; echo x > sv/small
$SUBVOL snapshot sv snap
echo changed >> snap/small; head -c 100K /dev/urandom >> snap/big
$SUBVOL snapshot . rootsnap
rm a/f3 a/f4; echo more > a/f5
truncate -s 10M sparse; echo end >> sparse
chattr +C d; echo nocow > d/nc
mkdir manyd; for i in $(seq 1 2000); do : > manyd/longname_$i; done
if [ -n "$KERNEL" ]; then
    # An inline extent with a reflinked extent after it (and, without
    # no-holes, a hole between).
    echo abc > inl; sync; xfs_io -c "reflink part 0 64k 4k" inl
fi
sync
"#;

/// Fill `dir`: `subvol` is the command that makes subvolumes, `clone` one
/// that copies a file sharing its extents.
fn populate(dir: &Path, subvol: &str, clone: &str) {
    let out = Command::new("bash")
        .args(["-c", POPULATE])
        .current_dir(dir)
        .env("SUBVOL", subvol)
        .env("CLONE", clone)
        .env("KERNEL", if subvol.starts_with("btrfs") { "1" } else { "" })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "populate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mkfs.btrfs OPTS` on fresh images, filled by the kernel.
fn kernel_image(t: &TestDir, name: &str, devices: usize, opts: &[&str]) -> Vec<PathBuf> {
    let imgs: Vec<PathBuf> = (0..devices)
        .map(|i| t.sparse_file(format!("{name}{i}.img"), 1 << 30).unwrap())
        .collect();
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .args(opts)
        .args(&imgs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs.btrfs {opts:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Mount::new(&imgs, &t.join(format!("{name}.mnt")), "compress=zstd").unwrap();
    populate(m.path(), "btrfs subvolume", "cp --reflink=always");
    m.unmount().unwrap();
    imgs
}

/// What `btrfs check --readonly` says, and whether it found no error.
fn progs_check(imgs: &[PathBuf]) -> (bool, String) {
    let loops: Vec<testkit::Loop> = if imgs.len() > 1 {
        imgs.iter()
            .map(|i| testkit::Loop::attach_read_only(i).unwrap())
            .collect()
    } else {
        Vec::new()
    };
    let target: PathBuf = if imgs.len() > 1 {
        let devs: Vec<&Path> = loops.iter().map(|l| l.device()).collect();
        let _ = Command::new("btrfs")
            .args(["device", "scan"])
            .args(&devs)
            .output();
        devs[0].to_path_buf()
    } else {
        imgs[0].clone()
    };
    let out = Command::new("btrfs")
        .args(["check", "--readonly"])
        .arg(&target)
        .output()
        .unwrap();
    if imgs.len() > 1 {
        let devs: Vec<&Path> = loops.iter().map(|l| l.device()).collect();
        let _ = Command::new("btrfs")
            .args(["device", "scan", "--forget"])
            .args(&devs)
            .output();
    }
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (
        out.status.success() && text.contains("no error found"),
        text,
    )
}

/// What `ubtrfs check` says, and whether it found no problem.
fn our_check(imgs: &[PathBuf]) -> (bool, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["check".as_ref(), "-q".as_ref()];
    args.extend(imgs.iter().map(|p| p.as_os_str()));
    let out = ubtrfs(&args);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let clean = out.status.success() && text.contains("no errors found");
    if !clean {
        assert_eq!(
            out.status.code(),
            Some(1),
            "ubtrfs check exits 1 on problems:\n{text}"
        );
    }
    (clean, text)
}

fn assert_both_clean(what: &str, imgs: &[PathBuf]) {
    let (ok, text) = progs_check(imgs);
    assert!(ok, "{what}: btrfs check found errors:\n{text}");
    let (ok, text) = our_check(imgs);
    assert!(
        ok,
        "{what}: ubtrfs check found problems btrfs check did not:\n{text}"
    );
}

#[test]
fn kernel_made_filesystems_check_clean() {
    require_privileged!();
    let t = TestDir::new("check-kernel").unwrap();
    for (name, devices, opts) in [
        ("default", 1, &[][..]),
        (
            "old",
            1,
            &["-O", "^no-holes,^skinny-metadata", "-R", "^free-space-tree"][..],
        ),
        ("mixed", 1, &["--mixed"][..]),
        ("xxhash64k", 1, &["--csum", "xxhash", "-n", "65536"][..]),
        ("raid1", 2, &["-d", "raid1", "-m", "raid1"][..]),
        ("raid5", 3, &["-d", "raid5", "-m", "raid1c3"][..]),
    ] {
        let imgs = kernel_image(&t, name, devices, opts);
        assert_both_clean(name, &imgs);
        // The report counts what it read.
        let (_, text) = our_check(&imgs);
        let first = text.lines().next().unwrap_or_default();
        assert!(
            first.contains(" 2") && first.contains("inodes"),
            "{name}: {first}"
        );
    }
}

#[test]
fn a_filesystem_ubtrfs_wrote_checks_clean() {
    require_privileged!();
    let t = TestDir::new("check-ubtrfs").unwrap();
    let img = t.sparse_file("u.img", 1 << 30).unwrap();
    common::assert_success(
        "ubtrfs mkfs",
        &ubtrfs([std::ffi::OsStr::new("mkfs"), img.as_os_str()]),
    );
    let m = common::start_mount(&img, &t.join("mnt"), &["-o", "compress=zstd"]);
    let subvol = format!("{} subvolume", common::ubtrfs_bin());
    // FICLONE does not reach FUSE: coreutils shares extents through
    // copy_file_range, which ubtrfs answers with a reflink.
    populate(m.path(), &subvol, "cp --reflink=auto --sparse=never");
    m.unmount().unwrap();
    assert_both_clean("ubtrfs-written", std::slice::from_ref(&img));
}

/// A directory and a file removed while still open, caught on disk
/// before they are cleaned up (as after a crash): no names, no links, an
/// orphan item each. Both checks call that consistent.
#[test]
fn files_removed_while_open_check_clean() {
    require_privileged!();
    let t = TestDir::new("check-open-removed").unwrap();
    let img = t.sparse_file("o.img", 1 << 30).unwrap();
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    let m = Mount::new(std::slice::from_ref(&img), &t.join("mnt"), "").unwrap();
    std::fs::create_dir(m.path().join("d")).unwrap();
    std::fs::write(m.path().join("f"), b"data").unwrap();
    let dir = std::fs::File::open(m.path().join("d")).unwrap();
    let file = std::fs::File::open(m.path().join("f")).unwrap();
    std::fs::remove_dir(m.path().join("d")).unwrap();
    std::fs::remove_file(m.path().join("f")).unwrap();
    // A commit with both removed and still open, then a copy of the image
    // while nothing changes it.
    let sync = Command::new("btrfs")
        .args(["filesystem", "sync"])
        .arg(m.path())
        .status()
        .unwrap();
    assert!(sync.success());
    let copy = t.join("copy.img");
    let freeze = Command::new("fsfreeze")
        .arg("-f")
        .arg(m.path())
        .status()
        .unwrap();
    assert!(freeze.success());
    let cp = Command::new("cp")
        .arg("--sparse=always")
        .arg(&img)
        .arg(&copy)
        .status();
    let thaw = Command::new("fsfreeze")
        .arg("-u")
        .arg(m.path())
        .status()
        .unwrap();
    assert!(cp.unwrap().success() && thaw.success());
    drop((dir, file));
    m.unmount().unwrap();
    let fs = Filesystem::open_without_log_replay(&[&copy]).unwrap();
    let orphans = fs
        .tree_by_id(FS_TREE_OBJECTID)
        .unwrap()
        .items_of(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY)
        .unwrap()
        .count();
    assert_eq!(orphans, 2, "the copy has both orphans");
    drop(fs);
    assert_both_clean("removed while open", &[copy]);
}

/// Rewrite the leaf holding `key` in tree `tree` of a single-device
/// image, with the item's data changed by `edit` (`None`: the item
/// removed), and a good checksum, on every copy.
fn patch(img: &Path, tree: u64, key: Key, edit: impl FnOnce(&[u8]) -> Option<Vec<u8>>) {
    patch_item(img, tree, key, |_, d| match edit(d) {
        Some(new) => {
            *d = new;
            true
        }
        None => false,
    })
}

/// As [`patch`], with the key open to change too (it must keep its place
/// among its neighbours); `edit` returns false to remove the item.
fn patch_item(img: &Path, tree: u64, key: Key, edit: impl FnOnce(&mut Key, &mut Vec<u8>) -> bool) {
    let fs = Filesystem::open_without_log_replay(&[img]).unwrap();
    let t = fs.tree_by_id(tree).unwrap();
    let item = t
        .get(&key)
        .unwrap()
        .unwrap_or_else(|| panic!("no item {key}"));
    let leaf = item.leaf().clone();
    let Body::Leaf(mut items) = leaf.body() else {
        unreachable!()
    };
    let slot = items.iter().position(|(k, _)| *k == key).unwrap();
    let (k, d) = &mut items[slot];
    let keep = edit(k, d);
    // The parent's key for the leaf must stay its first key.
    assert!(
        slot > 0 || (keep && *k == key),
        "{key} is its leaf's first item"
    );
    if !keep {
        items.remove(slot);
    }
    let node = Node::build(&leaf.header, &Body::Leaf(items), leaf.bytes().len()).unwrap();
    let bytes = node.sealed_bytes(fs.tree_reader().csum_type());
    // The filesystem is open read-only: write each copy to the image.
    let chunk = fs
        .tree_reader()
        .volume()
        .chunks
        .lookup(leaf.header.bytenr)
        .unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    for m in 0..chunk.num_copies() {
        let piece = chunk.map(leaf.header.bytenr, bytes.len(), m).unwrap();
        assert_eq!((piece.devid, piece.len), (1, bytes.len()));
        std::os::unix::fs::FileExt::write_all_at(&file, &bytes, piece.physical).unwrap();
    }
}

/// The first item of `tree` for which `pick` is true (key, data), not the
/// first of its leaf, when `not_first` (it is to be removed).
fn find(
    img: &Path,
    tree: u64,
    not_first: bool,
    pick: impl Fn(Key, &[u8]) -> bool,
) -> (Key, Vec<u8>) {
    let fs = Filesystem::open_without_log_replay(&[img]).unwrap();
    let t = fs.tree_by_id(tree).unwrap();
    for item in t
        .range(Key::new(0, 0, 0), Key::new(u64::MAX, u8::MAX, u64::MAX))
        .unwrap()
    {
        let item = item.unwrap();
        if not_first && item.leaf().key(0) == item.key() {
            continue;
        }
        if pick(item.key(), item.data()) {
            return (item.key(), item.data().to_vec());
        }
    }
    panic!("no such item in tree {tree}");
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn set64(b: &[u8], at: usize, v: u64) -> Vec<u8> {
    let mut b = b.to_vec();
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    b
}

fn set32(b: &[u8], at: usize, v: u32) -> Vec<u8> {
    let mut b = b.to_vec();
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    b
}

#[test]
fn damage_is_found_by_both_checks() {
    require_privileged!();
    let t = TestDir::new("check-damage").unwrap();
    let base = kernel_image(&t, "base", 1, &[]).remove(0);
    let (f1, big, a_dir) = {
        let fs = Filesystem::open_without_log_replay(&[&base]).unwrap();
        (
            fs.resolve_path(b"/a/f1").unwrap().ino,
            fs.resolve_path(b"/part").unwrap().ino,
            fs.resolve_path(b"/a").unwrap().ino,
        )
    };
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, &str, Damage)> = vec![
        (
            "a file's link count one too high",
            "[fs tree] tree 5: inode",
            Box::new(move |img| {
                patch(
                    img,
                    FS_TREE_OBJECTID,
                    Key::new(f1, INODE_ITEM_KEY, 0),
                    |d| Some(set32(d, 40, 4)),
                )
            }),
        ),
        (
            "a file's byte count wrong",
            "its byte count is",
            Box::new(move |img| {
                patch(
                    img,
                    FS_TREE_OBJECTID,
                    Key::new(big, INODE_ITEM_KEY, 0),
                    |d| Some(set64(d, 24, le64(d, 24) + 4096)),
                )
            }),
        ),
        (
            "a directory's size wrong",
            "its size is",
            Box::new(move |img| {
                patch(
                    img,
                    FS_TREE_OBJECTID,
                    Key::new(a_dir, INODE_ITEM_KEY, 0),
                    |d| Some(set64(d, 16, le64(d, 16) + 2)),
                )
            }),
        ),
        (
            "a directory index removed",
            "has no directory index",
            Box::new(move |img| {
                let (key, _) = find(img, FS_TREE_OBJECTID, true, |k, _| {
                    k.objectid == a_dir && k.item_type == DIR_INDEX_KEY
                });
                patch(img, FS_TREE_OBJECTID, key, |_| None)
            }),
        ),
        (
            "a directory item naming another inode than its index",
            "by index",
            Box::new(move |img| {
                let (key, _) = find(img, FS_TREE_OBJECTID, false, |k, _| {
                    k.objectid == a_dir && k.item_type == DIR_ITEM_KEY
                });
                // The entry's location key starts the item: objectid + 1.
                patch(img, FS_TREE_OBJECTID, key, |d| {
                    Some(set64(d, 0, le64(d, 0) + 1))
                })
            }),
        ),
        (
            "a block group's used bytes wrong",
            "[block groups] block group",
            Box::new(|img| {
                let (key, _) = find(img, EXTENT_TREE_OBJECTID, false, |k, d| {
                    k.item_type == BLOCK_GROUP_ITEM_KEY && le64(d, 16) & BLOCK_GROUP_DATA != 0
                });
                patch(img, EXTENT_TREE_OBJECTID, key, |d| {
                    Some(set64(d, 0, le64(d, 0) + 4096))
                })
            }),
        ),
        (
            "a data extent's reference count wrong",
            "[extent refs] extent",
            Box::new(|img| {
                let (key, _) = find(img, EXTENT_TREE_OBJECTID, false, |k, d| {
                    k.item_type == EXTENT_ITEM_KEY && le64(d, 16) & EXTENT_FLAG_DATA != 0
                });
                patch(img, EXTENT_TREE_OBJECTID, key, |d| {
                    Some(set64(d, 0, le64(d, 0) + 1))
                })
            }),
        ),
        (
            "a file extent pointing past its extent's start",
            "has no extent item",
            Box::new(move |img| {
                let (key, _) = find(img, FS_TREE_OBJECTID, false, |k, d| {
                    k.objectid == big && k.item_type == EXTENT_DATA_KEY && le64(d, 21) != 0
                });
                // disk_bytenr at 21, offset into the extent at 37.
                patch(img, FS_TREE_OBJECTID, key, |d| {
                    let d = set64(d, 21, le64(d, 21) + 4096);
                    Some(set64(&d, 37, le64(&d, 37).saturating_sub(4096)))
                })
            }),
        ),
        (
            "a checksum dropped",
            "[checksums] data",
            Box::new(|img| {
                let (key, _) = find(img, CSUM_TREE_OBJECTID, false, |k, d| {
                    k.item_type == EXTENT_CSUM_KEY && d.len() > 4
                });
                patch(img, CSUM_TREE_OBJECTID, key, |d| {
                    Some(d[..d.len() - 4].to_vec())
                })
            }),
        ),
        (
            "a free space range reaching into used space",
            "[free space] block group",
            Box::new(|img| {
                let (key, _) = find(img, FREE_SPACE_TREE_OBJECTID, true, |k, _| {
                    // Small ranges lie between tree blocks (mkfs leaves
                    // ranges of its own first block groups behind, which
                    // are not checked).
                    k.item_type == FREE_SPACE_EXTENT_KEY && k.offset < 1 << 20
                });
                // Free ranges are maximal: what follows one is in use.
                patch_item(img, FREE_SPACE_TREE_OBJECTID, key, |k, _| {
                    k.offset += 4096;
                    true
                })
            }),
        ),
        (
            "a device extent's length wrong",
            "[chunks] device 1",
            Box::new(|img| {
                let (key, _) = find(img, DEV_TREE_OBJECTID, false, |k, _| {
                    k.item_type == DEV_EXTENT_KEY
                });
                patch(img, DEV_TREE_OBJECTID, key, |d| {
                    Some(set64(d, 24, le64(d, 24) + 65536))
                })
            }),
        ),
        (
            "a subvolume's root backref removed",
            "[root refs] subvolume 256",
            Box::new(|img| {
                patch(
                    img,
                    ROOT_TREE_OBJECTID,
                    Key::new(256, ROOT_BACKREF_KEY, 5),
                    |_| None,
                )
            }),
        ),
    ];
    for (what, expect, damage) in cases {
        let dir = t.mkdir(what.replace(' ', "-")).unwrap();
        let img = dir.join("d.img");
        let cp = Command::new("cp")
            .args(["--sparse=always"])
            .arg(&base)
            .arg(&img)
            .status()
            .unwrap();
        assert!(cp.success());
        damage(&img);
        let imgs = [img];
        let (progs_ok, progs_text) = progs_check(&imgs);
        assert!(
            !progs_ok,
            "{what}: btrfs check found nothing wrong:\n{progs_text}"
        );
        let (ok, text) = our_check(&imgs);
        eprintln!("{what}:\n{text}");
        assert!(
            !ok,
            "{what}: ubtrfs check found nothing (btrfs check:\n{progs_text})"
        );
        assert!(
            text.contains(expect),
            "{what}: ubtrfs check does not say {expect:?}:\n{text}\n(btrfs check:\n{progs_text})"
        );
    }
}

//! Deleting subvolumes and snapshots with the library.
//!
//! The kernel makes an image with 4 KiB nodes: a subvolume with a tree of
//! several levels, reflinked files, a writable snapshot it then changes,
//! a read-only snapshot and a snapshot of the snapshot, a default
//! subvolume, a subvolume holding another, an empty one. The library
//! refuses what the kernel refuses (typed errors), deletes the shared
//! snapshots, removes the empty subvolume with `rmdir`; `btrfs check` is
//! clean and the kernel sees every remaining subvolume exactly as before,
//! writes to it, and check stays clean. Then the origin and its last
//! snapshot go too, and the used space comes back to that of an image made
//! without them.
//!
//! A subvolume deleted while a file in it is held lives on for it, as in
//! the kernel, and goes with the last release, or at the next open after
//! a crash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::xorshift_bytes as bytes;
use testkit::{KernelImageOptions, MkfsOptions, Mount, TestDir, kernel_image};
use ubtrfs::Error;
use ubtrfs::format::Key;
use ubtrfs::format::consts::{ORPHAN_ITEM_KEY, ORPHAN_OBJECTID, ROOT_ITEM_KEY};
use ubtrfs::format::items::RootItem;
use ubtrfs::fs::{Filesystem, InodeId, NewInode};

fn run(cmd: &mut Command) -> String {
    testkit::run(cmd).unwrap_or_else(|e| panic!("{e:#}"))
}

fn check(img: &Path, when: &str) {
    if let Err(e) = testkit::btrfs_check_file(img, &[]) {
        panic!("{when}: {e:#}");
    }
    let report = Filesystem::open_without_log_replay(&[img])
        .unwrap()
        .check(&mut |_| {})
        .unwrap();
    assert!(report.clean(), "{when}: ubtrfs check: {report}");
}

use testkit::compare::dir_contents as tree;

fn opts() -> KernelImageOptions {
    KernelImageOptions {
        mkfs: MkfsOptions {
            nodesize: 4096,
            ..MkfsOptions::default()
        },
        mount_options: "noatime".into(),
    }
}

/// What every image has besides the subvolume `sv` and its snapshots.
fn common(m: &Path) -> std::io::Result<()> {
    std::fs::write(m.join("keep"), bytes(1, 50_000))?;
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("dflt")));
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("outer")));
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("outer/inner")));
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("empty")));
    std::fs::create_dir(m.join("plain"))?;
    let id = run(Command::new("btrfs")
        .args(["inspect-internal", "rootid"])
        .arg(m.join("dflt")));
    run(Command::new("btrfs")
        .args(["subvolume", "set-default", id.trim()])
        .arg(m));
    Ok(())
}

/// The top-level subvolume's root (not the default subvolume's).
fn top(_fs: &Filesystem) -> InodeId {
    InodeId {
        subvol: 5,
        ino: 256,
    }
}

/// The root of the subvolume linked as `name` at the top level.
fn at_top(fs: &Filesystem, name: &[u8]) -> InodeId {
    fs.lookup(top(fs), name).unwrap().id
}

/// The ctransid in subvolume `id`'s root item.
fn ctransid(fs: &Filesystem, id: u64) -> u64 {
    let it = fs
        .root_tree()
        .get_le(&Key::new(id, ROOT_ITEM_KEY, u64::MAX))
        .unwrap()
        .unwrap();
    assert_eq!(it.key().objectid, id);
    RootItem::parse(it.data()).unwrap().ctransid
}

fn used(img: &Path) -> u64 {
    Filesystem::open(&[img]).unwrap().superblock().bytes_used
}

#[test]
fn delete_subvolumes_and_shared_snapshots() {
    testkit::require_privileged!();
    let t = TestDir::new("subvol-delete").unwrap();
    let image = kernel_image(&t.join("img"), &opts(), |m| {
        common(m)?;
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.join("sv")));
        for d in 0..10 {
            std::fs::create_dir(m.join(format!("sv/d{d}")))?;
            for f in 0..100u64 {
                let len = if f % 5 == 0 {
                    9000 + f as usize * 37
                } else {
                    f as usize * 13
                };
                std::fs::write(m.join(format!("sv/d{d}/f{f}")), bytes(d * 1000 + f, len))?;
            }
        }
        run(Command::new("cp")
            .args(["--reflink=always"])
            .arg(m.join("sv/d1/f5"))
            .arg(m.join("sv/d2/reflink")));
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(m.join("sv"))
            .arg(m.join("snap")));
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(m.join("sv"))
            .arg(m.join("ro")));
        // The kernel changes the snapshot (its copies of shared blocks get
        // FULL_BACKREF), then snapshots it.
        for f in (0..100).step_by(7) {
            std::fs::write(m.join(format!("snap/d3/f{f}")), bytes(f, 12_000))?;
        }
        std::fs::remove_file(m.join("snap/d4/f10"))?;
        run(Command::new("cp")
            .args(["--reflink=always"])
            .arg(m.join("snap/d5/f20"))
            .arg(m.join("snap/d6/reflink")));
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(m.join("snap"))
            .arg(m.join("snap2")));
        std::fs::write(m.join("sv/d7/f0"), b"changed in sv")?;
        Ok(())
    })
    .unwrap();
    let img = image.path().to_path_buf();
    let mnt = t.join("mnt");
    check(&img, "of the kernel's image");

    // What the kernel sees before.
    let m = Mount::single(&img, &mnt, "ro,subvolid=5").unwrap();
    let before: BTreeMap<&str, _> = ["sv", "snap2", "keep", "outer", "dflt", "plain"]
        .into_iter()
        .map(|p| {
            let path = m.path().join(p);
            let v = if path.is_dir() {
                tree(&path)
            } else {
                BTreeMap::from([(PathBuf::new(), Some(std::fs::read(&path).unwrap()))])
            };
            (p, v)
        })
        .collect();
    assert!(before["sv"].len() > 1000);
    m.unmount().unwrap();

    {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let root = top(&fs);
        let height = {
            let sv = at_top(&fs, b"snap").subvol;
            let mut top_level = 0;
            fs.tree_by_id(sv)
                .unwrap()
                .walk(&mut |n| {
                    top_level = top_level.max(n.level());
                    Ok(())
                })
                .unwrap();
            top_level
        };
        assert!(
            height >= 2,
            "the snapshot's tree is only {height} levels high"
        );
        // Refusals, with typed errors.
        let e = fs.delete_subvolume(root, b"dflt", false).unwrap_err();
        assert!(matches!(e, Error::NotPermitted(_)), "default: {e}");
        let e = fs.delete_subvolume(root, b"outer", false).unwrap_err();
        assert!(matches!(e, Error::NotEmpty(_)), "nested: {e}");
        let e = fs.delete_subvolume(root, b"plain", false).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "plain directory: {e}");
        let e = fs.delete_subvolume(root, b"keep", false).unwrap_err();
        assert!(matches!(e, Error::NotDir(_)), "file: {e}");
        let e = fs.delete_subvolume(root, b"missing", false).unwrap_err();
        assert!(matches!(e, Error::NotFound(_)), "missing: {e}");
        let sv = at_top(&fs, b"sv");
        let e = fs.delete_subvolume(sv, b"d1", false).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "directory in sv: {e}");
        let e = fs.rmdir(root, b"sv").unwrap_err();
        assert!(matches!(e, Error::NotEmpty(_)), "rmdir of sv: {e}");
        let e = fs.delete_subvolume(root, b"sv", true).unwrap_err();
        assert!(matches!(e, Error::NotEmpty(_)), "only_empty: {e}");
        // A library snapshot leaves its source's ctransid alone, as the
        // kernel does, and goes again.
        let sv_id = sv.subvol;
        let before_ct = ctransid(&fs, sv_id);
        fs.create_snapshot(sv_id, root, b"libsnap", false).unwrap();
        assert_eq!(ctransid(&fs, sv_id), before_ct, "source's ctransid");
        fs.delete_subvolume(root, b"libsnap", false).unwrap();
        // The deletions: shared snapshots, and rmdir of an empty subvolume.
        fs.delete_subvolume(root, b"snap", false).unwrap();
        fs.delete_subvolume(root, b"ro", false).unwrap();
        fs.rmdir(root, b"empty").unwrap();
        assert!(matches!(
            fs.lookup(root, b"snap").unwrap_err(),
            Error::NotFound(_)
        ));
        let names: Vec<String> = fs
            .subvolumes()
            .unwrap()
            .iter()
            .map(|s| String::from_utf8_lossy(&s.name).into_owned())
            .collect();
        for gone in ["snap", "ro", "empty"] {
            assert!(!names.iter().any(|n| n == gone), "{gone} in {names:?}");
        }
    }
    check(&img, "after deleting the snapshots");
    // The UUID tree the kernel vouched for stays vouched for: no rescan.
    let sb = Filesystem::open(&[&img]).unwrap().superblock().clone();
    assert_eq!(sb.uuid_tree_generation, sb.generation);

    let m = Mount::single(&img, &mnt, "subvolid=5").unwrap();
    let p = m.path();
    for (name, want) in &before {
        let path = p.join(name);
        let got = if path.is_dir() {
            tree(&path)
        } else {
            BTreeMap::from([(PathBuf::new(), Some(std::fs::read(&path).unwrap()))])
        };
        assert!(got == *want, "{name} changed by the deletions");
    }
    for gone in ["snap", "ro", "empty"] {
        assert!(!p.join(gone).exists(), "{gone} still there");
    }
    let listed = run(Command::new("btrfs").args(["subvolume", "list"]).arg(p));
    assert!(
        !listed.contains("path snap\n") && !listed.contains("path ro\n"),
        "{listed}"
    );
    // The kernel writes to what is left.
    std::fs::write(p.join("sv/d0/f1"), bytes(99, 30_000)).unwrap();
    std::fs::remove_file(p.join("snap2/d3/f7")).unwrap();
    std::fs::write(p.join("snap2/d8/new"), bytes(98, 20_000)).unwrap();
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(p.join("sv"))
        .arg(p.join("again")));
    m.unmount().unwrap();
    check(&img, "after the kernel's writes");

    // Everything made of `sv` goes: the space comes back.
    {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let root = top(&fs);
        for name in ["again", "snap2", "sv"] {
            fs.delete_subvolume(root, name.as_bytes(), false).unwrap();
        }
    }
    check(&img, "after deleting everything");
    let base = kernel_image(&t.join("base"), &opts(), |m| Ok(common(m)?)).unwrap();
    let (after, want) = (used(&img), used(base.path()));
    assert!(
        after <= want + 256 * 1024,
        "{after} bytes used after deleting, {want} in an image that never had them"
    );
    let m = Mount::single(&img, &mnt, "").unwrap();
    std::fs::write(m.path().join("last"), bytes(5, 100_000)).unwrap();
    m.unmount().unwrap();
    check(&img, "after the kernel's last write");
}

/// `sv` with a snapshot the kernel deletes right before unmounting.
fn make_dead(m: &Path) -> std::io::Result<()> {
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("sv")));
    for i in 0..300 {
        std::fs::write(m.join(format!("sv/f{i}")), bytes(i, 100 + i as usize * 7))?;
    }
    std::fs::write(m.join("sv/big"), bytes(7, 3 << 20))?;
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(m.join("sv"))
        .arg(m.join("snap")));
    std::fs::write(m.join("snap/new"), bytes(8, 70_000))?;
    run(Command::new("sync").arg("-f").arg(m.join("snap/new")));
    // Deleted and unmounted at once: the cleaner has not run.
    run(Command::new("btrfs")
        .args(["subvolume", "delete"])
        .arg(m.join("snap")));
    Ok(())
}

/// The oracle of a deletion the kernel left: a copy of `img` on which the
/// kernel finishes it itself (`btrfs subvolume sync`), and the content of
/// `survivor` (a subvolume that must not change) as the kernel shows it.
fn kernel_finishes_on_a_copy(
    t: &TestDir,
    img: &Path,
    survivor: &str,
) -> (PathBuf, BTreeMap<PathBuf, Option<Vec<u8>>>) {
    let copy = t.join("kernel-cleaned.img");
    std::fs::copy(img, &copy).unwrap();
    let m = Mount::single(&copy, &t.join("mnt"), "subvolid=5").unwrap();
    run(Command::new("btrfs")
        .args(["subvolume", "sync"])
        .arg(m.path()));
    let want = tree(&m.path().join(survivor));
    m.unmount().unwrap();
    (copy, want)
}

/// A snapshot the kernel deleted just before unmounting keeps its root
/// item (refs 0) and an ORPHAN_ITEM: the kernel's cleaner had not dropped
/// it yet. A read-write open drops it as the kernel's next mount would:
/// check is clean, the space comes back as when the kernel finishes the
/// drop itself (`btrfs subvolume sync`), and the origin is untouched.
#[test]
fn a_deletion_the_kernel_left_is_finished_at_open() {
    testkit::require_privileged!();
    let t = TestDir::new("subvol-delete-dead").unwrap();
    let orphan = |img: &Path| -> Option<u64> {
        let fs = Filesystem::open(&[img]).unwrap();
        let it = fs
            .root_tree()
            .items_of(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY)
            .unwrap()
            .next()?
            .unwrap();
        Some(it.key().offset)
    };
    // The kernel's cleaner could in principle win the race to the unmount;
    // the image is made again then (never silently accepted).
    let mut made = None;
    for attempt in 0..3 {
        let img = kernel_image(&t.join(format!("img{attempt}")), &opts(), |m| {
            Ok(make_dead(m)?)
        })
        .unwrap();
        if let Some(id) = orphan(img.path()) {
            made = Some((img, id));
            break;
        }
    }
    let (img, dead) = made.expect("the kernel dropped the snapshot before unmounting, 3 times");
    let img = img.path().to_path_buf();
    {
        let fs = Filesystem::open(&[&img]).unwrap();
        let it = fs
            .root_tree()
            .get_le(&Key::new(dead, ROOT_ITEM_KEY, u64::MAX))
            .unwrap()
            .expect("the dead root's item");
        assert_eq!(it.key().objectid, dead);
        assert_eq!(
            RootItem::parse(it.data()).unwrap().refs,
            0,
            "a deleted subvolume has no refs"
        );
    }
    // The kernel finishing the drop itself, on a copy: the oracle.
    let (copy, want) = kernel_finishes_on_a_copy(&t, &img, "sv");
    let mnt = t.join("mnt");
    assert_eq!(orphan(&copy), None, "the kernel left its orphan item");

    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    fs.commit().unwrap();
    let left = fs
        .root_tree()
        .get_le(&Key::new(dead, ROOT_ITEM_KEY, u64::MAX))
        .unwrap()
        .is_some_and(|it| it.key().objectid == dead);
    assert!(!left, "the dead root's item stays");
    drop(fs);
    assert_eq!(orphan(&img), None, "the orphan item stays");
    check(&img, "after finishing the kernel's deletion");
    let (ours, kernels) = (used(&img), used(&copy));
    assert!(
        ours <= kernels + 64 * 1024,
        "{ours} bytes used after the drop, the kernel's own drop leaves {kernels}"
    );
    let m = Mount::single(&img, &mnt, "subvolid=5").unwrap();
    assert_eq!(tree(&m.path().join("sv")), want, "the origin changed");
    assert!(!m.path().join("snap").exists());
    std::fs::write(m.path().join("sv/after"), bytes(9, 10_000)).unwrap();
    m.unmount().unwrap();
    check(&img, "after the kernel's write");
}

/// `sv` with 40,000 small files, the first half of them rewritten after a
/// snapshot `keep` (so the tree has blocks of its own and blocks it
/// shares), deleted by the kernel, which unmounts `wait` after waking its
/// cleaner: the drop is then often part done.
fn make_half_dropped(m: &Path, wait: std::time::Duration) -> std::io::Result<()> {
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("sv")));
    let files = 40_000usize;
    for i in 0..files {
        std::fs::write(m.join(format!("sv/f{i:05}")), bytes(i as u64, 60))?;
    }
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(m.join("sv"))
        .arg(m.join("keep")));
    for i in 0..files / 2 {
        std::fs::write(m.join(format!("sv/f{i:05}")), bytes(i as u64 + 1, 70))?;
    }
    run(Command::new("btrfs")
        .args(["subvolume", "delete"])
        .arg(m.join("sv")));
    // The commit wakes the cleaner; the unmount stops it where it is.
    run(Command::new("btrfs").args(["filesystem", "sync"]).arg(m));
    std::thread::sleep(wait);
    Ok(())
}

/// A subvolume whose drop the kernel stopped part way (unmounted while its
/// cleaner ran) keeps its root item with the key and level where the drop
/// stopped. A read-write open finishes the drop from there, as the
/// kernel's next mount would: `btrfs check` is clean (nothing dropped
/// twice, nothing left), the space comes back as when the kernel finishes
/// it itself, and the snapshot that shared its blocks is untouched.
#[test]
fn a_drop_the_kernel_left_half_done_is_finished_at_open() {
    testkit::require_privileged!();
    let t = TestDir::new("subvol-delete-half").unwrap();
    let progress = |img: &Path| -> Option<(u64, RootItem)> {
        let fs = Filesystem::open(&[img]).unwrap();
        let orphan = fs
            .root_tree()
            .items_of(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY)
            .unwrap()
            .next()?
            .unwrap()
            .key()
            .offset;
        let it = fs
            .root_tree()
            .get_le(&Key::new(orphan, ROOT_ITEM_KEY, u64::MAX))
            .unwrap()
            .filter(|it| it.key().objectid == orphan)?;
        Some((orphan, RootItem::parse(it.data()).unwrap()))
    };
    // Where the kernel's cleaner stops is a race: the image is made again
    // until a drop is part done (never silently accepted otherwise).
    let waits = [0u64, 0, 20, 5, 50, 0, 10, 100];
    let mut made = None;
    for (attempt, ms) in waits.into_iter().enumerate() {
        let wait = std::time::Duration::from_millis(ms);
        let img = kernel_image(&t.join(format!("img{attempt}")), &opts(), |m| {
            Ok(make_half_dropped(m, wait)?)
        })
        .unwrap();
        match progress(img.path()) {
            Some((id, item)) if item.drop_level > 0 => {
                made = Some((img, id, item));
                break;
            }
            _ => std::fs::remove_file(img.path()).unwrap(),
        }
    }
    let (img, dead, item) = made.expect("no unmount stopped the kernel's drop part way");
    assert_eq!(item.refs, 0, "a deleted subvolume has no refs");
    assert_ne!(item.drop_progress, Key::new(0, 0, 0));
    let img = img.path().to_path_buf();
    // Half dropped, both checks find every reference as it should be.
    check(&img, "as the kernel left its drop, half done");

    // The kernel finishing the drop itself, on a copy: the oracle.
    let (copy, want) = kernel_finishes_on_a_copy(&t, &img, "keep");
    let mnt = t.join("mnt");
    assert!(progress(&copy).is_none(), "the kernel left the dead root");

    let before = used(&img);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    fs.commit().unwrap();
    drop(fs);
    eprintln!(
        "drop stopped at {} level {}: {before} bytes used before the open, {} after",
        item.drop_progress,
        item.drop_level,
        used(&img)
    );
    assert!(
        progress(&img).is_none(),
        "subvolume {dead} (drop stopped at {} level {}) is still there",
        item.drop_progress,
        item.drop_level
    );
    check(&img, "after finishing the kernel's drop");
    // Check proves every reference exact; what differs is the shape of
    // the trees the drop shrank (a few blocks), not megabytes left behind.
    let (ours, kernels) = (used(&img), used(&copy));
    assert!(
        ours <= kernels + 256 * 1024,
        "{ours} bytes used after the drop, the kernel's own drop leaves {kernels}"
    );
    let m = Mount::single(&img, &mnt, "subvolid=5").unwrap();
    assert_eq!(tree(&m.path().join("keep")), want, "the snapshot changed");
    assert!(!m.path().join("sv").exists());
    std::fs::write(m.path().join("keep/after"), bytes(9, 10_000)).unwrap();
    m.unmount().unwrap();
    check(&img, "after the kernel's write");
}

/// Dead roots in the image: (root tree) orphan items of subvolumes.
fn dead_roots(img: &Path) -> usize {
    let out = run(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "root"])
        .arg(img));
    out.lines()
        .filter(|l| l.contains("key (ORPHAN ORPHAN_ITEM"))
        .count()
}

/// A subvolume deleted while a file in it is held (open) goes as the
/// kernel's does: gone from its directory and from the list at once, while
/// its file is still read, written and fsynced; its root is dead (no
/// lookup, no new file there), and a snapshot of it, or a subvolume made
/// in it, is refused (ENOENT).
/// Its tree goes with the last release. A crash before that (the hold
/// never released) leaves a dead root that `btrfs check` accepts and that
/// the next open drops; the kernel reads both images.
#[test]
fn a_subvolume_deleted_in_use_lives_until_its_last_release() {
    testkit::require_privileged!();
    let t = TestDir::new("lib-subvol-delete-in-use").unwrap();
    let image = kernel_image(&t.join("img"), &opts(), |_| Ok(())).unwrap();
    let img = image.path().to_path_buf();
    let file = NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    for crash in [false, true] {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let top = fs.root();
        let v = fs.create_subvolume(top, b"v", 0, 0).unwrap();
        let f = fs.create(v, b"f", file).unwrap().id;
        fs.write(f, 0, &vec![5u8; 200_000]).unwrap();
        fs.commit().unwrap();
        fs.hold_inode(f);
        fs.delete_subvolume(top, b"v", false).unwrap();
        assert!(matches!(fs.lookup(top, b"v"), Err(Error::NotFound(_))));
        assert!(fs.subvolumes().unwrap().is_empty());
        assert_eq!(dead_roots(&img), 1, "the deletion is committed, dead");
        // Still a working subvolume for what holds it.
        assert_eq!(fs.read_all(f).unwrap(), vec![5u8; 200_000]);
        fs.write(f, 100_000, b"later").unwrap();
        fs.fsync(f, false).unwrap();
        // Its root is dead, as in the kernel: no new names.
        assert!(matches!(fs.create(v, b"g", file), Err(Error::NotFound(_))));
        assert!(matches!(fs.lookup(v, b"f"), Err(Error::NotFound(_))));
        assert_eq!(fs.read(f, 100_000, 5).unwrap(), b"later");
        assert!(matches!(
            fs.create_snapshot(v.subvol, top, b"s", false),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            fs.create_subvolume(v, b"inner", 0, 0),
            Err(Error::NotFound(_))
        ));
        fs.commit().unwrap();
        if crash {
            // No release: the process dies holding the file.
            drop(fs);
            check(&img, "with a dead root left by a crash");
            assert_eq!(dead_roots(&img), 1);
            let fs = Filesystem::open_read_write(&[&img]).unwrap();
            assert_eq!(dead_roots(&img), 0, "the next open dropped it");
            assert!(fs.tree_by_id(v.subvol).is_err());
            drop(fs);
        } else {
            fs.release_inode(f).unwrap();
            assert_eq!(dead_roots(&img), 0, "the last release dropped it");
            assert!(fs.tree_by_id(v.subvol).is_err());
            drop(fs);
        }
        check(&img, "after the deleted subvolume went");
        let mnt = t.join("mnt");
        let m = Mount::new(&[&img], &mnt, "").unwrap();
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
        m.unmount().unwrap();
    }
}

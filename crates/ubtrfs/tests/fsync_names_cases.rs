//! fsync of names, case by case: the sequences where a log that holds
//! names as of the wrong moment would lose a file or show it where it
//! never was. Each takes a crash image right after the fsync and opens it
//! with ubtrfs (which replays the log in memory); `btrfs check` must be
//! clean on it, and on the image after ubtrfs' read-write replay.

use std::path::{Path, PathBuf};
use ubtrfs::fs::{Filesystem, InodeId, NewInode};
use ubtrfs::mkfs::{MkfsOptions, make_filesystem_at};
use ubtrfs::tree_log::Synced;

const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};

fn image(t: &testkit::TestDir) -> PathBuf {
    let img = t.path().join("a.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    make_filesystem_at(
        &[&img],
        &MkfsOptions {
            nodesize: 4096,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    img
}

/// The image as a power cut would leave it now, checked; opened with its
/// log replayed in memory.
fn crash(t: &testkit::TestDir, img: &Path, tag: &str) -> Filesystem {
    let c = t.path().join(format!("crash-{tag}.img"));
    std::fs::copy(img, &c).unwrap();
    testkit::btrfs_check_file(&c, &[]).unwrap();
    let rw = t.path().join(format!("replayed-{tag}.img"));
    std::fs::copy(&c, &rw).unwrap();
    Filesystem::open_read_write(&[&rw])
        .unwrap()
        .commit()
        .unwrap();
    testkit::btrfs_check_file(&rw, &[]).unwrap();
    Filesystem::open(&[&c]).unwrap()
}

fn names(fs: &Filesystem, dir: InodeId) -> Vec<String> {
    fs.read_dir(dir, 0)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect()
}

fn read(fs: &Filesystem, path: &str) -> Option<Vec<u8>> {
    fs.resolve_path(path.as_bytes())
        .ok()
        .map(|id| fs.read_all(id).unwrap())
}

/// A file moved out of a directory that is then removed: the replay of
/// the directory's removal must not take the file with it.
#[test]
fn file_moved_out_of_a_removed_directory_survives() {
    let t = testkit::TestDir::new("names-gone-dir").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let d = fs.mkdir(root, b"D", 0o755, 0, 0).unwrap().id;
    let q = fs.mkdir(root, b"Q", 0o755, 0, 0).unwrap().id;
    let g = fs.create(q, b"g", FILE).unwrap().id;
    let c = fs.create(d, b"c", FILE).unwrap().id;
    fs.write(c, 0, b"precious").unwrap();
    fs.commit().unwrap();
    // The root directory is in the log before the move.
    fs.create(root, b"new", FILE).unwrap();
    assert_eq!(fs.fsync(root, false).unwrap(), Synced::Logged);
    fs.rename(d, b"c", q, b"c", 0).unwrap();
    fs.rmdir(root, b"D").unwrap();
    fs.write(g, 0, b"z").unwrap();
    fs.fsync(g, false).unwrap();
    drop(fs);
    let fs = crash(&t, &img, "refresh");
    let found = read(&fs, "/Q/c").or_else(|| read(&fs, "/D/c"));
    assert_eq!(
        found.as_deref(),
        Some(&b"precious"[..]),
        "root: {:?}",
        names(&fs, fs.root())
    );
}

/// The same, with the root directory's own fsync.
#[test]
fn file_moved_out_of_a_removed_directory_survives_its_parents_fsync() {
    let t = testkit::TestDir::new("names-gone-dir-fsync").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let d = fs.mkdir(root, b"D", 0o755, 0, 0).unwrap().id;
    let q = fs.mkdir(root, b"Q", 0o755, 0, 0).unwrap().id;
    let c = fs.create(d, b"c", FILE).unwrap().id;
    fs.write(c, 0, b"precious").unwrap();
    fs.commit().unwrap();
    fs.rename(d, b"c", q, b"c", 0).unwrap();
    fs.rmdir(root, b"D").unwrap();
    fs.fsync(root, false).unwrap();
    drop(fs);
    let fs = crash(&t, &img, "fsync");
    assert_eq!(names(&fs, fs.root()), ["Q"]);
    assert_eq!(read(&fs, "/Q/c").as_deref(), Some(&b"precious"[..]));
}

/// A new file in a directory moved since the commit: it must not show at
/// the directory's old place.
#[test]
fn new_file_in_a_moved_directory_is_not_at_its_old_place() {
    let t = testkit::TestDir::new("names-moved-dir").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let d = fs.mkdir(root, b"D", 0o755, 0, 0).unwrap().id;
    let q = fs.mkdir(root, b"Q", 0o755, 0, 0).unwrap().id;
    fs.commit().unwrap();
    fs.rename(root, b"D", q, b"D2", 0).unwrap();
    let x = fs.create(d, b"x", FILE).unwrap().id;
    fs.write(x, 0, b"data").unwrap();
    fs.fsync(x, false).unwrap();
    drop(fs);
    let fs = crash(&t, &img, "moved");
    assert_eq!(read(&fs, "/D/x"), None, "root: {:?}", names(&fs, fs.root()));
    assert_eq!(read(&fs, "/Q/D2/x").as_deref(), Some(&b"data"[..]));
}

/// The last entry of a directory removed, then a new one made, in a
/// process that had not counted the directory's indexes before: the new
/// entry gets a new index, and a second fsync of the directory logs it.
#[test]
fn entry_after_removing_the_last_one_is_logged() {
    let t = testkit::TestDir::new("names-index").unwrap();
    let img = image(&t);
    {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().id;
        for n in [&b"a"[..], b"b"] {
            fs.create(d, n, FILE).unwrap();
        }
        fs.commit().unwrap();
    }
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let d = fs.resolve_path(b"/d").unwrap();
    // Some log first, so that the removal is recorded against it.
    let other = fs.create(fs.root(), b"o", FILE).unwrap().id;
    assert_eq!(fs.fsync(other, false).unwrap(), Synced::Logged);
    fs.unlink(d, b"b").unwrap();
    assert_eq!(fs.fsync(d, false).unwrap(), Synced::Logged);
    fs.create(d, b"n", FILE).unwrap();
    assert_eq!(fs.fsync(d, false).unwrap(), Synced::Logged);
    drop(fs);
    let fs = crash(&t, &img, "index");
    let d = fs.resolve_path(b"/d").unwrap();
    assert_eq!(names(&fs, d), ["a", "n"]);
}

/// A file logged, then hard-linked elsewhere and its first name removed,
/// then another file fsync'd: the first name must not come back.
#[test]
fn removed_name_of_a_logged_file_stays_removed() {
    let t = testkit::TestDir::new("names-link-unlink").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().id;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().id;
    let f = fs.create(d, b"a", FILE).unwrap().id;
    let g = fs.create(root, b"g", FILE).unwrap().id;
    fs.commit().unwrap();
    fs.write(f, 0, b"x").unwrap();
    assert_eq!(fs.fsync(f, false).unwrap(), Synced::Logged);
    fs.link(f, e, b"b").unwrap();
    fs.unlink(d, b"a").unwrap();
    fs.write(g, 0, b"y").unwrap();
    assert_eq!(fs.fsync(g, false).unwrap(), Synced::Logged);
    drop(fs);
    let fs = crash(&t, &img, "link");
    // Either the log shows f as fsync'd (name a) or as now (name b), never both.
    let (a, b) = (read(&fs, "/d/a"), read(&fs, "/e/b"));
    assert!(a.is_some() != b.is_some(), "d/a {a:?}, e/b {b:?}");
    assert_eq!(read(&fs, "/g").as_deref(), Some(&b"y"[..]));
}

/// A new file in a directory whose parent moved since the commit: it
/// must not show under the parent's old place either.
#[test]
fn new_file_below_a_moved_directory_is_not_at_its_old_place() {
    let t = testkit::TestDir::new("names-moved-parent").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().id;
    let d = fs.mkdir(a, b"D", 0o755, 0, 0).unwrap().id;
    fs.commit().unwrap();
    fs.rename(root, b"A", root, b"B", 0).unwrap();
    let x = fs.create(d, b"x", FILE).unwrap().id;
    fs.write(x, 0, b"data").unwrap();
    fs.fsync(x, false).unwrap();
    let y = fs.create(d, b"y", FILE).unwrap().id;
    fs.fsync(d, false).unwrap();
    drop(fs);
    let fs = crash(&t, &img, "moved-parent");
    assert_eq!(
        read(&fs, "/A/D/x"),
        None,
        "root: {:?}",
        names(&fs, fs.root())
    );
    assert_eq!(read(&fs, "/A/D/y"), None);
    assert_eq!(read(&fs, "/B/D/x").as_deref(), Some(&b"data"[..]));
    let _ = y;
}

/// A file the commit had, in a directory whose parent moved since,
/// rewritten and fsync'd: it is found where it was when fsync'd, not at
/// the directory's old place (where a log of the file alone would leave
/// it).
#[test]
fn old_file_below_a_moved_directory_is_found_where_it_is() {
    let t = testkit::TestDir::new("names-old-file-moved-parent").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().id;
    let d = fs.mkdir(a, b"D", 0o755, 0, 0).unwrap().id;
    let x = fs.create(d, b"x", FILE).unwrap().id;
    fs.write(x, 0, b"old data").unwrap();
    let other = fs.create(root, b"o", FILE).unwrap().id;
    fs.commit().unwrap();
    // An fsync elsewhere logs: the log itself works here.
    fs.write(other, 0, b"o").unwrap();
    assert_eq!(fs.fsync(other, false).unwrap(), Synced::Logged);
    fs.rename(root, b"A", root, b"B", 0).unwrap();
    fs.truncate(x, 0).unwrap();
    fs.write(x, 0, b"new").unwrap();
    assert_eq!(fs.fsync(x, false).unwrap(), Synced::Committed);
    drop(fs);
    let fs = crash(&t, &img, "old-file");
    let mut top = names(&fs, root);
    top.sort();
    assert_eq!(top, ["B", "o"]);
    assert_eq!(read(&fs, "/B/D/x").as_deref(), Some(&b"new"[..]));
}

/// The same with the file's own directory moved.
#[test]
fn old_file_in_a_moved_directory_is_found_where_it_is() {
    let t = testkit::TestDir::new("names-old-file-moved-dir").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().id;
    let q = fs.mkdir(root, b"Q", 0o755, 0, 0).unwrap().id;
    let d = fs.mkdir(a, b"D", 0o755, 0, 0).unwrap().id;
    let x = fs.create(d, b"x", FILE).unwrap().id;
    fs.write(x, 0, b"old data").unwrap();
    fs.commit().unwrap();
    fs.rename(a, b"D", q, b"D", 0).unwrap();
    fs.write(x, 0, b"new").unwrap();
    assert_eq!(fs.fsync(x, false).unwrap(), Synced::Committed);
    drop(fs);
    let fs = crash(&t, &img, "old-file-dir");
    assert_eq!(read(&fs, "/A/D/x"), None);
    assert_eq!(read(&fs, "/Q/D/x").as_deref(), Some(&b"new data"[..]));
}

/// The same with a directory moved above the subvolume the file is in:
/// the walk up goes on past the subvolume's root, from its link.
#[test]
fn old_file_in_a_subvolume_below_a_moved_directory_is_found_where_it_is() {
    let t = testkit::TestDir::new("names-old-file-moved-subvol").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().id;
    let s = fs.create_subvolume(a, b"S", 0, 0).unwrap();
    let d = fs.mkdir(s, b"D", 0o755, 0, 0).unwrap().id;
    let x = fs.create(d, b"x", FILE).unwrap().id;
    fs.write(x, 0, b"old data").unwrap();
    fs.commit().unwrap();
    fs.rename(root, b"A", root, b"B", 0).unwrap();
    fs.write(x, 0, b"new").unwrap();
    assert_eq!(fs.fsync(x, false).unwrap(), Synced::Committed);
    // A directory of the subvolume, fsync'd, the same.
    fs.rename(root, b"B", root, b"C", 0).unwrap();
    fs.create(d, b"y", FILE).unwrap();
    assert_eq!(fs.fsync(d, false).unwrap(), Synced::Committed);
    drop(fs);
    let fs = crash(&t, &img, "old-file-subvol");
    assert_eq!(read(&fs, "/A/S/D/x"), None);
    assert_eq!(read(&fs, "/C/S/D/x").as_deref(), Some(&b"new data"[..]));
    assert_eq!(read(&fs, "/C/S/D/y").as_deref(), Some(&b""[..]));
}

/// Files whose directories did not move are logged, not committed,
/// however deep, beside a directory that moved, in a directory new since
/// the commit, with a second name, in a nested subvolume.
#[test]
fn files_in_unmoved_directories_are_logged() {
    let t = testkit::TestDir::new("names-unmoved-logged").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().id;
    let b = fs.mkdir(a, b"B", 0o755, 0, 0).unwrap().id;
    let c = fs.mkdir(b, b"C", 0o755, 0, 0).unwrap().id;
    fs.mkdir(a, b"moving", 0o755, 0, 0).unwrap();
    let deep = fs.create(c, b"deep", FILE).unwrap().id;
    let linked = fs.create(b, b"linked", FILE).unwrap().id;
    fs.link(linked, c, b"second").unwrap();
    let s = fs.create_subvolume(b, b"S", 0, 0).unwrap();
    let in_sub = fs.create(s, b"f", FILE).unwrap().id;
    fs.commit().unwrap();
    fs.rename(a, b"moving", root, b"moved", 0).unwrap();
    let fresh = fs.mkdir(c, b"fresh", 0o755, 0, 0).unwrap().id;
    let new = fs.create(fresh, b"new", FILE).unwrap().id;
    for (what, id) in [
        ("deep", deep),
        ("linked", linked),
        ("new", new),
        ("in the subvolume", in_sub),
    ] {
        fs.write(id, 0, what.as_bytes()).unwrap();
        assert_eq!(fs.fsync(id, false).unwrap(), Synced::Logged, "{what}");
    }
    drop(fs);
    let fs = crash(&t, &img, "unmoved");
    assert_eq!(read(&fs, "/A/B/C/deep").as_deref(), Some(&b"deep"[..]));
    assert_eq!(read(&fs, "/A/B/C/second").as_deref(), Some(&b"linked"[..]));
    assert_eq!(read(&fs, "/A/B/C/fresh/new").as_deref(), Some(&b"new"[..]));
    assert_eq!(
        read(&fs, "/A/B/S/f").as_deref(),
        Some(&b"in the subvolume"[..])
    );
}

/// A directory fsync takes the new directories below it with it, and
/// theirs: their files come back (empty, as in the kernel's log, unless
/// fsync'd themselves), though nobody fsync'd those directories.
#[test]
fn new_subdirectories_come_with_their_parents_fsync() {
    let t = testkit::TestDir::new("names-new-subdirs").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().id;
    fs.commit().unwrap();
    let s = fs.mkdir(d, b"s", 0o755, 0, 0).unwrap().id;
    let f = fs.create(s, b"f", FILE).unwrap().id;
    fs.write(f, 0, b"in s").unwrap();
    assert_eq!(fs.fsync(f, false).unwrap(), Synced::Logged);
    let u = fs.mkdir(s, b"u", 0o755, 0, 0).unwrap().id;
    fs.create(u, b"g", FILE).unwrap();
    assert_eq!(fs.fsync(d, false).unwrap(), Synced::Logged);
    drop(fs);
    let fs = crash(&t, &img, "first");
    assert_eq!(names(&fs, fs.resolve_path(b"/d/s").unwrap()), ["f", "u"]);
    assert_eq!(read(&fs, "/d/s/f").as_deref(), Some(&b"in s"[..]));
    assert_eq!(read(&fs, "/d/s/u/g").as_deref(), Some(&b""[..]));
    drop(fs);

    // Later in the same transaction: a new entry deep below, a removed
    // one, and the parent's fsync again; the log must follow.
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let d = fs.resolve_path(b"/d").unwrap();
    fs.commit().unwrap();
    let s = fs.mkdir(d, b"s2", 0o755, 0, 0).unwrap().id;
    let u = fs.mkdir(s, b"u", 0o755, 0, 0).unwrap().id;
    fs.create(u, b"a", FILE).unwrap();
    assert_eq!(fs.fsync(d, false).unwrap(), Synced::Logged);
    fs.create(u, b"b", FILE).unwrap();
    fs.unlink(u, b"a").unwrap();
    let w = fs.mkdir(u, b"w", 0o755, 0, 0).unwrap().id;
    fs.create(w, b"c", FILE).unwrap();
    assert_eq!(fs.fsync(d, false).unwrap(), Synced::Logged);
    drop(fs);
    let fs = crash(&t, &img, "again");
    assert_eq!(names(&fs, fs.resolve_path(b"/d/s2/u").unwrap()), ["b", "w"]);
    assert_eq!(names(&fs, fs.resolve_path(b"/d/s2/u/w").unwrap()), ["c"]);
}

/// Data written into a chunk added in the running transaction: a log
/// naming it could not be replayed (the replay finds chunks in the
/// committed chunk tree only), so the fsync commits.
#[test]
fn fsync_after_a_new_chunk_commits() {
    let t = testkit::TestDir::new("names-new-chunk").unwrap();
    let img = image(&t);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let root = fs.root();
    let small = fs.create(root, b"small", FILE).unwrap().id;
    fs.write(small, 0, b"first").unwrap();
    fs.commit().unwrap();
    assert_eq!(fs.fsync(small, false).unwrap(), Synced::Nothing);
    fs.write(small, 0, b"again").unwrap();
    assert_eq!(fs.fsync(small, false).unwrap(), Synced::Logged);
    // More data than the data chunks mkfs made can hold.
    let free = fs.statfs().free_bytes;
    let big = fs.create(root, b"big", FILE).unwrap().id;
    let data = testkit::xorshift_bytes(5, (free as usize / 2).max(64 << 20));
    for (i, c) in data.chunks(1 << 20).enumerate() {
        fs.write(big, (i << 20) as u64, c).unwrap();
    }
    assert_eq!(fs.fsync(big, false).unwrap(), Synced::Committed);
    drop(fs);
    let fs = crash(&t, &img, "new-chunk");
    assert!(read(&fs, "/big").unwrap() == data);
    assert_eq!(read(&fs, "/small").as_deref(), Some(&b"again"[..]));
}

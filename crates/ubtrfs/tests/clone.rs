//! Reflinks through the library (`Filesystem::clone_range`), checked
//! against a model of every file's bytes, by `btrfs check`, and by the
//! kernel: whole files, partial ranges, the same file at another offset,
//! over existing data, past the destination's end, compressed extents,
//! inline sources (copied), preallocated extents, data not yet written
//! back, no-COW files, and the refusals of btrfs's rules. Then the kernel
//! changes the clones and the image must stay consistent. Run on an image
//! with the no-holes feature and on one with explicit hole extents.

use std::collections::BTreeMap;
use std::path::Path;
use testkit::*;
use ubtrfs::Error;
use ubtrfs::data::FALLOC_FL_KEEP_SIZE;
use ubtrfs::data::compression::Compression;
use ubtrfs::format::consts::{EXTENT_DATA_KEY, INODE_NODATACOW, INODE_NODATASUM};
use ubtrfs::format::items::{ExtentBody, FileExtentItem};
use ubtrfs::fs::{Filesystem, InodeId, NewInode};

const K: u64 = 1024;

/// Deterministic pseudo-random bytes.
fn pattern(len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Bytes that compress well but are not all alike.
fn text(len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| b"the quick brown fox jumps over "[(i % 31) as usize] ^ ((i / 4096) as u8 & 1))
        .collect()
}

/// The library and a model of what every file holds.
struct Fixture<'a> {
    fs: &'a Filesystem,
    model: BTreeMap<&'static str, Vec<u8>>,
}

impl<'a> Fixture<'a> {
    fn file(&mut self, name: &'static str) -> InodeId {
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        self.model.insert(name, Vec::new());
        self.fs
            .create(self.fs.root(), name.as_bytes(), new)
            .unwrap()
            .id
    }

    fn id(&self, name: &str) -> InodeId {
        self.fs.lookup(self.fs.root(), name.as_bytes()).unwrap().id
    }

    fn write(&mut self, name: &'static str, at: u64, data: &[u8]) {
        self.fs.write(self.id(name), at, data).unwrap();
        let m = self.model.get_mut(name).unwrap();
        put(m, at, data);
    }

    /// Clone in the library and in the model.
    fn clone(&mut self, src: &'static str, so: u64, dst: &'static str, d_o: u64, len: u64) {
        self.fs
            .clone_range(self.id(src), so, self.id(dst), d_o, len)
            .unwrap_or_else(|e| panic!("clone {src}@{so} -> {dst}@{d_o} ({len}): {e}"));
        let s = &self.model[src];
        let len = if len == 0 { s.len() as u64 - so } else { len };
        let bytes = s[so as usize..(so + len) as usize].to_vec();
        put(self.model.get_mut(dst).unwrap(), d_o, &bytes);
    }

    /// A clone that must be refused as invalid, changing nothing.
    fn refuse(&self, src: &str, so: u64, dst: &str, d_o: u64, len: u64) {
        match self
            .fs
            .clone_range(self.id(src), so, self.id(dst), d_o, len)
        {
            Err(Error::Invalid(_)) => {}
            other => panic!("clone {src}@{so} -> {dst}@{d_o} ({len}): {other:?}"),
        }
    }

    /// Every file reads as the model says, through the library.
    fn verify(&self, when: &str) {
        for (name, want) in &self.model {
            let got = self.fs.read_all(self.id(name)).unwrap();
            assert!(
                got == *want,
                "{when}: {name} differs ({} bytes, want {})",
                got.len(),
                want.len()
            );
        }
    }

    /// (file offset, disk bytenr, compression) of the extents of `name`.
    fn extents(&self, name: &str) -> Vec<(u64, u64, u8)> {
        let id = self.id(name);
        self.fs
            .tree_by_id(id.subvol)
            .unwrap()
            .items_of(id.ino, EXTENT_DATA_KEY)
            .unwrap()
            .map(|it| {
                let it = it.unwrap();
                let fe = FileExtentItem::parse(it.data()).unwrap();
                let disk = match fe.body {
                    ExtentBody::Regular { disk_bytenr, .. } => disk_bytenr,
                    ExtentBody::Inline(_) => u64::MAX,
                };
                (it.key().offset, disk, fe.compression)
            })
            .collect()
    }
}

/// `data` written into `m` at `at`, growing it with zeros.
fn put(m: &mut Vec<u8>, at: u64, data: &[u8]) {
    let end = at as usize + data.len();
    if m.len() < end {
        m.resize(end, 0);
    }
    m[at as usize..end].copy_from_slice(data);
}

/// Every file of the model, and nothing else, in directory `dir`.
fn assert_dir(when: &str, dir: &Path, model: &BTreeMap<&'static str, Vec<u8>>) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want: Vec<String> = model.keys().map(|s| s.to_string()).collect();
    assert_eq!(names, want, "{when}: names");
    for (name, data) in model {
        let got = std::fs::read(dir.join(name)).unwrap();
        assert!(
            got == *data,
            "{when}: {name} differs ({} bytes, want {})",
            got.len(),
            data.len()
        );
    }
}

/// `btrfs check --readonly` finds no error.
fn check(img: &Path) {
    if let Err(e) = run(command("btrfs").args(["check", "--readonly"]).arg(img)) {
        panic!("btrfs check {}: {e:#}", img.display());
    }
}

fn clones_reach_the_kernel(features: &[&str]) {
    require_privileged!();
    let tag = if features.is_empty() {
        "holes"
    } else {
        "no-no-holes"
    };
    let t = TestDir::new(&format!("clone-{tag}")).unwrap();
    let img = t.join("disk.img");
    let opts = MkfsOptions {
        device_size: 300 << 20,
        features: features.iter().map(|s| s.to_string()).collect(),
        ..MkfsOptions::default()
    };
    mkfs(std::slice::from_ref(&img), &opts, None).unwrap();

    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let mut f = Fixture {
        fs: &fs,
        model: BTreeMap::new(),
    };
    // Sources, committed: data, a hole, data ending in a partial sector.
    f.file("a");
    f.write("a", 0, &pattern(1 << 20, 1));
    f.write("a", 2 << 20, &pattern(512 * K + 1000, 2));
    f.file("small");
    f.write("small", 0, &pattern(100, 3));
    f.file("over");
    f.write("over", 0, &pattern(512 * K, 4));
    fs.set_compression(Some((Compression::Zstd, None))).unwrap();
    f.file("comp");
    f.write("comp", 0, &text(512 * K));
    // Compression is chosen at writeback.
    fs.commit().unwrap();
    fs.set_compression(None).unwrap();
    f.file("pre");
    fs.fallocate(f.id("pre"), 0, 0, 256 * K).unwrap();
    f.model.insert("pre", vec![0; 256 * K as usize]);
    f.write("pre", 64 * K, &pattern(4 * K, 5));
    fs.fallocate(f.id("pre"), FALLOC_FL_KEEP_SIZE, 256 * K, 64 * K)
        .unwrap();
    f.file("nc");
    fs.set_flags(f.id("nc"), INODE_NODATACOW).unwrap();
    f.write("nc", 0, &pattern(256 * K, 6));
    f.file("nds");
    fs.set_flags(f.id("nds"), INODE_NODATASUM).unwrap();
    f.write("nds", 0, &pattern(8 * K, 7));
    fs.commit().unwrap();

    // A whole file: length 0 means up to the end of the source.
    f.file("whole");
    f.clone("a", 0, "whole", 0, 0);
    let (a, whole) = (f.extents("a"), f.extents("whole"));
    assert_eq!(whole, a, "the clone points at the same extents");
    // Partial ranges, the second past the destination's end.
    f.file("part");
    f.clone("a", 64 * K, "part", 0, 192 * K);
    f.clone("a", 2 << 20, "part", 1 << 20, 64 * K);
    // Within one file, past its end; overlapping ranges are refused.
    f.clone("a", 0, "a", 4 << 20, 128 * K);
    f.refuse("a", 0, "a", 64 * K, 128 * K);
    // Over existing data, and again over a range already shared.
    f.clone("a", 0, "over", 128 * K, 128 * K);
    f.clone("a", 0, "whole", 0, 128 * K);
    f.clone("whole", 256 * K, "over", 384 * K, 64 * K);
    // Compressed extents, cut inside.
    f.file("comp_part");
    f.clone("comp", 4 * K, "comp_part", 8 * K, 200 * K);
    assert!(
        f.extents("comp_part").iter().any(|&(_, _, c)| c != 0),
        "compressed extents stay compressed"
    );
    // An inline source is copied: inline again in a small file, into an
    // extent further on.
    f.file("small_copy");
    f.clone("small", 0, "small_copy", 0, 0);
    assert_eq!(f.extents("small_copy")[0].1, u64::MAX, "inline");
    f.file("small_far");
    f.clone("small", 0, "small_far", 64 * K, 100);
    // Preallocated extents.
    f.file("pre_copy");
    f.clone("pre", 0, "pre_copy", 0, 256 * K);
    // Data written but not yet in extents.
    f.file("fresh");
    f.write("fresh", 0, &pattern(100_000, 8));
    f.file("fresh_copy");
    f.clone("fresh", 0, "fresh_copy", 0, 0);
    // No-COW: the source is then rewritten, and the clone must keep its bytes.
    f.file("nc2");
    fs.set_flags(f.id("nc2"), INODE_NODATACOW).unwrap();
    f.clone("nc", 0, "nc2", 0, 0);
    f.write("nc", 4 * K, &pattern(8 * K, 9));
    fs.commit().unwrap();
    // The rules.
    f.refuse("a", 100, "part", 0, 4096);
    f.refuse("a", 0, "part", 100, 4096);
    f.refuse("a", 0, "part", 0, 5000);
    f.refuse("a", 0, "part", 0, 8 << 20);
    f.refuse("small", 0, "over", 0, 0);
    f.refuse("a", 0, "nds", 0, 4096);
    match fs.clone_range(fs.root(), 0, f.id("part"), 0, 4096) {
        Err(Error::IsDir(_)) => {}
        other => panic!("clone of a directory: {other:?}"),
    }
    f.verify("before the commit");
    fs.commit().unwrap();
    f.verify("after the commit");
    let model = f.model;
    drop(fs);

    check(&img);
    let fs = Filesystem::open(&[&img]).unwrap();
    Fixture {
        fs: &fs,
        model: model.clone(),
    }
    .verify("reopened");
    drop(fs);
    {
        let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
        assert_dir("the kernel's view", k.path(), &model);
    }

    // The kernel changes the clones: copy-on-write of shared extents,
    // appends, truncates, deletion of a source.
    let mut model = model;
    {
        let k = Mount::single(&img, &t.join("kernel"), "rw").unwrap();
        let p = |n: &str| k.path().join(n);
        let patch = pattern(10_000, 10);
        {
            use std::os::unix::fs::FileExt;
            let w = std::fs::OpenOptions::new()
                .write(true)
                .open(p("whole"))
                .unwrap();
            w.write_all_at(&patch, 5000).unwrap();
            let c = std::fs::OpenOptions::new()
                .write(true)
                .open(p("comp_part"))
                .unwrap();
            c.write_all_at(&patch, 50 * K).unwrap();
        }
        put(model.get_mut("whole").unwrap(), 5000, &patch);
        put(model.get_mut("comp_part").unwrap(), 50 * K, &patch);
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(p("part"))
            .unwrap()
            .write_all(b"appended")
            .unwrap();
        model
            .get_mut("part")
            .unwrap()
            .extend_from_slice(b"appended");
        std::fs::OpenOptions::new()
            .write(true)
            .open(p("over"))
            .unwrap()
            .set_len(100_000)
            .unwrap();
        model.get_mut("over").unwrap().truncate(100_000);
        std::fs::remove_file(p("a")).unwrap();
        model.remove("a");
        k.unmount().unwrap();
    }
    check(&img);
    let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_dir("after the kernel's changes", k.path(), &model);
}

#[test]
fn clones_no_holes() {
    clones_reach_the_kernel(&[]);
}

#[test]
fn clones_explicit_holes() {
    clones_reach_the_kernel(&["^no-holes"]);
}

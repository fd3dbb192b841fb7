//! Metadata fuzzing of the read path.
//!
//! A corpus image (nodesize 4096, single profiles) holds inline, regular,
//! compressed (zlib, LZO, zstd), sparse, preallocated and partly
//! overwritten files, xattrs, symlinks, hard links and deep directories.
//! Each iteration damages 1-8 bytes of one or two tree blocks taken from
//! `dump-tree`'s list, on an in-memory copy of the image, then opens the
//! filesystem and walks all of it under `catch_unwind`.
//!
//! Two modes:
//! - **checksum kept bad**: the damaged block fails verification, so every
//!   answer the library gives must be exactly the original, and every error
//!   must be `BadTreeBlock` naming a damaged block; a damaged block of a
//!   tree the read path walks must be reported.
//! - **checksum recomputed**: the damage passes the checksum and only
//!   structural validation stands between it and the reader. The content
//!   may legitimately change; the walk must not panic or hang (it is
//!   bounded: a visited set against directory loops, caps on entries and
//!   bytes, and a watchdog per iteration).
//!
//! In both modes, damage to a tree the read path never reads (extent, dev,
//! free-space, uuid, data-reloc trees) must change nothing.
//!
//! The kernel lays the corpus out a little differently on every build, so
//! a failing run keeps its corpus image and says where; reproduce a case
//! with `UBTRFS_FUZZ_IMAGE=<that image> UBTRFS_FUZZ_SEED=<seed>`. Change
//! the amount of work with `UBTRFS_FUZZ_ITERS=<iterations per mode>`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::Mount;
use ubtrfs::device::{Counters, Device};
use ubtrfs::fs::{FileKind, Filesystem, InodeId};
use ubtrfs::volume::DeviceSet;
use ubtrfs::{Error, Result};

const NODESIZE: usize = 4096;
const IMAGE_SIZE: u64 = 128 << 20;
/// Iterations per mode unless `UBTRFS_FUZZ_ITERS` says otherwise.
const DEFAULT_ITERS: u64 = 2500;
/// Bounds of one walk in the recomputed-checksum mode.
const MAX_ENTRIES: usize = 20_000;
const MAX_READ: u64 = 8 << 20;
/// An iteration running longer than this is a hang.
const HANG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A memory-backed device: the pristine image plus patched blocks.

struct MemDevice {
    base: Arc<Vec<u8>>,
    patches: Patches,
    path: PathBuf,
    counters: Counters,
}

impl Device for MemDevice {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.base.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size())
            .ok_or_else(|| Error::ShortRead {
                path: self.path.clone(),
                offset,
                len: buf.len(),
                size: self.size(),
            })?;
        buf.copy_from_slice(&self.base[offset as usize..end as usize]);
        for (at, bytes) in &self.patches {
            let (lo, hi) = ((*at).max(offset), (at + bytes.len() as u64).min(end));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, _: u64, _: &[u8]) -> Result<()> {
        Err(Error::Unsupported("read-only test device".into()))
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn write_fua(&self, _: u64, _: &[u8]) -> Result<()> {
        Err(Error::Unsupported("read-only test device".into()))
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

// ---------------------------------------------------------------------------
// Deterministic randomness.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let words = ["btrfs ", "extent ", "checksum ", "tree ", "leaf ", "node\n"];
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(words[r.below(words.len() as u64) as usize].as_bytes());
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------
// The corpus.

/// Extended attributes as (name, value) pairs.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Patches to apply over the image: (device offset, bytes).
type Patches = Vec<(u64, Vec<u8>)>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    File(Vec<u8>),
    Link(Vec<u8>),
    /// Sorted child names.
    Dir(Vec<Vec<u8>>),
}

/// One tree block of the corpus.
#[derive(Clone, Debug)]
struct Block {
    logical: u64,
    physical: u64,
    /// dump-tree's owner label.
    owner: String,
}

impl Block {
    /// Whether the read path reads this tree at all.
    fn read_path_uses(&self) -> bool {
        matches!(
            self.owner.as_str(),
            "ROOT_TREE" | "CHUNK_TREE" | "FS_TREE" | "CSUM_TREE"
        )
    }
}

struct Corpus {
    image: Arc<Vec<u8>>,
    /// Every path as the kernel showed it, and its xattrs (sorted).
    paths: BTreeMap<String, Want>,
    xattrs: BTreeMap<String, Xattrs>,
    blocks: Vec<Block>,
    /// Logical address of the root tree's root block.
    root_tree: u64,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write(root: &Path, rel: &str, data: &[u8]) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, data).unwrap();
    p
}

/// The tree `mkfs.btrfs --rootdir` copies.
fn source_tree(root: &Path) {
    std::fs::create_dir_all(root.join("empty_dir")).unwrap();
    for i in 0..160u64 {
        let len = [0usize, 1, 17, 100, 700, 2000, 2047, 2048, 3000, 4095][i as usize % 10];
        write(root, &format!("many/f{i:03}"), &bytes(i, len));
    }
    for (i, len) in [4096usize, 4097, 12_345, 65_536, 200_000]
        .iter()
        .enumerate()
    {
        write(
            root,
            &format!("regular/r{i}"),
            &bytes(1000 + i as u64, *len),
        );
    }
    write(root, "deep/a/b/c/d/e/f/leaf", b"at the bottom\n");
    write(root, "text/t", &text(5, 50_000));
    for (i, (name, value)) in [
        ("user.short", b"v".to_vec()),
        ("user.medium", text(6, 200)),
        ("user.long", bytes(7, 1500)),
    ]
    .iter()
    .enumerate()
    {
        let target = if i == 2 { "regular/r1" } else { "many/f001" };
        testkit::sys::set_xattr(&root.join(target), name, value).unwrap();
        testkit::sys::set_xattr(&root.join("deep/a"), name, value).unwrap();
    }
    std::fs::create_dir_all(root.join("links")).unwrap();
    std::os::unix::fs::symlink("../regular/r0", root.join("links/to_r0")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", root.join("links/dangling")).unwrap();
    std::os::unix::fs::symlink("x".repeat(300), root.join("links/long")).unwrap();
    std::os::unix::fs::symlink("/", root.join("links/root")).unwrap();
    std::fs::hard_link(root.join("regular/r2"), root.join("links/hard_r2")).unwrap();
    std::fs::hard_link(root.join("many/f005"), root.join("deep/a/hard_f005")).unwrap();
}

/// Files the kernel adds: compressed, sparse, preallocated, overwritten.
fn kernel_files(mnt: &Path) {
    for alg in ["zlib", "lzo", "zstd"] {
        let d = mnt.join("comp").join(alg);
        std::fs::create_dir_all(&d).unwrap();
        run(Command::new("btrfs")
            .args(["property", "set"])
            .arg(&d)
            .args(["compression", alg]));
        write(&d, "inline", &text(20, 1500));
        write(&d, "big", &text(21, 300_000));
        let mut mixed = text(22, 100_000);
        mixed.extend(bytes(23, 50_000));
        mixed.extend(text(24, 100_000));
        write(&d, "mixed", &mixed);
        // Overwrite the middle: extents referenced from an offset.
        let p = write(&d, "patched", &text(25, 262_144));
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &bytes(26, 8192), 100_000).unwrap();
    }
    let sparse = mnt.join("misc/sparse");
    std::fs::create_dir_all(sparse.parent().unwrap()).unwrap();
    let f = std::fs::File::create(&sparse).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes(30, 5000), 1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes(31, 100), 3 << 20).unwrap();
    let f = std::fs::File::create(mnt.join("misc/prealloc")).unwrap();
    testkit::sys::fallocate(&f, 0, 0, 256 * 1024).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes(32, 10_000), 50_000).unwrap();
    let p = write(mnt, "misc/overwritten", &bytes(33, 200_000));
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes(34, 3000), 70_001).unwrap();
}

/// What the kernel shows under `mnt`: every path and its xattrs.
fn snapshot(mnt: &Path) -> (BTreeMap<String, Want>, BTreeMap<String, Xattrs>) {
    use std::os::unix::ffi::OsStrExt;
    let mut paths = BTreeMap::new();
    let mut xattrs = BTreeMap::new();
    let mut queue = VecDeque::from([(mnt.to_path_buf(), "/".to_string())]);
    while let Some((real, path)) = queue.pop_front() {
        let meta = std::fs::symlink_metadata(&real).unwrap();
        let want = if meta.is_dir() {
            let mut names = Vec::new();
            for e in std::fs::read_dir(&real).unwrap() {
                let e = e.unwrap();
                let name = e.file_name();
                let child = if path == "/" {
                    format!("/{}", name.to_str().unwrap())
                } else {
                    format!("{path}/{}", name.to_str().unwrap())
                };
                queue.push_back((e.path(), child));
                names.push(name.as_bytes().to_vec());
            }
            names.sort();
            Want::Dir(names)
        } else if meta.file_type().is_symlink() {
            Want::Link(
                std::fs::read_link(&real)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            )
        } else {
            Want::File(std::fs::read(&real).unwrap())
        };
        let mut x: Vec<(Vec<u8>, Vec<u8>)> = testkit::sys::xattrs(&real)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v))
            .collect();
        x.sort();
        xattrs.insert(path.clone(), x);
        paths.insert(path, want);
    }
    (paths, xattrs)
}

/// Every tree block dump-tree lists: (logical, owner).
fn tree_blocks(img: &Path) -> Vec<(u64, String)> {
    let out = run(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree"])
        .arg(img));
    let mut seen = HashSet::new();
    let mut blocks = Vec::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (addr, owner) = match w.as_slice() {
            ["leaf", addr, "items", .., "owner", owner] => (addr, owner),
            ["node", addr, "level", .., "owner", owner] => (addr, owner),
            _ => continue,
        };
        let logical: u64 = addr.parse().unwrap();
        if seen.insert(logical) {
            blocks.push((logical, owner.to_string()));
        }
    }
    blocks
}

fn build_corpus(dir: &Path) -> Corpus {
    let root = dir.join("root");
    source_tree(&root);
    let img = dir.join("corpus.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(IMAGE_SIZE)
        .unwrap();
    run(Command::new("mkfs.btrfs")
        .args([
            "-q", "-f", "-n", "4096", "-m", "single", "-d", "single", "-r",
        ])
        .arg(&root)
        .arg(&img));
    let mnt = dir.join("mnt");
    let m = Mount::single(&img, &mnt, "").expect("the kernel mounts the corpus");
    kernel_files(&mnt);
    testkit::sys::syncfs(&mnt).unwrap();
    let (paths, xattrs) = snapshot(&mnt);
    m.unmount().expect("unmount");
    load_corpus(&img, Some((paths, xattrs)))
}

/// The corpus in `img`, with the expected content given (from the kernel)
/// or, for a saved corpus, read by the library from the pristine image
/// (which the kernel's view was checked against when it was built).
fn load_corpus(
    img: &Path,
    expected: Option<(BTreeMap<String, Want>, BTreeMap<String, Xattrs>)>,
) -> Corpus {
    let fs = Filesystem::open(&[img]).expect("the pristine corpus opens");
    let (paths, xattrs) = expected.unwrap_or_else(|| library_snapshot(&fs));
    let blocks: Vec<Block> = tree_blocks(img)
        .into_iter()
        .map(|(logical, owner)| {
            let chunk = fs.tree_reader().volume().chunks.lookup(logical).unwrap();
            assert_eq!(chunk.num_copies(), 1);
            Block {
                logical,
                physical: chunk.map(logical, NODESIZE, 0).unwrap().physical,
                owner,
            }
        })
        .collect();
    for kind in [
        "ROOT_TREE",
        "CHUNK_TREE",
        "FS_TREE",
        "CSUM_TREE",
        "EXTENT_TREE",
    ] {
        assert!(blocks.iter().any(|b| b.owner == kind), "no {kind} block");
    }
    let corpus = Corpus {
        image: Arc::new(std::fs::read(img).unwrap()),
        paths,
        xattrs,
        blocks,
        root_tree: fs.superblock().root,
    };
    // The pristine corpus reads back exactly.
    let fs = open_mem(&corpus, Vec::new()).expect("open from memory");
    let mut walk = Walk::new(&corpus, true, HashSet::new());
    walk.run(&fs);
    assert!(
        walk.problems.is_empty() && walk.errors == 0,
        "pristine corpus: {:?}",
        walk.problems
    );
    corpus
}

/// What the library reads from `fs`: every path and its xattrs.
fn library_snapshot(fs: &Filesystem) -> (BTreeMap<String, Want>, BTreeMap<String, Xattrs>) {
    let mut paths = BTreeMap::new();
    let mut xattrs = BTreeMap::new();
    let mut queue = VecDeque::from([(fs.root(), "/".to_string())]);
    while let Some((id, path)) = queue.pop_front() {
        let st = fs.stat(id).unwrap();
        let want = match st.kind {
            FileKind::Dir => {
                let mut names = Vec::new();
                for e in fs.read_dir(id, 0).unwrap() {
                    let name = String::from_utf8(e.name.clone()).unwrap();
                    queue.push_back((e.id, format!("{}/{name}", path.trim_end_matches('/'))));
                    names.push(e.name);
                }
                names.sort();
                Want::Dir(names)
            }
            FileKind::Symlink => Want::Link(fs.read_link(id).unwrap()),
            _ => Want::File(fs.read_all(id).unwrap()),
        };
        let mut x = fs.xattrs(id).unwrap();
        x.sort();
        xattrs.insert(path.clone(), x);
        paths.insert(path, want);
    }
    (paths, xattrs)
}

fn open_mem(corpus: &Corpus, patches: Patches) -> Result<Filesystem> {
    let dev = MemDevice {
        base: corpus.image.clone(),
        patches,
        path: PathBuf::from("corpus.img"),
        counters: Counters::default(),
    };
    Filesystem::from_device_set(DeviceSet::from_devices(vec![Arc::new(dev)])?)
}

// ---------------------------------------------------------------------------
// Walking the filesystem.

struct Walk<'a> {
    corpus: &'a Corpus,
    /// Whether every answer must be the original (checksum kept bad).
    strict: bool,
    /// Blocks whose damage makes them fail verification.
    bad_blocks: HashSet<u64>,
    errors: usize,
    /// Answers that differ from the corpus (problems in strict mode).
    diffs: usize,
    problems: Vec<String>,
    entries: usize,
    read: u64,
}

impl<'a> Walk<'a> {
    fn new(corpus: &'a Corpus, strict: bool, bad_blocks: HashSet<u64>) -> Self {
        Walk {
            corpus,
            strict,
            bad_blocks,
            errors: 0,
            diffs: 0,
            problems: Vec::new(),
            entries: 0,
            read: 0,
        }
    }

    fn problem(&mut self, msg: String) {
        self.diffs += 1;
        if self.strict && self.problems.len() < 10 {
            self.problems.push(msg);
        }
    }

    /// Note an error; in strict mode it must name a damaged block.
    fn error(&mut self, what: &str, e: &Error) {
        self.errors += 1;
        let named =
            matches!(e, Error::BadTreeBlock { logical, .. } if self.bad_blocks.contains(logical));
        if !named && self.strict {
            self.problem(format!("{what}: unexpected error {e:?}"));
        }
    }

    fn check<T>(&mut self, what: &str, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.error(what, &e);
                None
            }
        }
    }

    fn same<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: &T, want: &T) {
        if got != want {
            self.problem(format!(
                "{what}: wrong answer: {} where {} was due",
                short_debug(got, 200),
                short_debug(want, 200)
            ));
        }
    }

    /// Read up to `MAX_READ` bytes of `id`, as a caller without trust in
    /// the size would.
    fn content(&mut self, fs: &Filesystem, id: InodeId, size: u64) -> Result<Vec<u8>> {
        let len = size.min(MAX_READ).min(MAX_READ.saturating_sub(self.read));
        self.read += len;
        let data = fs.read(id, 0, len as usize)?;
        if size == len && size < (1 << 20) {
            // read_all too, when it is cheap.
            let all = fs.read_all(id)?;
            if all != data {
                self.problem(format!("inode {id:?}: read_all and read differ"));
            }
        } else if size >= 1 << 48 {
            // More than any address space: must fail, not abort.
            if let Ok(v) = fs.read_all(id) {
                self.problem(format!("inode {id:?}: read_all of {size} gave {}", v.len()));
            }
        }
        Ok(data)
    }

    fn run(&mut self, fs: &Filesystem) {
        let corpus = self.corpus;
        // Every known path, by name.
        for (path, want) in &corpus.paths {
            if self.entries >= MAX_ENTRIES {
                return;
            }
            self.entries += 1;
            let Some(id) = self.check(path, fs.resolve_path(path.as_bytes())) else {
                continue;
            };
            self.inode(fs, path, id, Some(want));
        }
        // Paths through "..".
        for (path, want) in [
            ("/many/../regular/r0", "/regular/r0"),
            ("/deep/a/b/c/../../../../links/long", "/links/long"),
            ("/deep/a/b/c/d/e/f/..", "/deep/a/b/c/d/e"),
        ] {
            let a = fs.resolve_path(path.as_bytes());
            let b = fs.resolve_path(want.as_bytes());
            if let (Some(a), Some(b)) = (self.check(path, a), self.check(want, b)) {
                self.same(path, &a, &b);
            }
        }
        // Everything reachable by listing, whatever its name.
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([(fs.root(), "/".to_string())]);
        seen.insert(fs.root());
        while let Some((dir, path)) = queue.pop_front() {
            let Some(entries) = self.check(&path, fs.read_dir(dir, 0)) else {
                continue;
            };
            for e in entries {
                if self.entries >= MAX_ENTRIES {
                    return;
                }
                self.entries += 1;
                let child = format!(
                    "{}/{}",
                    path.trim_end_matches('/'),
                    String::from_utf8_lossy(&e.name)
                );
                let want = corpus.paths.get(&child);
                if want.is_none() {
                    self.problem(format!("{child}: listed but not in the corpus"));
                }
                if e.kind == FileKind::Dir && seen.insert(e.id) {
                    queue.push_back((e.id, child.clone()));
                }
                if !self.strict {
                    // Known paths were covered above; look at the rest.
                    if want.is_none() {
                        self.inode(fs, &child, e.id, None);
                    }
                    let _ = fs.parent(e.id);
                }
            }
        }
    }

    fn inode(&mut self, fs: &Filesystem, path: &str, id: InodeId, want: Option<&Want>) {
        let corpus = self.corpus;
        let Some(st) = self.check(path, fs.stat(id)) else {
            return;
        };
        match (st.kind, want) {
            (FileKind::File, Some(Want::File(data))) => {
                self.same(&format!("{path} size"), &st.size, &(data.len() as u64));
                let r = self.content(fs, id, st.size);
                if let Some(got) = self.check(path, r)
                    && got != *data
                {
                    self.problem(format!("{path}: content differs"));
                }
            }
            (FileKind::Symlink, Some(Want::Link(target))) => {
                if let Some(got) = self.check(path, fs.read_link(id)) {
                    self.same(path, &got, target);
                }
            }
            (FileKind::Dir, Some(Want::Dir(names))) => {
                if let Some(entries) = self.check(path, fs.read_dir(id, 0)) {
                    let mut got: Vec<Vec<u8>> = entries.into_iter().map(|e| e.name).collect();
                    got.sort();
                    self.same(&format!("{path} listing"), &got, names);
                }
            }
            (kind, Some(want)) => {
                self.problem(format!(
                    "{path}: kind {kind:?} where {} was due",
                    short_debug(want, 40)
                ));
            }
            (kind, None) => {
                // Only in the recomputed mode: read whatever is there.
                let _ = match kind {
                    FileKind::File => self.content(fs, id, st.size).map(|_| ()),
                    FileKind::Symlink => fs.read_link(id).map(|_| ()),
                    FileKind::Dir => fs.read_dir(id, 0).map(|_| ()),
                    _ => fs.read(id, 0, 4096).map(|_| ()),
                };
            }
        }
        if let Some(mut x) = self.check(path, fs.xattrs(id)) {
            x.sort();
            // The single-name lookup agrees with the listing.
            for (name, value) in &x {
                let one = fs.get_xattr(id, name);
                if let Some(one) = self.check(path, one) {
                    self.same(&format!("{path} xattr"), &one.as_ref(), &Some(value));
                }
            }
            if want.is_some() {
                let none = Vec::new();
                let want_x = corpus.xattrs.get(path).unwrap_or(&none);
                self.same(&format!("{path} xattrs"), &x, want_x);
            }
        }
    }
}

/// `Debug` of `v`, cut after `max` bytes without formatting the rest (a
/// damaged size can make a value huge).
fn short_debug(v: &dyn std::fmt::Debug, max: usize) -> String {
    struct Cut(String, usize);
    impl std::fmt::Write for Cut {
        fn write_str(&mut self, part: &str) -> std::fmt::Result {
            for c in part.chars() {
                if self.0.len() >= self.1 {
                    return Err(std::fmt::Error);
                }
                self.0.push(c);
            }
            Ok(())
        }
    }
    let mut cut = Cut(String::new(), max);
    let _ = std::fmt::write(&mut cut, format_args!("{v:?}"));
    cut.0
}

// ---------------------------------------------------------------------------
// Damage and the iterations.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The damaged block keeps its (now wrong) checksum.
    BadChecksum,
    /// The checksum is recomputed over the damaged block.
    Recomputed,
    /// The primary superblock is damaged and its checksum recomputed.
    Superblock,
}

const MODES: [Mode; 3] = [Mode::BadChecksum, Mode::Recomputed, Mode::Superblock];

/// Damage one or two blocks; returns the patches and the blocks whose
/// checksum no longer matches (for `BadChecksum`) plus all damaged blocks.
fn damage(corpus: &Corpus, mode: Mode, rng: &mut Rng) -> (Patches, HashSet<u64>, Vec<Block>) {
    if mode == Mode::Superblock {
        return (
            vec![(SUPER, damage_super(corpus, rng))],
            HashSet::new(),
            Vec::new(),
        );
    }
    let count = if rng.below(4) == 0 { 2 } else { 1 };
    let mut patches = Vec::new();
    let mut bad = HashSet::new();
    let mut hit = Vec::new();
    for _ in 0..count {
        let b = corpus.blocks[rng.below(corpus.blocks.len() as u64) as usize].clone();
        if hit.iter().any(|h: &Block| h.logical == b.logical) {
            continue;
        }
        let at = b.physical as usize;
        let orig = &corpus.image[at..at + NODESIZE];
        let mut blk = orig.to_vec();
        let level = blk[0x64];
        let nritems = u32::from_le_bytes(blk[0x60..0x64].try_into().unwrap()) as usize;
        let stride = if level == 0 { 25 } else { 33 };
        // Header and item headers: where structure lives.
        let head = (0x65 + nritems * stride).min(NODESIZE);
        for _ in 0..1 + rng.below(8) {
            let pos = if rng.below(2) == 0 {
                rng.below(head as u64)
            } else {
                rng.below(NODESIZE as u64)
            } as usize;
            let pos8 = pos.min(NODESIZE - 8);
            match rng.below(6) {
                0 | 1 => blk[pos] ^= 1 << rng.below(8),
                2 => blk[pos] = rng.next() as u8,
                3 => blk[pos] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5) as usize],
                4 => {
                    // Another block's address: a misdirected pointer.
                    let other =
                        corpus.blocks[rng.below(corpus.blocks.len() as u64) as usize].logical;
                    blk[pos8..pos8 + 8].copy_from_slice(&other.to_le_bytes());
                }
                _ => {
                    // A 64-bit value at the edges of arithmetic.
                    let v = [u64::MAX, u64::MAX - 4095, 1 << 63, 1 << 32, 0, 4096]
                        [rng.below(6) as usize];
                    blk[pos8..pos8 + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if mode == Mode::Recomputed {
            let sum = crc32c::crc32c(&blk[32..]);
            blk[..4].copy_from_slice(&sum.to_le_bytes());
        }
        // crc32c uses the first 4 bytes of the checksum field; the rest
        // of the field is not covered.
        let covered_change = blk[..4] != orig[..4] || blk[32..] != orig[32..];
        if mode == Mode::BadChecksum && covered_change {
            bad.insert(b.logical);
        }
        if blk[..] != orig[..] {
            patches.push((b.physical, blk));
            hit.push(b);
        }
    }
    (patches, bad, hit)
}

/// What an iteration saw, for the summary.
#[derive(Default)]
struct Seen {
    /// The slowest iteration: (microseconds, seed).
    slowest: Mutex<(u128, u64)>,
    open_failed: AtomicUsize,
    with_errors: AtomicUsize,
    with_diffs: AtomicUsize,
}

const SUPER: u64 = 65536;

/// The primary superblock with 1-8 bytes damaged, mostly in the fields the
/// reader uses (up to the end of the system chunk array), and its crc32c
/// recomputed.
fn damage_super(corpus: &Corpus, rng: &mut Rng) -> Vec<u8> {
    let at = SUPER as usize;
    let mut sb = corpus.image[at..at + 4096].to_vec();
    let sys_len = u32::from_le_bytes(sb[0xa0..0xa4].try_into().unwrap()) as usize;
    let used = (0x32b + sys_len) as u64;
    for _ in 0..1 + rng.below(8) {
        let span = if rng.below(4) == 0 { 4096 } else { used };
        let pos = 32 + rng.below(span - 32) as usize;
        match rng.below(4) {
            0 | 1 => sb[pos] ^= 1 << rng.below(8),
            2 => sb[pos] = rng.next() as u8,
            _ => sb[pos] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5) as usize],
        }
    }
    let sum = crc32c::crc32c(&sb[32..]);
    sb[..4].copy_from_slice(&sum.to_le_bytes());
    sb
}

/// One iteration; returns a description of what went wrong, if anything.
fn iteration(corpus: &Corpus, mode: Mode, seed: u64, seen: &Seen) -> Option<String> {
    let mut rng = Rng(seed);
    let (patches, bad, hit) = damage(corpus, mode, &mut rng);
    let describe = || {
        let mut blocks: Vec<String> = hit
            .iter()
            .map(|b| format!("{} ({})", b.logical, b.owner))
            .collect();
        if mode == Mode::Superblock {
            blocks.push("the primary superblock".into());
        }
        format!("seed {seed} {mode:?}, damaged {}", blocks.join(", "))
    };
    // Damage to trees the read path never reads must change nothing.
    let exact = mode == Mode::BadChecksum
        || mode == Mode::Recomputed && hit.iter().all(|b| !b.read_path_uses());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut walk = Walk::new(corpus, exact, bad.clone());
        match open_mem(corpus, patches) {
            Ok(fs) => walk.run(&fs),
            Err(e) => {
                seen.open_failed.fetch_add(1, Ordering::Relaxed);
                walk.error("open", &e)
            }
        }
        if walk.errors > 0 {
            seen.with_errors.fetch_add(1, Ordering::Relaxed);
        }
        if walk.diffs > 0 {
            seen.with_diffs.fetch_add(1, Ordering::Relaxed);
        }
        (walk.errors, walk.problems)
    }));
    let (errors, problems) = match outcome {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Some(format!("{}: PANIC: {msg}", describe()));
        }
    };
    if !problems.is_empty() {
        return Some(format!("{}: {}", describe(), problems.join("; ")));
    }
    if exact {
        // A block that fails verification in a tree the walk reads whole
        // must be reported; anything else must read without error.
        let must_fail = hit.iter().any(|b| {
            bad.contains(&b.logical)
                && (matches!(b.owner.as_str(), "CHUNK_TREE" | "FS_TREE" | "CSUM_TREE")
                    || b.logical == corpus.root_tree)
        });
        let may_fail = hit
            .iter()
            .any(|b| bad.contains(&b.logical) && b.read_path_uses());
        if must_fail && errors == 0 {
            return Some(format!("{}: damage went unreported", describe()));
        }
        if !may_fail && errors > 0 {
            return Some(format!("{}: {errors} errors without damage", describe()));
        }
    }
    None
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap())
}

#[test]
fn fuzz_metadata() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let saved = std::env::var_os("UBTRFS_FUZZ_IMAGE").map(PathBuf::from);
    let corpus = Arc::new(match &saved {
        Some(img) => load_corpus(img, None),
        None => build_corpus(dir.path()),
    });
    let built = started.elapsed();

    let mut jobs: Vec<(Mode, u64)> = Vec::new();
    if let Some(seed) = env_u64("UBTRFS_FUZZ_SEED") {
        jobs.extend(MODES.map(|m| (m, seed)));
    } else {
        let iters = env_u64("UBTRFS_FUZZ_ITERS").unwrap_or(DEFAULT_ITERS);
        for i in 0..iters {
            jobs.push((Mode::BadChecksum, 0x5EED_0000 + i));
            jobs.push((Mode::Recomputed, 0xC5C5_0000 + i));
            if i % 4 == 0 {
                jobs.push((Mode::Superblock, 0x5B5B_0000 + i));
            }
        }
    }
    let jobs = Arc::new(jobs);
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen: Arc<[Seen; 3]> = Arc::new(Default::default());
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 4);
    // What each worker is doing, for the watchdog.
    type Current = Mutex<Option<(Mode, u64, Instant)>>;
    let current: Arc<Vec<Current>> = Arc::new((0..workers).map(|_| Mutex::new(None)).collect());
    // A previous panic message is noise here: failures are collected.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (corpus, jobs, next, failures, current, seen) = (
                corpus.clone(),
                jobs.clone(),
                next.clone(),
                failures.clone(),
                current.clone(),
                seen.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(mode, seed)) = jobs.get(i) else {
                        break;
                    };
                    *current[w].lock().unwrap() = Some((mode, seed, Instant::now()));
                    let seen = &seen[MODES.iter().position(|&m| m == mode).unwrap()];
                    let t = Instant::now();
                    if let Some(f) = iteration(&corpus, mode, seed, seen) {
                        failures.lock().unwrap().push(f);
                    }
                    let us = t.elapsed().as_micros();
                    let mut slowest = seen.slowest.lock().unwrap();
                    if us > slowest.0 {
                        *slowest = (us, seed);
                    }
                }
                *current[w].lock().unwrap() = None;
            })
        })
        .collect();
    // Keep the corpus of a failing run so that its seeds reproduce.
    let keep_corpus = || match &saved {
        Some(img) => img.clone(),
        None => {
            let keep =
                std::env::temp_dir().join(format!("ubtrfs-fuzz-corpus-{}.img", std::process::id()));
            std::fs::copy(dir.path().join("corpus.img"), &keep).unwrap();
            keep
        }
    };
    // Watchdog: an iteration that does not finish is a hang.
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
        for slot in current.iter() {
            if let Some((mode, seed, since)) = *slot.lock().unwrap()
                && since.elapsed() > HANG
            {
                std::panic::set_hook(hook);
                panic!(
                    "hang: seed {seed} {mode:?} has run for {:?}; reproduce with UBTRFS_FUZZ_IMAGE={} UBTRFS_FUZZ_SEED={seed}",
                    since.elapsed(),
                    keep_corpus().display()
                );
            }
        }
    }
    std::panic::set_hook(hook);
    for h in handles {
        h.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    for (mode, s) in MODES.iter().zip(seen.iter()) {
        eprintln!(
            "fuzz_metadata: {mode:?}: open failed {}, errors seen in {}, changed answers in {} iterations; slowest {:?}",
            s.open_failed.load(Ordering::Relaxed),
            s.with_errors.load(Ordering::Relaxed),
            s.with_diffs.load(Ordering::Relaxed),
            s.slowest.lock().unwrap()
        );
    }
    eprintln!(
        "fuzz_metadata: {} iterations over {} tree blocks in {:?} (corpus built in {built:?}), {} failures",
        jobs.len(),
        corpus.blocks.len(),
        started.elapsed(),
        failures.len()
    );
    if failures.is_empty() {
        return;
    }
    let img = keep_corpus();
    panic!(
        "{} of {} iterations failed; reproduce one with UBTRFS_FUZZ_IMAGE={} UBTRFS_FUZZ_SEED=<seed>; first ones:\n{}",
        failures.len(),
        jobs.len(),
        img.display(),
        failures[..failures.len().min(20)].join("\n")
    );
}

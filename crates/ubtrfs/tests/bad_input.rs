//! Bad input for the read path: truncated images, damaged superblocks,
//! flipped bits in every kind of tree block and in file data, missing and
//! mismatched devices. Each case asserts the exact outcome: which error
//! variant, naming which block, device, inode or offset; or, where a good
//! copy exists, the exact original bytes.
//!
//! Images come from `mkfs.btrfs --rootdir` over generated trees (single
//! device) or from `mkfs.btrfs` plus a kernel mount (several devices:
//! btrfs-progs 6.2 copies a directory only onto one device). Tree blocks are
//! located with `btrfs inspect-internal dump-tree`; logical addresses are
//! turned into device offsets through the library's chunk map of the
//! pristine image.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use testkit::xorshift_bytes as bytes;
use ubtrfs::Error;
use ubtrfs::format::consts::{EXTENT_DATA_KEY, FS_TREE_OBJECTID};
use ubtrfs::format::items::{ExtentBody, FileExtentItem};
use ubtrfs::fs::{FileKind, Filesystem, InodeId};

const MIB: u64 = 1 << 20;
const NODESIZE: usize = 4096;
const SECTOR: u64 = 4096;

// ---------------------------------------------------------------------------
// Generated trees and what they must read back as.

/// What one path must read back as.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    File(Vec<u8>),
    Link(Vec<u8>),
    Dir,
}

/// Extended attributes as (name, value) pairs.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// A generated tree: every path (absolute, as the filesystem sees it) and
/// its expected content, plus the xattrs set on some paths.
#[derive(Default)]
struct Expected {
    paths: BTreeMap<String, Want>,
    xattrs: BTreeMap<String, Xattrs>,
}

impl Expected {
    fn file(&mut self, root: &Path, path: &str, data: Vec<u8>) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &data).unwrap();
        self.paths.insert(path.to_string(), Want::File(data));
    }

    fn dir(&mut self, root: &Path, path: &str) {
        std::fs::create_dir_all(root.join(path.trim_start_matches('/'))).unwrap();
        self.paths.insert(path.to_string(), Want::Dir);
    }

    fn symlink(&mut self, root: &Path, path: &str, target: &str) {
        std::os::unix::fs::symlink(target, root.join(path.trim_start_matches('/'))).unwrap();
        self.paths
            .insert(path.to_string(), Want::Link(target.as_bytes().to_vec()));
    }

    fn hard_link(&mut self, root: &Path, existing: &str, path: &str) {
        std::fs::hard_link(
            root.join(existing.trim_start_matches('/')),
            root.join(path.trim_start_matches('/')),
        )
        .unwrap();
        let want = self.paths[existing].clone();
        self.paths.insert(path.to_string(), want);
    }

    fn xattr(&mut self, root: &Path, path: &str, name: &str, value: &[u8]) {
        testkit::sys::set_xattr(&root.join(path.trim_start_matches('/')), name, value).unwrap();
        self.xattrs
            .entry(path.to_string())
            .or_default()
            .push((name.as_bytes().to_vec(), value.to_vec()));
    }

    /// Paths of regular files whose data is in data extents (not inline).
    fn regular_extent_files(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter(|(_, w)| matches!(w, Want::File(d) if d.len() > 4095))
            .map(|(p, _)| p.clone())
            .collect()
    }
}

/// The tree used for single-device images: 450 small inline files (enough
/// for a level-1 fs tree with 4 KiB nodes), files in data extents (about
/// 340 KB: one csum leaf), an empty file, a symlink, a hard link, an xattr.
fn single_tree(root: &Path) -> Expected {
    let mut e = Expected::default();
    e.dir(root, "/");
    e.dir(root, "/many");
    for i in 0..450u64 {
        let line = format!("small file number {i}\n");
        e.file(
            root,
            &format!("/many/file_{i:03}"),
            line.repeat(i as usize % 5 + 1).into_bytes(),
        );
    }
    e.dir(root, "/data");
    e.file(root, "/data/big", bytes(1, 300_000));
    e.file(root, "/data/mid", bytes(2, 20_000));
    e.file(root, "/data/small", bytes(3, 100));
    e.file(root, "/data/empty", Vec::new());
    e.symlink(root, "/data/link", "big");
    e.hard_link(root, "/data/mid", "/data/hard");
    e.xattr(root, "/data/big", "user.color", b"blue");
    e
}

/// The files written through the kernel onto multi-device filesystems:
/// sizes that cross sectors and 64 KiB stripes.
fn multi_files() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("/big".to_string(), bytes(11, 300_000)),
        ("/mid".to_string(), bytes(12, 20_000)),
        ("/small".to_string(), bytes(13, 100)),
        ("/huge".to_string(), bytes(14, 3_000_000)),
    ];
    for i in 0..20u64 {
        out.push((
            format!("/d/f{i}"),
            bytes(100 + i, (i as usize * 7919) % 70_000),
        ));
    }
    out
}

// ---------------------------------------------------------------------------
// Making images.

fn sparse_file(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
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

/// A single-device image of `size` bytes holding `single_tree`, with the
/// given metadata and data profiles.
fn single_image(dir: &Path, meta: &str, data: &str, size: u64) -> (PathBuf, Expected) {
    let root = dir.join("root");
    let expected = single_tree(&root);
    let img = dir.join("disk.img");
    sparse_file(&img, size);
    run(Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-n", "4096", "-m", meta, "-d", data, "-r"])
        .arg(&root)
        .arg(&img));
    (img, expected)
}

/// An `n`-device filesystem with the given profiles holding `multi_files`,
/// written by the kernel.
fn multi_image(dir: &Path, n: usize, meta: &str, data: &str) -> Vec<PathBuf> {
    let args = ["-n", "4096", "-m", meta, "-d", data];
    testkit::mkfs_devices_with_files(dir, n, 256 * MIB, &args, &multi_files()).unwrap()
}

// ---------------------------------------------------------------------------
// Locating tree blocks: `btrfs inspect-internal dump-tree` is the oracle.

/// One tree block as dump-tree prints it.
#[derive(Clone, Debug)]
struct Block {
    logical: u64,
    level: u8,
    owner: String,
    /// Leaf item keys: (objectid if numeric, type name, offset).
    keys: Vec<(Option<u64>, String, u64)>,
}

fn dump_tree(img: &Path, args: &[&str]) -> Vec<Block> {
    let out = run(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree"])
        .args(args)
        .arg(img));
    let mut blocks: Vec<Block> = Vec::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            [
                "leaf",
                addr,
                "items",
                _,
                "free",
                "space",
                _,
                "generation",
                _,
                "owner",
                owner,
            ] => blocks.push(Block {
                logical: addr.parse().unwrap(),
                level: 0,
                owner: owner.to_string(),
                keys: Vec::new(),
            }),
            [
                "node",
                addr,
                "level",
                level,
                "items",
                _,
                "free",
                "space",
                _,
                "generation",
                _,
                "owner",
                owner,
            ] => blocks.push(Block {
                logical: addr.parse().unwrap(),
                level: level.parse().unwrap(),
                owner: owner.to_string(),
                keys: Vec::new(),
            }),
            ["item", _, "key", obj, ty, off, ..] => {
                let obj = obj.trim_start_matches('(');
                let off = off.trim_end_matches(')');
                blocks.last_mut().unwrap().keys.push((
                    obj.parse().ok(),
                    ty.to_string(),
                    off.parse().unwrap_or(0),
                ));
            }
            _ => {}
        }
    }
    assert!(!blocks.is_empty(), "dump-tree printed no block:\n{out}");
    blocks
}

/// The root block of the tree whose blocks dump-tree labels `owner`.
fn root_block<'a>(blocks: &'a [Block], owner: &str) -> &'a Block {
    blocks
        .iter()
        .filter(|b| b.owner == owner)
        .max_by_key(|b| b.level)
        .unwrap_or_else(|| panic!("no {owner} block"))
}

/// Device offset of copy `mirror` of `logical` (single-device images).
fn physical(fs: &Filesystem, logical: u64, mirror: usize) -> (u64, u64) {
    let chunk = fs
        .tree_reader()
        .volume()
        .chunks
        .lookup(logical)
        .unwrap_or_else(|e| panic!("{logical}: {e}"));
    let piece = chunk.map(logical, 1, mirror).unwrap();
    (piece.devid, piece.physical)
}

/// Flip bit `bit` of the byte at `offset` of `img` (again to undo).
fn flip(img: &Path, offset: u64, bit: u8) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 1 << bit;
    f.write_all_at(&b, offset).unwrap();
}

// ---------------------------------------------------------------------------
// Reading back and comparing.

fn open<P: AsRef<Path>>(paths: &[P]) -> Filesystem {
    Filesystem::open(paths).unwrap_or_else(|e| panic!("open: {e}"))
}

fn open_err<P: AsRef<Path>>(paths: &[P]) -> Error {
    match Filesystem::open(paths) {
        Ok(_) => panic!("open succeeded where an error was due"),
        Err(e) => e,
    }
}

/// Resolve `path`, check its kind, and read it all (content, link target,
/// listing, xattrs), returning the first error.
fn read_path(fs: &Filesystem, ex: &Expected, path: &str) -> Result<(), Error> {
    let id = fs.resolve_path(path.as_bytes())?;
    let st = fs.stat(id)?;
    match &ex.paths[path] {
        Want::File(data) => {
            assert_eq!(st.kind, FileKind::File, "{path}");
            assert_eq!(st.size, data.len() as u64, "size of {path}");
            let got = fs.read_all(id)?;
            assert!(got == *data, "content of {path} differs");
        }
        Want::Link(target) => {
            assert_eq!(st.kind, FileKind::Symlink, "{path}");
            assert_eq!(fs.read_link(id)?, *target, "target of {path}");
        }
        Want::Dir => {
            assert_eq!(st.kind, FileKind::Dir, "{path}");
            let mut names: Vec<Vec<u8>> = fs.read_dir(id, 0)?.into_iter().map(|e| e.name).collect();
            names.sort();
            let prefix = if path == "/" {
                "/".to_string()
            } else {
                format!("{path}/")
            };
            let mut want: Vec<Vec<u8>> = ex
                .paths
                .keys()
                .filter_map(|p| p.strip_prefix(&prefix))
                .filter(|rest| !rest.is_empty() && !rest.contains('/'))
                .map(|n| n.as_bytes().to_vec())
                .collect();
            want.sort();
            assert_eq!(names, want, "listing of {path}");
        }
    }
    let want_x = ex.xattrs.get(path).cloned().unwrap_or_default();
    assert_eq!(fs.xattrs(id)?, want_x, "xattrs of {path}");
    Ok(())
}

/// Every path reads back exactly.
fn check_all(fs: &Filesystem, ex: &Expected) {
    for path in ex.paths.keys() {
        read_path(fs, ex, path).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// Every file of `multi_files` reads back exactly, whole and in ranges.
fn check_multi(fs: &Filesystem) {
    for (path, data) in multi_files() {
        let id = fs
            .resolve_path(path.as_bytes())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let got = fs.read_all(id).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(got == data, "content of {path} differs");
        for (off, len) in [(4090u64, 20usize), (65530, 70_000), (1_000_001, 200_000)] {
            let lo = (off as usize).min(data.len());
            let hi = (off as usize + len).min(data.len());
            let got = fs.read(id, off, len).unwrap();
            assert!(got == data[lo..hi], "{path} at {off}+{len}");
        }
    }
}

fn expect_bad_block(r: Result<(), Error>, logical: u64, what: &str) {
    match r {
        Err(Error::BadTreeBlock { logical: l, why }) => {
            assert_eq!(l, logical, "{what}: wrong block named ({why})");
            assert!(why.contains("checksum mismatch"), "{what}: {why}");
        }
        Err(other) => panic!("{what}: expected BadTreeBlock at {logical}, got {other:?}"),
        Ok(()) => panic!("{what}: read succeeded from a damaged block at {logical}"),
    }
}

// ---------------------------------------------------------------------------
// Truncated images and superblocks.

#[test]
fn truncated_image_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    let fs = open(&[&img]);
    let sb = fs.superblock().clone();
    let blocks = dump_tree(&img, &[]);
    // Device end of the tree block that lies furthest on the device.
    let meta_end = blocks
        .iter()
        .map(|b| physical(&fs, b.logical, 0).1 + NODESIZE as u64)
        .max()
        .unwrap();
    let root_phys = physical(&fs, sb.root, 0).1;
    let chunk_phys = physical(&fs, sb.chunk_root, 0).1;
    let fs_root = root_block(&blocks, "FS_TREE");
    let fs_root_phys = physical(&fs, fs_root.logical, 0).1;
    let big = fs.resolve_path(b"/data/big").unwrap();
    let big_data_phys = {
        let tree = fs.tree_by_id(FS_TREE_OBJECTID).unwrap();
        let item = tree
            .items_of(big.ino, EXTENT_DATA_KEY)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        match FileExtentItem::parse(item.data()).unwrap().body {
            ExtentBody::Regular { disk_bytenr, .. } => physical(&fs, disk_bytenr, 0).1,
            other => panic!("/data/big is not in a data extent: {other:?}"),
        }
    };
    drop(fs);
    let pristine = std::fs::read(&img).unwrap();
    let cut_to = |len: u64| {
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.set_len(0).unwrap();
        f.write_all_at(&pristine[..len as usize], 0).unwrap();
    };

    // Nothing, or too little to hold the primary superblock.
    for len in [0u64, 1000, 65536, 65536 + 2048] {
        cut_to(len);
        match open_err(&[&img]) {
            Error::NoSuperblock { path, why } => {
                assert_eq!(path, img);
                assert!(
                    why.contains(&format!("device of {len} bytes is too small")),
                    "cut at {len}: {why}"
                );
            }
            other => panic!("cut at {len}: expected NoSuperblock, got {other:?}"),
        }
    }

    // Just after the superblock: the chunk tree is gone.
    assert!(chunk_phys >= 69632);
    cut_to(69632);
    match open_err(&[&img]) {
        Error::BadTreeBlock { logical, why } => {
            assert_eq!(logical, sb.chunk_root, "{why}");
            assert!(
                why.contains("past the end of the device") && why.contains("truncated"),
                "{why}"
            );
        }
        other => panic!("cut after the superblock: expected BadTreeBlock, got {other:?}"),
    }

    // In the middle of the metadata: at the fs tree's root block, which
    // mkfs writes before the root tree; the chunk tree is before it.
    assert!(chunk_phys + NODESIZE as u64 <= fs_root_phys && fs_root_phys < root_phys);
    cut_to(fs_root_phys);
    match open_err(&[&img]) {
        Error::BadTreeBlock { logical, why } => {
            assert_eq!(logical, sb.root, "{why}");
            assert!(why.contains("past the end of the device"), "{why}");
        }
        other => panic!("cut inside the metadata: expected BadTreeBlock, got {other:?}"),
    }

    // After all metadata, before the data: metadata, inline files, links
    // and xattrs read; data extents are past the end.
    assert!(big_data_phys >= meta_end);
    cut_to(meta_end);
    let fs = open(&[&img]);
    let regular = ex.regular_extent_files();
    for path in ex.paths.keys() {
        let r = read_path(&fs, &ex, path);
        if regular.contains(path) {
            match r {
                Err(Error::ShortRead {
                    path: p,
                    offset,
                    len,
                    size,
                }) => {
                    assert_eq!((p.as_path(), size), (img.as_path(), meta_end));
                    assert!(offset + len as u64 > size, "{path}: {offset}+{len}");
                }
                other => panic!("{path}: expected ShortRead, got {other:?}"),
            }
        } else {
            r.unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
    drop(fs);
    // Not for writing: the device is smaller than the filesystem says,
    // and chunks lie past its end. The image does not grow.
    let e = Filesystem::open_read_write(&[&img])
        .err()
        .expect("opened for writing");
    assert!(
        e.to_string()
            .contains("a truncated image or the wrong device")
            && e.to_string().contains(&format!("holds {meta_end} bytes")),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), meta_end);
}

#[test]
fn zeroed_primary_superblock_uses_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    let generation = open(&[&img]).superblock().generation;
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&[0u8; 4096], 65536).unwrap();
    let fs = open(&[&img]);
    assert_eq!(fs.superblock().bytenr, 64 * MIB, "the mirror is in use");
    assert_eq!(
        fs.warnings(),
        vec![format!(
            "{}: superblock copy 0 at 65536: corrupt metadata: no btrfs magic; using the copy of generation {generation}",
            img.display()
        )]
    );
    check_all(&fs, &ex);
    drop(fs);

    // Both copies gone: no superblock, and both are named.
    f.write_all_at(&[0u8; 4096], 64 * MIB).unwrap();
    match open_err(&[&img]) {
        Error::NoSuperblock { path, why } => {
            assert_eq!(path, img);
            assert!(
                why.contains("copy 0 at 65536") && why.contains("copy 1 at 67108864"),
                "{why}"
            );
        }
        other => panic!("expected NoSuperblock, got {other:?}"),
    }
}

#[test]
fn flipped_bit_in_primary_superblock_uses_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    flip(&img, 65536 + 0x200, 3);
    let fs = open(&[&img]);
    assert_eq!(fs.superblock().bytenr, 64 * MIB);
    let w = fs.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(&format!("{}: superblock copy 0 at 65536: ", img.display()))
            && w[0].contains("crc32c checksum mismatch"),
        "{w:?}"
    );
    check_all(&fs, &ex);
}

// ---------------------------------------------------------------------------
// Flipped bits in tree blocks.

/// The tree blocks the tests damage, one of each kind.
struct Targets {
    root: u64,
    chunk: u64,
    extent: u64,
    csum: u64,
    fs_node: u64,
    /// Leaves of the fs tree holding no directory's items, away from both
    /// ends of the tree.
    fs_leaves: Vec<Block>,
}

/// `dirs`: inode numbers of every directory (a damaged leaf holding a
/// directory's items would fail every path below it).
fn targets(img: &Path, dirs: &[u64]) -> Targets {
    let blocks = dump_tree(img, &[]);
    let fs_root = root_block(&blocks, "FS_TREE");
    assert!(fs_root.level >= 1, "the fs tree must have internal nodes");
    let fs_leaves: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.owner == "FS_TREE" && b.level == 0)
        .collect();
    let candidates: Vec<&Block> = fs_leaves[1..fs_leaves.len() - 1]
        .iter()
        .copied()
        .filter(|b| {
            b.keys
                .iter()
                .all(|(obj, _, _)| obj.is_some_and(|o| !dirs.contains(&o)))
        })
        .collect();
    assert!(!candidates.is_empty(), "no fs leaf holds only file items");
    Targets {
        root: root_block(&blocks, "ROOT_TREE").logical,
        chunk: root_block(&blocks, "CHUNK_TREE").logical,
        extent: root_block(&blocks, "EXTENT_TREE").logical,
        csum: root_block(&blocks, "CSUM_TREE").logical,
        fs_node: fs_root.logical,
        fs_leaves: candidates.into_iter().cloned().collect(),
    }
}

fn dir_inos(fs: &Filesystem, ex: &Expected) -> Vec<u64> {
    ex.paths
        .iter()
        .filter(|(_, w)| **w == Want::Dir)
        .map(|(p, _)| fs.resolve_path(p.as_bytes()).unwrap().ino)
        .collect()
}

/// Flip one bit of copy `mirror` of the tree block at `logical`; flip it
/// back when dropped.
struct Flipped {
    img: PathBuf,
    offset: u64,
}

impl Flipped {
    fn new(img: &Path, fs: &Filesystem, logical: u64, mirror: usize) -> Self {
        // Inside the item area: covered by the checksum, past the header.
        let offset = physical(fs, logical, mirror).1 + 0x80;
        flip(img, offset, 2);
        Flipped {
            img: img.to_path_buf(),
            offset,
        }
    }
}

impl Drop for Flipped {
    fn drop(&mut self) {
        flip(&self.img, self.offset, 2);
    }
}

#[test]
fn flipped_bit_in_tree_blocks_single_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    let pristine = open(&[&img]);
    let t = targets(&img, &dir_inos(&pristine, &ex));
    check_all(&pristine, &ex);
    let fs_open =
        |what: &str| Filesystem::open(&[&img]).unwrap_or_else(|e| panic!("{what}: open: {e}"));

    // Root tree and chunk tree: nothing can be found without them.
    for (logical, what) in [(t.root, "root tree"), (t.chunk, "chunk tree")] {
        let _f = Flipped::new(&img, &pristine, logical, 0);
        expect_bad_block(
            Filesystem::open(&[&img]).map(|_| ()),
            logical,
            &format!("open with a damaged {what}"),
        );
    }

    // Extent tree: the read path does not use it; walking it names the block.
    {
        let _f = Flipped::new(&img, &pristine, t.extent, 0);
        let fs = fs_open("extent tree");
        check_all(&fs, &ex);
        let tree = fs.tree_by_id(2).unwrap();
        expect_bad_block(tree.walk(&mut |_| Ok(())), t.extent, "extent tree walk");
    }

    // Csum tree (one leaf): every file in data extents fails, naming it;
    // inline files, links, directories and xattrs read.
    {
        let _f = Flipped::new(&img, &pristine, t.csum, 0);
        let fs = fs_open("csum tree");
        let regular = ex.regular_extent_files();
        assert_eq!(regular.len(), 3, "{regular:?}");
        for path in ex.paths.keys() {
            let r = read_path(&fs, &ex, path);
            if regular.contains(path) {
                expect_bad_block(r, t.csum, path);
            } else {
                r.unwrap_or_else(|e| panic!("{path}: {e}"));
            }
        }
    }

    // Fs tree root node: open works, every path in the fs tree fails.
    {
        let _f = Flipped::new(&img, &pristine, t.fs_node, 0);
        let fs = fs_open("fs tree node");
        for path in ["/", "/data/big", "/many/file_007", "/data/link"] {
            expect_bad_block(read_path(&fs, &ex, path), t.fs_node, path);
        }
        expect_bad_block(fs.stat(fs.root()).map(|_| ()), t.fs_node, "stat /");
    }

    // One fs tree leaf at a time: exactly the files with an item in it fail.
    for leaf in &t.fs_leaves {
        let _f = Flipped::new(&img, &pristine, leaf.logical, 0);
        let fs = fs_open("fs tree leaf");
        let (mut failed, mut read) = (0, 0);
        for path in ex.paths.keys() {
            let ino = pristine.resolve_path(path.as_bytes()).unwrap().ino;
            let touched = leaf.keys.iter().any(|(o, _, _)| *o == Some(ino));
            let r = read_path(&fs, &ex, path);
            if touched {
                expect_bad_block(r, leaf.logical, path);
                failed += 1;
            } else {
                r.unwrap_or_else(|e| {
                    panic!("{path} (no item in the damaged leaf {}): {e}", leaf.logical)
                });
                read += 1;
            }
        }
        assert!(failed > 0 && read > 400, "{failed} failed, {read} read");
    }

    // All flips undone: everything reads again.
    check_all(&fs_open("restored"), &ex);
}

#[test]
fn flipped_bit_in_tree_blocks_dup_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "dup", "single", 128 * MIB);
    let pristine = open(&[&img]);
    let t = targets(&img, &dir_inos(&pristine, &ex));
    let all = [
        (t.root, "root tree"),
        (t.chunk, "chunk tree"),
        (t.extent, "extent tree"),
        (t.csum, "csum tree"),
        (t.fs_node, "fs tree node"),
        (t.fs_leaves[0].logical, "fs tree leaf"),
    ];
    // Each kind alone, on either copy, then every kind at once on copy 0.
    for mirror in [0, 1] {
        for (logical, what) in all {
            let _f = Flipped::new(&img, &pristine, logical, mirror);
            let fs = Filesystem::open(&[&img])
                .unwrap_or_else(|e| panic!("{what} copy {mirror}: open: {e}"));
            check_all(&fs, &ex);
            let tree = fs.tree_by_id(2).unwrap();
            tree.walk(&mut |_| Ok(()))
                .unwrap_or_else(|e| panic!("{what} copy {mirror}: extent tree: {e}"));
        }
    }
    let _flips: Vec<Flipped> = all
        .iter()
        .map(|&(logical, _)| Flipped::new(&img, &pristine, logical, 0))
        .collect();
    check_all(&open(&[&img]), &ex);
}

/// Set the size in the inode item of `ino` held by `leaf` (a single-copy
/// block) to `size`, and recompute the block's crc32c so that only the
/// item's meaning is wrong.
fn set_inode_size(img: &Path, fs: &Filesystem, leaf: u64, ino: u64, size: u64) {
    let at = physical(fs, leaf, 0).1;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = vec![0u8; NODESIZE];
    f.read_exact_at(&mut b, at).unwrap();
    let nritems = u32::from_le_bytes(b[0x60..0x64].try_into().unwrap()) as usize;
    let slot = (0..nritems)
        .map(|i| 0x65 + i * 25)
        .find(|&o| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) == ino && b[o + 8] == 1)
        .expect("the inode item is in the leaf");
    let data = 0x65 + u32::from_le_bytes(b[slot + 17..slot + 21].try_into().unwrap()) as usize;
    b[data + 16..data + 24].copy_from_slice(&size.to_le_bytes());
    let sum = crc32c::crc32c(&b[32..]);
    b[..4].copy_from_slice(&sum.to_le_bytes());
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn absurd_inode_size_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    let pristine = open(&[&img]);
    let id = pristine.resolve_path(b"/data/mid").unwrap();
    let leaf = dump_tree(&img, &["-t", "fs"])
        .into_iter()
        .find(|b| {
            b.level == 0
                && b.keys
                    .iter()
                    .any(|(o, t, _)| *o == Some(id.ino) && t == "INODE_ITEM")
        })
        .unwrap();
    let Want::File(data) = ex.paths["/data/mid"].clone() else {
        unreachable!()
    };
    // Larger than any address space, and larger than any memory.
    for size in [1u64 << 62, 1 << 50] {
        set_inode_size(&img, &pristine, leaf.logical, id.ino, size);
        let fs = open(&[&img]);
        assert_eq!(fs.stat(id).unwrap().size, size);
        match fs.read_all(id) {
            Err(Error::Invalid(msg)) => assert_eq!(
                msg,
                format!(
                    "inode {} in subvolume 5: {size} bytes do not fit in memory",
                    id.ino
                )
            ),
            Err(e) => panic!("size {size}: expected Error::Invalid, got {e:?}"),
            Ok(v) => panic!("size {size}: read_all returned {} bytes", v.len()),
        }
        // Bounded reads still work: the data, then the hole past it.
        let mut want = data.clone();
        want.resize(30_000, 0);
        assert!(fs.read(id, 0, 30_000).unwrap() == want);
        assert_eq!(fs.read(id, size - 10, 100).unwrap(), vec![0u8; 10]);
    }
    // Past the largest size Linux can give a file: damage, named as such
    // when the file's data is to change (no arithmetic overflows on it);
    // it is still listed, and deleted.
    set_inode_size(&img, &pristine, leaf.logical, id.ino, u64::MAX);
    drop(pristine);
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    assert_eq!(fs.stat(id).unwrap().size, u64::MAX);
    let refused = [
        ("truncate", fs.truncate(id, 0)),
        ("write", fs.write(id, 0, b"x").map(drop)),
        (
            "punch",
            fs.fallocate(
                id,
                ubtrfs::data::FALLOC_FL_PUNCH_HOLE | ubtrfs::data::FALLOC_FL_KEEP_SIZE,
                0,
                4096,
            ),
        ),
    ];
    for (op, r) in refused {
        let e = r.expect_err(op);
        assert!(
            e.to_string().contains("past the largest file size"),
            "{op}: {e}"
        );
    }
    // Refused before anything changed: the rest of the filesystem goes on.
    assert_eq!(fs.aborted(), None);
    let dir = fs.resolve_path(b"/data").unwrap();
    assert!(fs.read_dir(dir, 0).unwrap().iter().any(|e| e.id == id));
    fs.unlink(dir, b"mid").unwrap();
    assert_eq!(fs.aborted(), None);
    fs.commit().unwrap();
    drop(fs);
    check_image_file(&img);
}

fn check_image_file(img: &Path) {
    if let Err(e) = testkit::btrfs_check_file(img, &[]) {
        panic!("{e:#}");
    }
}

/// A superblock whose generation is the largest there is (checksum
/// right): nothing could be newer, and the open says so.
#[test]
fn superblock_generation_at_its_end_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = single_image(dir.path(), "single", "single", 128 * MIB);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    for at in [0x1_0000u64, 0x400_0000] {
        let mut b = vec![0u8; 4096];
        f.read_exact_at(&mut b, at).unwrap();
        b[0x48..0x50].copy_from_slice(&u64::MAX.to_le_bytes());
        let sum = crc32c::crc32c(&b[32..]);
        b[..4].copy_from_slice(&sum.to_le_bytes());
        f.write_all_at(&b, at).unwrap();
    }
    let e = open_err(&[&img]);
    assert!(
        e.to_string().contains("generation 18446744073709551615"),
        "{e}"
    );
}

/// Set bits `set` and clear bits `clear` of the read-only-compatible
/// feature flags in both superblocks of `img` (checksums right).
fn change_compat_ro(img: &Path, set: u64, clear: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    for at in [0x1_0000u64, 0x400_0000] {
        let mut b = vec![0u8; 4096];
        f.read_exact_at(&mut b, at).unwrap();
        let flags = u64::from_le_bytes(b[0xb4..0xbc].try_into().unwrap()) & !clear | set;
        b[0xb4..0xbc].copy_from_slice(&flags.to_le_bytes());
        let sum = crc32c::crc32c(&b[32..]);
        b[..4].copy_from_slice(&sum.to_le_bytes());
        f.write_all_at(&b, at).unwrap();
    }
}

/// A read-only-compatible feature flag this version does not know (a
/// newer kernel's): the filesystem is read, and writing it is refused by
/// name, as the kernel refuses a read-write mount. A free-space tree the
/// kernel marked not valid (it was building it) is not written either.
#[test]
fn unknown_read_only_feature_is_read_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    change_compat_ro(&img, 1 << 10, 0);
    let e = Filesystem::open_read_write(&[&img])
        .err()
        .expect("opened for writing");
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("0x400"), "{e}");
    check_all(&open(&[&img]), &ex);
    change_compat_ro(&img, 0, 1 << 10 | 1 << 1);
    let e = Filesystem::open_read_write(&[&img])
        .err()
        .expect("opened for writing");
    assert!(e.to_string().contains("free-space tree"), "{e}");
    check_all(&open(&[&img]), &ex);
}

/// A seed device (`btrfstune -S 1`) is read, never written: filesystems
/// sprouted from it hold its blocks, and the kernel only mounts it
/// read-only. Opening it for writing is refused by name, and the image
/// stays as it was.
#[test]
fn a_seed_device_is_read_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    run(Command::new("btrfstune").args(["-S", "1"]).arg(&img));
    let before = std::fs::read(&img).unwrap();
    let e = Filesystem::open_read_write(&[&img])
        .err()
        .expect("a seed opened for writing");
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");
    assert!(e.to_string().contains("seed device"), "{e}");
    check_all(&open(&[&img]), &ex);
    assert!(std::fs::read(&img).unwrap() == before, "the seed changed");
}

#[test]
fn symlink_longer_than_a_sector_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "single", "single", 128 * MIB);
    let pristine = open(&[&img]);
    let id = pristine.resolve_path(b"/data/link").unwrap();
    assert_eq!(pristine.read_link(id).unwrap(), b"big");
    let leaf = dump_tree(&img, &["-t", "fs"])
        .into_iter()
        .find(|b| {
            b.level == 0
                && b.keys
                    .iter()
                    .any(|(o, t, _)| *o == Some(id.ino) && t == "INODE_ITEM")
        })
        .unwrap();
    for size in [4096u64, 1 << 40] {
        set_inode_size(&img, &pristine, leaf.logical, id.ino, size);
        let fs = open(&[&img]);
        match fs.read_link(id) {
            Err(Error::Corrupt(msg)) => assert_eq!(
                msg,
                format!("symlink inode {} in subvolume 5 has size {size}", id.ino)
            ),
            other => panic!("size {size}: expected Error::Corrupt, got {other:?}"),
        }
        // Everything else reads.
        for path in ex.paths.keys().filter(|p| *p != "/data/link") {
            read_path(&fs, &ex, path).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
}

// ---------------------------------------------------------------------------
// Flipped bits in file data.

/// Logical address of the byte at `file_offset` of file `id`.
fn data_logical(fs: &Filesystem, id: InodeId, file_offset: u64) -> u64 {
    let tree = fs.tree_by_id(id.subvol).unwrap();
    for item in tree.items_of(id.ino, EXTENT_DATA_KEY).unwrap() {
        let item = item.unwrap();
        let start = item.key().offset;
        let fe = FileExtentItem::parse(item.data()).unwrap();
        assert_eq!(fe.compression, 0);
        if let ExtentBody::Regular {
            disk_bytenr,
            offset,
            num_bytes,
            ..
        } = fe.body
            && (start..start + num_bytes).contains(&file_offset)
        {
            return disk_bytenr + offset + (file_offset - start);
        }
    }
    panic!(
        "no data extent holds offset {file_offset} of inode {}",
        id.ino
    );
}

/// Flip a bit of copy `mirror` of the data at `logical`, among `imgs`
/// (image i holds devid i + 1).
fn flip_data(fs: &Filesystem, imgs: &[PathBuf], logical: u64, mirror: usize) {
    let (devid, phys) = physical(fs, logical, mirror);
    flip(&imgs[devid as usize - 1], phys, 5);
}

/// With copy 0 bad, copy 1 bad, or both bad, `path` reads as follows.
fn check_data_flips(imgs: &[PathBuf], path: &str, data: &[u8], copies: usize) {
    let pristine = open(imgs);
    let id = pristine.resolve_path(path.as_bytes()).unwrap();
    let bad = 70_000u64;
    let bad_sector = bad - bad % SECTOR;
    let logical = data_logical(&pristine, id, bad);
    let sector_logical = logical - (bad - bad_sector);
    let want_err = |e: Error, what: &str| match e {
        Error::DataChecksum {
            subvol,
            ino,
            file_offset,
            logical,
        } => assert_eq!(
            (subvol, ino, file_offset, logical),
            (FS_TREE_OBJECTID, id.ino, bad_sector, sector_logical),
            "{what}"
        ),
        other => panic!("{what}: expected DataChecksum, got {other:?}"),
    };
    let mut cases: Vec<Vec<usize>> = (0..copies).map(|m| vec![m]).collect();
    cases.push((0..copies).collect());
    for bad_copies in cases {
        for &m in &bad_copies {
            flip_data(&pristine, imgs, logical, m);
        }
        let fs = open(imgs);
        let what = format!("{path} with copies {bad_copies:?} of {copies} bad");
        if bad_copies.len() == copies {
            want_err(fs.read_all(id).unwrap_err(), &what);
            want_err(fs.read(id, bad + 1, 10).unwrap_err(), &what);
            // Ranges that do not touch the sector read.
            assert!(fs.read(id, 0, bad_sector as usize).unwrap() == data[..bad_sector as usize]);
            let after = (bad_sector + SECTOR) as usize;
            assert!(fs.read(id, after as u64, 50_000).unwrap() == data[after..after + 50_000]);
        } else {
            assert!(fs.read_all(id).unwrap() == data, "{what}");
            assert!(fs.read(id, bad, 1).unwrap() == data[bad as usize..bad as usize + 1]);
        }
        for &m in &bad_copies {
            flip_data(&pristine, imgs, logical, m);
        }
    }
}

#[test]
fn flipped_bit_in_data_single() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "dup", "single", 128 * MIB);
    let Want::File(data) = ex.paths["/data/big"].clone() else {
        unreachable!()
    };
    check_data_flips(std::slice::from_ref(&img), "/data/big", &data, 1);
    // Every other file is untouched by a bad sector of /data/big.
    let pristine = open(&[&img]);
    let id = pristine.resolve_path(b"/data/big").unwrap();
    flip_data(
        &pristine,
        std::slice::from_ref(&img),
        data_logical(&pristine, id, 70_000),
        0,
    );
    let fs = open(&[&img]);
    for path in ex.paths.keys().filter(|p| *p != "/data/big") {
        read_path(&fs, &ex, path).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

#[test]
fn flipped_bit_in_data_dup() {
    let dir = tempfile::tempdir().unwrap();
    let (img, ex) = single_image(dir.path(), "dup", "dup", 256 * MIB);
    let Want::File(data) = ex.paths["/data/big"].clone() else {
        unreachable!()
    };
    check_data_flips(std::slice::from_ref(&img), "/data/big", &data, 2);
    check_all(&open(&[&img]), &ex);
}

#[test]
fn flipped_bit_in_data_raid1() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = multi_image(dir.path(), 2, "raid1", "raid1");
    let (path, data) = multi_files()
        .into_iter()
        .find(|(p, _)| p == "/big")
        .unwrap();
    check_data_flips(&imgs, &path, &data, 2);
    check_multi(&open(&imgs));
}

// ---------------------------------------------------------------------------
// Missing devices.

fn degraded_warning(fs: &Filesystem, devid: u64) {
    let w = fs.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(&format!("device {devid} (uuid "))
            && w[0].contains("is missing; reading degraded"),
        "{w:?}"
    );
}

#[test]
fn raid1_with_a_device_missing_reads_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = multi_image(dir.path(), 2, "raid1", "raid1");
    let all = open(&imgs);
    assert!(all.warnings().is_empty(), "{:?}", all.warnings());
    for (present, missing) in [(0usize, 2u64), (1, 1)] {
        let fs = open(&[&imgs[present]]);
        degraded_warning(&fs, missing);
        check_multi(&fs);
    }
}

#[test]
fn raid10_with_a_device_missing_reads_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = multi_image(dir.path(), 4, "raid10", "raid10");
    check_multi(&open(&imgs));
    for gone in 0..4 {
        let rest: Vec<&PathBuf> = imgs
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != gone)
            .map(|(_, p)| p)
            .collect();
        let fs = open(&rest);
        degraded_warning(&fs, gone as u64 + 1);
        check_multi(&fs);
    }
}

#[test]
fn raid0_with_a_device_missing_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let imgs: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("dev{i}.img")))
        .collect();
    for img in &imgs {
        sparse_file(img, 256 * MIB);
    }
    run(Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-m", "raid1", "-d", "raid0"])
        .args(&imgs));
    assert!(open(&imgs).warnings().is_empty());
    for (present, missing) in [(0usize, 2u64), (1, 1)] {
        match open_err(&[&imgs[present]]) {
            Error::Devices(msg) => assert!(
                msg.starts_with(&format!("device {missing} (uuid "))
                    && msg.contains("is missing and the RAID0 chunk at logical"),
                "{msg}"
            ),
            other => panic!("expected Error::Devices, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Wrong device combinations.

fn fsid(img: &Path) -> String {
    ubtrfs::format::uuid_string(&open(&[img]).superblock().fsid)
}

#[test]
fn devices_of_different_filesystems_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let imgs: Vec<PathBuf> = (0..6)
        .map(|i| dir.path().join(format!("{i}.img")))
        .collect();
    for img in &imgs {
        sparse_file(img, 128 * MIB);
    }
    // Two single-device filesystems, and two two-device ones.
    for set in [&imgs[0..1], &imgs[1..2], &imgs[2..4], &imgs[4..6]] {
        let profiles = if set.len() == 1 { "single" } else { "raid1" };
        run(Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-m", profiles, "-d", profiles])
            .args(set));
    }
    for (a, b) in [
        (&imgs[0], &imgs[1]),
        (&imgs[2], &imgs[5]),
        (&imgs[3], &imgs[0]),
    ] {
        match open_err(&[a, b]) {
            Error::Devices(msg) => assert_eq!(
                msg,
                format!(
                    "{} belongs to filesystem {}, not {}",
                    b.display(),
                    fsid(b),
                    fsid(a)
                )
            ),
            other => panic!("expected Error::Devices, got {other:?}"),
        }
    }
}

#[test]
fn same_device_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = single_image(dir.path(), "single", "single", 128 * MIB);
    // Through another name too: a hard link is the same device.
    let alias = dir.path().join("alias.img");
    std::fs::hard_link(&img, &alias).unwrap();
    for other in [&img, &alias] {
        match open_err(&[&img, other]) {
            Error::Devices(msg) => assert_eq!(
                msg,
                format!(
                    "{} and {} are both device 1",
                    img.display(),
                    other.display()
                )
            ),
            e => panic!("expected Error::Devices, got {e:?}"),
        }
    }
}

#[test]
fn non_btrfs_file_has_no_superblock() {
    let dir = tempfile::tempdir().unwrap();
    let random = dir.path().join("random.bin");
    std::fs::write(&random, bytes(7, MIB as usize)).unwrap();
    let zeros = dir.path().join("zeros.bin");
    sparse_file(&zeros, 100 * MIB);
    let tiny = dir.path().join("tiny.bin");
    std::fs::write(&tiny, b"not a filesystem").unwrap();
    let (good, _) = single_image(dir.path(), "single", "single", 128 * MIB);
    let cases: [(&[&Path], &Path, &str); 4] = [
        (
            &[&random],
            &random,
            "copy 0 at 65536: corrupt metadata: no btrfs magic",
        ),
        (
            &[&zeros],
            &zeros,
            "copy 0 at 65536: corrupt metadata: no btrfs magic; copy 1 at 67108864: corrupt metadata: no btrfs magic",
        ),
        (
            &[&tiny],
            &tiny,
            "device of 16 bytes is too small to hold one",
        ),
        (
            &[&good, &random],
            &random,
            "copy 0 at 65536: corrupt metadata: no btrfs magic",
        ),
    ];
    for (paths, bad, why_want) in cases {
        match open_err(paths) {
            Error::NoSuperblock { path, why } => {
                assert_eq!(path, bad);
                assert_eq!(why, why_want);
            }
            other => panic!("{}: expected NoSuperblock, got {other:?}", bad.display()),
        }
    }
}

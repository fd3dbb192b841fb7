//! `ubtrfs inspect dump-tree` judged against `btrfs inspect-internal
//! dump-tree` (btrfs-progs is the oracle).
//!
//! For each image (made by `mkfs.btrfs --rootdir`, by the kernel through a
//! loop mount, and by `ubtrfs mkfs` on two devices), both tools dump every tree and then each tree alone
//! (`-t`); both outputs are parsed and compared: the same trees in the same
//! order, the same blocks depth first (bytenr, level, items, free space,
//! generation, owner, fsid, chunk uuid, flags, backref revision), the same
//! key pointers, the same items (key, itemoff, itemsize) and, for every item,
//! each field btrfs-progs prints: numbers as numbers, names of types and
//! flags mapped to their codes, names and xattr values as bytes. A line of
//! btrfs-progs this test does not understand counts as a difference, so a
//! new item kind shows up instead of passing unseen.
//!
//! Each image is also walked with the library itself: every item that
//! `format::items` parses (inode, dir/xattr, inode ref/extref, file extent,
//! root item and refs, block group, dev extent, dev item, chunk) must agree
//! with the checked decoder field by field, and where the library has an
//! encoder, re-encoding the parsed item must give back its exact bytes.
//!
//! The tests need root, loop devices, the btrfs module and btrfs-progs;
//! without them they fail (never skip). `UBTRFS_KEEP_TEST_DIR=1` keeps the images
//! and both dumps of a failing run; `UBTRFS_TEST_DIR` says where they go.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

// ---------------------------------------------------------------------------
// Environment

/// Why the privileged tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("btrfs"))
    {
        return Some("no btrfs in /proc/filesystems".into());
    }
    for tool in ["mkfs.btrfs", "btrfs", "mount", "umount", "losetup"] {
        if which(tool).is_none() {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Fails the test, naming what is missing, when it cannot run.
fn can_run(test: &str) -> bool {
    if let Some(why) = unavailable() {
        panic!("{test}: cannot run (scripts/test.sh installs what is needed): {why}");
    }
    true
}

/// Run a command; panic with its output if it fails. Returns stdout.
fn run(cmd: &mut Command) -> Vec<u8> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out.stdout
}

fn tool(name: &str) -> Command {
    Command::new(which(name).unwrap_or_else(|| PathBuf::from(name)))
}

fn temp_dir(name: &str) -> tempfile::TempDir {
    let base = std::env::var_os("UBTRFS_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).expect("test dir base");
    tempfile::Builder::new()
        .prefix(&format!("ubtrfs-{name}-"))
        .tempdir_in(base)
        .expect("temp dir")
}

/// A sparse image file of `size` bytes.
fn sparse(path: &Path, size: u64) {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(size))
        .expect("image file");
}

/// A loop mount, unmounted on drop (also when the test panics).
struct Mounted(PathBuf);

impl Mounted {
    fn new(image: &Path, target: &Path, options: &str) -> Mounted {
        std::fs::create_dir_all(target).expect("mount point");
        let mount = || {
            tool("mount")
                .arg("-o")
                .arg(format!("loop,{options}"))
                .arg(image)
                .arg(target)
                .stdin(Stdio::null())
                .output()
                .expect("cannot start mount")
        };
        // Setting up a loop device can fail when other tests grab loop
        // devices at the same moment: try again a few times.
        let mut out = mount();
        for _ in 0..4 {
            if out.status.success() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            out = mount();
        }
        assert!(
            out.status.success(),
            "mount -o loop,{options} {} {} failed: {}",
            image.display(),
            target.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Mounted(target.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let ok = tool("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = tool("umount").arg("-l").arg(&self.0).status();
        }
    }
}

// ---------------------------------------------------------------------------
// Generated content

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Bytes that compress well (repeated words), `n` long.
fn compressible(rng: &mut Rng, n: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 6] = [b"btrfs ", b"extent ", b"tree ", b"leaf ", b"node ", b"key;"];
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    v.truncate(n);
    v
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let p = CString::new(path.as_os_str().as_bytes()).expect("path");
    let n = CString::new(name).expect("name");
    // SAFETY: valid NUL-terminated strings and a valid buffer.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {name} on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn mkfifo(path: &Path) {
    let p = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: valid NUL-terminated path.
    let r = unsafe { libc::mkfifo(p.as_ptr(), 0o644) };
    assert_eq!(r, 0, "mkfifo {}", path.display());
}

/// A tree of `files` files under `root`: nested directories, inline and
/// regular files, empty files, symlinks, hard links, fifos, xattrs, and names
/// with spaces, non-ASCII characters and the maximum length.
fn gen_tree(root: &Path, seed: u64, files: usize) {
    let mut rng = Rng(seed | 1);
    let mut dirs = vec![root.to_path_buf()];
    std::fs::create_dir_all(root).expect("root dir");
    for i in 0..(files / 40).max(3) {
        let parent = dirs[rng.below(dirs.len() as u64) as usize].clone();
        let name = match i % 5 {
            0 => format!("dir {i}"),
            1 => format!("répertoire-{i}"),
            _ => format!("d{i}"),
        };
        let d = parent.join(name);
        std::fs::create_dir(&d).expect("mkdir");
        dirs.push(d);
    }
    let mut regular = Vec::new();
    for i in 0..files {
        let dir = &dirs[rng.below(dirs.len() as u64) as usize];
        let name = match i % 97 {
            0 => format!("{i}-{}", "n".repeat(240)),
            1 => format!("file with spaces {i}"),
            2 => format!("fichier-é-{i}"),
            _ => format!("f{i}"),
        };
        let path = dir.join(&name);
        let size = match rng.below(100) {
            0..=14 => 0,
            15..=54 => 1 + rng.below(2000) as usize,
            55..=94 => 3000 + rng.below(20_000) as usize,
            _ => 100_000 + rng.below(300_000) as usize,
        };
        let data = if rng.below(2) == 0 {
            rng.bytes(size)
        } else {
            compressible(&mut rng, size)
        };
        std::fs::write(&path, &data).expect("write file");
        if rng.below(20) == 0 {
            set_xattr(&path, "user.test", format!("value {i}").as_bytes());
            if rng.below(3) == 0 {
                set_xattr(&path, "user.big", &compressible(&mut rng, 300));
            }
        }
        regular.push(path);
    }
    for i in 0..files / 30 {
        let dir = &dirs[rng.below(dirs.len() as u64) as usize];
        let target = if i % 7 == 0 {
            "t/".repeat(200)
        } else {
            format!("../target-{i}")
        };
        std::os::unix::fs::symlink(target, dir.join(format!("link{i}"))).expect("symlink");
    }
    for i in 0..files / 60 {
        let src = &regular[rng.below(regular.len() as u64) as usize];
        for j in 0..1 + rng.below(3) {
            let dir = &dirs[rng.below(dirs.len() as u64) as usize];
            std::fs::hard_link(src, dir.join(format!("hard{i}-{j}"))).expect("hard link");
        }
    }
    for i in 0..3 {
        mkfifo(&dirs[i % dirs.len()].join(format!("fifo{i}")));
    }
}

/// Make an image with `mkfs.btrfs --rootdir`.
fn mkfs_rootdir(dir: &Path, name: &str, seed: u64, files: usize, mkfs_args: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}-src"));
    gen_tree(&src, seed, files);
    let img = dir.join(format!("{name}.img"));
    sparse(&img, 512 << 20);
    run(tool("mkfs.btrfs")
        .args(["-q", "-f", "-n", "4096"])
        .args(mkfs_args)
        .arg("--rootdir")
        .arg(&src)
        .arg(&img));
    std::fs::remove_dir_all(&src).expect("remove source tree");
    img
}

fn btrfs(args: &[&str], path: &Path) {
    run(tool("btrfs").args(args).arg(path));
}

fn sync() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// An image written by the kernel: compression (zstd, zlib, lzo), inline
/// and regular extents, fallocate, hard links (with extended refs), xattrs,
/// reflinks (standalone back references), a snapshot then changes to the
/// source (full back references, shared refs), a read-only snapshot,
/// qgroups, a deleted subvolume, fragmented free space.
fn kernel_image(dir: &Path) -> PathBuf {
    let img = dir.join("kernel.img");
    sparse(&img, 768 << 20);
    run(tool("mkfs.btrfs")
        .args(["-q", "-f", "-n", "4096", "--csum", "blake2"])
        .arg(&img));
    let mnt = dir.join("mnt");
    let m = Mounted::new(&img, &mnt, "compress=zstd");
    let mut rng = Rng(0x5eed);
    btrfs(&["quota", "enable"], &mnt);
    let sv = mnt.join("sv");
    btrfs(&["subvolume", "create"], &sv);
    gen_tree(&sv.join("tree"), 7, 1500);

    // Compression of each kind.
    for alg in ["zlib", "lzo", "zstd"] {
        let d = sv.join(alg);
        std::fs::create_dir(&d).expect("mkdir");
        run(tool("btrfs")
            .args(["property", "set"])
            .arg(&d)
            .args(["compression", alg]));
        std::fs::write(d.join("big"), compressible(&mut rng, 700_000)).expect("write");
        std::fs::write(d.join("small"), compressible(&mut rng, 1500)).expect("write");
    }
    // Preallocated space, partly written.
    let pre = sv.join("prealloc");
    let f = std::fs::File::create(&pre).expect("create");
    // SAFETY: a valid open file descriptor.
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 1 << 20) };
    assert_eq!(r, 0, "fallocate");
    std::os::unix::fs::FileExt::write_at(&f, &rng.bytes(8192), 65536).expect("write");
    drop(f);
    // Many long hard-link names: more than fit an inode ref.
    let links = sv.join("links");
    std::fs::create_dir(&links).expect("mkdir");
    std::fs::write(links.join("target"), b"linked").expect("write");
    for i in 0..60 {
        std::fs::hard_link(
            links.join("target"),
            links.join(format!("{}-{i}", "a-rather-long-hard-link-name".repeat(2))),
        )
        .expect("hard link");
    }
    // Reflinks: more references than fit inline in one extent item.
    let base = sv.join("reflink-base");
    std::fs::write(&base, rng.bytes(300_000)).expect("write");
    for i in 0..40 {
        run(tool("cp")
            .arg("--reflink=always")
            .arg(&base)
            .arg(sv.join(format!("clone{i}"))));
    }
    // Fragmented free space: many small extents, every other one freed.
    let frag = sv.join("frag");
    std::fs::create_dir(&frag).expect("mkdir");
    for i in 0..600 {
        std::fs::write(frag.join(format!("{i}")), rng.bytes(5000)).expect("write");
    }
    sync();
    for i in (0..600).step_by(2) {
        std::fs::remove_file(frag.join(format!("{i}"))).expect("remove");
    }
    sync();

    // Snapshots, then changes in the source: shared blocks get full back refs.
    run(tool("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(&sv)
        .arg(mnt.join("snap")));
    run(tool("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&sv)
        .arg(mnt.join("ro-snap")));
    sync();
    for (i, e) in std::fs::read_dir(sv.join("tree"))
        .expect("readdir")
        .enumerate()
    {
        let p = e.expect("entry").path();
        if i % 3 == 0 && p.is_file() && !p.is_symlink() {
            let mut old = std::fs::read(&p).unwrap_or_default();
            old.extend_from_slice(b"appended");
            std::fs::write(&p, old).expect("rewrite");
        }
    }
    std::fs::remove_dir_all(sv.join("zlib")).expect("remove");

    // Qgroups: a higher-level group, a relation, limits.
    run(tool("btrfs").args(["qgroup", "create", "1/100"]).arg(&mnt));
    let _ = tool("btrfs")
        .args(["qgroup", "assign", "0/256", "1/100"])
        .arg(&mnt)
        .output();
    run(tool("btrfs")
        .args(["qgroup", "limit", "-e", "5M", "0/256"])
        .arg(&mnt));
    run(tool("btrfs")
        .args(["qgroup", "limit", "7M", "0/256"])
        .arg(&mnt));

    // A deleted subvolume: its root stays (dead, with an orphan item) until
    // the cleaner drops it, which may be after the unmount. It is one leaf,
    // so the drop is a single step: the tree is whole or gone, never half
    // freed (a half-dropped tree has pointers to freed blocks).
    let doomed = mnt.join("doomed");
    btrfs(&["subvolume", "create"], &doomed);
    for i in 0..3 {
        std::fs::write(doomed.join(format!("f{i}")), b"x").expect("write");
    }
    sync();
    btrfs(&["subvolume", "delete"], &doomed);
    drop(m);
    img
}

// ---------------------------------------------------------------------------
// The common model of a dump

type K = (u64, u8, u64);

#[derive(Clone, Debug, PartialEq, Eq)]
enum V {
    N(u64),
    Time(u64, u64),
    Key(K),
    Uuid(String),
    Bytes(Vec<u8>),
}

impl std::fmt::Display for V {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            V::N(n) => write!(f, "{n}"),
            V::Time(s, n) => write!(f, "{s}.{n}"),
            V::Key(k) => write!(f, "({} {} {})", k.0, k.1, k.2),
            V::Uuid(u) => write!(f, "{u}"),
            V::Bytes(b) if b.len() > 60 => write!(
                f,
                "{:?}... ({} bytes)",
                String::from_utf8_lossy(&b[..60]),
                b.len()
            ),
            V::Bytes(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
        }
    }
}

/// One group of fields: the item's own (`kind` empty) or one entry.
#[derive(Clone, Debug, Default)]
struct Record {
    kind: String,
    fields: Vec<(String, V)>,
}

#[derive(Clone, Debug, Default)]
struct Item {
    key: K,
    itemoff: u64,
    itemsize: u64,
    records: Vec<Record>,
    problem: Option<String>,
}

#[derive(Clone, Debug, Default)]
struct Block {
    leaf: bool,
    bytenr: u64,
    level: u64,
    nritems: u64,
    free: u64,
    generation: u64,
    owner: u64,
    fsid: String,
    chunk_uuid: String,
    flags: u64,
    backref_rev: u64,
    ptrs: Vec<(K, u64, u64)>,
    items: Vec<Item>,
}

#[derive(Clone, Debug, Default)]
struct TreeDump {
    id: u64,
    root_key: Option<K>,
    blocks: Vec<Block>,
}

// ---------------------------------------------------------------------------
// Names btrfs-progs prints

const ITEM_TYPES: &[(&str, u8)] = &[
    ("INODE_ITEM", 1),
    ("INODE_REF", 12),
    ("INODE_EXTREF", 13),
    ("XATTR_ITEM", 24),
    ("VERITY_DESC_ITEM", 36),
    ("VERITY_MERKLE_ITEM", 37),
    ("ORPHAN_ITEM", 48),
    ("DIR_LOG_ITEM", 60),
    ("DIR_LOG_INDEX", 72),
    ("DIR_ITEM", 84),
    ("DIR_INDEX", 96),
    ("EXTENT_DATA", 108),
    ("EXTENT_CSUM", 128),
    ("ROOT_ITEM", 132),
    ("ROOT_BACKREF", 144),
    ("ROOT_REF", 156),
    ("EXTENT_ITEM", 168),
    ("METADATA_ITEM", 169),
    ("EXTENT_OWNER_REF", 172),
    ("TREE_BLOCK_REF", 176),
    ("EXTENT_DATA_REF", 178),
    ("SHARED_BLOCK_REF", 182),
    ("SHARED_DATA_REF", 184),
    ("BLOCK_GROUP_ITEM", 192),
    ("FREE_SPACE_INFO", 198),
    ("FREE_SPACE_EXTENT", 199),
    ("FREE_SPACE_BITMAP", 200),
    ("DEV_EXTENT", 204),
    ("DEV_ITEM", 216),
    ("CHUNK_ITEM", 228),
    ("RAID_STRIPE", 230),
    ("QGROUP_STATUS", 240),
    ("QGROUP_INFO", 242),
    ("QGROUP_LIMIT", 244),
    ("QGROUP_RELATION", 246),
    ("TEMPORARY_ITEM", 248),
    ("PERSISTENT_ITEM", 249),
    ("DEV_REPLACE", 250),
    ("UUID_KEY_SUBVOL", 251),
    ("UUID_KEY_RECEIVED_SUBVOL", 252),
    ("STRING_ITEM", 253),
];

const OBJECTIDS: &[(&str, u64)] = &[
    ("ROOT_TREE", 1),
    ("EXTENT_TREE", 2),
    ("CHUNK_TREE", 3),
    ("DEV_TREE", 4),
    ("FS_TREE", 5),
    ("ROOT_TREE_DIR", 6),
    ("CSUM_TREE", 7),
    ("QUOTA_TREE", 8),
    ("UUID_TREE", 9),
    ("FREE_SPACE_TREE", 10),
    ("BLOCK_GROUP_TREE", 11),
    ("RAID_STRIPE_TREE", 12),
    ("DEV_STATS", 0),
    ("DEV_ITEMS", 1),
    ("FIRST_CHUNK_TREE", 256),
    ("BALANCE", -4i64 as u64),
    ("ORPHAN", -5i64 as u64),
    ("TREE_LOG", -6i64 as u64),
    ("TREE_LOG_FIXUP", -7i64 as u64),
    ("TREE_RELOC", -8i64 as u64),
    ("DATA_RELOC_TREE", -9i64 as u64),
    ("EXTENT_CSUM", -10i64 as u64),
    ("FREE_SPACE", -11i64 as u64),
    ("FREE_INO", -12i64 as u64),
    ("MULTIPLE", -255i64 as u64),
];

const FILE_TYPES: &[(&str, u64)] = &[
    ("UNKNOWN", 0),
    ("FILE", 1),
    ("DIR", 2),
    ("CHRDEV", 3),
    ("BLKDEV", 4),
    ("FIFO", 5),
    ("SOCK", 6),
    ("SYMLINK", 7),
    ("XATTR", 8),
];

const EXTENT_FLAGS: &[(&str, u64)] = &[("DATA", 1), ("TREE_BLOCK", 2), ("FULL_BACKREF", 256)];

const BG_FLAGS: &[(&str, u64)] = &[
    ("DATA", 1),
    ("SYSTEM", 2),
    ("METADATA", 4),
    ("RAID0", 8),
    ("RAID1", 16),
    ("DUP", 32),
    ("RAID10", 64),
    ("RAID5", 128),
    ("RAID6", 256),
    ("RAID1C3", 512),
    ("RAID1C4", 1024),
    ("single", 0),
];

const QGROUP_STATUS_FLAGS: &[(&str, u64)] = &[
    ("ON", 1),
    ("RESCAN", 2),
    // btrfs-progs prints the rescan bit as SCANNING while a rescan runs.
    ("SCANNING", 2),
    ("INCONSISTENT", 4),
    ("SIMPLE_MODE", 8),
];

fn item_type(name: &str) -> u8 {
    if let Some(n) = name.strip_prefix("UNKNOWN.") {
        return n.parse().unwrap_or_else(|_| panic!("item type {name}"));
    }
    ITEM_TYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("unknown item type name {name}"))
}

/// A number as btrfs-progs prints it: decimal, `0x` hex, a qgroup id
/// `level/id`, or the name of a reserved objectid.
fn num(tok: &str) -> u64 {
    let tok = tok.trim_end_matches(',');
    let head = tok.split('(').next().unwrap_or(tok);
    if let Some(h) = head.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("hex number {tok}"));
    }
    if let Some((level, id)) = head.split_once('/') {
        return (level.parse::<u64>().expect("qgroup level") << 48)
            | id.parse::<u64>().expect("qgroup id");
    }
    if let Ok(n) = head.parse::<u64>() {
        return n;
    }
    if let Ok(n) = head.parse::<i64>() {
        return n as u64;
    }
    OBJECTIDS
        .iter()
        .find(|(n, _)| *n == head)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("not a number: {tok}"))
}

/// Flags printed as `NAME|NAME` (or `0xHEX(...)`).
fn flag_names(tok: &str, table: &[(&str, u64)]) -> u64 {
    if tok.starts_with("0x") {
        return num(tok);
    }
    let inner = tok.trim_start_matches('(').trim_end_matches(')');
    if inner == "none" || inner.is_empty() {
        return 0;
    }
    inner
        .split('|')
        .map(|n| {
            table
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("unknown flag name {n} in {tok}"))
        })
        .fold(0, |a, b| a | b)
}

fn parse_key_tokens(obj: &str, typ: &str, off: &str) -> K {
    (num(obj), item_type(typ), num(off))
}

/// A key printed by btrfs-progs: `(obj TYPE off)`.
fn progs_key(tok: &str) -> K {
    let inner = tok.trim_start_matches('(').trim_end_matches(')');
    let parts: Vec<&str> = inner.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "key {tok}");
    parse_key_tokens(parts[0], parts[1], parts[2])
}

/// The token after the whole word(s) `label` in `line`; a token starting
/// with `(` runs to the matching `)`.
fn after<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(pos) = line[from..].find(label) {
        let p = from + pos;
        let end = p + label.len();
        let word_start = p == 0 || line.as_bytes()[p - 1].is_ascii_whitespace();
        let word_end = line.as_bytes().get(end) == Some(&b' ');
        if word_start && word_end {
            let rest = line[end..].trim_start();
            if rest.starts_with('(') {
                let close = rest.find(')').map_or(rest.len(), |c| c + 1);
                return Some(&rest[..close]);
            }
            return Some(rest.split_whitespace().next().unwrap_or(""));
        }
        from = p + 1;
    }
    None
}

/// The bytes after `label` up to the end of the (raw) line.
fn rest_bytes(line: &[u8], label: &[u8]) -> Option<Vec<u8>> {
    line.windows(label.len())
        .position(|w| w == label)
        .map(|p| line[p + label.len()..].to_vec())
}

fn time(tok: &str) -> V {
    let (s, n) = tok.split_once('.').unwrap_or((tok, "0"));
    V::Time(s.parse().expect("seconds"), n.parse().expect("nanoseconds"))
}

// ---------------------------------------------------------------------------
// Parsing btrfs-progs output

struct Fields<'a> {
    text: String,
    rec: &'a mut Record,
}

impl Fields<'_> {
    fn n(&mut self, label: &str, name: &str) {
        if let Some(t) = after(&self.text, label) {
            self.rec.fields.push((name.into(), V::N(num(t))));
        }
    }
    fn octal(&mut self, label: &str, name: &str) {
        if let Some(t) = after(&self.text, label) {
            let v = u64::from_str_radix(t, 8).expect("octal");
            self.rec.fields.push((name.into(), V::N(v)));
        }
    }
    fn hex(&mut self, label: &str, name: &str) {
        if let Some(t) = after(&self.text, label) {
            let h = t.trim_start_matches("0x");
            let h = h.split('(').next().unwrap_or(h);
            let v = u64::from_str_radix(h, 16).expect("hex");
            self.rec.fields.push((name.into(), V::N(v)));
        }
    }
    fn flags(&mut self, label: &str, name: &str, table: &[(&str, u64)]) {
        if let Some(t) = after(&self.text, label) {
            self.rec
                .fields
                .push((name.into(), V::N(flag_names(t, table))));
        }
    }
    fn time(&mut self, label: &str, name: &str) {
        if let Some(t) = after(&self.text, label) {
            self.rec.fields.push((name.into(), time(t)));
        }
    }
    fn key(&mut self, label: &str, name: &str) {
        if let Some(t) = after(&self.text, label) {
            self.rec.fields.push((name.into(), V::Key(progs_key(t))));
        }
    }
    fn uuid(&mut self, label: &str, name: &str) {
        if let Some(t) = after(&self.text, label) {
            self.rec.fields.push((name.into(), V::Uuid(t.into())));
        }
    }
    fn enumv(&mut self, label: &str, name: &str, table: &[(&str, u64)]) {
        if let Some(t) = after(&self.text, label) {
            let v = table
                .iter()
                .find(|(n, _)| *n == t)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("unknown name {t} for {label}"));
            self.rec.fields.push((name.into(), V::N(v)));
        }
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn unparsed(line: &[u8]) -> Record {
    Record {
        kind: format!("unparsed: {}", lossy(line).trim()),
        fields: Vec::new(),
    }
}

/// The records of one item from the lines btrfs-progs prints under it.
fn progs_records(key: &K, lines: &[Vec<u8>]) -> Vec<Record> {
    let mut top = Record::default();
    let mut entries: Vec<Record> = Vec::new();
    let joined = lines.iter().map(|l| lossy(l)).collect::<Vec<_>>().join(" ");
    let starts = |l: &[u8], p: &str| lossy(l).trim_start().starts_with(p);
    match key.1 {
        // INODE_ITEM
        1 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            for l in ["generation", "transid", "size", "nbytes"] {
                f.n(l, l);
            }
            f.n("block group", "block_group");
            f.octal("mode", "mode");
            f.n("links", "nlink");
            for l in ["uid", "gid", "rdev", "sequence"] {
                f.n(l, l);
            }
            f.hex("flags", "flags");
            for l in ["atime", "ctime", "mtime", "otime"] {
                f.time(l, l);
            }
        }
        // INODE_REF, INODE_EXTREF
        12 | 13 => {
            for l in lines {
                let s = lossy(l);
                if after(&s, "index").is_none() {
                    entries.push(unparsed(l));
                    continue;
                }
                let mut r = Record {
                    kind: if key.1 == 12 { "ref" } else { "extref" }.into(),
                    fields: Vec::new(),
                };
                let mut f = Fields {
                    text: s,
                    rec: &mut r,
                };
                f.n("index", "index");
                f.n("parent", "parent");
                if let Some(name) = rest_bytes(l, b"name: ") {
                    r.fields.push(("name".into(), V::Bytes(name)));
                }
                entries.push(r);
            }
        }
        // XATTR_ITEM, DIR_ITEM, DIR_INDEX
        24 | 84 | 96 => {
            for l in lines {
                let s = lossy(l);
                let t = s.trim_start();
                if t.starts_with("location key") {
                    let mut r = Record {
                        kind: "dir_entry".into(),
                        fields: Vec::new(),
                    };
                    let mut f = Fields {
                        text: s.clone(),
                        rec: &mut r,
                    };
                    f.key("location key", "location");
                    f.enumv("type", "type", FILE_TYPES);
                    entries.push(r);
                } else if let Some(r) = entries.last_mut() {
                    if t.starts_with("transid") {
                        let mut f = Fields { text: s, rec: r };
                        f.n("transid", "transid");
                        f.n("data_len", "data_len");
                        f.n("name_len", "name_len");
                    } else if t.starts_with("name: ") {
                        let name = rest_bytes(l, b"name: ").unwrap_or_default();
                        r.fields.push(("name".into(), V::Bytes(name)));
                    } else if t.starts_with("data ") {
                        let data = rest_bytes(l, b"data ").unwrap_or_default();
                        r.fields.push(("data".into(), V::Bytes(data)));
                    } else {
                        entries.push(unparsed(l));
                    }
                } else {
                    entries.push(unparsed(l));
                }
            }
        }
        // ORPHAN_ITEM
        48 => {
            for l in lines {
                if !starts(l, "orphan item") {
                    entries.push(unparsed(l));
                }
            }
        }
        // EXTENT_DATA
        108 => {
            for l in lines {
                let s = lossy(l);
                let t = s.trim_start().to_string();
                let mut f = Fields {
                    text: s,
                    rec: &mut top,
                };
                if t.starts_with("generation") {
                    f.n("generation", "generation");
                    f.n("type", "type");
                } else if t.starts_with("inline extent data size") {
                    f.n("size", "inline_size");
                    f.n("ram_bytes", "ram_bytes");
                    f.n("compression", "compression");
                } else if t.starts_with("extent data disk byte")
                    || t.starts_with("prealloc data disk byte")
                {
                    f.n("byte", "disk_bytenr");
                    f.n("nr", "disk_num_bytes");
                } else if t.starts_with("extent data offset")
                    || t.starts_with("prealloc data offset")
                {
                    f.n("offset", "offset");
                    f.n("nr", "num_bytes");
                    f.n("ram", "ram_bytes");
                } else if t.starts_with("extent compression") {
                    f.n("compression", "compression");
                } else {
                    entries.push(unparsed(l));
                }
            }
        }
        // EXTENT_CSUM
        128 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            f.n("start", "start");
            f.n("end", "end");
            f.n("length", "length");
        }
        // ROOT_ITEM
        132 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            for l in [
                "generation",
                "root_dirid",
                "bytenr",
                "byte_limit",
                "bytes_used",
                "last_snapshot",
            ] {
                f.n(l, l);
            }
            f.hex("flags", "flags");
            f.n("refs", "refs");
            f.key("drop_progress key", "drop_progress");
            f.n("drop_level", "drop_level");
            f.n("level", "level");
            f.n("generation_v2", "generation_v2");
            for l in ["uuid", "parent_uuid", "received_uuid"] {
                f.uuid(l, l);
            }
            for l in ["ctransid", "otransid", "stransid", "rtransid"] {
                f.n(l, l);
            }
            for l in ["ctime", "otime", "stime", "rtime"] {
                f.time(l, l);
            }
        }
        // ROOT_BACKREF, ROOT_REF
        144 | 156 => {
            let line = lines.first().cloned().unwrap_or_default();
            let mut f = Fields {
                text: lossy(&line),
                rec: &mut top,
            };
            f.n("dirid", "dirid");
            f.n("sequence", "sequence");
            if let Some(name) = rest_bytes(&line, b" name ") {
                top.fields.push(("name".into(), V::Bytes(name)));
            }
            for l in lines.iter().skip(1) {
                entries.push(unparsed(l));
            }
        }
        // EXTENT_ITEM, METADATA_ITEM
        168 | 169 => {
            for (i, l) in lines.iter().enumerate() {
                let s = lossy(l);
                let t = s.trim_start().to_string();
                if i == 0 && t.starts_with("refs") {
                    let mut f = Fields {
                        text: s,
                        rec: &mut top,
                    };
                    f.n("refs", "refs");
                    f.n("gen", "generation");
                    f.flags("flags", "flags", EXTENT_FLAGS);
                    continue;
                }
                let (kind, labels): (&str, &[(&str, &str)]) =
                    if t.starts_with("tree block key") || t.starts_with("tree block skinny") {
                        let mut f = Fields {
                            text: s,
                            rec: &mut top,
                        };
                        f.key("tree block key", "key");
                        f.n("level", "level");
                        continue;
                    } else if t.starts_with("tree block backref") {
                        ("tree_block_ref", &[("root", "root")])
                    } else if t.starts_with("shared block backref") {
                        ("shared_block_ref", &[("parent", "parent")])
                    } else if t.starts_with("extent data backref") {
                        (
                            "extent_data_ref",
                            &[
                                ("root", "root"),
                                ("objectid", "objectid"),
                                ("offset", "offset"),
                                ("count", "count"),
                            ],
                        )
                    } else if t.starts_with("shared data backref") {
                        (
                            "shared_data_ref",
                            &[("parent", "parent"), ("count", "count")],
                        )
                    } else if t.starts_with("extent owner") {
                        ("extent_owner_ref", &[("root", "root")])
                    } else {
                        entries.push(unparsed(l));
                        continue;
                    };
                let mut r = Record {
                    kind: kind.into(),
                    fields: Vec::new(),
                };
                let mut f = Fields {
                    text: s,
                    rec: &mut r,
                };
                for (label, name) in labels {
                    f.n(label, name);
                }
                entries.push(r);
            }
        }
        // TREE_BLOCK_REF, SHARED_BLOCK_REF, EXTENT_DATA_REF, SHARED_DATA_REF (standalone)
        176 | 182 | 178 | 184 | 172 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            if key.1 == 178 {
                for l in ["root", "objectid", "offset", "count"] {
                    f.n(l, l);
                }
            }
            if key.1 == 184 {
                f.n("count", "count");
            }
            if key.1 == 172 {
                f.n("root", "root");
            }
        }
        // BLOCK_GROUP_ITEM
        192 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            f.n("used", "used");
            f.n("chunk_objectid", "chunk_objectid");
            f.flags("flags", "flags", BG_FLAGS);
        }
        // FREE_SPACE_INFO
        198 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            f.n("count", "extent_count");
            f.n("flags", "flags");
        }
        // FREE_SPACE_EXTENT, FREE_SPACE_BITMAP, QGROUP_RELATION: nothing but the key.
        199 | 200 | 246 => {}
        // DEV_EXTENT
        204 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            for l in ["chunk_tree", "chunk_objectid", "chunk_offset", "length"] {
                f.n(l, l);
            }
            f.uuid("chunk_tree_uuid", "chunk_tree_uuid");
        }
        // DEV_ITEM
        216 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            for l in [
                "devid",
                "total_bytes",
                "bytes_used",
                "io_align",
                "io_width",
                "sector_size",
                "type",
                "generation",
                "start_offset",
                "dev_group",
                "seek_speed",
                "bandwidth",
            ] {
                f.n(l, l);
            }
            f.uuid("uuid", "uuid");
            f.uuid("fsid", "fsid");
        }
        // CHUNK_ITEM
        228 => {
            for l in lines {
                let s = lossy(l);
                let t = s.trim_start().to_string();
                if t.starts_with("stripe ") {
                    let mut r = Record {
                        kind: "stripe".into(),
                        fields: Vec::new(),
                    };
                    let mut f = Fields {
                        text: s,
                        rec: &mut r,
                    };
                    f.n("devid", "devid");
                    f.n("offset", "offset");
                    entries.push(r);
                } else if t.starts_with("dev_uuid") {
                    match entries.last_mut() {
                        Some(r) => Fields { text: s, rec: r }.uuid("dev_uuid", "dev_uuid"),
                        None => entries.push(unparsed(l)),
                    }
                } else {
                    let mut f = Fields {
                        text: s,
                        rec: &mut top,
                    };
                    for l in [
                        "length",
                        "owner",
                        "stripe_len",
                        "io_align",
                        "io_width",
                        "sector_size",
                        "num_stripes",
                        "sub_stripes",
                    ] {
                        f.n(l, l);
                    }
                    f.flags("type", "type", BG_FLAGS);
                }
            }
        }
        // QGROUP_STATUS
        240 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            f.n("version", "version");
            f.n("generation", "generation");
            f.flags("flags", "flags", QGROUP_STATUS_FLAGS);
            f.n("scan", "scan");
            f.n("enable_gen", "enable_gen");
        }
        // QGROUP_INFO
        242 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            for l in [
                "generation",
                "referenced",
                "referenced_compressed",
                "exclusive",
                "exclusive_compressed",
            ] {
                f.n(l, l);
            }
        }
        // QGROUP_LIMIT: btrfs-progs prints the flags in hex without 0x.
        244 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            f.hex("flags", "flags");
            for l in [
                "max_referenced",
                "max_exclusive",
                "rsv_referenced",
                "rsv_exclusive",
            ] {
                f.n(l, l);
            }
        }
        // PERSISTENT_ITEM (device statistics)
        249 => {
            let mut f = Fields {
                text: joined,
                rec: &mut top,
            };
            if key.0 == 0 {
                f.n("offset", "devid");
                for l in ["write_errs", "read_errs", "flush_errs", "corruption_errs"] {
                    f.n(l, l);
                }
                f.n("generation", "generation_errs");
            }
        }
        // UUID_KEY_SUBVOL, UUID_KEY_RECEIVED_SUBVOL
        251 | 252 => {
            for l in lines {
                let s = lossy(l);
                match after(&s, "subvol_id") {
                    Some(t) => entries.push(Record {
                        kind: "subvol".into(),
                        fields: vec![("subvol_id".into(), V::N(num(t)))],
                    }),
                    None => entries.push(unparsed(l)),
                }
            }
        }
        _ => {
            for l in lines {
                entries.push(unparsed(l));
            }
        }
    }
    let mut out = vec![top];
    out.extend(entries);
    out
}

/// Parse the output of `btrfs inspect-internal dump-tree --dfs`.
fn parse_progs(out: &[u8]) -> Vec<TreeDump> {
    let mut trees: Vec<TreeDump> = Vec::new();
    let mut details: Vec<Vec<u8>> = Vec::new();
    // Item details are gathered, then decoded when the next line that is
    // not a detail arrives.
    fn flush(trees: &mut [TreeDump], details: &mut Vec<Vec<u8>>) {
        if let Some(item) = trees
            .last_mut()
            .and_then(|t| t.blocks.last_mut())
            .and_then(|b| b.items.last_mut())
            && item.records.is_empty()
        {
            item.records = progs_records(&item.key, details);
        }
        details.clear();
    }
    for raw in out.split(|&c| c == b'\n') {
        if raw.starts_with(b"\t\t") {
            details.push(raw.to_vec());
            continue;
        }
        flush(&mut trees, &mut details);
        let line = lossy(raw);
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with('\t') {
            let block = trees
                .last_mut()
                .and_then(|t| t.blocks.last_mut())
                .unwrap_or_else(|| panic!("line outside a block: {line}"));
            if words.first() == Some(&"item") {
                let key = progs_key(after(&line, "key").expect("item key"));
                block.items.push(Item {
                    key,
                    itemoff: num(after(&line, "itemoff").expect("itemoff")),
                    itemsize: num(after(&line, "itemsize").expect("itemsize")),
                    ..Item::default()
                });
            } else if words.first() == Some(&"key") {
                block.ptrs.push((
                    progs_key(after(&line, "key").expect("key")),
                    num(after(&line, "block").expect("block")),
                    num(after(&line, "gen").expect("gen")),
                ));
            } else {
                panic!("unexpected line: {line}");
            }
            continue;
        }
        match words.first().copied() {
            None | Some("btrfs-progs") | Some("total") | Some("bytes") => {}
            Some("uuid") if words.len() == 2 => {}
            Some("fs") if line.starts_with("fs uuid ") => {
                if let Some(b) = trees.last_mut().and_then(|t| t.blocks.last_mut()) {
                    b.fsid = words[2].into();
                }
            }
            Some("chunk") if line.starts_with("chunk uuid ") => {
                if let Some(b) = trees.last_mut().and_then(|t| t.blocks.last_mut()) {
                    b.chunk_uuid = words[2].into();
                }
            }
            Some(w @ ("node" | "leaf")) if words.len() > 2 => {
                let tree = trees
                    .last_mut()
                    .unwrap_or_else(|| panic!("block before any tree: {line}"));
                if words[2] == "flags" {
                    let b = tree.blocks.last_mut().expect("flags line after header");
                    b.flags = num(words[3]);
                    b.backref_rev = num(after(&line, "revision").expect("backref revision"));
                    continue;
                }
                tree.blocks.push(Block {
                    leaf: w == "leaf",
                    bytenr: num(words[1]),
                    level: after(&line, "level").map_or(0, num),
                    nritems: num(after(&line, "items").expect("items")),
                    free: num(after(&line, "space").expect("free space")),
                    generation: num(after(&line, "generation").expect("generation")),
                    owner: num(after(&line, "owner").expect("owner")),
                    ..Block::default()
                });
            }
            _ => {
                // A tree heading: "root tree", "chunk tree", "log root tree",
                // or "<name> tree key (ID ROOT_ITEM OFFSET)".
                let root_key = line
                    .find(" tree key (")
                    .map(|p| progs_key(line[p + " tree key ".len()..].trim()));
                let id = match (root_key, line.trim()) {
                    (Some(k), _) => k.0,
                    (None, "root tree") => 1,
                    (None, "chunk tree") => 3,
                    (None, "log root tree") => -6i64 as u64,
                    (None, "block group tree") => 11,
                    _ => panic!("unexpected line in btrfs-progs output: {line}"),
                };
                trees.push(TreeDump {
                    id,
                    root_key,
                    blocks: Vec::new(),
                });
            }
        }
    }
    flush(&mut trees, &mut details);
    trees
}

// ---------------------------------------------------------------------------
// Parsing ubtrfs output

/// Undo the `\xNN` escapes of names and values.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 4 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 2..i + 4]).expect("escape");
            out.push(u8::from_str_radix(hex, 16).expect("escape"));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// A key printed by ubtrfs: `(obj,TYPE,off)`.
fn our_key(tok: &str) -> K {
    let inner = tok.trim_start_matches('(').trim_end_matches(')');
    let parts: Vec<&str> = inner.split(',').collect();
    assert_eq!(parts.len(), 3, "key {tok}");
    parse_key_tokens(parts[0], parts[1], parts[2])
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36 && s.bytes().filter(|&c| c == b'-').count() == 4
}

fn our_value(name: &str, v: &str) -> V {
    if matches!(name, "name" | "data" | "string") {
        return V::Bytes(unescape(v));
    }
    if v.starts_with('(') {
        return V::Key(our_key(v));
    }
    if let Some(o) = v.strip_prefix("0o") {
        return V::N(u64::from_str_radix(o, 8).expect("octal"));
    }
    if is_uuid(v) {
        return V::Uuid(v.into());
    }
    if v.contains('.') && !v.contains('(') {
        return time(v);
    }
    V::N(num(v))
}

fn pairs(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn parse_ours(out: &[u8]) -> Vec<TreeDump> {
    let text = std::str::from_utf8(out).expect("ubtrfs output is ASCII");
    let mut trees: Vec<TreeDump> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let word = t.split_whitespace().next().unwrap_or("");
        let p = pairs(t);
        let get = |k: &str| -> u64 { num(p.get(k).unwrap_or_else(|| panic!("{k} in {line}"))) };
        match word {
            "tree" => trees.push(TreeDump {
                id: get("id"),
                root_key: p.get("root_key").map(|k| our_key(k)),
                blocks: Vec::new(),
            }),
            "node" | "leaf" => {
                let flags = p["flags"];
                trees.last_mut().expect("tree").blocks.push(Block {
                    leaf: word == "leaf",
                    bytenr: get("bytenr"),
                    level: get("level"),
                    nritems: get("items"),
                    free: get("free"),
                    generation: get("generation"),
                    owner: get("owner"),
                    fsid: p["fsid"].into(),
                    chunk_uuid: p["chunk_uuid"].into(),
                    flags: num(flags),
                    backref_rev: get("backref_rev"),
                    ..Block::default()
                });
            }
            "ptr" => {
                let b = trees
                    .last_mut()
                    .and_then(|t| t.blocks.last_mut())
                    .expect("block");
                b.ptrs.push((our_key(p["key"]), get("block"), get("gen")));
            }
            "item" => {
                let b = trees
                    .last_mut()
                    .and_then(|t| t.blocks.last_mut())
                    .expect("block");
                b.items.push(Item {
                    key: our_key(p["key"]),
                    itemoff: get("itemoff"),
                    itemsize: get("itemsize"),
                    records: vec![Record::default()],
                    problem: None,
                });
            }
            "fields" | "entry" | "problem" => {
                let item = trees
                    .last_mut()
                    .and_then(|t| t.blocks.last_mut())
                    .and_then(|b| b.items.last_mut())
                    .expect("item");
                if word == "problem" {
                    item.problem = Some(t["problem".len()..].trim().into());
                    continue;
                }
                let mut fields = Vec::new();
                for w in t.split_whitespace().skip(1) {
                    let (n, v) = w.split_once('=').expect("name=value");
                    if word == "entry" && n == "kind" {
                        continue;
                    }
                    fields.push((n.to_string(), our_value(n, v)));
                }
                if word == "fields" {
                    item.records[0].fields = fields;
                } else {
                    item.records.push(Record {
                        kind: p["kind"].into(),
                        fields,
                    });
                }
            }
            "error" => panic!("ubtrfs could not read a block: {line}"),
            _ => panic!("unexpected line in ubtrfs output: {line}"),
        }
    }
    trees
}

// ---------------------------------------------------------------------------
// Comparison

/// What was compared, for the summary and the coverage checks.
#[derive(Default)]
struct Coverage {
    blocks: usize,
    max_level: u64,
    items: BTreeMap<u8, usize>,
    entries: BTreeMap<String, usize>,
    fields: usize,
    library_items: usize,
}

fn show_key(k: &K) -> String {
    let t = ITEM_TYPES
        .iter()
        .find(|(_, t)| *t == k.1)
        .map_or_else(|| format!("UNKNOWN.{}", k.1), |(n, _)| n.to_string());
    format!("({} {t} {})", k.0, k.2)
}

/// Longest xattr value btrfs-progs prints; it cuts longer ones.
const PROGS_DATA_MAX: usize = 255;

/// Whether a field btrfs-progs printed agrees with ubtrfs's.
fn same(name: &str, progs: &V, ours: &V) -> bool {
    match (progs, ours) {
        (V::Bytes(p), V::Bytes(o)) if name == "data" && p.len() == PROGS_DATA_MAX => {
            o.starts_with(p)
        }
        _ => progs == ours,
    }
}

fn compare_records(
    who: &str,
    at: &str,
    key: &K,
    progs: &[Record],
    ours: &[Record],
    cov: &mut Coverage,
    diffs: &mut Vec<String>,
) {
    // btrfs-progs does not print the inode item embedded in a root item.
    let ours: Vec<&Record> = ours
        .iter()
        .filter(|r| !(key.1 == 132 && r.kind == "inode"))
        .collect();
    if progs.len() != ours.len() {
        diffs.push(format!(
            "{at}: {who} has {} record(s) {:?}, ubtrfs {} {:?}",
            progs.len(),
            progs.iter().map(|r| &r.kind).collect::<Vec<_>>(),
            ours.len(),
            ours.iter().map(|r| &r.kind).collect::<Vec<_>>()
        ));
        return;
    }
    for (i, (p, o)) in progs.iter().zip(ours).enumerate() {
        if p.kind != o.kind {
            diffs.push(format!(
                "{at}: record {i} is '{}' in {who}, '{}' in ubtrfs",
                p.kind, o.kind
            ));
            continue;
        }
        if !p.kind.is_empty() {
            *cov.entries.entry(p.kind.clone()).or_default() += 1;
        }
        for (name, pv) in &p.fields {
            cov.fields += 1;
            match o.fields.iter().find(|(n, _)| n == name) {
                None => diffs.push(format!(
                    "{at}: record {i} ({}): ubtrfs has no field {name} ({who}: {pv})",
                    p.kind
                )),
                Some((_, ov)) if !same(name, pv, ov) => diffs.push(format!(
                    "{at}: record {i} ({}): {name} is {pv} in {who}, {ov} in ubtrfs",
                    p.kind
                )),
                Some(_) => {}
            }
        }
    }
}

fn compare(progs: &[TreeDump], ours: &[TreeDump], cov: &mut Coverage) -> Vec<String> {
    let mut diffs = Vec::new();
    let ids = |t: &[TreeDump]| -> Vec<(u64, Option<K>)> {
        t.iter().map(|t| (t.id, t.root_key)).collect()
    };
    if ids(progs) != ids(ours) {
        diffs.push(format!(
            "trees differ: btrfs-progs {:?}, ubtrfs {:?}",
            ids(progs),
            ids(ours)
        ));
        return diffs;
    }
    for (pt, ot) in progs.iter().zip(ours) {
        let tree = format!("tree {}", pt.id);
        if pt.blocks.len() != ot.blocks.len() {
            diffs.push(format!(
                "{tree}: {} blocks in btrfs-progs, {} in ubtrfs",
                pt.blocks.len(),
                ot.blocks.len()
            ));
        }
        for (pb, ob) in pt.blocks.iter().zip(&ot.blocks) {
            cov.blocks += 1;
            cov.max_level = cov.max_level.max(pb.level);
            let at = format!("{tree} block {}", pb.bytenr);
            let head = |b: &Block| {
                (
                    b.leaf,
                    b.bytenr,
                    b.level,
                    b.nritems,
                    b.free,
                    b.generation,
                    b.owner,
                    b.fsid.clone(),
                    b.chunk_uuid.clone(),
                    b.flags,
                    b.backref_rev,
                )
            };
            if head(pb) != head(ob) {
                diffs.push(format!(
                    "{at}: header (leaf, bytenr, level, items, free, generation, owner, fsid, chunk uuid, flags, backref rev) {:?} in btrfs-progs, {:?} in ubtrfs",
                    head(pb),
                    head(ob)
                ));
                continue;
            }
            if pb.ptrs != ob.ptrs {
                diffs.push(format!(
                    "{at}: key pointers differ: {:?} vs {:?}",
                    pb.ptrs, ob.ptrs
                ));
            }
            if pb.items.len() != ob.items.len() {
                diffs.push(format!(
                    "{at}: {} items in btrfs-progs, {} in ubtrfs",
                    pb.items.len(),
                    ob.items.len()
                ));
                continue;
            }
            for (slot, (pi, oi)) in pb.items.iter().zip(&ob.items).enumerate() {
                let at = format!("{at} item {slot} key {}", show_key(&pi.key));
                let place = |i: &Item| (i.key, i.itemoff, i.itemsize);
                if place(pi) != place(oi) {
                    diffs.push(format!(
                        "{at}: (key, itemoff, itemsize) {:?} in btrfs-progs, {:?} in ubtrfs",
                        place(pi),
                        place(oi)
                    ));
                    continue;
                }
                *cov.items.entry(pi.key.1).or_default() += 1;
                if let Some(p) = &oi.problem {
                    diffs.push(format!("{at}: ubtrfs reports a problem: {p}"));
                }
                compare_records(
                    "btrfs-progs",
                    &at,
                    &pi.key,
                    &pi.records,
                    &oi.records,
                    cov,
                    &mut diffs,
                );
            }
        }
    }
    diffs
}

// ---------------------------------------------------------------------------
// The library's own item parsers and encoders (format/items.rs), checked
// against the field decoder that the comparison above validated.

mod library {
    use super::{Coverage, K, Record, V, compare_records};
    use std::path::PathBuf;
    use ubtrfs::format::Key;
    use ubtrfs::format::consts::*;
    use ubtrfs::format::describe::{self, Ctx, Value};
    use ubtrfs::format::items::*;
    use ubtrfs::format::uuid_string;
    use ubtrfs::fs::Filesystem;
    use ubtrfs::tree::RootPtr;

    fn dv(v: &Value) -> V {
        match v {
            Value::U64(x) | Value::Octal(x) | Value::Enum(x, _) | Value::Flags(x, _) => V::N(*x),
            Value::Key(k) => V::Key((k.objectid, k.item_type, k.offset)),
            Value::Uuid(u) => V::Uuid(uuid_string(u)),
            Value::Time(t) => V::Time(t.sec as u64, u64::from(t.nsec)),
            Value::Bytes(b) => V::Bytes(b.clone()),
        }
    }

    fn n(x: impl Into<u64>) -> V {
        V::N(x.into())
    }

    fn ts(t: &Timespec) -> V {
        V::Time(t.sec as u64, u64::from(t.nsec))
    }

    fn key(k: &Key) -> V {
        V::Key((k.objectid, k.item_type, k.offset))
    }

    fn rec(kind: &str, fields: Vec<(&str, V)>) -> Record {
        Record {
            kind: kind.into(),
            fields: fields
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
        }
    }

    fn inode_fields(i: &InodeItem) -> Vec<(&'static str, V)> {
        vec![
            ("generation", n(i.generation)),
            ("transid", n(i.transid)),
            ("size", n(i.size)),
            ("nbytes", n(i.nbytes)),
            ("block_group", n(i.block_group)),
            ("nlink", n(i.nlink)),
            ("uid", n(i.uid)),
            ("gid", n(i.gid)),
            ("mode", n(i.mode)),
            ("rdev", n(i.rdev)),
            ("flags", n(i.flags)),
            ("sequence", n(i.sequence)),
            ("atime", ts(&i.atime)),
            ("ctime", ts(&i.ctime)),
            ("mtime", ts(&i.mtime)),
            ("otime", ts(&i.otime)),
        ]
    }

    /// What the library's parser makes of an item, and its re-encoding
    /// where the library has an encoder; `None` for types it does not parse.
    /// The library's records of an item and its re-encoding, if any.
    type Parsed = (Vec<Record>, Option<Vec<u8>>);

    fn parse(k: &Key, b: &[u8]) -> Option<ubtrfs::Result<Parsed>> {
        let r = || -> ubtrfs::Result<Parsed> {
            Ok(match k.item_type {
                INODE_ITEM_KEY => {
                    let i = InodeItem::parse(b)?;
                    (vec![rec("", inode_fields(&i))], Some(i.to_bytes()))
                }
                DIR_ITEM_KEY | DIR_INDEX_KEY | XATTR_ITEM_KEY => {
                    let all = DirItem::parse_all(b)?;
                    let mut out = vec![Record::default()];
                    let mut enc = Vec::new();
                    for d in &all {
                        d.encode(&mut enc);
                        out.push(rec(
                            "dir_entry",
                            vec![
                                ("location", key(&d.location)),
                                ("transid", n(d.transid)),
                                ("type", n(d.file_type)),
                                ("name", V::Bytes(d.name.clone())),
                                ("data", V::Bytes(d.data.clone())),
                            ],
                        ));
                    }
                    (out, Some(enc))
                }
                INODE_REF_KEY | INODE_EXTREF_KEY => {
                    let ext = k.item_type == INODE_EXTREF_KEY;
                    let all = if ext {
                        InodeRef::parse_extrefs(b)?
                    } else {
                        InodeRef::parse_refs(b, k.offset)?
                    };
                    let mut out = vec![Record::default()];
                    let mut enc = Vec::new();
                    for r in &all {
                        let mut f = vec![("index", n(r.index)), ("name", V::Bytes(r.name.clone()))];
                        if ext {
                            r.encode_extref(&mut enc);
                            f.push(("parent", n(r.parent)));
                            out.push(rec("extref", f));
                        } else {
                            r.encode_ref(&mut enc);
                            out.push(rec("ref", f));
                        }
                    }
                    (out, Some(enc))
                }
                EXTENT_DATA_KEY => {
                    let e = FileExtentItem::parse(b)?;
                    let mut f = vec![
                        ("generation", n(e.generation)),
                        ("ram_bytes", n(e.ram_bytes)),
                        ("compression", n(e.compression)),
                        ("encryption", n(e.encryption)),
                        ("other_encoding", n(e.other_encoding)),
                        ("type", n(e.extent_type)),
                    ];
                    match &e.body {
                        ExtentBody::Inline(d) => f.push(("inline_size", n(d.len() as u64))),
                        ExtentBody::Regular {
                            disk_bytenr,
                            disk_num_bytes,
                            offset,
                            num_bytes,
                        } => f.extend([
                            ("disk_bytenr", n(*disk_bytenr)),
                            ("disk_num_bytes", n(*disk_num_bytes)),
                            ("offset", n(*offset)),
                            ("num_bytes", n(*num_bytes)),
                        ]),
                    }
                    (vec![rec("", f)], Some(e.to_bytes()))
                }
                ROOT_ITEM_KEY => {
                    let r = RootItem::parse(b)?;
                    let mut f = vec![
                        ("generation", n(r.generation)),
                        ("root_dirid", n(r.root_dirid)),
                        ("bytenr", n(r.bytenr)),
                        ("byte_limit", n(r.byte_limit)),
                        ("bytes_used", n(r.bytes_used)),
                        ("last_snapshot", n(r.last_snapshot)),
                        ("flags", n(r.flags)),
                        ("refs", n(r.refs)),
                        ("drop_progress", key(&r.drop_progress)),
                        ("drop_level", n(r.drop_level)),
                        ("level", n(r.level)),
                    ];
                    if b.len() > RootItem::V1_SIZE {
                        f.extend([
                            ("generation_v2", n(r.generation_v2)),
                            ("uuid", V::Uuid(uuid_string(&r.uuid))),
                            ("parent_uuid", V::Uuid(uuid_string(&r.parent_uuid))),
                            ("received_uuid", V::Uuid(uuid_string(&r.received_uuid))),
                            ("ctransid", n(r.ctransid)),
                            ("otransid", n(r.otransid)),
                            ("stransid", n(r.stransid)),
                            ("rtransid", n(r.rtransid)),
                            ("ctime", ts(&r.ctime)),
                            ("otime", ts(&r.otime)),
                            ("stime", ts(&r.stime)),
                            ("rtime", ts(&r.rtime)),
                        ]);
                    }
                    let inode = rec("inode", inode_fields(&r.inode));
                    (vec![rec("", f), inode], None)
                }
                ROOT_REF_KEY | ROOT_BACKREF_KEY => {
                    let r = RootRef::parse(b)?;
                    let f = vec![
                        ("dirid", n(r.dirid)),
                        ("sequence", n(r.sequence)),
                        ("name", V::Bytes(r.name)),
                    ];
                    (vec![rec("", f)], None)
                }
                BLOCK_GROUP_ITEM_KEY => {
                    let g = BlockGroupItem::parse(b)?;
                    let f = vec![
                        ("used", n(g.used)),
                        ("chunk_objectid", n(g.chunk_objectid)),
                        ("flags", n(g.flags)),
                    ];
                    (vec![rec("", f)], None)
                }
                DEV_EXTENT_KEY => {
                    let d = DevExtent::parse(b)?;
                    let f = vec![
                        ("chunk_tree", n(d.chunk_tree)),
                        ("chunk_objectid", n(d.chunk_objectid)),
                        ("chunk_offset", n(d.chunk_offset)),
                        ("length", n(d.length)),
                        ("chunk_tree_uuid", V::Uuid(uuid_string(&d.chunk_tree_uuid))),
                    ];
                    (vec![rec("", f)], Some(d.to_bytes()))
                }
                DEV_ITEM_KEY => {
                    let d = DevItem::parse(b)?;
                    let f = vec![
                        ("devid", n(d.devid)),
                        ("total_bytes", n(d.total_bytes)),
                        ("bytes_used", n(d.bytes_used)),
                        ("io_align", n(d.io_align)),
                        ("io_width", n(d.io_width)),
                        ("sector_size", n(d.sector_size)),
                        ("type", n(d.dev_type)),
                        ("generation", n(d.generation)),
                        ("start_offset", n(d.start_offset)),
                        ("dev_group", n(d.dev_group)),
                        ("seek_speed", n(d.seek_speed)),
                        ("bandwidth", n(d.bandwidth)),
                        ("uuid", V::Uuid(uuid_string(&d.uuid))),
                        ("fsid", V::Uuid(uuid_string(&d.fsid))),
                    ];
                    (vec![rec("", f)], Some(d.to_bytes()))
                }
                CHUNK_ITEM_KEY => {
                    let c = ChunkItem::parse(b)?;
                    let f = vec![
                        ("length", n(c.length)),
                        ("owner", n(c.owner)),
                        ("stripe_len", n(c.stripe_len)),
                        ("type", n(c.chunk_type)),
                        ("io_align", n(c.io_align)),
                        ("io_width", n(c.io_width)),
                        ("sector_size", n(c.sector_size)),
                        ("num_stripes", n(c.stripes.len() as u64)),
                        ("sub_stripes", n(c.sub_stripes)),
                    ];
                    let mut out = vec![rec("", f)];
                    for s in &c.stripes {
                        out.push(rec(
                            "stripe",
                            vec![
                                ("devid", n(s.devid)),
                                ("offset", n(s.offset)),
                                ("dev_uuid", V::Uuid(uuid_string(&s.dev_uuid))),
                            ],
                        ));
                    }
                    (out, Some(c.to_bytes()))
                }
                _ => return Err(ubtrfs::Error::NotFound(String::new())),
            })
        };
        match r() {
            Err(ubtrfs::Error::NotFound(_)) => None,
            other => Some(other),
        }
    }

    fn show(k: &K) -> String {
        super::show_key(k)
    }

    /// Walk every tree of the filesystem with the library and check each
    /// item its parsers know. Returns the differences.
    pub fn check(devices: &[PathBuf], cov: &mut Coverage) -> Vec<String> {
        let fs = Filesystem::open(devices).expect("the library opens the image");
        let sb = fs.superblock();
        let ctx = Ctx {
            csum_size: sb.csum_type.size(),
            sectorsize: sb.sectorsize,
        };
        let mut trees = vec![(1u64, fs.root_tree()), (3, fs.chunk_tree())];
        for item in fs.root_tree().range(Key::MIN, Key::MAX).expect("root tree") {
            let item = item.expect("root tree item");
            let k = item.key();
            if k.item_type == ROOT_ITEM_KEY {
                let r = RootItem::parse(item.data()).expect("root item");
                let ptr = RootPtr {
                    bytenr: r.bytenr,
                    level: r.level,
                    generation: Some(r.generation),
                };
                trees.push((k.objectid, fs.tree_reader().tree(ptr)));
            }
        }
        let mut diffs = Vec::new();
        for (id, tree) in trees {
            for item in tree.range(Key::MIN, Key::MAX).expect("tree") {
                let item = item.expect("item");
                let k = item.key();
                let kk: K = (k.objectid, k.item_type, k.offset);
                let at = format!("library: tree {id} item {}", show(&kk));
                let Some(parsed) = parse(&k, item.data()) else {
                    continue;
                };
                let (lib, encoded) = match parsed {
                    Ok(x) => x,
                    Err(e) => {
                        diffs.push(format!("{at}: the library cannot parse it: {e}"));
                        continue;
                    }
                };
                let d = describe::describe(&k, item.data(), &ctx);
                let mut ours = vec![Record {
                    kind: String::new(),
                    fields: d
                        .fields
                        .iter()
                        .map(|(n, v)| (n.to_string(), dv(v)))
                        .collect(),
                }];
                ours.extend(d.entries.iter().map(|e| {
                    Record {
                        kind: e.kind.into(),
                        fields: e
                            .fields
                            .iter()
                            .map(|(n, v)| (n.to_string(), dv(v)))
                            .collect(),
                    }
                }));
                // Here the embedded inode of a root item is compared too.
                let key_for_filter = (kk.0, 0, kk.2);
                compare_records(
                    "format::items",
                    &at,
                    &key_for_filter,
                    &lib,
                    &ours,
                    cov,
                    &mut diffs,
                );
                if let Some(enc) = encoded
                    && enc != item.data()
                {
                    diffs.push(format!(
                        "{at}: the library's encoding of its parse differs from the item's bytes ({} vs {} bytes)",
                        enc.len(),
                        item.data().len()
                    ));
                }
                cov.library_items += 1;
            }
        }
        diffs
    }
}

// ---------------------------------------------------------------------------
// Running both tools

fn progs_dump(devices: &[PathBuf], tree: Option<u64>) -> Vec<u8> {
    let mut cmd = tool("btrfs");
    cmd.args(["inspect-internal", "dump-tree", "--dfs"]);
    if let Some(t) = tree {
        cmd.arg("-t").arg(t.to_string());
    }
    run(cmd.args(devices))
}

fn ubtrfs_dump(devices: &[PathBuf], tree: Option<&str>) -> Vec<u8> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ubtrfs"));
    cmd.args(["inspect", "dump-tree"]);
    if let Some(t) = tree {
        cmd.args(["-t", t]);
    }
    run(cmd.args(devices))
}

/// The `-t` argument ubtrfs gets for a tree: its name where it has one.
fn tree_arg(id: u64) -> String {
    match id {
        1 => "root".into(),
        2 => "extent".into(),
        3 => "chunk".into(),
        4 => "dev".into(),
        5 => "fs".into(),
        7 => "csum".into(),
        8 => "quota".into(),
        9 => "uuid".into(),
        10 => "free-space".into(),
        11 => "block-group".into(),
        12 => "raid-stripe".into(),
        x if x == -9i64 as u64 => "data-reloc".into(),
        x => x.to_string(),
    }
}

/// Compare both tools on `devices`: all trees, then each tree alone.
/// Returns the coverage; panics with the differences.
fn check_image(dir: &Path, name: &str, devices: &[PathBuf]) -> Coverage {
    let mut cov = Coverage::default();
    let mut all_diffs = Vec::new();
    let mut runs: Vec<(String, Option<u64>)> = vec![("all trees".into(), None)];
    let progs_all = progs_dump(devices, None);
    let tree_ids: BTreeSet<u64> = parse_progs(&progs_all).iter().map(|t| t.id).collect();
    runs.extend(
        tree_ids
            .iter()
            .map(|&id| (format!("-t {}", tree_arg(id)), Some(id))),
    );
    for (label, tree) in runs {
        let progs = match tree {
            None => progs_all.clone(),
            Some(id) => progs_dump(devices, Some(id)),
        };
        let arg = tree.map(tree_arg);
        let ours = ubtrfs_dump(devices, arg.as_deref());
        let diffs = compare(&parse_progs(&progs), &parse_ours(&ours), &mut cov);
        if !diffs.is_empty() {
            let stem = format!("{name}-{}", label.replace(' ', "_"));
            let _ = std::fs::write(dir.join(format!("{stem}.progs.txt")), &progs);
            let _ = std::fs::write(dir.join(format!("{stem}.ubtrfs.txt")), &ours);
            let n = diffs.len();
            all_diffs.extend(
                diffs
                    .into_iter()
                    .take(30)
                    .map(|d| format!("{name} [{label}]: {d}")),
            );
            if n > 30 {
                all_diffs.push(format!("{name} [{label}]: ... {} more", n - 30));
            }
        }
    }
    let lib_diffs = library::check(devices, &mut cov);
    let n = lib_diffs.len();
    all_diffs.extend(
        lib_diffs
            .into_iter()
            .take(30)
            .map(|d| format!("{name}: {d}")),
    );
    if n > 30 {
        all_diffs.push(format!("{name}: library: ... {} more", n - 30));
    }
    if !all_diffs.is_empty() {
        panic!(
            "ubtrfs dump-tree differs from btrfs-progs ({} shown; dumps in {}):\n{}",
            all_diffs.len(),
            dir.display(),
            all_diffs.join("\n")
        );
    }
    eprintln!(
        "{name}: {} blocks (max level {}), {} fields compared; items by type {:?}; entries {:?}; {} items checked against the library's parsers",
        cov.blocks, cov.max_level, cov.fields, cov.items, cov.entries, cov.library_items
    );
    cov
}

/// Run `f` with a temp dir, kept (even after a panic) when
/// `UBTRFS_KEEP_TEST_DIR=1`.
fn with_dir(name: &str, f: impl FnOnce(&Path)) {
    let dir = temp_dir(name);
    let path = dir.path().to_path_buf();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&path)));
    if std::env::var("UBTRFS_KEEP_TEST_DIR").is_ok_and(|v| v == "1") {
        eprintln!("kept {}", dir.keep().display());
    }
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

fn assert_covers(cov: &Coverage, types: &[&str], entries: &[&str]) {
    for t in types {
        let code = item_type(t);
        assert!(
            cov.items.get(&code).is_some_and(|&n| n > 0),
            "no {t} item was compared"
        );
    }
    for e in entries {
        assert!(
            cov.entries.get(*e).is_some_and(|&n| n > 0),
            "no {e} entry was compared"
        );
    }
}

// ---------------------------------------------------------------------------
// The tests

const COMMON_TYPES: &[&str] = &[
    "INODE_ITEM",
    "INODE_REF",
    "DIR_ITEM",
    "DIR_INDEX",
    "XATTR_ITEM",
    "EXTENT_DATA",
    "EXTENT_CSUM",
    "ROOT_ITEM",
    "BLOCK_GROUP_ITEM",
    "DEV_EXTENT",
    "DEV_ITEM",
    "CHUNK_ITEM",
    "FREE_SPACE_INFO",
    "FREE_SPACE_EXTENT",
];

#[test]
fn dump_tree_mkfs_rootdir_crc32c() {
    if !can_run("dump_tree_mkfs_rootdir_crc32c") {
        return;
    }
    with_dir("dump-tree-crc32c", |dir| {
        let img = mkfs_rootdir(dir, "crc32c", 1, 3000, &["--csum", "crc32c"]);
        let cov = check_image(dir, "rootdir-crc32c", &[img]);
        assert_covers(
            &cov,
            &[COMMON_TYPES, &["METADATA_ITEM", "EXTENT_ITEM"]].concat(),
            &[
                "tree_block_ref",
                "extent_data_ref",
                "dir_entry",
                "ref",
                "stripe",
            ],
        );
        assert!(cov.max_level >= 2, "the fs tree should have several levels");
    });
}

#[test]
fn dump_tree_mkfs_rootdir_xxhash_fat_extents() {
    if !can_run("dump_tree_mkfs_rootdir_xxhash_fat_extents") {
        return;
    }
    with_dir("dump-tree-xxhash", |dir| {
        // Without skinny metadata, tree blocks have EXTENT_ITEMs with a key.
        let img = mkfs_rootdir(
            dir,
            "xxhash",
            2,
            2000,
            &["--csum", "xxhash", "-O", "^skinny-metadata"],
        );
        let cov = check_image(dir, "rootdir-xxhash", &[img]);
        assert_covers(&cov, COMMON_TYPES, &["tree_block_ref", "extent_data_ref"]);
        assert!(
            !cov.items.contains_key(&169),
            "no METADATA_ITEM expected without skinny-metadata"
        );
    });
}

#[test]
fn dump_tree_kernel_image() {
    if !can_run("dump_tree_kernel_image") {
        return;
    }
    with_dir("dump-tree-kernel", |dir| {
        let img = kernel_image(dir);
        let cov = check_image(dir, "kernel-blake2", &[img]);
        assert_covers(
            &cov,
            &[
                COMMON_TYPES,
                &[
                    "METADATA_ITEM",
                    "EXTENT_ITEM",
                    "INODE_EXTREF",
                    "EXTENT_DATA_REF",
                    "ROOT_REF",
                    "ROOT_BACKREF",
                    "QGROUP_STATUS",
                    "QGROUP_INFO",
                    "QGROUP_LIMIT",
                    "QGROUP_RELATION",
                    "UUID_KEY_SUBVOL",
                    "PERSISTENT_ITEM",
                    "FREE_SPACE_BITMAP",
                ],
            ]
            .concat(),
            &[
                "tree_block_ref",
                "extent_data_ref",
                "shared_data_ref",
                "shared_block_ref",
                "extref",
                "subvol",
            ],
        );
    });
}

#[test]
fn dump_tree_ubtrfs_mkfs_raid1_sha256() {
    if !can_run("dump_tree_ubtrfs_mkfs_raid1_sha256") {
        return;
    }
    with_dir("dump-tree-ubtrfs-mkfs", |dir| {
        // Two devices given on the command line of both tools; chunks with
        // a stripe on each device; a third checksum algorithm.
        let devices = vec![dir.join("a.img"), dir.join("b.img")];
        run(Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
            .args(["mkfs", "-b", "300M", "-d", "raid1", "-m", "raid1"])
            .args(["--csum", "sha256", "-n", "4096"])
            .args(&devices));
        let cov = check_image(dir, "ubtrfs-mkfs-raid1", &devices);
        assert_covers(
            &cov,
            &["ROOT_ITEM", "DEV_ITEM", "CHUNK_ITEM", "BLOCK_GROUP_ITEM"],
            &["stripe"],
        );
    });
}

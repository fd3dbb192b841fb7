//! The kernel's log tree, replayed by ubtrfs, against the kernel's own
//! replay.
//!
//! For each setup (node size, checksum, compression, holes, subvolumes):
//! `mkfs.btrfs` an image, loop-mount it, commit a base tree, then run a
//! seeded workload (create, write, append, overwrite, truncate, fallocate,
//! punch, rename, rename-exchange, link, unlink, mkdir, rmdir, symlink,
//! fifo, xattrs, chmod, utimes, reflinks, O_TMPFILE) with fsyncs of files
//! and directories in between. While still mounted, the image file is
//! copied: the copy is a crash image whose superblock has a log tree
//! (checked with `dump-super`). Then:
//!
//! - the kernel mounts it without replaying: the log must change the tree;
//! - the kernel mounts a copy (it replays the log): the oracle tree;
//! - the library opens the crash image read-only: it must show the oracle
//!   tree (replayed in memory) and leave the image unchanged;
//! - the library opens another copy read-write: the replay is committed,
//!   the superblock has no log any more, the log's blocks are intact,
//!   `btrfs check` is clean, and the library and a kernel mount of it both
//!   show the oracle tree (names, types, modes, owners, sizes, directory
//!   sizes, link counts, mtimes, ctimes, xattrs, contents, symlink
//!   targets, hard links).
//!
//! The kernel decides by itself between logging and committing, partly on
//! timing, so a seed does not always give the same log; each run checks
//! whatever log it got. `UBTRFS_LOG_REPLAY_ROUNDS=N` runs N seeds of every
//! setup, `UBTRFS_LOG_REPLAY_ONLY=NAME` one setup.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use testkit::{Mount, TestDir};
use ubtrfs::fs::{FileKind, Filesystem, InodeId};

// ---------------------------------------------------------------------
// What a tree looks like, from the host (a kernel mount) or the library.

#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    kind: char,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u32,
    mtime: (i64, u32),
    ctime: (i64, u32),
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// File contents or symlink target.
    data: Vec<u8>,
    /// The first path (in walk order) naming the same inode.
    link: String,
}

type Snapshot = BTreeMap<String, Node>;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The tree below `root` as the kernel shows it.
fn host_snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, rel: &str, out: &mut Snapshot, seen: &mut BTreeMap<(u64, u64), String>) {
        let full = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let m = std::fs::symlink_metadata(&full).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            'd'
        } else if ft.is_symlink() {
            'l'
        } else if ft.is_file() {
            'f'
        } else {
            'o'
        };
        let data = match kind {
            'f' => std::fs::read(&full).unwrap(),
            'l' => std::fs::read_link(&full)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes(),
            _ => Vec::new(),
        };
        let xattrs = testkit::sys::xattrs(&full)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k.into_encoded_bytes(), v))
            .collect();
        let link = seen
            .entry((m.dev(), m.ino()))
            .or_insert_with(|| rel.to_string())
            .clone();
        out.insert(
            rel.to_string(),
            Node {
                kind,
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: m.size(),
                nlink: m.nlink() as u32,
                mtime: (m.mtime(), m.mtime_nsec() as u32),
                ctime: (m.ctime(), m.ctime_nsec() as u32),
                xattrs,
                data,
                link,
            },
        );
        if kind == 'd' {
            let mut names: Vec<String> = std::fs::read_dir(&full)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            for n in names {
                walk(root, &join(rel, &n), out, seen);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, "", &mut out, &mut BTreeMap::new());
    out
}

/// The tree as the library shows it.
fn lib_snapshot(fs: &Filesystem) -> Snapshot {
    fn walk(
        fs: &Filesystem,
        id: InodeId,
        rel: &str,
        out: &mut Snapshot,
        seen: &mut BTreeMap<InodeId, String>,
    ) {
        let st = fs.stat(id).unwrap_or_else(|e| panic!("stat {rel}: {e}"));
        let kind = match st.kind {
            FileKind::Dir => 'd',
            FileKind::Symlink => 'l',
            FileKind::File => 'f',
            _ => 'o',
        };
        let data = match kind {
            'f' => fs
                .read_all(id)
                .unwrap_or_else(|e| panic!("read {rel}: {e}")),
            'l' => fs.read_link(id).unwrap(),
            _ => Vec::new(),
        };
        let link = seen.entry(id).or_insert_with(|| rel.to_string()).clone();
        out.insert(
            rel.to_string(),
            Node {
                kind,
                mode: st.mode,
                uid: st.uid,
                gid: st.gid,
                size: st.size,
                nlink: st.nlink,
                mtime: (st.mtime.sec, st.mtime.nsec),
                ctime: (st.ctime.sec, st.ctime.nsec),
                xattrs: fs.xattrs(id).unwrap().into_iter().collect(),
                data,
                link,
            },
        );
        if kind == 'd' {
            let mut entries = fs.read_dir(id, 0).unwrap();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for e in entries {
                let name = String::from_utf8(e.name).unwrap();
                walk(fs, e.id, &join(rel, &name), out, seen);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(fs, fs.root(), "", &mut out, &mut BTreeMap::new());
    out
}

/// Stands for a time the replay itself stamped (its "now").
const REPLAY_TIME: (i64, u32) = (-1, 0);

/// A little before now: times from here on were stamped by the replay
/// that follows (the kernel's clock for times is coarse, a tick behind).
fn replay_starts() -> (i64, u32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        - std::time::Duration::from_millis(20);
    (d.as_secs() as i64, d.subsec_nanos())
}

/// `snap` with the times from `since` on replaced by [`REPLAY_TIME`]: the
/// kernel's replay and ubtrfs's run at different moments, so their own
/// time stamps can only be compared as such.
fn stamped(mut snap: Snapshot, since: (i64, u32)) -> Snapshot {
    for n in snap.values_mut() {
        for t in [&mut n.mtime, &mut n.ctime] {
            if *t >= since {
                *t = REPLAY_TIME;
            }
        }
    }
    snap
}

/// Fails with every difference between the oracle and what was seen.
fn assert_same(what: &str, want: &Snapshot, got: &Snapshot) {
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("{p:?}: missing")),
            Some(g) if g != w => {
                let mut d = format!("{p:?}:");
                let fields: [(&str, String, String); 10] = [
                    ("kind", w.kind.to_string(), g.kind.to_string()),
                    ("mode", format!("{:o}", w.mode), format!("{:o}", g.mode)),
                    (
                        "owner",
                        format!("{}:{}", w.uid, w.gid),
                        format!("{}:{}", g.uid, g.gid),
                    ),
                    ("size", w.size.to_string(), g.size.to_string()),
                    ("nlink", w.nlink.to_string(), g.nlink.to_string()),
                    ("mtime", format!("{:?}", w.mtime), format!("{:?}", g.mtime)),
                    ("ctime", format!("{:?}", w.ctime), format!("{:?}", g.ctime)),
                    (
                        "xattrs",
                        format!("{:?}", w.xattrs),
                        format!("{:?}", g.xattrs),
                    ),
                    ("link", w.link.clone(), g.link.clone()),
                    (
                        "data",
                        format!("{} bytes", w.data.len()),
                        format!(
                            "{} bytes{}",
                            g.data.len(),
                            if g.data == w.data { "" } else { " (differ)" }
                        ),
                    ),
                ];
                for (name, a, b) in fields {
                    if a != b || (name == "data" && g.data != w.data) {
                        d.push_str(&format!(" {name} {a} vs {b};"));
                    }
                }
                diffs.push(d);
            }
            _ => {}
        }
    }
    for p in got.keys() {
        if !want.contains_key(p) {
            diffs.push(format!("{p:?}: unexpected"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{what}: {} differences from the kernel's replay (kernel vs ubtrfs):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

// ---------------------------------------------------------------------
// Workloads.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        (!v.is_empty()).then(|| &v[self.below(v.len() as u64) as usize])
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// Bytes that compress somewhat (text with random runs).
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            if self.chance(50) {
                let line = format!("line {} of some text\n", self.below(1000));
                v.extend_from_slice(line.as_bytes());
            } else {
                for _ in 0..64 {
                    v.push(self.next() as u8);
                }
            }
        }
        v.truncate(n);
        v
    }
    /// A file size: inline, a few sectors, or up to a megabyte.
    fn size(&mut self) -> u64 {
        match self.below(4) {
            0 => 1 + self.below(1500),
            1 => 1 + self.below(20_000),
            2 => 4096 * (1 + self.below(40)),
            _ => 1 + self.below(1 << 20),
        }
    }
}

/// The workload's view of the tree (relative paths under the mount).
struct Work<'a> {
    top: &'a Path,
    rng: Rng,
    /// Directories in which to work (subvolume roots, never removed).
    roots: Vec<String>,
    dirs: Vec<String>,
    files: Vec<String>,
    /// Symlinks and fifos.
    links: Vec<String>,
    counter: u32,
    fsyncs: u32,
    /// Percent of steps followed by an fsync of a directory.
    dir_sync: u64,
}

impl Work<'_> {
    fn p(&self, rel: &str) -> PathBuf {
        self.top.join(rel)
    }

    /// The subvolume root `path` is in.
    fn root_of(&self, path: &str) -> String {
        let first = path.split('/').next().unwrap_or("");
        if self.roots.iter().any(|r| r == first) {
            first.to_string()
        } else {
            String::new()
        }
    }

    /// A new name in a random directory.
    fn new_name(&mut self, prefix: &str) -> String {
        self.new_name_near(prefix, None)
    }

    /// A new name in a random directory of the subvolume `near` is in
    /// (renames and links cannot cross subvolumes).
    fn new_name_near(&mut self, prefix: &str, near: Option<&str>) -> String {
        let want = near.map(|p| self.root_of(p));
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| want.as_ref().is_none_or(|r| self.root_of(d) == *r))
            .cloned()
            .collect();
        let dir = self
            .rng
            .pick(&dirs)
            .cloned()
            .unwrap_or_else(|| want.clone().unwrap_or_default());
        self.counter += 1;
        // Long names now and then, so INODE_REF items hold several names.
        let pad = if self.rng.chance(10) {
            "-".repeat(100)
        } else {
            String::new()
        };
        join(&dir, &format!("{prefix}{}{pad}", self.counter))
    }

    fn fsync(&mut self, rel: &str, data_only: bool) {
        let f = File::open(self.p(rel)).unwrap();
        if data_only {
            f.sync_data().unwrap();
        } else {
            f.sync_all().unwrap();
        }
        self.fsyncs += 1;
    }

    fn write_at(&mut self, rel: &str, at: u64, len: usize) {
        let data = self.rng.bytes(len);
        let f = OpenOptions::new().write(true).open(self.p(rel)).unwrap();
        f.write_all_at(&data, at).unwrap();
    }

    fn create_file(&mut self) -> String {
        let rel = self.new_name("f");
        File::create(self.p(&rel)).unwrap();
        let n = self.rng.size() as usize;
        self.write_at(&rel, 0, n);
        self.files.push(rel.clone());
        rel
    }

    fn size_of(&self, rel: &str) -> u64 {
        std::fs::metadata(self.p(rel)).unwrap().len()
    }

    /// Whether `dir` holds nothing.
    fn is_empty_dir(&self, dir: &str) -> bool {
        std::fs::read_dir(self.p(dir)).unwrap().next().is_none()
    }

    /// Forget paths under `dir` (it was renamed or removed).
    fn rename_paths(&mut self, from: &str, to: &str) {
        let fix = |v: &mut Vec<String>| {
            for p in v.iter_mut() {
                if p == from {
                    *p = to.to_string();
                } else if let Some(rest) = p.strip_prefix(&format!("{from}/")) {
                    *p = format!("{to}/{rest}");
                }
            }
        };
        fix(&mut self.dirs);
        fix(&mut self.files);
        fix(&mut self.links);
    }

    /// One random operation.
    fn step(&mut self) {
        let op = self.rng.below(110);
        let file = self.rng.pick(&self.files).cloned();
        match (op, file) {
            (0..=14, _) | (_, None) => {
                self.create_file();
            }
            (15..=24, Some(f)) => {
                let at = self.size_of(&f);
                let n = self.rng.size() as usize;
                self.write_at(&f, at, n);
            }
            (25..=34, Some(f)) => {
                let size = self.size_of(&f).max(1);
                let at = self.rng.below(size);
                let n = 1 + self.rng.below(100_000) as usize;
                self.write_at(&f, at, n);
            }
            (35..=39, Some(f)) => {
                let size = self.size_of(&f);
                let to = if self.rng.chance(70) {
                    self.rng.below(size + 1)
                } else {
                    size + self.rng.below(300_000)
                };
                File::options()
                    .write(true)
                    .open(self.p(&f))
                    .unwrap()
                    .set_len(to)
                    .unwrap();
            }
            (40..=44, Some(f)) => {
                let fd = File::options().write(true).open(self.p(&f)).unwrap();
                let size = self.size_of(&f);
                let at = self.rng.below(size + 100_000) & !4095;
                let len = 4096 * (1 + self.rng.below(64));
                let mode = match self.rng.below(3) {
                    0 => 0,
                    1 => testkit::sys::falloc::KEEP_SIZE,
                    _ => testkit::sys::falloc::KEEP_SIZE | testkit::sys::falloc::PUNCH_HOLE,
                };
                testkit::sys::fallocate(&fd, mode, at, len).unwrap();
            }
            (45..=52, Some(f)) => {
                let to = if self.rng.chance(30) {
                    self.rng
                        .pick(&self.files.clone())
                        .cloned()
                        .unwrap_or_else(|| self.new_name_near("r", Some(&f)))
                } else {
                    self.new_name_near("r", Some(&f))
                };
                if to == f || self.root_of(&to) != self.root_of(&f) {
                    return;
                }
                std::fs::rename(self.p(&f), self.p(&to)).unwrap();
                // A file renamed over loses the name; a hard link of it keeps its other names.
                self.files.retain(|x| *x != to && *x != f);
                self.files.push(to);
            }
            (53..=57, Some(f)) => {
                let to = self.new_name_near("h", Some(&f));
                std::fs::hard_link(self.p(&f), self.p(&to)).unwrap();
                self.files.push(to);
            }
            (58..=64, Some(f)) => {
                std::fs::remove_file(self.p(&f)).unwrap();
                self.files.retain(|x| *x != f);
            }
            (65..=69, _) => {
                let d = self.new_name("d");
                std::fs::create_dir(self.p(&d)).unwrap();
                self.dirs.push(d);
            }
            (70..=72, _) => {
                let Some(d) = self.rng.pick(&self.dirs).cloned() else {
                    return;
                };
                if self.roots.contains(&d) {
                    return;
                }
                if self.is_empty_dir(&d) {
                    std::fs::remove_dir(self.p(&d)).unwrap();
                    self.dirs.retain(|x| *x != d);
                } else {
                    let to = self.new_name_near("rd", Some(&d));
                    if to.starts_with(&format!("{d}/")) {
                        return;
                    }
                    std::fs::rename(self.p(&d), self.p(&to)).unwrap();
                    self.rename_paths(&d, &to);
                }
            }
            (73..=75, Some(f)) => {
                let l = self.new_name("s");
                std::os::unix::fs::symlink(&f, self.p(&l)).unwrap();
                self.links.push(l);
            }
            (76..=82, Some(f)) => {
                let name = format!("user.k{}", self.rng.below(4));
                if self.rng.chance(25) {
                    let _ = testkit::sys::remove_xattr(&self.p(&f), &name);
                } else {
                    let n = self.rng.below(300) as usize;
                    let v = self.rng.bytes(n);
                    testkit::sys::set_xattr(&self.p(&f), &name, &v).unwrap();
                }
            }
            (83..=85, Some(f)) => {
                let mode = 0o600 | (self.rng.below(0o100) as u32);
                std::fs::set_permissions(self.p(&f), std::fs::Permissions::from_mode(mode))
                    .unwrap();
            }
            (86..=88, Some(f)) => {
                let t =
                    testkit::sys::Timestamp::new(1_600_000_000 + self.rng.below(1 << 20) as i64, 0);
                testkit::sys::set_mtime(&self.p(&f), t).unwrap();
            }
            (89..=91, Some(f)) => {
                let to = self.new_name("c");
                let src = File::open(self.p(&f)).unwrap();
                let dst = File::create(self.p(&to)).unwrap();
                testkit::sys::reflink(&src, &dst).unwrap();
                self.files.push(to);
            }
            (100..=104, Some(f)) => {
                // Two names swap places (RENAME_EXCHANGE), a file and a
                // file or a directory of the same subvolume.
                let pool: Vec<String> = self
                    .files
                    .iter()
                    .chain(self.dirs.iter().filter(|d| !self.roots.contains(d)))
                    .filter(|o| self.root_of(o) == self.root_of(&f) && **o != f)
                    .filter(|o| !f.starts_with(&format!("{o}/")))
                    .cloned()
                    .collect();
                let Some(other) = self.rng.pick(&pool).cloned() else {
                    return;
                };
                let (a, b) = (
                    std::ffi::CString::new(self.p(&f).into_os_string().into_encoded_bytes())
                        .unwrap(),
                    std::ffi::CString::new(self.p(&other).into_os_string().into_encoded_bytes())
                        .unwrap(),
                );
                // SAFETY: valid C strings.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
                if self.dirs.contains(&other) {
                    // The directory now lives at f's old name.
                    self.rename_paths(&other, "\0swap");
                    self.files.retain(|x| *x != f);
                    self.files.push(other.clone());
                    self.rename_paths("\0swap", &f);
                }
            }
            (105..=107, _) => {
                let p = self.new_name("p");
                testkit::sys::mkfifo(&self.p(&p), 0o640).unwrap();
                self.links.push(p);
            }
            (_, Some(f)) => {
                // Unlink then recreate the same name.
                std::fs::remove_file(self.p(&f)).unwrap();
                File::create(self.p(&f)).unwrap();
                let n = self.rng.size() as usize;
                self.write_at(&f, 0, n);
            }
        }
    }

    /// `steps` random operations with fsyncs of files and directories,
    /// ending with a written, fsynced file.
    fn run(&mut self, steps: u32) {
        for _ in 0..steps {
            self.step();
            if self.rng.chance(30)
                && let Some(f) = self.rng.pick(&self.files).cloned()
            {
                let data_only = self.rng.chance(20);
                self.fsync(&f, data_only);
            }
            if self.rng.chance(self.dir_sync)
                && let Some(d) = self.rng.pick(&self.dirs).cloned()
            {
                self.fsync(&d, false);
            }
        }
        let f = self.create_file();
        self.fsync(&f, false);
    }
}

/// The fixed part of every workload: the cases the brief names, each
/// followed by the fsync that logs it.
fn scripted(w: &mut Work<'_>) {
    let r = w.roots[0].clone();
    let p = |s: &str| join(&r, s);
    // Renames, then fsync of the file and of the directory.
    std::fs::rename(w.p(&p("base/a")), w.p(&p("base/sub/a-moved"))).unwrap();
    w.fsync(&p("base/sub/a-moved"), false);
    std::fs::rename(w.p(&p("base/b")), w.p(&p("base/b-renamed"))).unwrap();
    w.fsync(&p("base"), false);
    // Unlink, then fsync of the directory.
    std::fs::remove_file(w.p(&p("base/sub/gone"))).unwrap();
    w.fsync(&p("base/sub"), false);
    // A hard link, and the file fsynced.
    std::fs::hard_link(w.p(&p("base/linked")), w.p(&p("base/sub/linked2"))).unwrap();
    w.fsync(&p("base/linked"), false);
    // Xattrs added and removed.
    testkit::sys::set_xattr(&w.p(&p("base/x")), "user.new", b"fresh").unwrap();
    testkit::sys::remove_xattr(&w.p(&p("base/x")), "user.old").unwrap();
    w.fsync(&p("base/x"), false);
    // Preallocation, inside and past the size.
    let f = File::options()
        .write(true)
        .open(w.p(&p("base/big")))
        .unwrap();
    testkit::sys::fallocate(&f, 0, 1 << 20, 256 << 10).unwrap();
    testkit::sys::fallocate(&f, testkit::sys::falloc::KEEP_SIZE, 4 << 20, 128 << 10).unwrap();
    drop(f);
    w.fsync(&p("base/big"), false);
    // Truncate down.
    File::options()
        .write(true)
        .open(w.p(&p("base/trunc")))
        .unwrap()
        .set_len(5000)
        .unwrap();
    w.fsync(&p("base/trunc"), false);
    // Appends and overwrites of a committed file.
    let n = w.size_of(&p("base/big"));
    w.write_at(&p("base/big"), n, 70_000);
    w.write_at(&p("base/big"), 10_000, 30_000);
    w.fsync(&p("base/big"), true);
    // Renamed over another file, then fsynced.
    std::fs::rename(w.p(&p("base/trunc")), w.p(&p("base/x"))).unwrap();
    w.fsync(&p("base/x"), false);
    // Many long names for one inode: more than an INODE_REF item of a
    // 4 KiB leaf holds (extended refs take the rest).
    std::fs::create_dir(w.p(&p("many"))).unwrap();
    std::fs::write(w.p(&p("many/target")), b"one inode, many names").unwrap();
    for i in 0..50 {
        let name = format!("{}-{i}", "n".repeat(120));
        std::fs::hard_link(w.p(&p("many/target")), w.p(&p(&format!("many/{name}")))).unwrap();
    }
    w.fsync(&p("many/target"), false);
    // An O_TMPFILE written and fsynced, then given a name and fsynced;
    // another left nameless.
    for named in [true, false] {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(w.p(&p("base")))
            .unwrap();
        f.write_all(&w.rng.bytes(9000)).unwrap();
        f.sync_all().unwrap();
        if named {
            let fd = format!("/proc/self/fd/{}", f.as_raw_fd());
            let to = w.p(&p("base/was-tmpfile"));
            let (src, dst) = (
                std::ffi::CString::new(fd).unwrap(),
                std::ffi::CString::new(to.as_os_str().as_encoded_bytes()).unwrap(),
            );
            // SAFETY: valid C strings; linkat with AT_SYMLINK_FOLLOW on the fd's proc link.
            let r = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    src.as_ptr(),
                    libc::AT_FDCWD,
                    dst.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            assert_eq!(r, 0, "linkat: {}", std::io::Error::last_os_error());
            f.sync_all().unwrap();
        }
    }
    // A committed file unlinked while open, then fsynced through its descriptor.
    let f = File::options()
        .write(true)
        .open(w.p(&p("base/linked")))
        .unwrap();
    std::fs::remove_file(w.p(&p("base/linked"))).unwrap();
    std::fs::remove_file(w.p(&p("base/sub/linked2"))).unwrap();
    f.write_all_at(b"written after unlink", 0).unwrap();
    f.sync_all().unwrap();
}

/// The committed base the scripted cases change.
fn base(top: &Path, rng: &mut Rng) {
    std::fs::create_dir_all(top.join("base/sub")).unwrap();
    for name in ["a", "b", "sub/gone", "linked", "x", "trunc"] {
        let n = rng.size() as usize;
        std::fs::write(top.join("base").join(name), rng.bytes(n)).unwrap();
    }
    std::fs::write(top.join("base/big"), rng.bytes(3 << 20)).unwrap();
    testkit::sys::set_xattr(&top.join("base/x"), "user.old", b"stale").unwrap();
    testkit::sys::set_xattr(&top.join("base/x"), "user.kept", b"kept").unwrap();
}

// ---------------------------------------------------------------------
// One setup, end to end.

struct Setup {
    name: &'static str,
    mkfs: &'static [&'static str],
    mount: &'static str,
    subvols: usize,
    seed: u64,
    steps: u32,
    /// Percent of steps followed by an fsync of a directory.
    dir_sync: u64,
}

fn run_setup(t: &TestDir, s: &Setup) {
    eprintln!("{}: seed {}", s.name, s.seed);
    let img = t.join(format!("{}.img", s.name));
    testkit::sparse_file(&img, 512 << 20).unwrap();
    let mut mkfs = vec!["-q", "-f"];
    mkfs.extend_from_slice(s.mkfs);
    mkfs.push(img.to_str().unwrap());
    testkit::run_args("mkfs.btrfs", &mkfs).unwrap();
    let mnt = t.join(format!("{}-mnt", s.name));
    let crash = t.join(format!("{}-crash.img", s.name));
    let mut rng = Rng(0x5eed_0000_0000_0001 ^ s.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let fsyncs;
    {
        let opts = if s.mount.is_empty() {
            "commit=1000".to_string()
        } else {
            format!("commit=1000,{}", s.mount)
        };
        let m = Mount::single(&img, &mnt, &opts).unwrap();
        let top = m.path();
        let mut roots = vec![String::new()];
        for i in 0..s.subvols {
            let name = format!("vol{i}");
            testkit::run_args(
                "btrfs",
                ["subvolume", "create", top.join(&name).to_str().unwrap()],
            )
            .unwrap();
            roots.push(name);
        }
        for r in &roots {
            base(&top.join(r), &mut rng);
        }
        if s.subvols > 0 {
            // A snapshot: its changes copy blocks it shares with vol0.
            let (src, dst) = (top.join("vol0"), top.join("snap0"));
            testkit::run_args(
                "btrfs",
                [
                    "subvolume",
                    "snapshot",
                    src.to_str().unwrap(),
                    dst.to_str().unwrap(),
                ],
            )
            .unwrap();
            roots.push("snap0".into());
        }
        testkit::sys::syncfs(top).unwrap();
        let mut w = Work {
            top,
            rng,
            dirs: roots
                .iter()
                .flat_map(|r| [r.clone(), join(r, "base"), join(r, "base/sub")])
                .collect(),
            roots,
            files: Vec::new(),
            links: Vec::new(),
            counter: 0,
            fsyncs: 0,
            dir_sync: s.dir_sync,
        };
        w.dirs.retain(|d| !d.is_empty());
        w.dirs.push(String::new());
        scripted(&mut w);
        w.run(s.steps);
        // Every subvolume gets a logged change at the end. The kernel may
        // still turn an fsync into a full commit (it does after some
        // renames and unlinks): then more changes are logged, until a
        // copy of the image holds a log.
        let mut seen = Vec::new();
        for attempt in 0.. {
            for r in w.roots.clone() {
                let f = join(&r, &format!("last{attempt}"));
                std::fs::write(w.p(&f), b"the last fsync").unwrap();
                w.fsync(&f, false);
                seen.push((f, log_root_of(&img)));
            }
            // The crash: the image as the device holds it now, still mounted.
            copy_sparse(&img, &crash);
            if log_root_of(&crash) != 0 {
                break;
            }
            assert!(
                attempt < 5,
                "{}: no log after {attempt} tries: {seen:?}",
                s.name
            );
        }
        fsyncs = w.fsyncs;
        m.unmount().unwrap();
    }
    let super_text = testkit::run_args(
        "btrfs",
        ["inspect-internal", "dump-super", crash.to_str().unwrap()],
    )
    .unwrap();
    assert!(
        super_text.lines().any(|l| l.starts_with("log_root")
            && !l.ends_with("\t0")
            && l.split_whitespace().nth(1) != Some("0")),
        "{}: dump-super shows no log root:\n{super_text}",
        s.name
    );

    // What the last commit holds (the kernel mounts without replaying):
    // the log must matter, or this setup proves nothing.
    let committed = {
        let m = Mount::single(&crash, &mnt, "ro,rescue=nologreplay").unwrap();
        let snap = host_snapshot(m.path());
        m.unmount().unwrap();
        snap
    };

    // The oracle: the kernel replays a copy.
    let kimg = t.join(format!("{}-kernel.img", s.name));
    copy_sparse(&crash, &kimg);
    let want = {
        let since = replay_starts();
        let m = Mount::single(&kimg, &mnt, "").unwrap();
        let snap = stamped(host_snapshot(m.path()), since);
        m.unmount().unwrap();
        snap
    };
    std::fs::remove_file(&kimg).unwrap();
    assert_ne!(committed, want, "{}: the log changes nothing", s.name);

    // Read-only: replayed in memory, the image untouched.
    let before = file_hash(&crash);
    let log_blocks;
    {
        let since = replay_starts();
        let fs = Filesystem::open(&[&crash]).unwrap();
        let log = ubtrfs::tree_log::read::read_log(&fs).unwrap().unwrap();
        assert!(!log.subvols.is_empty(), "{}: an empty log", s.name);
        log_blocks = block_copies(&fs, &log.blocks);
        assert!(
            fs.warnings()
                .iter()
                .any(|w| w.contains("replayed in memory")),
            "{}: {:?}",
            s.name,
            fs.warnings()
        );
        assert_same(
            &format!("{}: read-only open", s.name),
            &want,
            &stamped(lib_snapshot(&fs), since),
        );
    }
    assert_eq!(
        before,
        file_hash(&crash),
        "{}: a read-only open changed the image",
        s.name
    );

    // Read-write: replayed and committed.
    let uimg = t.join(format!("{}-ubtrfs.img", s.name));
    copy_sparse(&crash, &uimg);
    let since = replay_starts();
    {
        let fs = Filesystem::open_read_write(&[&uimg]).unwrap();
        assert_eq!(fs.superblock().log_root, 0);
        assert_same(
            &format!("{}: read-write open", s.name),
            &want,
            &stamped(lib_snapshot(&fs), since),
        );
        fs.commit().unwrap();
    }
    let fs = Filesystem::open(&[&uimg]).unwrap();
    assert_eq!(
        fs.superblock().log_root,
        0,
        "{}: the log is still there",
        s.name
    );
    // The replay and its commit wrote nothing over the log it read: its
    // blocks are free only once that commit is on disk.
    let addrs: Vec<u64> = log_blocks.iter().map(|(a, _)| *a).collect();
    assert!(
        block_copies(&fs, &addrs) == log_blocks,
        "{}: the replay overwrote blocks of the log",
        s.name
    );
    assert!(fs.warnings().is_empty(), "{}: {:?}", s.name, fs.warnings());
    assert_same(
        &format!("{}: reopened", s.name),
        &want,
        &stamped(lib_snapshot(&fs), since),
    );
    drop(fs);
    let check = testkit::output_of(
        std::process::Command::new("btrfs")
            .args(["check", "--readonly"])
            .arg(&uimg),
    )
    .unwrap();
    let text = String::from_utf8_lossy(&check.stderr).into_owned()
        + &String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && text.contains("no error found"),
        "{}: btrfs check after the replay:\n{text}",
        s.name
    );
    let m = Mount::single(&uimg, &mnt, "ro").unwrap();
    let got = stamped(host_snapshot(m.path()), since);
    m.unmount().unwrap();
    assert_same(
        &format!("{}: kernel mount of the replayed image", s.name),
        &want,
        &got,
    );
    // The space the log held is free once the replay is committed: new
    // files take it, and the filesystem stays consistent.
    {
        let fs = Filesystem::open_read_write(&[&uimg]).unwrap();
        let dir = fs.root();
        let new = ubtrfs::fs::NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        for i in 0..300 {
            let st = fs
                .create(dir, format!("after-{i}").as_bytes(), new)
                .unwrap();
            fs.write(st.id, 0, &vec![i as u8; 3000 + 5000 * (i % 3)])
                .unwrap();
        }
        fs.commit().unwrap();
    }
    let check = testkit::output_of(
        std::process::Command::new("btrfs")
            .args(["check", "--readonly"])
            .arg(&uimg),
    )
    .unwrap();
    assert!(
        check.status.success(),
        "{}: btrfs check after writing on the replayed image:\n{}{}",
        s.name,
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!(
        "{}: {fsyncs} fsyncs, {} paths replayed and compared",
        s.name,
        want.len()
    );
}

/// Every copy of the tree blocks at `addrs`, raw.
fn block_copies(fs: &Filesystem, addrs: &[u64]) -> Vec<(u64, Vec<Vec<u8>>)> {
    let vol = fs.tree_reader().volume();
    let n = fs.geometry().nodesize as usize;
    addrs
        .iter()
        .map(|&a| {
            let copies = (0..vol.num_copies(a).unwrap())
                .map(|m| {
                    let mut b = vec![0u8; n];
                    vol.read_copy(a, m, &mut b).unwrap();
                    b
                })
                .collect();
            (a, copies)
        })
        .collect()
}

/// Copy an image, keeping it sparse.
fn copy_sparse(from: &Path, to: &Path) {
    testkit::run_args(
        "cp",
        [
            "--sparse=always",
            from.to_str().unwrap(),
            to.to_str().unwrap(),
        ],
    )
    .unwrap();
}

/// The primary superblock's `log_root`.
fn log_root_of(img: &Path) -> u64 {
    let mut b = [0u8; 8];
    File::open(img)
        .unwrap()
        .read_exact_at(&mut b, 0x10000 + 0x60)
        .unwrap();
    u64::from_le_bytes(b)
}

fn file_hash(p: &Path) -> u64 {
    let mut f = File::open(p).unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        buf[..n].hash(&mut h);
    }
    h.finish()
}

fn setups() -> Vec<Setup> {
    vec![
        Setup {
            name: "crc32c-16k",
            mkfs: &[],
            mount: "",
            subvols: 0,
            seed: 1,
            steps: 60,
            dir_sync: 10,
        },
        Setup {
            name: "xxhash-4k",
            mkfs: &["--csum", "xxhash", "-n", "4096"],
            mount: "",
            subvols: 0,
            seed: 2,
            steps: 60,
            dir_sync: 10,
        },
        Setup {
            name: "sha256-16k-subvols",
            mkfs: &["--csum", "sha256"],
            mount: "",
            subvols: 2,
            seed: 3,
            steps: 60,
            dir_sync: 10,
        },
        Setup {
            name: "blake2-4k-zstd",
            mkfs: &["--csum", "blake2", "-n", "4096"],
            mount: "compress-force=zstd",
            subvols: 1,
            seed: 4,
            steps: 60,
            dir_sync: 10,
        },
        Setup {
            name: "crc32c-64k-long",
            mkfs: &["-n", "65536"],
            mount: "",
            subvols: 0,
            seed: 6,
            steps: 200,
            dir_sync: 10,
        },
        Setup {
            name: "xxhash-4k-long-subvol",
            mkfs: &["--csum", "xxhash", "-n", "4096"],
            mount: "",
            subvols: 1,
            seed: 7,
            steps: 200,
            dir_sync: 10,
        },
        Setup {
            name: "crc32c-16k-dirs",
            mkfs: &[],
            mount: "",
            subvols: 0,
            seed: 8,
            steps: 150,
            dir_sync: 50,
        },
        Setup {
            name: "crc32c-16k-lzo-holes",
            mkfs: &["-O", "^no-holes"],
            mount: "compress=lzo",
            subvols: 0,
            seed: 5,
            steps: 60,
            dir_sync: 10,
        },
    ]
}

#[test]
fn kernel_logs_replay_as_the_kernel_does() {
    testkit::require_privileged!();
    let t = TestDir::new("log-replay").unwrap();
    // For hunting bugs by hand: one setup only, and more seeds of each.
    let only = std::env::var("UBTRFS_LOG_REPLAY_ONLY").ok();
    let rounds: u64 = std::env::var("UBTRFS_LOG_REPLAY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        for mut s in setups() {
            if only.as_deref().is_some_and(|o| o != s.name) {
                continue;
            }
            s.seed += round * 1000;
            run_setup(&t, &s);
        }
    }
}

/// A log whose root block is damaged on every copy: no open shows the
/// filesystem without the fsynced changes; both refuse, naming the block,
/// and nothing is written.
#[test]
fn damaged_log_is_refused() {
    testkit::require_privileged!();
    let t = TestDir::new("log-replay-bad").unwrap();
    let img = t.join("a.img");
    testkit::sparse_file(&img, 256 << 20).unwrap();
    testkit::run_args("mkfs.btrfs", ["-q", "-f", img.to_str().unwrap()]).unwrap();
    let mnt = t.join("mnt");
    let crash = t.join("crash.img");
    {
        let m = Mount::single(&img, &mnt, "commit=1000").unwrap();
        std::fs::write(m.path().join("committed"), b"old").unwrap();
        testkit::sys::syncfs(m.path()).unwrap();
        let f = File::create(m.path().join("fsynced")).unwrap();
        f.write_all_at(b"new data", 0).unwrap();
        f.sync_all().unwrap();
        drop(f);
        copy_sparse(&img, &crash);
        m.unmount().unwrap();
    }
    let root = log_root_of(&crash);
    assert_ne!(root, 0, "no log in the crash image");
    // Where the log root block's copies are on the device.
    let places: Vec<u64> = {
        let fs = Filesystem::open(&[&crash]).unwrap();
        assert_eq!(
            fs.read_all(fs.resolve_path(b"/fsynced").unwrap()).unwrap(),
            b"new data"
        );
        let vol = fs.tree_reader().volume();
        let chunk = vol.chunks.lookup(root).unwrap();
        (0..chunk.num_copies())
            .map(|m| chunk.map(root, 4096, m).unwrap().physical)
            .collect()
    };
    let f = File::options().read(true).write(true).open(&crash).unwrap();
    for p in &places {
        // A byte inside the header (the owner): the checksum no longer matches.
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, p + 0x58).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], p + 0x58).unwrap();
    }
    drop(f);
    let before = file_hash(&crash);
    let ro = Filesystem::open(&[&crash])
        .err()
        .expect("a read-only open with a damaged log must fail");
    let msg = ro.to_string();
    assert!(
        msg.contains("log tree") && msg.contains(&root.to_string()),
        "{msg}"
    );
    let rw = Filesystem::open_read_write(&[&crash])
        .err()
        .expect("a read-write open with a damaged log must fail");
    assert!(
        rw.to_string().contains("log tree") && rw.to_string().contains(&root.to_string()),
        "{rw}"
    );
    eprintln!("read-only open: {msg}\nread-write open: {rw}");
    assert_eq!(
        before,
        file_hash(&crash),
        "a failed open wrote to the image"
    );
}

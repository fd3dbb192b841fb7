//! Writes to subvolumes whose tree blocks are shared with snapshots, and
//! snapshots made by the library.
//!
//! The kernel makes an image with 4 KiB nodes and thousands of files in a
//! subvolume (trees of height 3), a nested subvolume, reflinked files, a
//! writable and a read-only snapshot, and a snapshot of the snapshot, with
//! kernel writes in between. The library then writes, overwrites,
//! truncates, renames, reflinks, deletes and creates files in the origin
//! and in the snapshots, commits, and is reopened; `btrfs check` must be
//! clean and the kernel must see exactly what a model of the content says
//! (file by file, in every subvolume). The kernel writes more, the library
//! reads that back and writes again, and the checks repeat. The same runs
//! on an image without skinny metadata (EXTENT_ITEM tree block items).
//!
//! A second test makes the subvolume and its snapshots with the library
//! (writable, read-only, and one inside its own source), then both sides
//! change them.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use testkit::{KernelImageOptions, MkfsOptions, Mount, TestDir, kernel_image};
use ubtrfs::fs::{FileKind, Filesystem, InodeId, NewInode};

// ---------------------------------------------------------------------
// The model: every path of the filesystem and what it holds.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

type Model = BTreeMap<String, Entry>;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn parent_of(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

/// The tree below `root` on the host (a kernel mount).
fn host_tree(root: &Path) -> Model {
    fn walk(root: &Path, rel: &str, out: &mut Model) {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
            .unwrap_or_else(|e| panic!("read_dir {rel}: {e}"))
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for name in names {
            let path = join(rel, &name);
            let full = root.join(&path);
            let meta = std::fs::symlink_metadata(&full).unwrap();
            if meta.is_dir() {
                out.insert(path.clone(), Entry::Dir);
                walk(root, &path, out);
            } else if meta.file_type().is_symlink() {
                let t = std::fs::read_link(&full).unwrap();
                out.insert(
                    path,
                    Entry::Symlink(t.into_os_string().into_encoded_bytes()),
                );
            } else {
                out.insert(path, Entry::File(std::fs::read(&full).unwrap()));
            }
        }
    }
    let mut out = Model::new();
    walk(root, "", &mut out);
    out
}

/// The tree the library shows, from the default subvolume's root.
fn lib_tree(fs: &Filesystem) -> Model {
    fn walk(fs: &Filesystem, dir: InodeId, rel: &str, out: &mut Model) {
        for e in fs.read_dir(dir, 0).unwrap() {
            let name = String::from_utf8(e.name.clone()).unwrap();
            let path = join(rel, &name);
            match e.kind {
                FileKind::Dir => {
                    out.insert(path.clone(), Entry::Dir);
                    walk(fs, e.id, &path, out);
                }
                FileKind::Symlink => {
                    out.insert(path, Entry::Symlink(fs.read_link(e.id).unwrap()));
                }
                _ => {
                    let data = fs
                        .read_all(e.id)
                        .unwrap_or_else(|err| panic!("reading {path}: {err}"));
                    out.insert(path, Entry::File(data));
                }
            }
        }
    }
    let mut out = Model::new();
    walk(fs, fs.root(), "", &mut out);
    out
}

fn assert_same(what: &str, want: &Model, got: &Model) {
    let mut diffs = Vec::new();
    for (p, e) in want {
        match got.get(p) {
            None => diffs.push(format!("{p}: missing")),
            Some(g) if g != e => {
                diffs.push(format!("{p}: differs ({} vs {})", describe(e), describe(g)))
            }
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("{p}: unexpected"));
    }
    if !diffs.is_empty() {
        diffs.truncate(30);
        panic!("{what}: {} differences:\n{}", diffs.len(), diffs.join("\n"));
    }
}

fn describe(e: &Entry) -> String {
    match e {
        Entry::Dir => "dir".into(),
        Entry::File(d) => format!("file of {} bytes", d.len()),
        Entry::Symlink(t) => format!("symlink to {}", String::from_utf8_lossy(t)),
    }
}

// ---------------------------------------------------------------------
// Randomness and content

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        (!v.is_empty()).then(|| &v[self.below(v.len() as u64) as usize])
    }

    /// A file size: mostly small (inline), some of a few sectors, a few large.
    fn size(&mut self) -> usize {
        match self.below(100) {
            0..=64 => self.below(1800) as usize,
            65..=94 => 2048 + self.below(24 << 10) as usize,
            _ => (40 << 10) + self.below(200 << 10) as usize,
        }
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

// ---------------------------------------------------------------------
// Operations, applied to the model and to a backend (the library, or a
// kernel mount).

trait Backend {
    fn write(&mut self, path: &str, off: u64, data: &[u8]);
    fn truncate(&mut self, path: &str, size: u64);
    fn create(&mut self, path: &str);
    fn mkdir(&mut self, path: &str);
    fn unlink(&mut self, path: &str);
    fn rename(&mut self, from: &str, to: &str);
    /// Make new file `to` share the data of `from`.
    fn reflink(&mut self, from: &str, to: &str);
}

struct Lib<'a>(&'a Filesystem);

impl Lib<'_> {
    fn id(&self, path: &str) -> InodeId {
        self.0
            .resolve_path(format!("/{path}").as_bytes())
            .unwrap_or_else(|e| panic!("resolve {path}: {e}"))
    }

    fn dir_and_name<'p>(&self, path: &'p str) -> (InodeId, &'p str) {
        let (d, n) = parent_of(path);
        (self.id(d), n)
    }
}

impl Backend for Lib<'_> {
    fn write(&mut self, path: &str, off: u64, data: &[u8]) {
        let n = self
            .0
            .write(self.id(path), off, data)
            .unwrap_or_else(|e| panic!("write {path}: {e}"));
        assert_eq!(n, data.len());
    }
    fn truncate(&mut self, path: &str, size: u64) {
        self.0
            .truncate(self.id(path), size)
            .unwrap_or_else(|e| panic!("truncate {path}: {e}"));
    }
    fn create(&mut self, path: &str) {
        let (dir, name) = self.dir_and_name(path);
        let new = NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        };
        self.0
            .create(dir, name.as_bytes(), new)
            .unwrap_or_else(|e| panic!("create {path}: {e}"));
    }
    fn mkdir(&mut self, path: &str) {
        let (dir, name) = self.dir_and_name(path);
        self.0
            .mkdir(dir, name.as_bytes(), 0o755, 0, 0)
            .unwrap_or_else(|e| panic!("mkdir {path}: {e}"));
    }
    fn unlink(&mut self, path: &str) {
        let (dir, name) = self.dir_and_name(path);
        self.0
            .unlink(dir, name.as_bytes())
            .unwrap_or_else(|e| panic!("unlink {path}: {e}"));
    }
    fn rename(&mut self, from: &str, to: &str) {
        let (d1, n1) = self.dir_and_name(from);
        let (d2, n2) = self.dir_and_name(to);
        self.0
            .rename(d1, n1.as_bytes(), d2, n2.as_bytes(), 0)
            .unwrap_or_else(|e| panic!("rename {from} {to}: {e}"));
    }
    fn reflink(&mut self, from: &str, to: &str) {
        self.create(to);
        self.0
            .clone_range(self.id(from), 0, self.id(to), 0, 0)
            .unwrap_or_else(|e| panic!("clone {from} {to}: {e}"));
    }
}

struct Host<'a>(&'a Path);

impl Backend for Host<'_> {
    fn write(&mut self, path: &str, off: u64, data: &[u8]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.0.join(path))
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        f.write_all_at(data, off).unwrap();
    }
    fn truncate(&mut self, path: &str, size: u64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.0.join(path))
            .unwrap();
        f.set_len(size).unwrap();
    }
    fn create(&mut self, path: &str) {
        std::fs::File::create(self.0.join(path)).unwrap_or_else(|e| panic!("create {path}: {e}"));
    }
    fn mkdir(&mut self, path: &str) {
        std::fs::create_dir(self.0.join(path)).unwrap();
    }
    fn unlink(&mut self, path: &str) {
        std::fs::remove_file(self.0.join(path)).unwrap_or_else(|e| panic!("unlink {path}: {e}"));
    }
    fn rename(&mut self, from: &str, to: &str) {
        std::fs::rename(self.0.join(from), self.0.join(to)).unwrap();
    }
    fn reflink(&mut self, from: &str, to: &str) {
        run(Command::new("cp")
            .arg("--reflink=always")
            .arg(self.0.join(from))
            .arg(self.0.join(to)));
    }
}

/// The random operations on one filesystem and their model.
struct Workload {
    model: Model,
    rng: Rng,
    /// Roots of the writable subvolumes (paths; "" is the top level).
    subvols: Vec<String>,
    /// Paths nothing may be written below: read-only snapshots and the
    /// placeholders of subvolumes nested in snapshots.
    frozen: Vec<String>,
    serial: u64,
}

impl Workload {
    fn new(model: Model, seed: u64, subvols: &[&str], frozen: &[&str]) -> Self {
        Workload {
            model,
            rng: Rng(seed),
            subvols: subvols.iter().map(|s| s.to_string()).collect(),
            frozen: frozen.iter().map(|s| s.to_string()).collect(),
            serial: 0,
        }
    }

    fn below(prefix: &str, path: &str) -> bool {
        prefix.is_empty() || path == prefix || path.starts_with(&format!("{prefix}/"))
    }

    /// The subvolume root `path` belongs to: the longest that holds it.
    fn subvol_of(&self, path: &str) -> String {
        self.subvols
            .iter()
            .filter(|s| Self::below(s, path))
            .max_by_key(|s| s.len())
            .cloned()
            .unwrap_or_default()
    }

    fn writable(&self, path: &str) -> bool {
        !self.frozen.iter().any(|f| Self::below(f, path))
    }

    /// Files and directories of subvolume `sv` (its own, not nested ones).
    fn entries_of(&self, sv: &str, dirs: bool) -> Vec<String> {
        let mut out: Vec<String> = self
            .model
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Dir) == dirs && !matches!(e, Entry::Symlink(_)))
            .map(|(p, _)| p.clone())
            .filter(|p| Self::below(sv, p) && self.subvol_of(p) == *sv && self.writable(p))
            .filter(|p| !self.subvols.contains(p))
            .collect();
        if dirs && self.writable(sv) {
            out.push(sv.to_string());
        }
        out
    }

    fn new_name(&mut self, dir: &str) -> String {
        self.serial += 1;
        join(dir, &format!("n{}-{}", self.serial, self.rng.below(1000)))
    }

    /// One random operation on subvolume `sv`.
    fn step(&mut self, b: &mut dyn Backend, sv: &str) {
        let files = self.entries_of(sv, false);
        let dirs = self.entries_of(sv, true);
        let roll = self.rng.below(100);
        let file = self.rng.pick(&files).cloned();
        match (roll, file) {
            (0..=34, Some(f)) => {
                let Some(Entry::File(cur)) = self.model.get(&f).cloned() else {
                    unreachable!()
                };
                let off = self.rng.below(cur.len() as u64 + 6000);
                let len = if self.rng.chance(70) {
                    1 + self.rng.below(3000) as usize
                } else {
                    self.rng.size().max(1)
                };
                let data = self.rng.bytes(len);
                b.write(&f, off, &data);
                let mut new = cur;
                let end = off as usize + len;
                if new.len() < end {
                    new.resize(end, 0);
                }
                new[off as usize..end].copy_from_slice(&data);
                self.model.insert(f, Entry::File(new));
            }
            (35..=49, Some(f)) => {
                let Some(Entry::File(mut cur)) = self.model.get(&f).cloned() else {
                    unreachable!()
                };
                let size = self.rng.below(cur.len() as u64 * 3 / 2 + 100) as usize;
                b.truncate(&f, size as u64);
                cur.resize(size, 0);
                self.model.insert(f, Entry::File(cur));
            }
            (50..=64, Some(f)) => {
                b.unlink(&f);
                self.model.remove(&f);
            }
            (65..=69, Some(f)) => {
                let Some(to_dir) = self.rng.pick(&dirs).cloned() else {
                    return;
                };
                let to = self.new_name(&to_dir);
                b.rename(&f, &to);
                let e = self.model.remove(&f).unwrap();
                self.model.insert(to, e);
            }
            (70..=72, Some(f)) => {
                let Some(dir) = self.rng.pick(&dirs).cloned() else {
                    return;
                };
                if matches!(self.model.get(&f), Some(Entry::File(d)) if d.is_empty()) {
                    return;
                }
                let to = self.new_name(&dir);
                b.reflink(&f, &to);
                let e = self.model.get(&f).cloned().unwrap();
                self.model.insert(to, e);
            }
            (73..=75, _) => {
                let Some(dir) = self.rng.pick(&dirs).cloned() else {
                    return;
                };
                let d = self.new_name(&dir);
                b.mkdir(&d);
                self.model.insert(d, Entry::Dir);
            }
            _ => {
                let Some(dir) = self.rng.pick(&dirs).cloned() else {
                    return;
                };
                let f = self.new_name(&dir);
                b.create(&f);
                let len = self.rng.size();
                let data = self.rng.bytes(len);
                if len > 0 {
                    b.write(&f, 0, &data);
                }
                self.model.insert(f, Entry::File(data));
            }
        }
    }

    /// `n` operations spread over the subvolumes in `targets`.
    fn run(&mut self, b: &mut dyn Backend, targets: &[&str], n: usize) {
        for _ in 0..n {
            let sv = targets[self.rng.below(targets.len() as u64) as usize];
            self.step(b, sv);
        }
    }
}

// ---------------------------------------------------------------------
// Helpers

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// `btrfs check --readonly` must find nothing.
fn check(img: &Path, when: &str) {
    let out =
        testkit::output_of(Command::new("btrfs").args(["check", "--readonly"]).arg(img)).unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("no error found") && !text.contains("ERROR"),
        "btrfs check {when}:\n{text}"
    );
}

fn open_rw(img: &Path) -> Filesystem {
    Filesystem::open_read_write(&[img]).unwrap_or_else(|e| panic!("open {}: {e}", img.display()))
}

fn subvol_id(fs: &Filesystem, path: &str) -> u64 {
    fs.resolve_path(format!("/{path}").as_bytes())
        .unwrap()
        .subvol
}

/// Height of subvolume `sv`'s tree (its root's level + 1).
fn tree_height(fs: &Filesystem, sv: u64) -> u8 {
    let mut top = 0;
    fs.tree_by_id(sv)
        .unwrap()
        .walk(&mut |n| {
            top = top.max(n.level());
            Ok(())
        })
        .unwrap();
    top + 1
}

/// Kernel's view: mount, compare with the model, optionally change it.
fn kernel_round(
    img: &Path,
    mnt: &Path,
    w: &mut Workload,
    what: &str,
    writes: Option<(&[&str], usize)>,
) {
    let m = Mount::single(img, mnt, "").unwrap_or_else(|e| panic!("kernel mount {what}: {e:#}"));
    assert_same(
        &format!("kernel view {what}"),
        &w.model,
        &host_tree(m.path()),
    );
    if let Some((targets, n)) = writes {
        w.run(&mut Host(m.path()), targets, n);
        // A write into the read-only snapshot fails in the kernel too.
        if let Some(ro) = w.frozen.first()
            && let Some(f) = w
                .model
                .keys()
                .find(|p| Workload::below(ro, p) && matches!(w.model[*p], Entry::File(_)))
        {
            assert!(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(m.path().join(f))
                    .is_err()
            );
        }
    }
    m.unmount().unwrap();
}

// ---------------------------------------------------------------------
// Kernel-made snapshots, written by the library

/// Populate a kernel mount: `sv` with thousands of files, a nested
/// subvolume, reflinks; `snap`, a snapshot of it; kernel writes to `sv`;
/// `snap2`, a snapshot of `snap`; kernel writes to `snap`; `ro`, a
/// read-only snapshot of `sv`.
fn populate(mnt: &Path, rng: &mut Rng) -> std::io::Result<()> {
    let p = |s: &str| mnt.join(s);
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(p("sv")));
    for d in 0..24 {
        std::fs::create_dir(p(&format!("sv/d{d}")))?;
        for f in 0..110 {
            let len = rng.size();
            std::fs::write(p(&format!("sv/d{d}/f{f}")), rng.bytes(len))?;
        }
    }
    std::fs::create_dir(p("sv/refl"))?;
    for i in 0..12 {
        let len = (64 << 10) + rng.below(200 << 10) as usize;
        let big = rng.bytes(len);
        std::fs::write(p(&format!("sv/refl/orig{i}")), &big)?;
        for c in 0..3 {
            run(Command::new("cp")
                .arg("--reflink=always")
                .arg(p(&format!("sv/refl/orig{i}")))
                .arg(p(&format!("sv/refl/copy{i}-{c}"))));
        }
    }
    std::os::unix::fs::symlink("d0/f1", p("sv/link"))?;
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(p("sv/nested")));
    for f in 0..200 {
        let len = rng.size();
        std::fs::write(p(&format!("sv/nested/g{f}")), rng.bytes(len))?;
    }
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(p("sv"))
        .arg(p("snap")));
    // The kernel changes the origin: some shared blocks get copied by it.
    for d in 0..24 {
        let f = p(&format!("sv/d{d}/f{}", rng.below(110)));
        if rng.chance(50) {
            std::fs::remove_file(&f)?;
        } else {
            let len = rng.size();
            std::fs::write(&f, rng.bytes(len))?;
        }
    }
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot"])
        .arg(p("snap"))
        .arg(p("snap2")));
    for d in (0..24).step_by(3) {
        let len = rng.size();
        std::fs::write(p(&format!("snap/d{d}/new")), rng.bytes(len))?;
    }
    // Last, so every block of the origin is shared with it.
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(p("sv"))
        .arg(p("ro")));
    Ok(())
}

fn kernel_snapshots(label: &str, features: &[&str], seed: u64) {
    testkit::require_privileged!();
    let t = TestDir::new(&format!("snapshot-{label}")).unwrap();
    let mut rng = Rng(seed);
    let opts = KernelImageOptions {
        mkfs: MkfsOptions {
            nodesize: 4096,
            device_size: 512 << 20,
            features: features.iter().map(|s| s.to_string()).collect(),
            ..MkfsOptions::default()
        },
        // Reading the model must not copy every inode for its atime.
        mount_options: "noatime".into(),
    };
    let mut model = Model::new();
    let image = kernel_image(&t.join("img"), &opts, |m| {
        populate(m, &mut rng)?;
        model = host_tree(m);
        Ok(())
    })
    .unwrap();
    let img = image.path().to_path_buf();
    check(&img, "of the kernel's image");
    let subvols = ["", "sv", "sv/nested", "snap", "snap2", "ro"];
    let frozen = ["ro", "snap/nested", "snap2/nested"];
    let mut w = Workload::new(model, seed ^ 0x5eed, &subvols, &frozen);
    let targets = ["sv", "snap", "snap2", "sv", "snap", "sv/nested", ""];

    let fs = open_rw(&img);
    assert_same(
        "library view of the kernel's image",
        &w.model,
        &lib_tree(&fs),
    );
    for sv in ["sv", "snap", "snap2"] {
        let h = tree_height(&fs, subvol_id(&fs, sv));
        assert!(h >= 3, "{sv}: tree of height {h}, too small to test");
    }
    // Nothing in a read-only snapshot changes.
    let ro_file = fs.resolve_path(b"/ro/d0/f0").unwrap();
    assert!(matches!(
        fs.write(ro_file, 0, b"x"),
        Err(ubtrfs::Error::ReadOnly(_))
    ));
    assert!(matches!(
        fs.unlink(fs.resolve_path(b"/ro/d0").unwrap(), b"f0"),
        Err(ubtrfs::Error::ReadOnly(_))
    ));
    let mut fs = fs;
    for round in 0..6 {
        w.run(&mut Lib(&fs), &targets, 250);
        fs.commit().unwrap();
        if round % 2 == 1 {
            drop(fs);
            fs = open_rw(&img);
            assert_same(
                &format!("library view after round {round}"),
                &w.model,
                &lib_tree(&fs),
            );
        }
    }
    drop(fs);
    check(&img, "after the library's writes");
    let mnt = t.join("mnt");
    kernel_round(
        &img,
        &mnt,
        &mut w,
        "after the library's writes",
        Some((&targets, 300)),
    );
    check(&img, "after the kernel's writes");

    let fs = open_rw(&img);
    assert_same(
        "library view after the kernel's writes",
        &w.model,
        &lib_tree(&fs),
    );
    w.run(&mut Lib(&fs), &targets, 400);
    fs.commit().unwrap();
    drop(fs);
    check(&img, "after the library's second writes");
    kernel_round(&img, &mnt, &mut w, "at the end", None);
}

#[test]
fn kernel_snapshots_skinny() {
    kernel_snapshots("skinny", &[], 1);
}

#[test]
fn kernel_snapshots_without_skinny_metadata() {
    kernel_snapshots("non-skinny", &["^skinny-metadata"], 2);
}

// ---------------------------------------------------------------------
// Snapshots made by the library

/// Copy the model's entries below `from` to below `to`, leaving nested
/// subvolumes (in `nested`) as empty directories, as a snapshot shows them.
fn snapshot_model(m: &mut Model, from: &str, to: &str, nested: &[&str]) {
    let copy: Vec<(String, Entry)> = m
        .iter()
        .filter(|(p, _)| p.starts_with(&format!("{from}/")))
        .filter(|(p, _)| !nested.iter().any(|n| p.starts_with(&format!("{n}/"))))
        .map(|(p, e)| (format!("{to}{}", &p[from.len()..]), e.clone()))
        .collect();
    m.insert(to.to_string(), Entry::Dir);
    m.extend(copy);
}

fn library_snapshots(label: &str, features: &[&str], seed: u64) {
    testkit::require_privileged!();
    let t = TestDir::new(&format!("lib-snapshot-{label}")).unwrap();
    let opts = KernelImageOptions {
        mkfs: MkfsOptions {
            nodesize: 4096,
            device_size: 384 << 20,
            features: features.iter().map(|s| s.to_string()).collect(),
            ..MkfsOptions::default()
        },
        mount_options: String::new(),
    };
    let image = kernel_image(&t.join("img"), &opts, |m| {
        std::fs::create_dir(m.join("a"))?;
        Ok(())
    })
    .unwrap();
    let img = image.path().to_path_buf();
    let mut w = Workload::new(Model::new(), seed, &["", "a/sv", "a/sv/inner"], &[]);
    w.model.insert("a".into(), Entry::Dir);

    // A subvolume filled by the library, with one nested in it.
    let fs = open_rw(&img);
    let a = fs.resolve_path(b"/a").unwrap();
    let sv = fs.create_subvolume(a, b"sv", 0, 0).unwrap();
    assert!(matches!(
        fs.create_subvolume(a, b"sv", 0, 0),
        Err(ubtrfs::Error::Exists(_))
    ));
    w.model.insert("a/sv".into(), Entry::Dir);
    for d in 0..20 {
        let dir = format!("a/sv/d{d}");
        Lib(&fs).mkdir(&dir);
        w.model.insert(dir.clone(), Entry::Dir);
        for f in 0..100 {
            let path = format!("{dir}/f{f}");
            Lib(&fs).create(&path);
            let len = w.rng.size();
            let data = w.rng.bytes(len);
            if len > 0 {
                Lib(&fs).write(&path, 0, &data);
            }
            w.model.insert(path, Entry::File(data));
        }
    }
    let inner = fs.create_subvolume(sv, b"inner", 0, 0).unwrap();
    w.model.insert("a/sv/inner".into(), Entry::Dir);
    w.run(&mut Lib(&fs), &["a/sv/inner"], 60);
    // A subvolume small enough for its root to be a leaf, with data
    // extents (one reflinked) that a copy of the root references.
    fs.create_subvolume(a, b"tiny", 0, 0).unwrap();
    w.model.insert("a/tiny".into(), Entry::Dir);
    for (name, len) in [("big", 20000), ("small", 100)] {
        let path = format!("a/tiny/{name}");
        let data = w.rng.bytes(len);
        Lib(&fs).create(&path);
        Lib(&fs).write(&path, 0, &data);
        w.model.insert(path, Entry::File(data));
    }
    Lib(&fs).reflink("a/tiny/big", "a/tiny/big2");
    let big = w.model["a/tiny/big"].clone();
    w.model.insert("a/tiny/big2".into(), big);
    fs.commit().unwrap();
    assert!(tree_height(&fs, sv.subvol) >= 3);
    assert_ne!(inner.subvol, sv.subvol);

    // Snapshots: writable, read-only, one inside its own source.
    let top = fs.root();
    let snap = fs.create_snapshot(sv.subvol, top, b"snap", false).unwrap();
    snapshot_model(&mut w.model, "a/sv", "snap", &["a/sv/inner"]);
    let ro = fs.create_snapshot(sv.subvol, a, b"ro", true).unwrap();
    snapshot_model(&mut w.model, "a/sv", "a/ro", &["a/sv/inner"]);
    let d0 = fs.resolve_path(b"/a/sv/d0").unwrap();
    let own = fs.create_snapshot(sv.subvol, d0, b"self", false).unwrap();
    // The snapshot was taken before its own link existed.
    snapshot_model(&mut w.model, "a/sv", "a/sv/d0/self", &["a/sv/inner"]);
    let tiny = subvol_id(&fs, "a/tiny");
    assert_eq!(tree_height(&fs, tiny), 1);
    fs.create_snapshot(tiny, a, b"tiny-snap", false).unwrap();
    snapshot_model(&mut w.model, "a/tiny", "a/tiny-snap", &[]);
    assert_same("library view after the snapshots", &w.model, &lib_tree(&fs));
    assert!(matches!(
        fs.write(fs.resolve_path(b"/a/ro/d1/f1").unwrap(), 0, b"x"),
        Err(ubtrfs::Error::ReadOnly(_))
    ));
    let subvols = fs.subvolumes().unwrap();
    let info = |id: u64| subvols.iter().find(|s| s.id == id).unwrap().clone();
    let sv_uuid = info(sv.subvol).uuid;
    for (id, readonly) in [(snap.subvol, false), (ro.subvol, true), (own.subvol, false)] {
        let i = info(id);
        assert_eq!(i.parent_uuid, sv_uuid);
        assert_eq!(i.readonly, readonly);
        assert_ne!(i.uuid, sv_uuid);
    }
    drop(fs);
    check(&img, "after the library's snapshots");

    // The kernel sees each snapshot as the source was.
    let mnt = t.join("mnt");
    {
        let m = Mount::single(&img, &mnt, "ro").unwrap();
        assert_same(
            "kernel view of the library's snapshots",
            &w.model,
            &host_tree(m.path()),
        );
        let show = run(Command::new("btrfs")
            .args(["subvolume", "show"])
            .arg(m.path().join("a/ro")));
        assert!(show.contains("readonly"), "{show}");
        let list = run(Command::new("btrfs")
            .args(["subvolume", "list", "-u", "-q"])
            .arg(m.path()));
        assert_eq!(list.lines().count(), 7, "{list}");
        m.unmount().unwrap();
    }

    // Both sides change the source and the snapshots.
    w.subvols = [
        "",
        "a/sv",
        "a/sv/inner",
        "snap",
        "a/ro",
        "a/sv/d0/self",
        "a/tiny",
        "a/tiny-snap",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    w.frozen = ["a/ro", "snap/inner", "a/sv/d0/self/inner"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let targets = [
        "a/sv",
        "snap",
        "a/sv/d0/self",
        "a/sv",
        "snap",
        "a/tiny",
        "a/tiny-snap",
    ];
    let fs = open_rw(&img);
    for _ in 0..3 {
        w.run(&mut Lib(&fs), &targets, 250);
        fs.commit().unwrap();
    }
    drop(fs);
    check(&img, "after the library changed its snapshots");
    kernel_round(
        &img,
        &mnt,
        &mut w,
        "after the library changed its snapshots",
        Some((&targets, 300)),
    );
    check(&img, "after the kernel changed the library's snapshots");
    let fs = open_rw(&img);
    assert_same(
        "library view after the kernel's changes",
        &w.model,
        &lib_tree(&fs),
    );
    // A snapshot of a snapshot, on top of all that.
    let snap_id = subvol_id(&fs, "snap");
    fs.create_snapshot(snap_id, fs.root(), b"snap-of-snap", false)
        .unwrap();
    snapshot_model(&mut w.model, "snap", "snap-of-snap", &["snap/inner"]);
    w.subvols.push("snap-of-snap".into());
    w.frozen.push("snap-of-snap/inner".into());
    w.run(&mut Lib(&fs), &["snap", "snap-of-snap", "a/sv"], 300);
    fs.commit().unwrap();
    drop(fs);
    check(&img, "at the end");
    kernel_round(&img, &mnt, &mut w, "at the end", None);
}

#[test]
fn library_snapshots_skinny() {
    library_snapshots("skinny", &[], 11);
}

#[test]
fn library_snapshots_without_skinny_metadata() {
    library_snapshots("non-skinny", &["^skinny-metadata"], 12);
}

/// A snapshot of a subvolume that holds others shows an empty directory
/// where each nested one was linked: `rm -rf` of the snapshot removes it
/// (rmdir), moving it is refused (ENOTEMPTY, as the kernel answers), a
/// directory renamed over it replaces it, and the image stays clean for
/// `btrfs check` and the kernel.
#[test]
fn placeholders_of_nested_subvolumes_go_with_rmdir() {
    testkit::require_privileged!();
    let t = TestDir::new("lib-snapshot-placeholder").unwrap();
    let opts = KernelImageOptions {
        mkfs: MkfsOptions {
            device_size: 256 << 20,
            ..MkfsOptions::default()
        },
        mount_options: String::new(),
    };
    let image = kernel_image(&t.join("img"), &opts, |_| Ok(())).unwrap();
    let img = image.path().to_path_buf();
    let fs = open_rw(&img);
    let top = fs.root();
    let a = fs.create_subvolume(top, b"a", 0, 0).unwrap();
    fs.create_subvolume(a, b"inner", 0, 0).unwrap();
    fs.create_subvolume(a, b"inner2", 0, 0).unwrap();
    fs.create_snapshot(a.subvol, top, b"s", false).unwrap();
    let s = fs.resolve_path(b"/s").unwrap();
    let placeholder = fs.lookup(s, b"inner").unwrap();
    assert_eq!(placeholder.kind, FileKind::Dir);
    fs.mkdir(s, b"other", 0o755, 0, 0).unwrap();
    assert!(matches!(
        fs.rename(s, b"inner", s, b"moved", 0),
        Err(ubtrfs::Error::NotEmpty(_))
    ));
    assert!(matches!(
        fs.rename(s, b"other", s, b"inner", ubtrfs::fs::RENAME_EXCHANGE),
        Err(ubtrfs::Error::NotEmpty(_))
    ));
    // A directory renamed over one replaces it.
    fs.rename(s, b"other", s, b"inner", 0).unwrap();
    assert!(matches!(
        fs.lookup(s, b"other"),
        Err(ubtrfs::Error::NotFound(_))
    ));
    let replaced = fs.lookup(s, b"inner").unwrap();
    assert_eq!(replaced.id.subvol, s.subvol);
    assert_ne!(replaced.id.ino, placeholder.id.ino);
    // The other one goes with rmdir.
    fs.rmdir(s, b"inner2").unwrap();
    assert!(matches!(
        fs.lookup(s, b"inner2"),
        Err(ubtrfs::Error::NotFound(_))
    ));
    fs.rmdir(s, b"inner").unwrap();
    assert!(fs.read_dir(s, 0).unwrap().is_empty());
    // The nested subvolumes themselves are still there, in `a`.
    assert!(fs.resolve_path(b"/a/inner").is_ok());
    assert!(fs.resolve_path(b"/a/inner2").is_ok());
    fs.commit().unwrap();
    drop(fs);
    check(&img, "after the placeholder went");
    let mnt = t.join("mnt");
    let m = Mount::new(&[&img], &mnt, "").unwrap();
    assert_eq!(std::fs::read_dir(mnt.join("s")).unwrap().count(), 0);
    assert!(mnt.join("a/inner").is_dir() && mnt.join("a/inner2").is_dir());
    m.unmount().unwrap();
}

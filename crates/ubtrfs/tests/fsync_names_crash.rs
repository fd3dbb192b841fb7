//! fsync of names, judged by the kernel: files created, written, renamed
//! (in the same directory, across directories, over another file),
//! hard-linked and unlinked; directories made and moved; fsyncs of files
//! and of directories in between; on a recording device. Power cuts after
//! every flush and every FUA write, and at the end: ubtrfs's read-only
//! open (which replays the log in memory) and the kernel's mount (which
//! replays it on disk) must show
//!
//! - every name of a file fsync'd before the cut as it was at that fsync
//!   or later (per name: present, absent, or naming the same inode);
//! - every entry of a directory fsync'd before the cut likewise, and of
//!   the directories below it made since the last commit (as the kernel's
//!   directory fsync logs them);
//! - the content of a file fsync'd before the cut in a state since;
//!
//! and `btrfs check` must be clean on the cut image and after the
//! kernel's replay. Most of these fsyncs must be logged, not committed:
//! that is what makes them cheap. `UBTRFS_SEED=<n>` runs another sequence
//! (the seed is printed; how many fsyncs were logged is then reported,
//! not asserted).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use ubtrfs::device::recording::{Op, cut_points, replay};
use ubtrfs::device::{Device, MemDevice, RecordingDevice};
use ubtrfs::fs::{FileKind, Filesystem, InodeId, NewInode};
use ubtrfs::tree_log::Synced;
use ubtrfs::volume::DeviceSet;

const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The namespace: for each directory (by inode number), its entries by
/// name; and each file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct View {
    dirs: BTreeMap<u64, BTreeMap<Vec<u8>, u64>>,
    /// Files' data and symlinks' targets.
    content: BTreeMap<u64, Vec<u8>>,
    symlinks: BTreeSet<u64>,
}

impl View {
    /// The names of inode `ino`: (directory, name) pairs.
    fn names(&self, ino: u64) -> BTreeSet<(u64, Vec<u8>)> {
        let mut out = BTreeSet::new();
        for (d, es) in &self.dirs {
            for (n, &t) in es {
                if t == ino {
                    out.insert((*d, n.clone()));
                }
            }
        }
        out
    }
}

/// What ubtrfs shows, walking from the root directory.
fn lib_view(fs: &Filesystem) -> View {
    let mut v = View::default();
    let mut todo = vec![fs.root()];
    while let Some(dir) = todo.pop() {
        let mut es = BTreeMap::new();
        for e in fs.read_dir(dir, 0).unwrap() {
            es.insert(e.name.clone(), e.id.ino);
            match e.kind {
                FileKind::Dir => todo.push(e.id),
                k => {
                    if k == FileKind::Symlink {
                        v.symlinks.insert(e.id.ino);
                    }
                    v.content
                        .entry(e.id.ino)
                        .or_insert_with(|| fs.read_all(e.id).unwrap());
                }
            }
        }
        v.dirs.insert(dir.ino, es);
    }
    v
}

/// What the kernel shows under `root`.
fn kernel_view(root: &Path) -> View {
    let mut v = View::default();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let ino = std::fs::symlink_metadata(&dir).unwrap().ino();
        let mut es = BTreeMap::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            es.insert(e.file_name().as_bytes().to_vec(), md.ino());
            if md.is_dir() {
                todo.push(e.path());
            } else if md.is_symlink() {
                v.symlinks.insert(md.ino());
                let to = std::fs::read_link(e.path()).unwrap();
                v.content
                    .entry(md.ino())
                    .or_insert_with(|| to.as_os_str().as_bytes().to_vec());
            } else {
                v.content
                    .entry(md.ino())
                    .or_insert_with(|| std::fs::read(e.path()).unwrap());
            }
        }
        v.dirs.insert(ino, es);
    }
    v
}

/// What must hold at a cut: the fsync'd things, each with the index of
/// the view it was fsync'd in.
#[derive(Clone, Default)]
struct Due {
    /// Files whose names and content were fsync'd.
    files: BTreeMap<u64, usize>,
    /// Directories whose entries were fsync'd.
    dirs: BTreeMap<u64, usize>,
}

/// Check view `got` (from `who`) against the history of views and what
/// was due.
fn judge(who: &str, history: &[View], due: &Due, got: &View) {
    for (&ino, &s) in &due.files {
        let later = &history[s..];
        // Each name, as at the fsync or later.
        let mut pairs: BTreeSet<(u64, Vec<u8>)> = got.names(ino);
        for h in later {
            pairs.extend(h.names(ino));
        }
        let have = got.names(ino);
        for p in &pairs {
            let now = have.contains(p);
            assert!(
                later.iter().any(|h| h.names(ino).contains(p) == now),
                "{who}: file {ino}: name {:?} in dir {} is {} but was not since its fsync",
                String::from_utf8_lossy(&p.1),
                p.0,
                if now { "there" } else { "gone" }
            );
        }
        if let Some(c) = got.content.get(&ino) {
            assert!(
                later.iter().any(|h| h.content.get(&ino) == Some(c)),
                "{who}: file {ino} has content (size {}) it did not have since its fsync",
                c.len()
            );
        } else {
            assert!(
                later.iter().any(|h| h.names(ino).is_empty()),
                "{who}: fsync'd file {ino} is gone"
            );
        }
    }
    for (&dir, &s) in &due.dirs {
        let later = &history[s..];
        let Some(es) = got.dirs.get(&dir) else {
            assert!(
                later.iter().any(|h| !h.dirs.contains_key(&dir)),
                "{who}: fsync'd directory {dir} is gone"
            );
            continue;
        };
        let mut names: BTreeSet<&Vec<u8>> = es.keys().collect();
        for h in later {
            if let Some(e) = h.dirs.get(&dir) {
                names.extend(e.keys());
            }
        }
        for n in names {
            let now = es.get(n);
            assert!(
                later
                    .iter()
                    .any(|h| h.dirs.get(&dir).map(|e| e.get(n)) == Some(now)),
                "{who}: directory {dir}: entry {:?} is {now:?}, which it was not since its fsync",
                String::from_utf8_lossy(n)
            );
        }
    }
}

/// The entries that differ between two views.
fn diff(a: &View, b: &View) -> Vec<String> {
    let mut out = Vec::new();
    let dirs: BTreeSet<&u64> = a.dirs.keys().chain(b.dirs.keys()).collect();
    for d in dirs {
        let (x, y) = (a.dirs.get(d), b.dirs.get(d));
        let names: BTreeSet<&Vec<u8>> = x.iter().chain(y.iter()).flat_map(|e| e.keys()).collect();
        for n in names {
            let (p, q) = (x.and_then(|e| e.get(n)), y.and_then(|e| e.get(n)));
            if p != q {
                out.push(format!(
                    "{d}/{}: {p:?} -> {q:?}",
                    String::from_utf8_lossy(n)
                ));
            }
        }
    }
    for (f, c) in &b.content {
        if a.content.get(f).is_some_and(|o| o != c) {
            out.push(format!("{f}: content"));
        }
    }
    out
}

/// Counts of fsyncs by kind: (logged, committed).
#[derive(Default, Debug)]
struct Tally {
    after_rename: (usize, usize),
    dirs: (usize, usize),
    files: (usize, usize),
}

fn names_survive(name: &str, mkfs_args: &[&str], seed: u64) {
    // `UBTRFS_SEED` runs another sequence.
    let chosen = std::env::var("UBTRFS_SEED").ok();
    let mut seed = match &chosen {
        Some(v) => v
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("UBTRFS_SEED={v:?} is not a number"))
            .max(1),
        None => seed,
    };
    eprintln!("{name}: seed {seed} (UBTRFS_SEED)");
    let t = testkit::TestDir::new(name).unwrap();
    let img = t.path().join("base.img");
    testkit::mkfs_file(&img, 256 << 20, mkfs_args).unwrap();
    // Three directories and eight files (two with a second name), committed.
    {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let dirs: Vec<InodeId> = (0..3)
            .map(|i| {
                fs.mkdir(fs.root(), format!("d{i}").as_bytes(), 0o755, 0, 0)
                    .unwrap()
                    .id
            })
            .collect();
        for i in 0..8u64 {
            let d = dirs[(i % 3) as usize];
            let f = fs.create(d, format!("f{i}").as_bytes(), FILE).unwrap().id;
            let len = (rng(&mut seed) % 20_000) as usize;
            fs.write(f, 0, &testkit::xorshift_bytes(seed, len)).unwrap();
            if i % 4 == 0 {
                fs.link(f, dirs[((i + 1) % 3) as usize], format!("h{i}").as_bytes())
                    .unwrap();
            }
        }
        fs.commit().unwrap();
    }
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(Arc::new(MemDevice::new(
        &img,
        base.clone(),
    ))));
    let set = DeviceSet::from_devices(vec![rec.clone() as Arc<dyn Device>]).unwrap();
    let fs = Filesystem::open_devices_read_write(set).unwrap();

    let mut history = vec![lib_view(&fs)];
    let mut due = Due::default();
    // (ops in the device log when an fsync returned, what was due then)
    let mut marks: Vec<(usize, Due)> = vec![(0, Due::default())];
    let mut tally = Tally::default();
    let mut renamed_since_fsync: BTreeSet<u64> = BTreeSet::new();
    // The directories the last commit has.
    let mut committed_dirs: BTreeSet<u64> = history[0].dirs.keys().copied().collect();
    let mut fresh = 0u64;
    for step in 0..90 {
        let v = history.last().unwrap().clone();
        let dirs: Vec<u64> = v.dirs.keys().copied().collect();
        let files: Vec<u64> = v
            .content
            .keys()
            .filter(|f| !v.symlinks.contains(f))
            .copied()
            .collect();
        let id = |ino: u64| InodeId {
            subvol: fs.root().subvol,
            ino,
        };
        let pick = |seed: &mut u64, v: &[u64]| v[(rng(seed) % v.len() as u64) as usize];
        // A (directory, name) pair naming a file, if any.
        let file_names: Vec<(u64, Vec<u8>, u64)> = v
            .dirs
            .iter()
            .flat_map(|(d, es)| {
                es.iter()
                    .filter(|(_, t)| v.content.contains_key(t))
                    .map(|(n, t)| (*d, n.clone(), *t))
            })
            .collect();
        fresh += 1;
        let new_name = format!("n{fresh}").into_bytes();
        let mut fsync: Option<u64> = None;
        let op = rng(&mut seed) % 16;
        match op {
            0 | 1 => {
                // A new file, written, maybe fsync'd.
                let d = pick(&mut seed, &dirs);
                let f = fs.create(id(d), &new_name, FILE).unwrap().id;
                let len = (rng(&mut seed) % 30_000) as usize;
                fs.write(f, 0, &testkit::xorshift_bytes(seed, len)).unwrap();
                if rng(&mut seed).is_multiple_of(2) {
                    fsync = Some(f.ino);
                }
            }
            2..=5 if !file_names.is_empty() => {
                // Rename in the same directory (2, 3) or into another
                // (4, 5), maybe over another file.
                let (d, n, t) =
                    file_names[(rng(&mut seed) % file_names.len() as u64) as usize].clone();
                let same_dir = op < 4;
                let d2 = if same_dir { d } else { pick(&mut seed, &dirs) };
                let over: Vec<&(u64, Vec<u8>, u64)> = file_names
                    .iter()
                    .filter(|(dd, _, tt)| *dd == d2 && *tt != t)
                    .collect();
                let to = if !over.is_empty() && rng(&mut seed).is_multiple_of(2) {
                    over[(rng(&mut seed) % over.len() as u64) as usize]
                        .1
                        .clone()
                } else {
                    new_name.clone()
                };
                fs.rename(id(d), &n, id(d2), &to, 0).unwrap();
                renamed_since_fsync.insert(t);
                if same_dir || rng(&mut seed).is_multiple_of(2) {
                    fsync = Some(t);
                }
            }
            6 if !file_names.is_empty() => {
                let (d, n, _) =
                    file_names[(rng(&mut seed) % file_names.len() as u64) as usize].clone();
                fs.unlink(id(d), &n).unwrap();
            }
            7 if !files.is_empty() => {
                let f = pick(&mut seed, &files);
                let d = pick(&mut seed, &dirs);
                fs.link(id(f), id(d), &new_name).unwrap();
                if rng(&mut seed).is_multiple_of(2) {
                    fsync = Some(f);
                }
            }
            13 => {
                // A symlink: logged with its target as a directory's new
                // entry.
                let d = pick(&mut seed, &dirs);
                let to = format!("target-{}", rng(&mut seed) % 1000);
                fs.symlink(id(d), &new_name, to.as_bytes(), 0, 0).unwrap();
            }
            8 if dirs.len() < 8 => {
                let d = pick(&mut seed, &dirs);
                fs.mkdir(id(d), &new_name, 0o755, 0, 0).unwrap();
            }
            9 => {
                // Move a directory (not the root, not into itself).
                let movable: Vec<(u64, Vec<u8>, u64)> = v
                    .dirs
                    .iter()
                    .flat_map(|(d, es)| {
                        es.iter()
                            .filter(|(_, t)| v.dirs.contains_key(t))
                            .map(|(n, t)| (*d, n.clone(), *t))
                    })
                    .collect();
                let d2 = pick(&mut seed, &dirs);
                if let Some((d, n, t)) = movable.get((rng(&mut seed) % 4) as usize).cloned() {
                    // Not under itself: d2's ancestors must not include t.
                    let mut up = d2;
                    let mut inside = false;
                    while up != fs.root().ino {
                        if up == t {
                            inside = true;
                            break;
                        }
                        up = *v
                            .dirs
                            .iter()
                            .find(|(_, es)| es.values().any(|&x| x == up))
                            .unwrap()
                            .0;
                    }
                    if !inside {
                        fs.rename(id(d), &n, id(d2), &new_name, 0).unwrap();
                    }
                }
            }
            10..=12 if !files.is_empty() => {
                let f = pick(&mut seed, &files);
                let size = fs.stat(id(f)).unwrap().size;
                let off = rng(&mut seed) % (size + 1);
                let len = (rng(&mut seed) % 20_000 + 1) as usize;
                fs.write(id(f), off, &vec![(step % 250) as u8 + 1; len])
                    .unwrap();
                if rng(&mut seed).is_multiple_of(2) {
                    fsync = Some(f);
                }
            }
            _ => {
                // An fsync of a directory.
                fsync = Some(pick(&mut seed, &dirs));
            }
        }
        let now = lib_view(&fs);
        // Shown when the test fails: what each step did.
        eprintln!(
            "step {step} (view {}): {:?} fsync {fsync:?}",
            history.len(),
            diff(history.last().unwrap(), &now)
        );
        history.push(now.clone());
        // An fsync of a symlink commits (as the kernel's does).
        let Some(target) = fsync.filter(|t| !now.symlinks.contains(t)) else {
            continue;
        };
        let is_dir = now.dirs.contains_key(&target);
        let before = rec.log().len();
        let how = fs.fsync(id(target), false).unwrap();
        let log = rec.log();
        let new = &log[before..];
        let flushes = new.iter().filter(|o| **o == Op::Flush).count();
        let counter = if is_dir {
            &mut tally.dirs
        } else if renamed_since_fsync.contains(&target) {
            &mut tally.after_rename
        } else {
            &mut tally.files
        };
        let at = history.len() - 1;
        match how {
            Synced::Logged => {
                counter.0 += 1;
                assert_eq!(
                    flushes, 1,
                    "{name}: step {step}: a logged fsync flushes once"
                );
            }
            Synced::Committed => {
                counter.1 += 1;
                // Everything is durable as it is.
                for f in now.content.keys() {
                    due.files.insert(*f, at);
                }
                for d in now.dirs.keys() {
                    due.dirs.insert(*d, at);
                }
                committed_dirs = now.dirs.keys().copied().collect();
            }
            Synced::Nothing => {}
        }
        if is_dir {
            // The directory, and the new ones below it.
            let mut walk = vec![target];
            while let Some(d) = walk.pop() {
                due.dirs.insert(d, at);
                walk.extend(
                    now.dirs[&d]
                        .values()
                        .filter(|t| now.dirs.contains_key(t) && !committed_dirs.contains(t)),
                );
            }
        } else {
            due.files.insert(target, at);
            renamed_since_fsync.remove(&target);
        }
        eprintln!("  -> {how:?}, mark {} at op {}", marks.len(), log.len());
        marks.push((log.len(), due.clone()));
    }
    eprintln!("{name}: {tally:?}");
    let log = rec.log();
    drop(fs);
    let cuts: Vec<(usize, &Due)> = cut_points(&log)
        .into_iter()
        .map(|c| (c, &marks.iter().rev().find(|(at, _)| *at <= c).unwrap().1))
        .collect();
    let work = t.path().join("cut.img");
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    for (n, &(cut, due)) in cuts.iter().enumerate() {
        eprintln!("cut {n} at op {cut}");
        let mut image = base.clone();
        replay(&mut image, &log[..cut]);
        std::fs::write(&work, &image).unwrap();
        testkit::btrfs_check_file(&work, &[])
            .unwrap_or_else(|e| panic!("{name}: cut {n}: btrfs check of the cut: {e}"));
        {
            let fs = Filesystem::open(&[&work]).unwrap();
            judge(
                &format!("{name}: cut {n}: ubtrfs"),
                &history,
                due,
                &lib_view(&fs),
            );
        }
        {
            let m = testkit::Mount::single(&work, &mnt, "").unwrap();
            let got = kernel_view(m.path());
            m.unmount().unwrap();
            judge(&format!("{name}: cut {n}: the kernel"), &history, due, &got);
        }
        testkit::btrfs_check_file(&work, &[]).unwrap_or_else(|e| {
            panic!("{name}: cut {n}: btrfs check after the kernel's replay: {e}")
        });
    }
    // Renames and directories are logged, not committed, nearly always.
    // Asserted on the fixed sequences: on a few dozen fsyncs of another
    // one, moved directories (which commit) may weigh more.
    if chosen.is_none() {
        for (what, (logged, committed)) in [
            ("after a rename", tally.after_rename),
            ("of a directory", tally.dirs),
        ] {
            assert!(
                logged > 0 && committed * 5 <= logged,
                "{name}: fsyncs {what}: {logged} logged, {committed} committed"
            );
        }
    }
}

#[test]
fn names_survive_16k() {
    testkit::require_privileged!();
    names_survive("log-names-16k", &[], 0x4a3e_5101);
}

/// Small nodes: directories and the log span several leaves.
#[test]
fn names_survive_4k() {
    testkit::require_privileged!();
    names_survive("log-names-4k", &["-n", "4096"], 0x7733_0a0b);
}

#[test]
fn names_survive_without_no_holes() {
    testkit::require_privileged!();
    names_survive("log-names-holes", &["-O", "^no-holes"], 0x1d_e5c0);
}

//! Many threads at once through the FUSE mount.
//!
//! 16 threads run for a while (150 s; `UBTRFS_CONCURRENCY_SECS` changes
//! it) on one `ubtrfs mount` (8 serving threads, a commit every 2 s),
//! each with its own seeded random sequence:
//!
//! - in its private directory and, under names with its own prefix, in 4
//!   shared directories: create, overwrite, write at offsets, truncate,
//!   rename (over its own files too, directories included), unlink,
//!   mkdir, rmdir, xattrs, fsync; every result, every read, every
//!   listing of its own names is checked against the thread's model at
//!   once;
//! - genuine races on shared names, whose outcome is checked for
//!   consistency: 8 tokens taken by renaming them away and given back with
//!   `RENAME_NOREPLACE` (exactly one taker at a time; each taker increments
//!   the counter inside, so the final counter is the number of takes);
//!   `O_EXCL` creates of the same names (exactly one winner each); appends
//!   with `O_APPEND` to one log (every record intact, the size their sum);
//!   writes to disjoint, unaligned regions of one file; publishing by
//!   rename over one name while others unlink it (never a torn file).
//!
//! A watchdog fails the test, printing what every thread is doing and the
//! stacks of the mount's threads, if a call takes more than 60 s or no
//! thread makes progress for 60 s. At the end every file is what the
//! models say; then a clean unmount, `btrfs check --readonly`, and the
//! kernel's mount must show the same, exactly as ubtrfs showed it.
//!
//! `UBTRFS_SEED` changes the seeds; `UBTRFS_CONCURRENCY_MOUNT_ARGS` adds
//! mount arguments (`-o compress=zstd`, say). Needs root, loop devices, the btrfs
//! module, btrfs-progs and fuse3.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::fuse_mount::UbtrfsMount;
use testkit::snapshot::{Kind, Snapshot, diff_same_filesystem};
use testkit::{Mount, Rng, TestDir, run};

const THREADS: usize = 16;
const SHARED_DIRS: usize = 4;
const TOKENS: usize = 8;
/// Bytes of the shared file each thread owns (prime: regions share sectors).
const REGION: usize = 30_011;
/// A thread keeps its own files below this much data.
const THREAD_DATA_MAX: usize = 3 << 20;
/// The watchdog fires after this long without progress.
const STALL: Duration = Duration::from_secs(60);
const IMAGE_SIZE: u64 = 2 << 30;

fn secs() -> u64 {
    std::env::var("UBTRFS_CONCURRENCY_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150)
}

fn seed() -> u64 {
    std::env::var("UBTRFS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Deterministic bytes.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = r.bytes(len);
    // Some zeros, so zero runs and holes-in-waiting are written too.
    if len > 64 && seed.is_multiple_of(5) {
        let at = r.below(len);
        let n = r.below(len - at);
        v[at..at + n].fill(0);
    }
    v
}

fn fnv(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    let (a, b) = (
        CString::new(from.as_os_str().as_bytes()).unwrap(),
        CString::new(to.as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: valid paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

// ---------------------------------------------------------------------
// Shared state: progress, the watchdog, failures

/// What one worker is doing, for the watchdog.
struct Status {
    what: Mutex<(String, Instant)>,
    done: AtomicU64,
}

struct Shared {
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    status: Vec<Status>,
}

impl Shared {
    fn fail(&self, msg: String) {
        self.failures.lock().unwrap().push(msg);
        self.stop.store(true, Ordering::SeqCst);
    }

    fn report(&self) -> String {
        let mut s = String::new();
        for (i, st) in self.status.iter().enumerate() {
            let (what, since) = &*st.what.lock().unwrap();
            s.push_str(&format!(
                "  thread {i:2}: {} calls done; for {:.1?}: {what}\n",
                st.done.load(Ordering::Relaxed),
                since.elapsed()
            ));
        }
        s
    }
}

/// Stacks of every thread of process `pid`: the kernel's and, if gdb is
/// there, the user-space ones.
fn stacks(pid: u32) -> String {
    let mut out = String::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let stack = fs::read_to_string(t.path().join("stack")).unwrap_or_default();
            let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            out.push_str(&format!(
                "task {} ({}):\n{stack}",
                t.file_name().to_string_lossy(),
                comm.trim()
            ));
        }
    }
    if testkit::which("gdb").is_some()
        && let Ok(o) = testkit::command("timeout")
            .args([
                "-k",
                "5",
                "30",
                "gdb",
                "-p",
                &pid.to_string(),
                "-batch",
                "-ex",
                "thread apply all bt",
            ])
            .stdin(std::process::Stdio::null())
            .output()
    {
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    out
}

// ---------------------------------------------------------------------
// A worker

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File {
        data: Vec<u8>,
        xattr: Option<Vec<u8>>,
    },
}

/// What a worker leaves behind, for the final check.
#[derive(Default)]
struct Outcome {
    /// Its own paths (relative to the mount) and what they hold.
    tree: BTreeMap<String, Node>,
    token_takes: [u64; TOKENS],
    excl_wins: BTreeSet<u64>,
    appended: u32,
    appended_bytes: u64,
    region: Vec<u8>,
    published: BTreeSet<u64>,
    calls: u64,
}

struct Worker {
    id: usize,
    mnt: PathBuf,
    rng: Rng,
    shared: Arc<Shared>,
    out: Outcome,
    held: Option<usize>,
    excl_next: u64,
    publish_seq: u64,
    log: Vec<String>,
}

/// The content of token `j` after its `count`th take, by `holder`.
fn token_content(j: usize, count: u64, holder: usize) -> Vec<u8> {
    let mut v = format!("{count} {holder}\n").into_bytes();
    // Sometimes large enough for a regular extent.
    let fill = if count.is_multiple_of(3) { 6000 } else { 40 };
    v.extend(pattern((j as u64) << 32 | count, fill));
    v
}

/// Parse a token: (count, holder) if the whole content is consistent.
fn parse_token(j: usize, d: &[u8]) -> Option<(u64, usize)> {
    let nl = d.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&d[..nl]).ok()?;
    let (c, h) = line.split_once(' ')?;
    let (c, h): (u64, usize) = (c.parse().ok()?, h.parse().ok()?);
    (token_content(j, c, h) == d && h < THREADS).then_some((c, h))
}

fn publish_content(thread: usize, seq: u64) -> Vec<u8> {
    let mut v = format!("pub {thread} {seq}\n").into_bytes();
    let fill = [10, 3000, 20_000][(seq % 3) as usize];
    v.extend(pattern(((thread as u64) << 40) | seq | 1 << 63, fill));
    v
}

fn parse_publish(d: &[u8]) -> Option<(usize, u64)> {
    let nl = d.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&d[..nl]).ok()?;
    let mut w = line.split(' ');
    if w.next()? != "pub" {
        return None;
    }
    let (t, s): (usize, u64) = (w.next()?.parse().ok()?, w.next()?.parse().ok()?);
    (t < THREADS && publish_content(t, s) == d).then_some((t, s))
}

const REC_MAGIC: &[u8; 4] = b"REC!";

fn record(thread: usize, seq: u32, len: usize) -> Vec<u8> {
    let payload = pattern(((thread as u64) << 32) | u64::from(seq), len);
    let mut v = Vec::with_capacity(len + 22);
    v.extend_from_slice(REC_MAGIC);
    v.extend_from_slice(&(thread as u16).to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend_from_slice(&payload);
    v.extend_from_slice(&fnv(&payload).to_le_bytes());
    v
}

type Step = Result<(), String>;

impl Worker {
    fn private(&self) -> String {
        format!("p{}", self.id)
    }

    /// Tell the watchdog what comes next.
    fn doing(&mut self, what: String) {
        *self.shared.status[self.id].what.lock().unwrap() = (what.clone(), Instant::now());
        self.log.push(what);
        if self.log.len() > 20_000 {
            self.log.drain(..10_000);
        }
    }

    fn done(&mut self) {
        self.out.calls += 1;
        self.shared.status[self.id]
            .done
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A call whose result is checked by `check`.
    fn call<T>(
        &mut self,
        what: String,
        f: impl FnOnce(&Path) -> std::io::Result<T>,
    ) -> Result<std::io::Result<T>, String> {
        self.doing(what);
        let mnt = self.mnt.clone();
        let r = f(&mnt);
        self.done();
        Ok(r)
    }

    fn expect_ok<T>(
        &mut self,
        what: String,
        f: impl FnOnce(&Path) -> std::io::Result<T>,
    ) -> Result<T, String> {
        let w = what.clone();
        self.call(what, f)?.map_err(|e| format!("{w}: {e}"))
    }

    fn expect_err<T: std::fmt::Debug>(
        &mut self,
        what: String,
        errno: i32,
        f: impl FnOnce(&Path) -> std::io::Result<T>,
    ) -> Step {
        let w = what.clone();
        match self.call(what, f)? {
            Err(e) if errno_of(&e) == errno => Ok(()),
            r => Err(format!(
                "{w}: expected {}, got {r:?}",
                std::io::Error::from_raw_os_error(errno)
            )),
        }
    }

    fn data_bytes(&self) -> usize {
        self.out
            .tree
            .values()
            .map(|n| match n {
                Node::File { data, .. } => data.len(),
                Node::Dir => 0,
            })
            .sum()
    }

    fn dirs(&self) -> Vec<String> {
        let mut v = vec![self.private()];
        v.extend(
            self.out
                .tree
                .iter()
                .filter(|(_, n)| **n == Node::Dir)
                .map(|(p, _)| p.clone()),
        );
        v
    }

    fn files(&self) -> Vec<String> {
        self.out
            .tree
            .iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// A path for a file of this thread: in one of its directories, or in
    /// a shared one with its prefix.
    fn file_path(&mut self) -> String {
        let name = format!("f{}", self.rng.below(6));
        if self.rng.chance(1, 3) {
            format!(
                "shared/s{}/t{}-{name}",
                self.rng.below(SHARED_DIRS),
                self.id
            )
        } else {
            let dirs = self.dirs();
            format!("{}/{name}", self.rng.pick(&dirs))
        }
    }

    fn data(&mut self) -> Vec<u8> {
        let len = match self.rng.below(10) {
            0..=3 => self.rng.below(2000),
            4..=7 => self.rng.below(64 << 10),
            _ => self.rng.below(300 << 10),
        };
        pattern(self.rng.next_u64(), len)
    }

    fn file_of(&self, p: &str) -> Option<&Vec<u8>> {
        match self.out.tree.get(p) {
            Some(Node::File { data, .. }) => Some(data),
            _ => None,
        }
    }

    fn under(p: &str, dir: &str) -> bool {
        p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/'
    }

    // --- its own namespace -------------------------------------------

    fn own(&mut self) -> Step {
        let files = self.files();
        let heavy = self.data_bytes() > THREAD_DATA_MAX;
        match self.rng.below(if heavy { 6 } else { 24 }) {
            // Remove a file (or find one missing).
            0..=1 => {
                let p = self.file_path();
                if self.file_of(&p).is_some() {
                    self.expect_ok(format!("unlink {p}"), |m: &Path| {
                        fs::remove_file(m.join(&p))
                    })?;
                    self.out.tree.remove(&p);
                } else if !self.out.tree.contains_key(&p) {
                    self.expect_err(format!("unlink missing {p}"), libc::ENOENT, |m: &Path| {
                        fs::remove_file(m.join(&p))
                    })?;
                }
            }
            // Truncate shorter (or longer).
            2..=3 if !files.is_empty() => {
                let p = self.rng.pick(&files).clone();
                let mut d = self.file_of(&p).unwrap().clone();
                let len = if heavy {
                    self.rng.below(d.len() / 2 + 1)
                } else {
                    self.rng.below(d.len() * 2 + 5000)
                };
                self.expect_ok(format!("truncate {p} to {len}"), |m: &Path| {
                    OpenOptions::new()
                        .write(true)
                        .open(m.join(&p))?
                        .set_len(len as u64)
                })?;
                d.resize(len, 0);
                self.set_data(&p, d);
            }
            // Read a file back and compare.
            4..=5 if !files.is_empty() => {
                let p = self.rng.pick(&files).clone();
                let got = self.expect_ok(format!("read {p}"), |m: &Path| fs::read(m.join(&p)))?;
                let want = self.file_of(&p).unwrap();
                if &got != want {
                    return Err(format!(
                        "read {p}: {} bytes, expected {} (first difference at {:?})",
                        got.len(),
                        want.len(),
                        got.iter().zip(want).position(|(a, b)| a != b)
                    ));
                }
            }
            // Create or overwrite a whole file.
            6..=9 => {
                let p = self.file_path();
                if self.out.tree.get(&p) == Some(&Node::Dir) {
                    return Ok(());
                }
                let d = self.data();
                self.expect_ok(format!("write {p} ({} bytes)", d.len()), |m: &Path| {
                    fs::write(m.join(&p), &d)
                })?;
                self.set_data(&p, d);
            }
            // O_EXCL on its own names.
            10 => {
                let p = self.file_path();
                let open = |m: &Path| {
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(m.join(&p))
                };
                if self.out.tree.contains_key(&p) {
                    self.expect_err(format!("create exclusive existing {p}"), libc::EEXIST, open)?;
                } else {
                    self.expect_ok(format!("create exclusive {p}"), open)?;
                    self.out.tree.insert(
                        p,
                        Node::File {
                            data: Vec::new(),
                            xattr: None,
                        },
                    );
                }
            }
            // Write at an offset (maybe past the end).
            11..=13 if !files.is_empty() => {
                let p = self.rng.pick(&files).clone();
                let mut d = self.file_of(&p).unwrap().clone();
                let at = self.rng.below(d.len() + 10_000);
                let add = self.data();
                self.expect_ok(
                    format!("pwrite {p} at {at} ({} bytes)", add.len()),
                    |m: &Path| {
                        OpenOptions::new()
                            .write(true)
                            .open(m.join(&p))?
                            .write_all_at(&add, at as u64)
                    },
                )?;
                // Writing nothing extends nothing.
                if !add.is_empty() {
                    if d.len() < at + add.len() {
                        d.resize(at + add.len(), 0);
                    }
                    d[at..at + add.len()].copy_from_slice(&add);
                }
                self.set_data(&p, d);
            }
            // Rename a file over one of its own names or to a new one.
            14..=16 if !files.is_empty() => {
                let from = self.rng.pick(&files).clone();
                let to = self.file_path();
                if to == from || self.out.tree.get(&to) == Some(&Node::Dir) {
                    return Ok(());
                }
                self.expect_ok(format!("rename {from} to {to}"), |m: &Path| {
                    fs::rename(m.join(&from), m.join(&to))
                })?;
                let n = self.out.tree.remove(&from).unwrap();
                self.out.tree.insert(to, n);
            }
            // Make a directory in its private tree.
            17 => {
                let parent = self.rng.pick(&self.dirs()).clone();
                if parent.matches('/').count() >= 2 {
                    return Ok(());
                }
                let p = format!("{parent}/d{}", self.rng.below(3));
                if self.out.tree.contains_key(&p) {
                    return self.expect_err(
                        format!("mkdir existing {p}"),
                        libc::EEXIST,
                        |m: &Path| fs::create_dir(m.join(&p)),
                    );
                }
                self.expect_ok(format!("mkdir {p}"), |m: &Path| fs::create_dir(m.join(&p)))?;
                self.out.tree.insert(p, Node::Dir);
            }
            // Remove a directory: empty, or refused.
            18 => {
                let dirs = self.dirs();
                if dirs.len() < 2 {
                    return Ok(());
                }
                let d = self.rng.pick(&dirs[1..]).clone();
                if self.out.tree.keys().any(|p| Self::under(p, &d)) {
                    self.expect_err(
                        format!("rmdir non-empty {d}"),
                        libc::ENOTEMPTY,
                        |m: &Path| fs::remove_dir(m.join(&d)),
                    )?;
                } else {
                    self.expect_ok(format!("rmdir {d}"), |m: &Path| fs::remove_dir(m.join(&d)))?;
                    self.out.tree.remove(&d);
                }
            }
            // Rename a directory within its private tree.
            19 => {
                let dirs = self.dirs();
                if dirs.len() < 2 {
                    return Ok(());
                }
                let d = self.rng.pick(&dirs[1..]).clone();
                let to = format!("{}/r{}", self.private(), self.rng.below(3));
                if to == d || Self::under(&to, &d) || self.out.tree.contains_key(&to) {
                    return Ok(());
                }
                self.expect_ok(format!("rename directory {d} to {to}"), |m: &Path| {
                    fs::rename(m.join(&d), m.join(&to))
                })?;
                let moved: Vec<String> = self
                    .out
                    .tree
                    .keys()
                    .filter(|p| **p == d || Self::under(p, &d))
                    .cloned()
                    .collect();
                for q in moved {
                    let n = self.out.tree.remove(&q).unwrap();
                    self.out.tree.insert(format!("{to}{}", &q[d.len()..]), n);
                }
            }
            // List a directory: its own names, exactly, once each.
            20 => {
                let shared = self.rng.chance(1, 2);
                let (dir, prefix) = if shared {
                    let k = self.rng.below(SHARED_DIRS);
                    (format!("shared/s{k}"), format!("t{}-", self.id))
                } else {
                    (self.rng.pick(&self.dirs()).clone(), String::new())
                };
                let names = self.expect_ok(format!("readdir {dir}"), |m: &Path| {
                    fs::read_dir(m.join(&dir))?
                        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                        .collect::<std::io::Result<Vec<String>>>()
                })?;
                // Others' names may change while the listing runs (a name
                // renamed over within the directory gets a new position
                // and may come twice); this thread's names stand still.
                let mine: Vec<String> = names
                    .iter()
                    .filter(|n| n.starts_with(&prefix))
                    .cloned()
                    .collect();
                let n = mine.len();
                let mine: BTreeSet<String> = mine.into_iter().collect();
                if mine.len() != n {
                    return Err(format!(
                        "readdir {dir}: one of its names listed twice: {names:?}"
                    ));
                }
                let want: BTreeSet<String> = self
                    .out
                    .tree
                    .keys()
                    .filter(|p| Self::under(p, &dir) && !p[dir.len() + 1..].contains('/'))
                    .map(|p| p[dir.len() + 1..].to_string())
                    .collect();
                if mine != want {
                    return Err(format!("readdir {dir}: {mine:?}, expected {want:?}"));
                }
            }
            // fsync a file, or fdatasync.
            21 if !files.is_empty() => {
                let p = self.rng.pick(&files).clone();
                let data_only = self.rng.chance(1, 2);
                self.expect_ok(format!("fsync {p} (data only: {data_only})"), |m: &Path| {
                    let f = File::open(m.join(&p))?;
                    if data_only {
                        f.sync_data()
                    } else {
                        f.sync_all()
                    }
                })?;
            }
            // Set an xattr, or read it back.
            22..=23 if !files.is_empty() => {
                let p = self.rng.pick(&files).clone();
                let Some(Node::File { xattr, .. }) = self.out.tree.get(&p).cloned() else {
                    unreachable!()
                };
                if self.rng.chance(1, 2) {
                    let v = pattern(self.rng.next_u64(), self.rng.below(200));
                    self.expect_ok(format!("setxattr {p}"), |m: &Path| {
                        testkit::sys::set_xattr(&m.join(&p), "user.t", &v)
                    })?;
                    if let Some(Node::File { xattr, .. }) = self.out.tree.get_mut(&p) {
                        *xattr = Some(v);
                    }
                } else {
                    let got = self
                        .call(format!("getxattr {p}"), |m: &Path| {
                            testkit::sys::get_xattr(&m.join(&p), "user.t")
                        })?
                        .map_err(|e| errno_of(&e));
                    let want = xattr.ok_or(libc::ENODATA);
                    if got != want {
                        return Err(format!("getxattr {p}: {got:?}, expected {want:?}"));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn set_data(&mut self, p: &str, d: Vec<u8>) {
        match self.out.tree.get_mut(p) {
            Some(Node::File { data, .. }) => *data = d,
            _ => {
                self.out.tree.insert(
                    p.to_string(),
                    Node::File {
                        data: d,
                        xattr: None,
                    },
                );
            }
        }
    }

    // --- races -------------------------------------------------------

    /// Take a token (rename it away), or give back the one held.
    fn token(&mut self) -> Step {
        if let Some(j) = self.held {
            return self.give_back(j);
        }
        let j = self.rng.below(TOKENS);
        let (tok, held) = (
            format!("race/token{j}"),
            format!("race/held-{}-{j}", self.id),
        );
        let r = self.call(format!("take {tok}"), |m: &Path| {
            renameat2(&m.join(&tok), &m.join(&held), libc::RENAME_NOREPLACE)
        })?;
        match r {
            Ok(()) => {}
            Err(e) if errno_of(&e) == libc::ENOENT => return Ok(()),
            Err(e) => return Err(format!("take {tok}: {e}")),
        }
        self.held = Some(j);
        let d = self.expect_ok(format!("read {held}"), |m: &Path| fs::read(m.join(&held)))?;
        let Some((count, _)) = parse_token(j, &d) else {
            return Err(format!("{held}: torn or wrong content ({} bytes)", d.len()));
        };
        let next = token_content(j, count + 1, self.id);
        self.expect_ok(format!("write {held}"), |m: &Path| {
            fs::write(m.join(&held), &next)
        })?;
        self.out.token_takes[j] += 1;
        Ok(())
    }

    fn give_back(&mut self, j: usize) -> Step {
        let (tok, held) = (
            format!("race/token{j}"),
            format!("race/held-{}-{j}", self.id),
        );
        self.expect_ok(format!("give back {tok}"), |m: &Path| {
            renameat2(&m.join(&held), &m.join(&tok), libc::RENAME_NOREPLACE)
        })?;
        self.held = None;
        Ok(())
    }

    /// Race others to create the same names exclusively.
    fn excl(&mut self) -> Step {
        let n = self.excl_next;
        self.excl_next += 1 + self.rng.below(2) as u64;
        let p = format!("race/excl/e{n}");
        let r = self.call(format!("create exclusive {p}"), |m: &Path| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.join(&p))
        })?;
        match r {
            Ok(f) => {
                let me = format!("thread {}\n", self.id);
                self.expect_ok(format!("write {p}"), |_| f.write_all_at(me.as_bytes(), 0))?;
                self.out.excl_wins.insert(n);
            }
            Err(e) if errno_of(&e) == libc::EEXIST => {
                let d = self.expect_ok(format!("read {p}"), |m: &Path| fs::read(m.join(&p)))?;
                // The winner's name, or a beginning of it while its write
                // is under way (empty before it).
                let ok = (0..THREADS).filter(|&t| t != self.id).any(|t| {
                    let full = format!("thread {t}\n").into_bytes();
                    full.starts_with(&d)
                });
                if !ok {
                    return Err(format!(
                        "{p}: unexpected content {:?}",
                        String::from_utf8_lossy(&d)
                    ));
                }
            }
            Err(e) => return Err(format!("create exclusive {p}: {e}")),
        }
        Ok(())
    }

    /// Append one record to the shared log with O_APPEND.
    fn append(&mut self) -> Step {
        // Mostly small: the log holds every record until the end.
        let len = match self.rng.below(100) {
            0..=96 => self.rng.below(1000),
            97..=98 => self.rng.below(40_000),
            _ => self.rng.below(64 << 10),
        };
        let rec = record(self.id, self.out.appended, len);
        let n = self.expect_ok(
            format!("append {} bytes to race/log", rec.len()),
            |m: &Path| {
                let f = OpenOptions::new().append(true).open(m.join("race/log"))?;
                // One write(2): the whole record at once, or the test fails.
                // SAFETY: a buffer of rec.len() bytes.
                let n = unsafe { libc::write(f.as_raw_fd(), rec.as_ptr().cast(), rec.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            },
        )?;
        if n != rec.len() {
            return Err(format!("append: short write {n} of {}", rec.len()));
        }
        self.out.appended += 1;
        self.out.appended_bytes += rec.len() as u64;
        Ok(())
    }

    /// Write into, or read back, this thread's region of the shared file.
    fn region(&mut self) -> Step {
        let base = (self.id * REGION) as u64;
        if self.rng.chance(1, 4) {
            let got = self.expect_ok("read its region of race/blocks".into(), |m: &Path| {
                let mut b = vec![0u8; REGION];
                File::open(m.join("race/blocks"))?.read_exact_at(&mut b, base)?;
                Ok(b)
            })?;
            if got != self.out.region {
                return Err(format!(
                    "race/blocks region {}: first difference at {:?}",
                    self.id,
                    got.iter().zip(&self.out.region).position(|(a, b)| a != b)
                ));
            }
            return Ok(());
        }
        let at = self.rng.below(REGION);
        let most = if self.rng.chance(1, 2) { 200 } else { REGION };
        let len = 1 + self.rng.below((REGION - at).min(most));
        let d = pattern(self.rng.next_u64(), len);
        self.expect_ok(
            format!("pwrite race/blocks at {} ({len} bytes)", base + at as u64),
            |m: &Path| {
                OpenOptions::new()
                    .write(true)
                    .open(m.join("race/blocks"))?
                    .write_all_at(&d, base + at as u64)
            },
        )?;
        self.out.region[at..at + len].copy_from_slice(&d);
        Ok(())
    }

    /// Publish by rename over `race/current`, or unlink it, or read it.
    fn publish(&mut self) -> Step {
        let cur = "race/current";
        match self.rng.below(10) {
            0..=4 => {
                let seq = self.publish_seq;
                self.publish_seq += 1;
                let tmp = format!("race/tmp-{}", self.id);
                let d = publish_content(self.id, seq);
                self.expect_ok(format!("write {tmp}"), |m: &Path| {
                    fs::write(m.join(&tmp), &d)
                })?;
                self.expect_ok(format!("rename {tmp} over {cur}"), |m: &Path| {
                    fs::rename(m.join(&tmp), m.join(cur))
                })?;
                self.out.published.insert(seq);
            }
            5 => {
                let r = self.call(format!("unlink {cur}"), |m: &Path| {
                    fs::remove_file(m.join(cur))
                })?;
                if let Err(e) = r
                    && errno_of(&e) != libc::ENOENT
                {
                    return Err(format!("unlink {cur}: {e}"));
                }
            }
            _ => {
                let r = self.call(format!("read {cur}"), |m: &Path| fs::read(m.join(cur)))?;
                match r {
                    Ok(d) if parse_publish(&d).is_some() => {}
                    Ok(d) => return Err(format!("{cur}: torn content ({} bytes)", d.len())),
                    Err(e) if errno_of(&e) == libc::ENOENT => {}
                    Err(e) => return Err(format!("read {cur}: {e}")),
                }
            }
        }
        Ok(())
    }

    fn step(&mut self) -> Step {
        match self.rng.below(100) {
            0..=54 => self.own(),
            55..=66 => self.token(),
            67..=74 => self.excl(),
            75..=82 => self.append(),
            83..=92 => self.region(),
            _ => self.publish(),
        }
    }

    fn run(mut self, deadline: Instant) -> Option<Outcome> {
        while Instant::now() < deadline && !self.shared.stop.load(Ordering::SeqCst) {
            if let Err(e) = self.step() {
                self.fail(e);
                return None;
            }
        }
        if let Some(j) = self.held
            && let Err(e) = self.give_back(j)
        {
            self.fail(e);
            return None;
        }
        self.doing("finished".into());
        Some(self.out)
    }

    fn fail(&self, e: String) {
        let all = std::env::temp_dir().join(format!("ubtrfs-concurrency-thread{}.calls", self.id));
        let _ = fs::write(&all, self.log.join("\n"));
        let tail = &self.log[self.log.len().saturating_sub(30)..];
        self.shared.fail(format!(
            "thread {}: {e}\n  its last calls (all in {}), oldest first:\n    {}",
            self.id,
            all.display(),
            tail.join("\n    ")
        ));
    }
}

// ---------------------------------------------------------------------
// The final check

/// Every entry of `s` must be what the outcomes say, and everything they
/// say must be there.
fn verify(s: &Snapshot, outs: &[Outcome]) -> Vec<String> {
    let mut errs = Vec::new();
    let mut want: BTreeMap<String, &Node> = BTreeMap::new();
    for o in outs {
        for (p, n) in &o.tree {
            want.insert(p.clone(), n);
        }
    }
    let mut fixed_dirs: BTreeSet<String> = ["", "shared", "race", "race/excl"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    fixed_dirs.extend((0..THREADS).map(|i| format!("p{i}")));
    fixed_dirs.extend((0..SHARED_DIRS).map(|k| format!("shared/s{k}")));
    let mut excl_files = BTreeMap::new();
    let mut tokens_seen = BTreeSet::new();
    for (path, e) in &s.entries {
        let p = path.to_string_lossy().into_owned();
        if fixed_dirs.contains(&p) {
            if e.kind != Kind::Dir {
                errs.push(format!("{p}: not a directory"));
            }
            continue;
        }
        if let Some(n) = want.remove(&p) {
            match n {
                Node::Dir if e.kind == Kind::Dir => {}
                Node::File { data, xattr } if e.kind == Kind::File => {
                    if &e.data != data {
                        errs.push(format!(
                            "{p}: {} bytes, expected {} (first difference at {:?})",
                            e.data.len(),
                            data.len(),
                            e.data.iter().zip(data).position(|(a, b)| a != b)
                        ));
                    }
                    let x = e.xattrs.get(b"user.t".as_slice());
                    if x != xattr.as_ref() {
                        errs.push(format!("{p}: xattr user.t {x:?}, expected {xattr:?}"));
                    }
                }
                _ => errs.push(format!("{p}: {:?}, expected {n:?}", e.kind)),
            }
            continue;
        }
        if let Some(j) = p
            .strip_prefix("race/token")
            .and_then(|j| j.parse::<usize>().ok())
        {
            let takes: u64 = outs.iter().map(|o| o.token_takes[j]).sum();
            match parse_token(j, &e.data) {
                Some((c, _)) if c == takes => {}
                got => errs.push(format!("{p}: (count, holder) {got:?}, but {takes} takes")),
            }
            tokens_seen.insert(j);
            continue;
        }
        if let Some(n) = p
            .strip_prefix("race/excl/e")
            .and_then(|n| n.parse::<u64>().ok())
        {
            excl_files.insert(n, e.data.clone());
            continue;
        }
        match p.as_str() {
            "race/log" => errs.extend(verify_log(&e.data, outs)),
            "race/blocks" => {
                for (i, o) in outs.iter().enumerate() {
                    let r = &e.data
                        [(i * REGION).min(e.data.len())..((i + 1) * REGION).min(e.data.len())];
                    if r != o.region.as_slice() {
                        errs.push(format!("race/blocks: region {i} differs"));
                    }
                }
                if e.data.len() != THREADS * REGION {
                    errs.push(format!("race/blocks: size {}", e.data.len()));
                }
            }
            "race/current" => match parse_publish(&e.data) {
                Some((t, seq)) if outs[t].published.contains(&seq) => {}
                got => errs.push(format!("race/current: {got:?} was never published")),
            },
            _ if p.starts_with("race/tmp-") => {
                // A publisher's next version, written but not yet renamed.
                let t: usize = p["race/tmp-".len()..].parse().unwrap_or(usize::MAX);
                if parse_publish(&e.data).is_none_or(|(tt, _)| tt != t) {
                    errs.push(format!("{p}: bad content"));
                }
            }
            _ => errs.push(format!("{p}: unexpected {:?}", e.kind)),
        }
    }
    for p in want.keys() {
        errs.push(format!("{p}: missing"));
    }
    if tokens_seen.len() != TOKENS {
        errs.push(format!("tokens present: {tokens_seen:?}"));
    }
    let mut wins = BTreeMap::new();
    for (t, o) in outs.iter().enumerate() {
        for n in &o.excl_wins {
            if let Some(other) = wins.insert(*n, t) {
                errs.push(format!("race/excl/e{n}: won by threads {other} and {t}"));
            }
        }
    }
    for (n, d) in &excl_files {
        let want = wins.get(n).map(|t| format!("thread {t}\n").into_bytes());
        if want.as_ref() != Some(d) {
            errs.push(format!(
                "race/excl/e{n}: {:?}, expected {want:?}",
                String::from_utf8_lossy(d)
            ));
        }
    }
    for n in wins.keys() {
        if !excl_files.contains_key(n) {
            errs.push(format!("race/excl/e{n}: missing"));
        }
    }
    errs
}

/// The log holds every thread's records, each intact, a thread's in its
/// order, nothing else.
fn verify_log(d: &[u8], outs: &[Outcome]) -> Vec<String> {
    let total: u64 = outs.iter().map(|o| o.appended_bytes).sum();
    if d.len() as u64 != total {
        return vec![format!("race/log: {} bytes, expected {total}", d.len())];
    }
    let mut next = vec![0u32; outs.len()];
    let mut at = 0;
    while at < d.len() {
        let bad = |what: &str| vec![format!("race/log: {what} at offset {at}")];
        if d.len() - at < 22 || &d[at..at + 4] != REC_MAGIC {
            return bad("no record header");
        }
        let t = u16::from_le_bytes(d[at + 4..at + 6].try_into().unwrap()) as usize;
        let seq = u32::from_le_bytes(d[at + 6..at + 10].try_into().unwrap());
        let len = u32::from_le_bytes(d[at + 10..at + 14].try_into().unwrap()) as usize;
        if t >= outs.len() || at + 22 + len > d.len() {
            return bad("a bad record header");
        }
        if seq != next[t] {
            return bad(&format!(
                "thread {t}'s record {seq} where {} was due",
                next[t]
            ));
        }
        if d[at..at + 22 + len] != record(t, seq, len) {
            return bad(&format!("thread {t}'s record {seq} damaged"));
        }
        next[t] += 1;
        at += 22 + len;
    }
    let mut errs = Vec::new();
    for (t, o) in outs.iter().enumerate() {
        if next[t] != o.appended {
            errs.push(format!(
                "race/log: {} records of thread {t}, expected {}",
                next[t], o.appended
            ));
        }
    }
    errs
}

// ---------------------------------------------------------------------

#[test]
fn sixteen_threads_at_once() {
    testkit::require_privileged!();
    let t = TestDir::new("concurrency").unwrap();
    let img = t.sparse_file("fs.img", IMAGE_SIZE).unwrap();
    run(testkit::command("mkfs.btrfs").args(["-q", "-f"]).arg(&img)).expect("mkfs.btrfs");
    let bin = Path::new(common::ubtrfs_bin());
    // More mount arguments by hand (say `-o compress=zstd`): later ones win.
    let extra = std::env::var("UBTRFS_CONCURRENCY_MOUNT_ARGS").unwrap_or_default();
    // The mount's view is compared with the kernel's, access times too:
    // reading files for it must not move them (relatime would).
    let mut args = vec!["-o", "commit=2", "-o", "noatime"];
    if !extra.contains("--threads") {
        args.extend(["--threads", "8"]);
    }
    args.extend(extra.split_whitespace());
    let mut m = UbtrfsMount::start(bin, &[&img], &t.join("fuse"), &args).expect("ubtrfs mount");
    let mnt = m.path().to_path_buf();
    for d in ["shared", "race", "race/excl"] {
        fs::create_dir(mnt.join(d)).unwrap();
    }
    for k in 0..SHARED_DIRS {
        fs::create_dir(mnt.join(format!("shared/s{k}"))).unwrap();
    }
    for i in 0..THREADS {
        fs::create_dir(mnt.join(format!("p{i}"))).unwrap();
    }
    for j in 0..TOKENS {
        fs::write(mnt.join(format!("race/token{j}")), token_content(j, 0, 0)).unwrap();
    }
    fs::write(mnt.join("race/log"), b"").unwrap();
    File::create(mnt.join("race/blocks"))
        .unwrap()
        .set_len((THREADS * REGION) as u64)
        .unwrap();

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        status: (0..THREADS)
            .map(|_| Status {
                what: Mutex::new(("starting".into(), Instant::now())),
                done: AtomicU64::new(0),
            })
            .collect(),
    });
    let duration = Duration::from_secs(secs());
    let started = Instant::now();
    let deadline = started + duration;
    let seed = seed();
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let w = Worker {
                id,
                mnt: mnt.clone(),
                rng: Rng::new(seed.wrapping_mul(1000).wrapping_add(id as u64)),
                shared: shared.clone(),
                out: Outcome {
                    region: vec![0; REGION],
                    ..Outcome::default()
                },
                held: None,
                excl_next: 0,
                publish_seq: 0,
                log: Vec::new(),
            };
            std::thread::spawn(move || w.run(deadline))
        })
        .collect();

    // The watchdog: the main thread, until every worker is done.
    let mut last_total = 0;
    let mut last_progress = Instant::now();
    let mut hung = None;
    while !workers.iter().all(|w| w.is_finished()) {
        std::thread::sleep(Duration::from_millis(500));
        let total: u64 = shared
            .status
            .iter()
            .map(|s| s.done.load(Ordering::Relaxed))
            .sum();
        if total != last_total {
            (last_total, last_progress) = (total, Instant::now());
        }
        let longest = shared
            .status
            .iter()
            .map(|s| s.what.lock().unwrap().1.elapsed())
            .zip(workers.iter().map(|w| w.is_finished()))
            .filter(|(_, done)| !done)
            .map(|(d, _)| d)
            .max()
            .unwrap_or_default();
        if hung.is_none() && (last_progress.elapsed() > STALL || longest > STALL) {
            let mut report = format!(
                "no progress: {:.0?} since the last call ended, the longest call running \
                 {longest:.0?}\n{}",
                last_progress.elapsed(),
                shared.report(),
            );
            eprintln!("{report}");
            let st = m.pid().map(stacks).unwrap_or_default();
            eprintln!("stacks of the mount (pid {:?}):\n{st}", m.pid());
            report.push_str("(the mount's stacks are printed above)\n");
            shared.fail(report.clone());
            hung = Some(report);
            // Kill the mount: every waiting call fails instead of hanging.
            m.kill();
        }
        if hung.is_some() && last_progress.elapsed() > STALL * 2 {
            panic!(
                "workers still stuck after the mount was killed:\n{}",
                shared.report()
            );
        }
    }
    let outs: Vec<Option<Outcome>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let failures = shared.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "seed {seed} (UBTRFS_SEED): {} failures, the first:\n{}\nthe mount's stderr:\n{}",
        failures.len(),
        failures[0],
        m.stderr_text()
    );
    let outs: Vec<Outcome> = outs.into_iter().map(Option::unwrap).collect();
    let calls: u64 = outs.iter().map(|o| o.calls).sum();
    eprintln!(
        "{THREADS} threads, {:.0?}: {calls} calls; token takes {:?}, exclusive wins {}, \
         {} appends ({} bytes), {} publishes",
        started.elapsed(),
        (0..TOKENS)
            .map(|j| outs.iter().map(|o| o.token_takes[j]).sum::<u64>())
            .collect::<Vec<_>>(),
        outs.iter().map(|o| o.excl_wins.len()).sum::<usize>(),
        outs.iter().map(|o| o.appended).sum::<u32>(),
        outs.iter().map(|o| o.appended_bytes).sum::<u64>(),
        outs.iter().map(|o| o.published.len()).sum::<usize>(),
    );

    let fuse_view = Snapshot::take(&mnt, &[]).expect("read the mount");
    let errs = verify(&fuse_view, &outs);
    assert!(
        errs.is_empty(),
        "seed {seed}: through the mount:\n{}",
        errs.join("\n")
    );
    m.unmount().expect("unmount");
    run(testkit::command("btrfs")
        .args(["check", "--readonly"])
        .arg(&img))
    .unwrap_or_else(|e| panic!("btrfs check: {e:#}"));
    let k = Mount::single(&img, &t.join("kernel"), "ro,noatime,nodev").expect("kernel mount");
    let kernel_view = Snapshot::take(k.path(), &[]).expect("read the kernel's mount");
    let errs = verify(&kernel_view, &outs);
    assert!(
        errs.is_empty(),
        "seed {seed}: the kernel's view:\n{}",
        errs.join("\n")
    );
    let d = diff_same_filesystem(&fuse_view, &kernel_view);
    assert!(
        d.is_empty(),
        "ubtrfs before the unmount and the kernel after differ:\n{}",
        d.join("\n")
    );
}

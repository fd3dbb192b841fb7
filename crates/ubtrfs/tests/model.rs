//! Model-based random test of the namespace and data operations.
//!
//! Seeded, reproducible sequences of operations (create, mkdir, write,
//! truncate, unlink, rmdir, rename with its flags, link, symlink, chmod,
//! chown, utimes, xattrs, fallocate) are applied to a btrfs image through
//! the library and to a plain directory on the host, the model. After
//! every operation the two must agree on success or on the class of the
//! error; every so often the whole trees are compared (names, types,
//! sizes, contents, modes, owners, xattrs, link targets, link counts).
//! The library commits at random points and is sometimes reopened from
//! the image. At the end `btrfs check` must find no error and the kernel,
//! mounting the image, must see the model's tree.
//!
//! Four main configurations (crc32c and xxhash, 4 and 16 KiB nodes,
//! no-holes on and off) run the full number of operations; shorter runs
//! (a quarter) cover sha256 and blake2, 64 KiB nodes, DUP and RAID1
//! metadata, RAID1 and RAID0 data on two devices, and images made by the
//! library's own mkfs (`ubtrfs mkfs`).
//!
//! `UBTRFS_MODEL_SEED=<n>` replays one seed on every configuration;
//! `UBTRFS_MODEL_OPS=<n>` changes the number of operations (the short
//! configurations run a quarter of it);
//! `UBTRFS_MODEL_ONLY=<label part>` runs the matching configurations only;
//! `UBTRFS_MODEL_SERIAL=1` runs them one after the other;
//! `UBTRFS_MODEL_CHECK=1` runs `btrfs check` after every commit.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::Mount;
use testkit::model::{content, cpath, io_errno, join, last_errno, rc};
use ubtrfs::data::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
use ubtrfs::format::items::Timespec;
use ubtrfs::fs::{
    FileKind, Filesystem, InodeId, NewInode, RENAME_EXCHANGE, RENAME_NOREPLACE, SetAttr,
    XATTR_CREATE, XATTR_REPLACE,
};

// ---------------------------------------------------------------------
// Scratch space

/// A directory for one run: images, the model, mount points. Its name
/// does not start with `ubtrfs-`, so sweeps of other tests' leftovers
/// leave it alone. Removed on drop unless `UBTRFS_KEEP_TEST_DIR` is set.
struct Scratch(Option<tempfile::TempDir>, PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let base = testkit::base_dir();
        fs::create_dir_all(&base).unwrap();
        let d = tempfile::Builder::new()
            .prefix(&format!("model-run-{label}-"))
            .tempdir_in(&base)
            .unwrap();
        let p = d.path().to_path_buf();
        Scratch(Some(d), p)
    }

    fn join(&self, rel: &str) -> PathBuf {
        self.1.join(rel)
    }

    fn sparse_file(&self, rel: &str, size: u64) -> std::io::Result<PathBuf> {
        let p = self.join(rel);
        fs::File::create(&p)?.set_len(size)?;
        Ok(p)
    }

    fn mkdir(&self, rel: &str) -> std::io::Result<PathBuf> {
        let p = self.join(rel);
        fs::create_dir_all(&p)?;
        Ok(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(d) = self.0.take() else { return };
        // Never delete through a mount left behind.
        testkit::unmount_below(&self.1);
        if std::env::var_os("UBTRFS_KEEP_TEST_DIR").is_some_and(|v| !v.is_empty() && v != "0") {
            eprintln!("keeping {}", d.keep().display());
        }
    }
}

// ---------------------------------------------------------------------
// Randomness

/// testkit's splitmix64, with the helpers this generator wants (which
/// accept empty ranges and slices).
struct Rng(testkit::Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(testkit::Rng::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, n)` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Uniform in `[lo, hi]`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `pct` percent.
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.below(v.len() as u64) as usize])
        }
    }
}

// ---------------------------------------------------------------------
// Operations

#[derive(Clone, Debug)]
enum Op {
    Create {
        path: String,
        mode: u32,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Write {
        path: String,
        off: u64,
        len: usize,
        seed: u64,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Unlink {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        flags: u32,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Chown {
        path: String,
        uid: u32,
        gid: u32,
    },
    Utimes {
        path: String,
        atime: (i64, u32),
        mtime: (i64, u32),
    },
    SetXattr {
        path: String,
        name: String,
        len: usize,
        seed: u64,
        flags: u32,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    Fallocate {
        path: String,
        mode: u32,
        off: u64,
        len: u64,
    },
    Commit,
    Reopen,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Long names are shown short.
        let s = format!("{self:?}");
        let re = "L".repeat(40);
        write!(
            f,
            "{}",
            s.replace(&"L".repeat(200), "L*200").replace(&re, "L*40")
        )
    }
}

/// Outcome of an operation: success or an errno.
type Outcome = Result<(), i32>;

/// The errno class compared: ENODATA (missing xattr) is ENOENT for the library.
fn class(e: i32) -> i32 {
    if e == libc::ENODATA { libc::ENOENT } else { e }
}

fn errno_name(e: i32) -> String {
    format!("{e} ({})", std::io::Error::from_raw_os_error(e))
}

fn show(o: &Outcome) -> String {
    match o {
        Ok(()) => "ok".into(),
        Err(e) => errno_name(*e),
    }
}

// ---------------------------------------------------------------------
// The host side (the model)

fn host_open(p: &Path) -> Result<fs::File, i32> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(io_errno)
}

fn host_apply(root: &Path, op: &Op) -> Outcome {
    let p = |s: &str| root.join(s);
    match op {
        Op::Create { path, mode } => OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(*mode)
            .open(p(path))
            .map(|_| ())
            .map_err(io_errno),
        Op::Mkdir { path, mode } => fs::DirBuilder::new()
            .mode(*mode)
            .create(p(path))
            .map_err(io_errno),
        Op::Write {
            path,
            off,
            len,
            seed,
        } => {
            let f = host_open(&p(path))?;
            f.write_all_at(&content(*seed, *len), *off)
                .map_err(io_errno)
        }
        Op::Truncate { path, size } => host_open(&p(path))?.set_len(*size).map_err(io_errno),
        Op::Unlink { path } => fs::remove_file(p(path)).map_err(io_errno),
        Op::Rmdir { path } => fs::remove_dir(p(path)).map_err(io_errno),
        Op::Rename { from, to, flags } => {
            let (a, b) = (cpath(&p(from)), cpath(&p(to)));
            rc(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    *flags,
                )
            })
        }
        Op::Link { from, to } => {
            let (a, b) = (cpath(&p(from)), cpath(&p(to)));
            rc(unsafe { libc::linkat(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), 0) })
        }
        Op::Symlink { target, path } => {
            let (t, l) = (CString::new(target.as_bytes()).unwrap(), cpath(&p(path)));
            rc(unsafe { libc::symlink(t.as_ptr(), l.as_ptr()) })
        }
        Op::Chmod { path, mode } => {
            let c = cpath(&p(path));
            rc(unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), *mode, 0) })
        }
        Op::Chown { path, uid, gid } => {
            let c = cpath(&p(path));
            rc(unsafe {
                libc::fchownat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    *uid,
                    *gid,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })
        }
        Op::Utimes { path, atime, mtime } => {
            let c = cpath(&p(path));
            let ts = [
                libc::timespec {
                    tv_sec: atime.0,
                    tv_nsec: atime.1 as i64,
                },
                libc::timespec {
                    tv_sec: mtime.0,
                    tv_nsec: mtime.1 as i64,
                },
            ];
            rc(unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    ts.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })
        }
        Op::SetXattr {
            path,
            name,
            len,
            seed,
            flags,
        } => {
            let (c, n) = (cpath(&p(path)), CString::new(name.as_bytes()).unwrap());
            let v = content(*seed, *len);
            rc(unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    n.as_ptr(),
                    v.as_ptr() as *const _,
                    v.len(),
                    *flags as i32,
                )
            })
        }
        Op::RemoveXattr { path, name } => {
            let (c, n) = (cpath(&p(path)), CString::new(name.as_bytes()).unwrap());
            rc(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
        }
        Op::Fallocate {
            path,
            mode,
            off,
            len,
        } => {
            let f = host_open(&p(path))?;
            rc(unsafe { libc::fallocate(f.as_raw_fd(), *mode as i32, *off as i64, *len as i64) })
        }
        Op::Commit | Op::Reopen => Ok(()),
    }
}

// ---------------------------------------------------------------------
// The library side

fn split(path: &str) -> (String, &str) {
    match path.rfind('/') {
        Some(i) => (format!("/{}", &path[..i]), &path[i + 1..]),
        None => ("/".into(), path),
    }
}

fn lib_err(e: ubtrfs::Error) -> i32 {
    e.errno()
}

fn resolve(fs: &Filesystem, path: &str) -> Result<InodeId, i32> {
    fs.resolve_path(format!("/{path}").as_bytes())
        .map_err(lib_err)
}

fn parent_and_name<'a>(fs: &Filesystem, path: &'a str) -> Result<(InodeId, &'a str), i32> {
    let (dir, name) = split(path);
    Ok((fs.resolve_path(dir.as_bytes()).map_err(lib_err)?, name))
}

fn ts(t: (i64, u32)) -> Timespec {
    Timespec {
        sec: t.0,
        nsec: t.1,
    }
}

/// Apply `op` through the library. Commit and reopen are handled by the caller.
fn lib_apply(fs: &Filesystem, op: &Op) -> Outcome {
    match op {
        Op::Create { path, mode } => {
            let (dir, name) = parent_and_name(fs, path)?;
            let new = NewInode {
                mode: libc::S_IFREG | mode,
                uid: 0,
                gid: 0,
                rdev: 0,
            };
            fs.create(dir, name.as_bytes(), new)
                .map(|_| ())
                .map_err(lib_err)
        }
        Op::Mkdir { path, mode } => {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.mkdir(dir, name.as_bytes(), *mode, 0, 0)
                .map(|_| ())
                .map_err(lib_err)
        }
        Op::Write {
            path,
            off,
            len,
            seed,
        } => {
            let id = resolve(fs, path)?;
            fs.write(id, *off, &content(*seed, *len))
                .map(|_| ())
                .map_err(lib_err)
        }
        Op::Truncate { path, size } => {
            let id = resolve(fs, path)?;
            fs.truncate(id, *size).map_err(lib_err)
        }
        Op::Unlink { path } => {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.unlink(dir, name.as_bytes()).map_err(lib_err)
        }
        Op::Rmdir { path } => {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.rmdir(dir, name.as_bytes()).map_err(lib_err)
        }
        Op::Rename { from, to, flags } => {
            let (a, an) = parent_and_name(fs, from)?;
            let (b, bn) = parent_and_name(fs, to)?;
            fs.rename(a, an.as_bytes(), b, bn.as_bytes(), *flags)
                .map_err(lib_err)
        }
        Op::Link { from, to } => {
            let id = resolve(fs, from)?;
            let (b, bn) = parent_and_name(fs, to)?;
            fs.link(id, b, bn.as_bytes()).map(|_| ()).map_err(lib_err)
        }
        Op::Symlink { target, path } => {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.symlink(dir, name.as_bytes(), target.as_bytes(), 0, 0)
                .map(|_| ())
                .map_err(lib_err)
        }
        Op::Chmod { path, mode } => {
            let id = resolve(fs, path)?;
            let a = SetAttr {
                mode: Some(*mode),
                ..Default::default()
            };
            fs.setattr(id, a).map(|_| ()).map_err(lib_err)
        }
        Op::Chown { path, uid, gid } => {
            let id = resolve(fs, path)?;
            let a = SetAttr {
                uid: Some(*uid),
                gid: Some(*gid),
                ..Default::default()
            };
            fs.setattr(id, a).map(|_| ()).map_err(lib_err)
        }
        Op::Utimes { path, atime, mtime } => {
            let id = resolve(fs, path)?;
            let a = SetAttr {
                atime: Some(ts(*atime)),
                mtime: Some(ts(*mtime)),
                ..Default::default()
            };
            fs.setattr(id, a).map(|_| ()).map_err(lib_err)
        }
        Op::SetXattr {
            path,
            name,
            len,
            seed,
            flags,
        } => {
            let id = resolve(fs, path)?;
            fs.set_xattr(id, name.as_bytes(), &content(*seed, *len), *flags)
                .map_err(lib_err)
        }
        Op::RemoveXattr { path, name } => {
            let id = resolve(fs, path)?;
            fs.remove_xattr(id, name.as_bytes()).map_err(lib_err)
        }
        Op::Fallocate {
            path,
            mode,
            off,
            len,
        } => {
            let id = resolve(fs, path)?;
            fs.fallocate(id, *mode, *off, *len).map_err(lib_err)
        }
        Op::Commit | Op::Reopen => Ok(()),
    }
}

// ---------------------------------------------------------------------
// Trees as compared

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    body: Body,
    /// Permission bits.
    perm: u32,
    uid: u32,
    gid: u32,
    /// Link count (0 for directories, whose counts differ by design).
    nlink: u64,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

type Tree = BTreeMap<String, Entry>;

fn host_xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = cpath(p);
    let mut out = BTreeMap::new();
    let mut buf = vec![0u8; 65536];
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr() as *mut _, buf.len()) };
    assert!(
        n >= 0,
        "llistxattr {}: {}",
        p.display(),
        errno_name(last_errno())
    );
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let m =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr() as *mut _, v.len()) };
        assert!(m >= 0, "lgetxattr {}", p.display());
        v.truncate(m as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

/// The tree below `root` on the host (the model, or a kernel mount).
fn host_tree(root: &Path) -> Tree {
    fn walk(root: &Path, rel: &str, out: &mut Tree) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let rel2 = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let p = root.join(&rel2);
            let md = fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let body = if ft.is_dir() {
                Body::Dir
            } else if ft.is_symlink() {
                Body::Symlink(fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec())
            } else {
                Body::File(fs::read(&p).unwrap())
            };
            out.insert(
                rel2.clone(),
                Entry {
                    perm: md.mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    nlink: if ft.is_dir() { 0 } else { md.nlink() },
                    xattrs: host_xattrs(&p),
                    body,
                },
            );
            if ft.is_dir() {
                walk(root, &rel2, out);
            }
        }
    }
    let mut out = Tree::new();
    walk(root, "", &mut out);
    out
}

/// The tree as the library shows it.
fn lib_tree(fs: &Filesystem) -> Tree {
    fn walk(fs: &Filesystem, dir: InodeId, rel: &str, out: &mut Tree) {
        for e in fs.read_dir(dir, 0).unwrap() {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let rel2 = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let st = fs.stat(e.id).unwrap();
            assert_eq!(
                st.kind, e.kind,
                "{rel2}: entry type differs from the inode's"
            );
            let body = match st.kind {
                FileKind::Dir => Body::Dir,
                FileKind::Symlink => Body::Symlink(fs.read_link(e.id).unwrap()),
                FileKind::File => {
                    let data = fs.read_all(e.id).unwrap();
                    assert_eq!(data.len() as u64, st.size, "{rel2}: short read");
                    Body::File(data)
                }
                k => panic!("{rel2}: unexpected {k:?}"),
            };
            out.insert(
                rel2.clone(),
                Entry {
                    perm: st.mode & 0o7777,
                    uid: st.uid,
                    gid: st.gid,
                    nlink: if st.kind == FileKind::Dir {
                        0
                    } else {
                        st.nlink as u64
                    },
                    xattrs: fs.xattrs(e.id).unwrap().into_iter().collect(),
                    body,
                },
            );
            if st.kind == FileKind::Dir {
                walk(fs, e.id, &rel2, out);
            }
        }
    }
    let mut out = Tree::new();
    walk(fs, fs.root(), "", &mut out);
    out
}

/// Differences between two trees, described.
fn diff_trees(want: &Tree, got: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (k, w) in want {
        match got.get(k) {
            None => out.push(format!("{k}: missing")),
            Some(g) if g != w => {
                let mut what = Vec::new();
                match (&w.body, &g.body) {
                    (Body::File(a), Body::File(b)) if a != b => {
                        let at = a.iter().zip(b).position(|(x, y)| x != y);
                        what.push(format!(
                            "content: sizes {} vs {}, first difference at {:?}",
                            a.len(),
                            b.len(),
                            at
                        ));
                    }
                    (a, b) if std::mem::discriminant(a) != std::mem::discriminant(b) => {
                        what.push(format!("type {a:?} vs {b:?}"))
                    }
                    (a, b) if a != b => what.push(format!("{a:?} vs {b:?}")),
                    _ => {}
                }
                if w.perm != g.perm {
                    what.push(format!("mode {:o} vs {:o}", w.perm, g.perm));
                }
                if (w.uid, w.gid) != (g.uid, g.gid) {
                    what.push(format!("owner {}:{} vs {}:{}", w.uid, w.gid, g.uid, g.gid));
                }
                if w.nlink != g.nlink {
                    what.push(format!("nlink {} vs {}", w.nlink, g.nlink));
                }
                if w.xattrs != g.xattrs {
                    what.push(format!(
                        "xattrs {:?} vs {:?}",
                        w.xattrs
                            .keys()
                            .map(|k| String::from_utf8_lossy(k))
                            .collect::<Vec<_>>(),
                        g.xattrs
                            .keys()
                            .map(|k| String::from_utf8_lossy(k))
                            .collect::<Vec<_>>()
                    ));
                }
                out.push(format!("{k}: {}", what.join("; ")));
            }
            _ => {}
        }
    }
    for k in got.keys() {
        if !want.contains_key(k) {
            out.push(format!("{k}: unexpected"));
        }
    }
    out
}

// ---------------------------------------------------------------------
// Generating operations

/// What the generator knows of the model: every path and its type.
#[derive(Default)]
struct Known {
    dirs: Vec<String>,
    files: Vec<(String, u64)>,
    symlinks: Vec<String>,
    total_bytes: u64,
}

impl Known {
    fn scan(root: &Path) -> Self {
        let mut k = Known {
            dirs: vec![String::new()],
            ..Default::default()
        };
        fn walk(root: &Path, rel: &str, k: &mut Known) {
            let dir = if rel.is_empty() {
                root.to_path_buf()
            } else {
                root.join(rel)
            };
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                let rel2 = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let md = fs::symlink_metadata(root.join(&rel2)).unwrap();
                if md.is_dir() {
                    k.dirs.push(rel2.clone());
                    walk(root, &rel2, k);
                } else if md.file_type().is_symlink() {
                    k.symlinks.push(rel2);
                } else {
                    k.total_bytes += md.len();
                    k.files.push((rel2, md.len()));
                }
            }
        }
        walk(root, "", &mut k);
        k
    }

    fn count(&self) -> usize {
        self.dirs.len() + self.files.len() + self.symlinks.len()
    }

    fn all(&self) -> Vec<String> {
        let mut v: Vec<String> = self.dirs.iter().skip(1).cloned().collect();
        v.extend(self.files.iter().map(|(p, _)| p.clone()));
        v.extend(self.symlinks.iter().cloned());
        v
    }
}

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k2", "m3"];

fn new_name(r: &mut Rng) -> String {
    if r.chance(12) {
        // Long names fill leaves quickly (deep trees with 4 KiB nodes).
        format!("{}{}", "L".repeat(200), r.below(6))
    } else {
        NAMES[r.below(NAMES.len() as u64) as usize].to_string()
    }
}

/// A path that may or may not exist: mostly in an existing directory.
fn some_path(r: &mut Rng, k: &Known) -> String {
    if r.chance(3) {
        // Through a missing directory or through a file.
        let base = match r.pick(&k.files) {
            Some((f, _)) if r.chance(50) => f.clone(),
            _ => "nosuchdir".to_string(),
        };
        return join(&base, &new_name(r));
    }
    let dir = r.pick(&k.dirs).cloned().unwrap_or_default();
    join(&dir, &new_name(r))
}

/// An existing path of any kind, or sometimes a made-up one.
fn existing(r: &mut Rng, k: &Known) -> String {
    let all = k.all();
    if all.is_empty() || r.chance(5) {
        return some_path(r, k);
    }
    r.pick(&all).unwrap().clone()
}

/// A regular file (sometimes a directory or a missing path, for the
/// errors; never a symlink, which open(2) would follow), with its size.
fn a_file(r: &mut Rng, k: &Known) -> (String, u64) {
    if k.files.is_empty() || r.chance(4) {
        if let Some(d) = k.dirs.get(1..).and_then(|d| r.pick(d)) {
            return (d.clone(), 0);
        }
        loop {
            let p = some_path(r, k);
            if !k.symlinks.contains(&p) {
                return (p, 0);
            }
        }
    }
    r.pick(&k.files).unwrap().clone()
}

/// A file or directory (what chmod and xattrs are tried on).
fn file_or_dir(r: &mut Rng, k: &Known) -> String {
    if r.chance(40) && k.dirs.len() > 1 {
        return r.pick(&k.dirs[1..]).unwrap().clone();
    }
    a_file(r, k).0
}

fn size_near(r: &mut Rng, size: u64) -> u64 {
    match r.below(10) {
        0 => 0,
        1..=4 => r.below(size + 1),
        5..=7 => size + r.below(60_000),
        8 => (r.below(size + 20_000) / 4096) * 4096,
        _ => r.below(300_000),
    }
}

/// Largest file the generator makes.
const FILE_MAX: u64 = 2 << 20;
/// Keep the model's data below this.
const DATA_MAX: u64 = 64 << 20;

fn gen_op(r: &mut Rng, k: &Known) -> Op {
    let crowded = k.count() > 600;
    let heavy = k.total_bytes > DATA_MAX;
    loop {
        let roll = r.below(100);
        let op = match roll {
            0..=7 if !crowded => Op::Create {
                path: some_path(r, k),
                mode: [0o644, 0o600, 0o755, 0o444][r.below(4) as usize],
            },
            8..=11 if !crowded => Op::Mkdir {
                path: some_path(r, k),
                mode: [0o755, 0o700, 0o775][r.below(3) as usize],
            },
            12..=31 if !heavy => {
                let (path, size) = a_file(r, k);
                let off = match r.below(10) {
                    0..=2 => r.below(size + 1),
                    3..=4 => size + r.below(40_000),
                    5 => (r.below(size + 8192) / 4096) * 4096,
                    6 => 0,
                    _ => r.below(size + 100_000),
                };
                let mut len = match r.below(20) {
                    0..=9 => r.range(1, 200),
                    10..=15 => r.range(200, 9000),
                    16..=18 => r.range(9000, 70_000),
                    _ => r.range(70_000, 400_000),
                } as usize;
                if off >= FILE_MAX {
                    continue;
                }
                len = len.min((FILE_MAX - off) as usize).max(1);
                Op::Write {
                    path,
                    off,
                    len,
                    seed: r.next(),
                }
            }
            32..=39 => {
                let (path, size) = a_file(r, k);
                let size = if heavy {
                    r.below(size / 2 + 1)
                } else {
                    size_near(r, size).min(FILE_MAX)
                };
                Op::Truncate { path, size }
            }
            40..=45 => {
                let path = if r.chance(80) {
                    match r.pick(&k.files) {
                        Some((f, _)) => f.clone(),
                        None => existing(r, k),
                    }
                } else {
                    existing(r, k)
                };
                Op::Unlink { path }
            }
            46..=48 => Op::Rmdir {
                path: existing(r, k),
            },
            49..=58 => {
                let from = existing(r, k);
                let to = if r.chance(40) {
                    existing(r, k)
                } else {
                    some_path(r, k)
                };
                let flags = match r.below(10) {
                    0..=5 => 0,
                    6..=7 => RENAME_NOREPLACE,
                    _ => RENAME_EXCHANGE,
                };
                Op::Rename { from, to, flags }
            }
            59..=63 if !crowded => Op::Link {
                from: existing(r, k),
                to: some_path(r, k),
            },
            64..=67 if !crowded => {
                let len = if r.chance(10) {
                    r.range(300, 1000)
                } else {
                    r.range(1, 60)
                } as usize;
                let target: String = content(r.next(), len)
                    .iter()
                    .map(|b| (b'a' + b % 26) as char)
                    .enumerate()
                    .map(|(i, c)| if i % 7 == 6 { '/' } else { c })
                    .collect();
                Op::Symlink {
                    target,
                    path: some_path(r, k),
                }
            }
            68..=70 => Op::Chmod {
                path: file_or_dir(r, k),
                mode: r.below(0o1000) as u32,
            },
            71..=72 => Op::Chown {
                path: existing(r, k),
                uid: [0, 1000, 65534][r.below(3) as usize],
                gid: [0, 100, 65534][r.below(3) as usize],
            },
            73..=74 => Op::Utimes {
                path: existing(r, k),
                atime: (
                    r.range(0, 2_000_000_000) as i64,
                    r.below(1_000_000_000) as u32,
                ),
                mtime: (
                    r.range(0, 2_000_000_000) as i64,
                    r.below(1_000_000_000) as u32,
                ),
            },
            75..=81 => Op::SetXattr {
                path: file_or_dir(r, k),
                name: format!("user.k{}", r.below(5)),
                len: if r.chance(10) {
                    0
                } else {
                    r.range(1, 150) as usize
                },
                seed: r.next(),
                flags: [0, 0, XATTR_CREATE, XATTR_REPLACE][r.below(4) as usize],
            },
            82..=84 => Op::RemoveXattr {
                path: file_or_dir(r, k),
                name: format!("user.k{}", r.below(5)),
            },
            85..=94 => {
                let (path, size) = a_file(r, k);
                let mode = [
                    0,
                    FALLOC_FL_KEEP_SIZE,
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    FALLOC_FL_ZERO_RANGE,
                    FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                ][r.below(6) as usize];
                let off = match r.below(4) {
                    0 => r.below(size + 1),
                    1 => (r.below(size + 8192) / 4096) * 4096,
                    2 => size + r.below(20_000),
                    _ => r.below(size + 40_000),
                };
                let len = if r.chance(10) {
                    r.range(40_000, 200_000)
                } else {
                    r.range(1, 40_000)
                };
                if off + len > FILE_MAX || (heavy && mode & FALLOC_FL_PUNCH_HOLE == 0) {
                    continue;
                }
                Op::Fallocate {
                    path,
                    mode,
                    off,
                    len,
                }
            }
            95..=98 => Op::Commit,
            99 => Op::Reopen,
            _ => continue,
        };
        return op;
    }
}

// ---------------------------------------------------------------------
// Running one configuration

#[derive(Clone, Copy, Debug)]
struct Config {
    label: &'static str,
    csum: &'static str,
    nodesize: u32,
    no_holes: bool,
    seed: u64,
    ops: usize,
    /// Metadata profile (`mkfs -m`); the mkfs default if empty; "mixed"
    /// for mixed block groups (`mkfs --mixed`, with `data` the same).
    meta: &'static str,
    /// Data profile (`mkfs -d`); the mkfs default if empty.
    data: &'static str,
    /// Number of image files (devices).
    devices: usize,
    /// Made by the library's mkfs (`ubtrfs mkfs`) instead of `mkfs.btrfs`.
    lib_mkfs: bool,
}

/// The fields the older configurations leave at their defaults.
const BASE: Config = Config {
    label: "",
    csum: "crc32c",
    nodesize: 16384,
    no_holes: true,
    seed: 0,
    ops: 0,
    meta: "",
    data: "",
    devices: 1,
    lib_mkfs: false,
};

fn mkfs(img: &Path, c: &Config) {
    mkfs_devices(&[img.to_path_buf()], c)
}

/// Make the filesystem of `c` on `imgs` (all its devices).
fn mkfs_devices(imgs: &[PathBuf], c: &Config) {
    if c.lib_mkfs {
        use ubtrfs::mkfs::{Features, MkfsOptions, make_filesystem_at, parse_csum, parse_profile};
        let profile = |s: &str| (!s.is_empty()).then(|| parse_profile(s).unwrap());
        let opts = MkfsOptions {
            csum_type: parse_csum(c.csum).unwrap(),
            nodesize: c.nodesize,
            metadata_profile: profile(c.meta),
            data_profile: profile(c.data),
            features: Features {
                no_holes: c.no_holes,
                ..Features::default()
            },
            force: true,
            ..MkfsOptions::default()
        };
        make_filesystem_at(imgs, &opts).unwrap_or_else(|e| panic!("ubtrfs mkfs: {e}"));
        return;
    }
    let mut cmd = Command::new("mkfs.btrfs");
    cmd.args(["-q", "-f", "--csum", c.csum, "-n", &c.nodesize.to_string()]);
    if !c.no_holes {
        cmd.args(["-O", "^no-holes"]);
    }
    if c.meta == "mixed" {
        // Data and metadata in the same block groups.
        cmd.arg("--mixed");
    } else {
        if !c.meta.is_empty() {
            cmd.args(["-m", c.meta]);
        }
        if !c.data.is_empty() {
            cmd.args(["-d", c.data]);
        }
    }
    let out = cmd.args(imgs).output().expect("mkfs.btrfs runs");
    assert!(
        out.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn btrfs_check(img: &Path) -> Result<(), String> {
    btrfs_check_devices(&[img.to_path_buf()])
}

/// `btrfs check` of the filesystem on `imgs`; several devices are attached
/// to loop devices and scanned first (testkit does that).
fn btrfs_check_devices(imgs: &[PathBuf]) -> Result<(), String> {
    let text = if imgs.len() > 1 {
        let image = testkit::Image {
            devices: imgs.to_vec(),
            source: None,
            mkfs: testkit::MkfsOptions::default(),
            mount_options: String::new(),
            builder: testkit::corpus::Builder::Kernel,
        };
        match testkit::btrfs_check(&image) {
            Ok(t) => t,
            Err(e) => return Err(format!("{e:#}")),
        }
    } else {
        let out = testkit::output_of(
            Command::new("btrfs")
                .args(["check", "--readonly"])
                .arg(&imgs[0]),
        )
        .expect("btrfs check runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(text);
        }
        text
    };
    if text.contains("ERROR") || text.contains("error(s) found") {
        return Err(text);
    }
    // ubtrfs' own check must agree with btrfs check's verdict.
    let fs =
        Filesystem::open_without_log_replay(imgs).map_err(|e| format!("open for check: {e}"))?;
    let report = fs
        .check(&mut |_| {})
        .map_err(|e| format!("ubtrfs check: {e}"))?;
    if !report.clean() {
        return Err(format!(
            "ubtrfs check, where btrfs check found nothing:\n{report}"
        ));
    }
    Ok(())
}

struct Run<'a> {
    c: &'a Config,
    imgs: Vec<PathBuf>,
    model: PathBuf,
    log: Vec<String>,
}

impl Run<'_> {
    fn fail(&self, what: &str) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(60).collect();
        let mut msg = format!(
            "[{}] seed {} (replay with UBTRFS_MODEL_SEED={}): {what}\nlast operations, newest first:\n",
            self.c.label, self.c.seed, self.c.seed
        );
        for l in tail {
            msg.push_str("  ");
            msg.push_str(l);
            msg.push('\n');
        }
        panic!("{msg}");
    }

    fn compare(&self, fs: &Filesystem, when: &str) {
        let want = host_tree(&self.model);
        let got = lib_tree(fs);
        let d = diff_trees(&want, &got);
        if !d.is_empty() {
            self.fail(&format!(
                "{when}: the library's tree differs from the model's:\n  {}",
                d.iter().take(20).cloned().collect::<Vec<_>>().join("\n  ")
            ));
        }
    }

    fn check_image(&self, when: &str) {
        if let Err(t) = btrfs_check_devices(&self.imgs) {
            let mut kept = Vec::new();
            for (i, img) in self.imgs.iter().enumerate() {
                let keep = std::env::temp_dir().join(if self.imgs.len() > 1 {
                    format!("ubtrfs-model-{}.dev{i}.img", self.c.label)
                } else {
                    format!("ubtrfs-model-{}.img", self.c.label)
                });
                let _ = fs::copy(img, &keep);
                kept.push(keep.display().to_string());
            }
            self.fail(&format!(
                "{when}: btrfs check found errors (image kept at {}):\n{t}",
                kept.join(" ")
            ));
        }
    }
}

/// Open the image read-write. A child process another thread forks may
/// hold the image's lock for a moment (until it execs): the lock of the
/// library's mkfs or of an earlier open, so a few retries.
fn open_read_write(imgs: &[PathBuf]) -> ubtrfs::Result<Filesystem> {
    let mut tries = 0;
    loop {
        match Filesystem::open_read_write(imgs) {
            Err(ubtrfs::Error::Devices(_)) if tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn run_config(c: &Config) {
    let t = Scratch::new(c.label);
    let imgs: Vec<PathBuf> = (0..c.devices)
        .map(|i| {
            let name = if c.devices > 1 {
                format!("dev{i}.img")
            } else {
                "fs.img".into()
            };
            t.sparse_file(&name, 300 << 20).unwrap()
        })
        .collect();
    mkfs_devices(&imgs, c);
    let model = t.mkdir("model").unwrap();
    let mut run = Run {
        c,
        imgs: imgs.clone(),
        model: model.clone(),
        log: Vec::new(),
    };
    let mut fs = Some(open_read_write(&imgs).expect("open read-write"));
    let mut r = Rng::new(c.seed);
    let mut known = Known::scan(&model);
    let mut counts: BTreeMap<&'static str, [u32; 2]> = BTreeMap::new();
    let check_every_commit = std::env::var("UBTRFS_MODEL_CHECK").is_ok();
    for step in 0..c.ops {
        let op = gen_op(&mut r, &known);
        run.log.push(format!("#{step} {op}"));
        let f = fs.as_ref().unwrap();
        match op {
            Op::Commit => {
                if let Err(e) = f.commit() {
                    run.fail(&format!("commit failed: {e}"));
                }
                if check_every_commit {
                    run.check_image(&format!("after the commit at step {step}"));
                }
                continue;
            }
            Op::Reopen => {
                if let Err(e) = f.commit() {
                    run.fail(&format!("commit failed: {e}"));
                }
                drop(fs.take());
                run.check_image(&format!("after step {step}"));
                fs = match open_read_write(&imgs) {
                    Ok(f) => Some(f),
                    Err(e) => run.fail(&format!("reopen failed: {e}")),
                };
                run.compare(
                    fs.as_ref().unwrap(),
                    &format!("after reopening at step {step}"),
                );
                continue;
            }
            _ => {}
        }
        let want = host_apply(&model, &op);
        let got = lib_apply(f, &op);
        let name: &'static str = match &op {
            Op::Create { .. } => "create",
            Op::Mkdir { .. } => "mkdir",
            Op::Write { .. } => "write",
            Op::Truncate { .. } => "truncate",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::Link { .. } => "link",
            Op::Symlink { .. } => "symlink",
            Op::Chmod { .. } => "chmod",
            Op::Chown { .. } => "chown",
            Op::Utimes { .. } => "utimes",
            Op::SetXattr { .. } => "setxattr",
            Op::RemoveXattr { .. } => "removexattr",
            Op::Fallocate { .. } => "fallocate",
            Op::Commit | Op::Reopen => "",
        };
        counts.entry(name).or_default()[want.is_ok() as usize] += 1;
        if want.map_err(class) != got.map_err(class) {
            run.fail(&format!(
                "step {step}: the model says {}, the library {}",
                show(&want),
                show(&got)
            ));
        }
        if let (Op::Utimes { path, atime, mtime }, Ok(())) = (&op, &want) {
            let st = f.stat(resolve(f, path).unwrap()).unwrap();
            if (st.atime, st.mtime) != (ts(*atime), ts(*mtime)) {
                run.fail(&format!("step {step}: times not set: {st:?}"));
            }
        }
        if want.is_ok() {
            known = Known::scan(&model);
        }
        if step % 250 == 249 {
            run.compare(f, &format!("after step {step}"));
        }
    }
    let f = fs.take().unwrap();
    f.commit().expect("final commit");
    run.compare(&f, "at the end");
    drop(f);
    run.check_image("at the end");
    // The kernel's view.
    let mnt = t.join("mnt");
    let m = Mount::new(&imgs, &mnt, "").expect("the kernel mounts the image");
    let got = host_tree(m.path());
    let want = host_tree(&model);
    let d = diff_trees(&want, &got);
    m.unmount().expect("unmount");
    if !d.is_empty() {
        run.fail(&format!(
            "the kernel's tree differs from the model's:\n  {}",
            d.iter().take(20).cloned().collect::<Vec<_>>().join("\n  ")
        ));
    }
    run.check_image("after the kernel mounted it");
    eprintln!(
        "[{}] seed {}: {} operations, {} entries at the end; (failed, succeeded) per op: {:?}",
        c.label,
        c.seed,
        c.ops,
        want.len(),
        counts
    );
}

fn configs() -> Vec<Config> {
    let ops = std::env::var("UBTRFS_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6000);
    let seed = std::env::var("UBTRFS_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok());
    // The main configurations: checksums, node sizes, no-holes.
    let base = [
        ("crc32c-4k-holes", "crc32c", 4096, false, 1),
        ("xxhash-16k-noholes", "xxhash", 16384, true, 2),
        ("xxhash-4k-noholes", "xxhash", 4096, true, 3),
        ("crc32c-16k-holes", "crc32c", 16384, false, 4),
    ]
    .map(|(label, csum, nodesize, no_holes, s)| Config {
        label,
        csum,
        nodesize,
        no_holes,
        seed: s,
        ops,
        ..BASE
    });
    // Shorter runs of the rest: the other checksums, 64 KiB nodes,
    // metadata and data profiles, two to four devices (RAID5/6 parity
    // rewritten under every kind of change), and images the library's
    // own mkfs made. (label, csum, nodesize, no-holes, -m, -d, devices,
    // library mkfs, seed)
    let short = ops.div_ceil(4);
    #[rustfmt::skip]
    let table = [
        ("sha256-16k-holes", "sha256", 16384, false, "", "", 1, false, 5),
        ("blake2-4k-noholes", "blake2", 4096, true, "", "", 1, false, 6),
        ("crc32c-64k-noholes", "crc32c", 65536, true, "", "", 1, false, 7),
        ("xxhash-64k-holes", "xxhash", 65536, false, "", "", 1, false, 8),
        ("crc32c-4k-dup", "crc32c", 4096, true, "dup", "single", 1, false, 9),
        ("xxhash-4k-raid1-2dev", "xxhash", 4096, true, "raid1", "raid1", 2, false, 10),
        ("crc32c-16k-raid0-2dev", "crc32c", 16384, false, "raid1", "raid0", 2, false, 11),
        ("ubtrfs-mkfs-crc32c-16k", "crc32c", 16384, true, "", "", 1, true, 12),
        ("ubtrfs-mkfs-sha256-4k-holes", "sha256", 4096, false, "dup", "single", 1, true, 13),
        ("ubtrfs-mkfs-blake2-64k-raid1-2dev", "blake2", 65536, true, "raid1", "raid1", 2, true, 14),
        ("ubtrfs-mkfs-xxhash-4k-raid0-2dev", "xxhash", 4096, false, "raid1", "raid0", 2, true, 15),
        ("crc32c-16k-raid5-3dev", "crc32c", 16384, true, "raid5", "raid5", 3, false, 16),
        ("ubtrfs-mkfs-xxhash-4k-raid6-4dev", "xxhash", 4096, false, "raid6", "raid6", 4, true, 17),
        ("crc32c-4k-mixed", "crc32c", 4096, true, "mixed", "mixed", 1, false, 18),
    ];
    let more = table.map(
        |(label, csum, nodesize, no_holes, meta, data, devices, lib_mkfs, s)| Config {
            label,
            csum,
            nodesize,
            no_holes,
            seed: s,
            ops: short,
            meta,
            data,
            devices,
            lib_mkfs,
        },
    );
    let only = std::env::var("UBTRFS_MODEL_ONLY").ok();
    base.into_iter()
        .chain(more)
        .filter(|c| only.as_deref().is_none_or(|o| c.label.contains(o)))
        .map(|c| Config {
            seed: seed.unwrap_or(c.seed),
            ..c
        })
        .collect()
}

#[test]
fn random_operations_match_the_model() {
    testkit::require_privileged!();
    // Modes as given: the model must not apply a umask the library does not.
    unsafe { libc::umask(0) };
    let serial = std::env::var("UBTRFS_MODEL_SERIAL").is_ok();
    let handles: Vec<_> = configs()
        .into_iter()
        .map(|c| {
            let h = std::thread::spawn(move || run_config(&c));
            if serial {
                let _ = h.join();
                None
            } else {
                Some(h)
            }
        })
        .collect();
    let mut failed = Vec::new();
    for h in handles.into_iter().flatten() {
        if let Err(e) = h.join() {
            failed.push(
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            );
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

// ---------------------------------------------------------------------
// The items themselves: the library and the kernel, same operations

/// The fs tree's items as `dump-tree` shows them, without what differs
/// between any two runs: times, generations, transids, sequence numbers,
/// data extent addresses.
fn fs_tree_items(img: &Path) -> Vec<String> {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "5"])
        .arg(img)
        .output()
        .expect("dump-tree runs");
    assert!(out.status.success(), "dump-tree failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut items = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("item ") {
            // "item N key (..) itemoff X itemsize Y"
            let key = rest.split_once(' ').map_or(rest, |(_, k)| k);
            let (k, size) = key.split_once(" itemoff ").unwrap_or((key, ""));
            let size = size.split_once(" itemsize ").map_or("", |(_, s)| s);
            items.push(format!("{k} size {size}"));
            continue;
        }
        let skip = [
            "leaf ",
            "node ",
            "fs uuid",
            "chunk uuid",
            "total bytes",
            "bytes used",
            "uuid ",
            "btrfs-progs",
            "fs tree key",
            "key (",
        ];
        if items.is_empty() || skip.iter().any(|s| t.starts_with(s)) {
            continue;
        }
        if ["atime ", "ctime ", "mtime ", "otime "]
            .iter()
            .any(|s| t.starts_with(s))
        {
            continue;
        }
        let mut words: Vec<String> = t.split_whitespace().map(String::from).collect();
        let mut i = 0;
        while i < words.len() {
            let w = words[i].clone();
            let blank = matches!(w.as_str(), "generation" | "transid" | "sequence")
                || (w == "byte" && words.get(i + 1).is_some_and(|n| n != "0"));
            if blank && i + 1 < words.len() {
                words[i + 1] = "*".into();
                i += 1;
            }
            i += 1;
        }
        let last = items.last_mut().unwrap();
        last.push_str(" | ");
        last.push_str(&words.join(" "));
    }
    items
}

/// A script of operations whose items the kernel writes the same way
/// every time (each followed by a sync, or a commit).
fn layout_script() -> Vec<Op> {
    let s = |x: &str| x.to_string();
    let write = |p: &str, off: u64, len: usize, seed: u64| Op::Write {
        path: s(p),
        off,
        len,
        seed,
    };
    vec![
        Op::Mkdir {
            path: s("d"),
            mode: 0o755,
        },
        Op::Mkdir {
            path: s("d2"),
            mode: 0o750,
        },
        Op::Create {
            path: s("f"),
            mode: 0o644,
        },
        write("f", 0, 5, 1),
        Op::Symlink {
            target: s("target/of/link"),
            path: s("s"),
        },
        Op::Symlink {
            target: "x".repeat(3000),
            path: s("long"),
        },
        Op::Link {
            from: s("f"),
            to: s("f2"),
        },
        Op::Link {
            from: s("f"),
            to: s("d/f3"),
        },
        Op::SetXattr {
            path: s("f"),
            name: s("user.x"),
            len: 3,
            seed: 2,
            flags: 0,
        },
        Op::SetXattr {
            path: s("f"),
            name: s("user.y"),
            len: 40,
            seed: 3,
            flags: XATTR_CREATE,
        },
        Op::SetXattr {
            path: s("f"),
            name: s("user.x"),
            len: 9,
            seed: 4,
            flags: XATTR_REPLACE,
        },
        Op::RemoveXattr {
            path: s("f"),
            name: s("user.y"),
        },
        Op::Rename {
            from: s("d"),
            to: s("d2/d"),
            flags: 0,
        },
        Op::Mkdir {
            path: s("A"),
            mode: 0o755,
        },
        Op::Mkdir {
            path: s("B"),
            mode: 0o755,
        },
        Op::Create {
            path: s("A/x"),
            mode: 0o644,
        },
        write("A/x", 0, 2, 5),
        Op::Create {
            path: s("B/y"),
            mode: 0o600,
        },
        write("B/y", 0, 3, 6),
        Op::Rename {
            from: s("A/x"),
            to: s("B/y"),
            flags: RENAME_EXCHANGE,
        },
        Op::Create {
            path: s("r1"),
            mode: 0o644,
        },
        Op::Create {
            path: s("r2"),
            mode: 0o644,
        },
        Op::Link {
            from: s("r2"),
            to: s("r2b"),
        },
        Op::Rename {
            from: s("r1"),
            to: s("r2"),
            flags: 0,
        },
        Op::Rename {
            from: s("r2b"),
            to: s("r3"),
            flags: RENAME_NOREPLACE,
        },
        Op::Rename {
            from: s("A"),
            to: s("B"),
            flags: RENAME_EXCHANGE,
        },
        Op::Chmod {
            path: s("f"),
            mode: 0o600,
        },
        Op::Chown {
            path: s("f"),
            uid: 1000,
            gid: 100,
        },
        Op::Create {
            path: s("i1"),
            mode: 0o644,
        },
        write("i1", 0, 6, 7),
        Op::Truncate {
            path: s("i1"),
            size: 1000,
        },
        Op::Create {
            path: s("i2"),
            mode: 0o644,
        },
        write("i2", 0, 6, 8),
        Op::Truncate {
            path: s("i2"),
            size: 3,
        },
        Op::Create {
            path: s("t1"),
            mode: 0o644,
        },
        Op::Truncate {
            path: s("t1"),
            size: 100,
        },
        Op::Create {
            path: s("t2"),
            mode: 0o644,
        },
        Op::Truncate {
            path: s("t2"),
            size: 10000,
        },
        Op::Create {
            path: s("small2"),
            mode: 0o644,
        },
        write("small2", 0, 3, 9),
        Op::Truncate {
            path: s("small2"),
            size: 10000,
        },
        Op::Create {
            path: s("pa"),
            mode: 0o644,
        },
        Op::Fallocate {
            path: s("pa"),
            mode: 0,
            off: 0,
            len: 8192,
        },
        Op::Create {
            path: s("pk"),
            mode: 0o644,
        },
        Op::Fallocate {
            path: s("pk"),
            mode: FALLOC_FL_KEEP_SIZE,
            off: 16384,
            len: 8192,
        },
        Op::Create {
            path: s("g"),
            mode: 0o644,
        },
        Op::Fallocate {
            path: s("g"),
            mode: 0,
            off: 0,
            len: 8192,
        },
        Op::Fallocate {
            path: s("g"),
            mode: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            off: 0,
            len: 4096,
        },
        Op::Create {
            path: s("e"),
            mode: 0o644,
        },
        write("e", 0, 11, 10),
        Op::Fallocate {
            path: s("e"),
            mode: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            off: 2,
            len: 3,
        },
        Op::Create {
            path: s("r"),
            mode: 0o644,
        },
        write("r", 0, 10000, 11),
        Op::Truncate {
            path: s("r"),
            size: 30000,
        },
        Op::Create {
            path: s("ph"),
            mode: 0o644,
        },
        write("ph", 0, 20000, 12),
        Op::Fallocate {
            path: s("ph"),
            mode: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            off: 8192,
            len: 4096,
        },
        Op::Create {
            path: s("z"),
            mode: 0o644,
        },
        write("z", 0, 20000, 13),
        Op::Fallocate {
            path: s("z"),
            mode: FALLOC_FL_ZERO_RANGE,
            off: 1000,
            len: 10000,
        },
        Op::Create {
            path: s("a"),
            mode: 0o644,
        },
        write("a", 0, 20000, 14),
        Op::Fallocate {
            path: s("a"),
            mode: 0,
            off: 8192,
            len: 40000,
        },
        Op::Create {
            path: s("pk2"),
            mode: 0o644,
        },
        write("pk2", 0, 3, 15),
        Op::Fallocate {
            path: s("pk2"),
            mode: FALLOC_FL_KEEP_SIZE,
            off: 16384,
            len: 8192,
        },
        Op::Create {
            path: s("zi"),
            mode: 0o644,
        },
        write("zi", 0, 3, 16),
        Op::Fallocate {
            path: s("zi"),
            mode: FALLOC_FL_ZERO_RANGE,
            off: 0,
            len: 100,
        },
        Op::Create {
            path: s("b5"),
            mode: 0o644,
        },
        write("b5", 0, 5000, 17),
        Op::Fallocate {
            path: s("b5"),
            mode: FALLOC_FL_KEEP_SIZE,
            off: 16384,
            len: 8192,
        },
        Op::Truncate {
            path: s("b5"),
            size: 20000,
        },
        Op::Truncate {
            path: s("b5"),
            size: 2000,
        },
        Op::Unlink { path: s("f2") },
        Op::Rmdir { path: s("d2/d") },
    ]
}

#[test]
fn the_kernel_writes_the_same_items() {
    testkit::require_privileged!();
    let c = Config {
        label: "layout",
        csum: "crc32c",
        nodesize: 16384,
        no_holes: false,
        seed: 0,
        ops: 0,
        ..BASE
    };
    same_items_as_the_kernel(&c, layout_script());
}

/// Many hard links in one directory with long names: past what one
/// INODE_REF item holds, names go to INODE_EXTREF items (4 KiB nodes).
#[test]
fn extended_refs_as_the_kernel_writes_them() {
    testkit::require_privileged!();
    let c = Config {
        label: "extref",
        csum: "xxhash",
        nodesize: 4096,
        no_holes: true,
        seed: 0,
        ops: 0,
        ..BASE
    };
    let name = |i: usize| format!("d/{}{i}", "n".repeat(200));
    let mut script = vec![
        Op::Mkdir {
            path: "d".into(),
            mode: 0o755,
        },
        Op::Create {
            path: "d/f".into(),
            mode: 0o644,
        },
    ];
    for i in 0..40 {
        script.push(Op::Link {
            from: "d/f".into(),
            to: name(i),
        });
    }
    // Names from both kinds of item go, move and come back.
    for i in [3, 25, 39, 0] {
        script.push(Op::Unlink { path: name(i) });
    }
    script.push(Op::Rename {
        from: name(30),
        to: "d/short".into(),
        flags: 0,
    });
    script.push(Op::Rename {
        from: name(5),
        to: name(3),
        flags: 0,
    });
    script.push(Op::Mkdir {
        path: "e".into(),
        mode: 0o755,
    });
    script.push(Op::Rename {
        from: name(31),
        to: "e/moved".into(),
        flags: 0,
    });
    script.push(Op::Link {
        from: "d/f".into(),
        to: name(25),
    });
    script.push(Op::Rename {
        from: name(32),
        to: "d/short".into(),
        flags: RENAME_EXCHANGE,
    });
    same_items_as_the_kernel(&c, script);
}

/// Apply `script` to a fresh image through the kernel (a sync after each
/// operation) and to another through the library (a commit after each);
/// the two fs trees must hold the same items.
fn same_items_as_the_kernel(c: &Config, script: Vec<Op>) {
    unsafe { libc::umask(0) };
    let t = Scratch::new(c.label);
    let (ki, li) = (
        t.sparse_file("kernel.img", 300 << 20).unwrap(),
        t.sparse_file("lib.img", 300 << 20).unwrap(),
    );
    mkfs(&ki, c);
    mkfs(&li, c);
    let m = Mount::single(&ki, &t.join("mnt"), "").expect("mount");
    let fs = Filesystem::open_read_write(&[&li]).unwrap();
    for op in script {
        let want = host_apply(m.path(), &op);
        let got = lib_apply(&fs, &op);
        assert_eq!(
            want,
            got,
            "{op}: the kernel says {}, the library {}",
            show(&want),
            show(&got)
        );
        unsafe { libc::sync() };
        fs.commit().unwrap();
    }
    m.unmount().unwrap();
    drop(fs);
    btrfs_check(&li).unwrap_or_else(|e| panic!("btrfs check: {e}"));
    let (k, l) = (fs_tree_items(&ki), fs_tree_items(&li));
    let mut diffs = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < k.len() || j < l.len() {
        match (k.get(i), l.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) => {
                let ka = a.split(" | ").next().unwrap_or("");
                let kb = b.split(" | ").next().unwrap_or("");
                diffs.push(format!("kernel:  {a}\nlibrary: {b}"));
                if ka <= kb {
                    i += 1;
                }
                if kb <= ka {
                    j += 1;
                }
            }
            (Some(a), None) => {
                diffs.push(format!("kernel only: {a}"));
                i += 1;
            }
            (None, Some(b)) => {
                diffs.push(format!("library only: {b}"));
                j += 1;
            }
            (None, None) => break,
        }
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// The kernel leaves the bytes past the end of a file it shrank in the
/// last sector on disk; growing the file again must show zeros there,
/// whichever way it grows.
#[test]
fn growing_a_file_the_kernel_shrank_shows_zeros() {
    testkit::require_privileged!();
    let t = Scratch::new("stale-tail");
    let c = Config {
        label: "stale",
        csum: "crc32c",
        nodesize: 16384,
        no_holes: true,
        seed: 0,
        ops: 0,
        ..BASE
    };
    let img = t.sparse_file("fs.img", 300 << 20).unwrap();
    mkfs(&img, &c);
    let names = ["w", "t", "f", "z", "k"];
    {
        let m = Mount::single(&img, &t.join("mnt"), "").expect("mount");
        for n in names {
            fs::write(m.path().join(n), content(7, 10000)).unwrap();
        }
        unsafe { libc::sync() };
        for n in names {
            host_open(&m.path().join(n)).unwrap().set_len(5000).unwrap();
        }
        unsafe { libc::sync() };
        m.unmount().unwrap();
    }
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let id = |n: &str| fs.resolve_path(format!("/{n}").as_bytes()).unwrap();
    fs.write(id("w"), 9000, b"0123456789").unwrap();
    fs.truncate(id("t"), 9010).unwrap();
    fs.fallocate(id("f"), 0, 6000, 3010).unwrap();
    fs.fallocate(id("z"), FALLOC_FL_ZERO_RANGE, 8000, 1010)
        .unwrap();
    fs.fallocate(id("k"), FALLOC_FL_KEEP_SIZE, 6000, 10000)
        .unwrap();
    fs.truncate(id("k"), 9010).unwrap();
    let mut want = content(7, 5000);
    want.resize(9010, 0);
    for n in names {
        let mut w = want.clone();
        if n == "w" {
            w[9000..].copy_from_slice(b"0123456789");
        }
        let got = fs.read_all(id(n)).unwrap();
        let bad = got.iter().zip(&w).position(|(a, b)| a != b);
        assert!(
            got == w,
            "{n}: first wrong byte at {bad:?} (before the commit)"
        );
    }
    fs.commit().unwrap();
    drop(fs);
    btrfs_check(&img).unwrap_or_else(|e| panic!("btrfs check: {e}"));
    let m = Mount::single(&img, &t.join("mnt"), "").expect("mount");
    for n in names {
        let got = fs::read(m.path().join(n)).unwrap();
        let bad = got.iter().zip(&want).position(|(a, b)| a != b);
        if n != "w" {
            assert!(got == want, "{n}: the kernel reads a wrong byte at {bad:?}");
        }
    }
    m.unmount().unwrap();
}

/// The longest symlink target and the largest xattr are what the kernel
/// takes, with either node size; one more byte fails in both.
#[test]
fn size_limits_are_the_kernels() {
    testkit::require_privileged!();
    for nodesize in [4096u32, 16384] {
        let c = Config {
            label: "limits",
            csum: "crc32c",
            nodesize,
            no_holes: true,
            seed: 0,
            ops: 0,
            ..BASE
        };
        let t = Scratch::new("limits");
        let (ki, li) = (
            t.sparse_file("kernel.img", 300 << 20).unwrap(),
            t.sparse_file("lib.img", 300 << 20).unwrap(),
        );
        mkfs(&ki, &c);
        mkfs(&li, &c);
        let fs = Filesystem::open_read_write(&[&li]).unwrap();
        let (link_max, xattr_max) = (fs.symlink_max(), fs.xattr_max());
        let m = Mount::single(&ki, &t.join("mnt"), "").expect("mount");
        let root = fs.root();
        for (i, len) in [link_max, link_max + 1].into_iter().enumerate() {
            let target = "x".repeat(len);
            let name = format!("s{i}");
            let k = host_apply(
                m.path(),
                &Op::Symlink {
                    target: target.clone(),
                    path: name.clone(),
                },
            );
            let l = fs.symlink(root, name.as_bytes(), target.as_bytes(), 0, 0);
            if i == 0 {
                assert!(
                    k.is_ok() && l.is_ok(),
                    "{nodesize}: symlink of {len}: {k:?} {:?}",
                    l.err()
                );
                assert_eq!(fs.read_link(l.unwrap().id).unwrap(), target.as_bytes());
            } else {
                // The kernel says ENAMETOOLONG (or ENAMETOOLONG past PATH_MAX).
                assert_eq!(
                    k,
                    Err(libc::ENAMETOOLONG),
                    "{nodesize}: kernel, symlink of {len}"
                );
                assert!(
                    matches!(l, Err(ubtrfs::Error::NameTooLong(_))),
                    "{nodesize}: {l:?}"
                );
            }
        }
        let name = "user.v";
        let f = fs
            .create(
                root,
                b"f",
                NewInode {
                    mode: libc::S_IFREG | 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                },
            )
            .unwrap();
        host_apply(
            m.path(),
            &Op::Create {
                path: "f".into(),
                mode: 0o644,
            },
        )
        .unwrap();
        for (i, len) in [xattr_max - name.len(), xattr_max - name.len() + 1]
            .into_iter()
            .enumerate()
        {
            let op = Op::SetXattr {
                path: "f".into(),
                name: name.into(),
                len,
                seed: 1,
                flags: 0,
            };
            let k = host_apply(m.path(), &op);
            let l = fs
                .set_xattr(f.id, name.as_bytes(), &content(1, len), 0)
                .map_err(lib_err);
            if len > 65536 {
                // Past XATTR_SIZE_MAX the VFS refuses first (E2BIG).
                assert!(
                    k.is_err() && l.is_err(),
                    "{nodesize}: xattr of {len}: {k:?} {l:?}"
                );
                continue;
            }
            assert_eq!(k, l, "{nodesize}: xattr of {len}");
            assert_eq!(k.is_ok(), i == 0, "{nodesize}: xattr of {len}: {k:?}");
        }
        m.unmount().unwrap();
        fs.commit().unwrap();
        drop(fs);
        btrfs_check(&li).unwrap_or_else(|e| panic!("btrfs check: {e}"));
        let m = Mount::single(&li, &t.join("mnt"), "").expect("mount");
        assert_eq!(
            fs::read_link(m.path().join("s0"))
                .unwrap()
                .as_os_str()
                .len(),
            link_max
        );
        assert_eq!(host_xattrs(&m.path().join("f")).len(), 1);
        m.unmount().unwrap();
    }
}

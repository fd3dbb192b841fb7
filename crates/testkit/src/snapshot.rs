//! A tree captured in memory: every entry's `lstat`, content, symlink
//! target and xattrs, so two views that cannot exist at once (a FUSE mount
//! before its unmount, the kernel's mount of the same image after) can be
//! compared.

use crate::compare::{CompareOptions, show_path};
use crate::sys;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The type of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A character device.
    Char,
    /// A block device.
    Block,
    /// A socket.
    Socket,
}

/// One entry as `lstat` and friends show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The type.
    pub kind: Kind,
    /// The 12 permission bits (the type is in `kind`).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// `st_size`.
    pub size: u64,
    /// `st_nlink`.
    pub nlink: u64,
    /// `st_rdev`.
    pub rdev: u64,
    /// `(st_dev, st_ino)`: names with equal keys are hard links.
    pub inode: (u64, u64),
    /// Access time (seconds, nanoseconds).
    pub atime: (i64, i64),
    /// Modification time.
    pub mtime: (i64, i64),
    /// Change time.
    pub ctime: (i64, i64),
    /// Content of a regular file.
    pub data: Vec<u8>,
    /// Target of a symlink.
    pub target: Vec<u8>,
    /// Extended attributes, by name.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A whole tree: relative paths (`""` for the top) to entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The entries, by path relative to the top.
    pub entries: BTreeMap<PathBuf, Entry>,
}

impl Snapshot {
    /// Capture the tree below `root` (never following symlinks), skipping
    /// the relative paths in `skip` and everything below them.
    pub fn take(root: &Path, skip: &[&str]) -> io::Result<Snapshot> {
        let mut s = Snapshot::default();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let p = if rel.as_os_str().is_empty() {
                root.to_path_buf()
            } else {
                root.join(&rel)
            };
            let e = capture(&p).map_err(|e| annotate(e, &p))?;
            if e.kind == Kind::Dir {
                for d in std::fs::read_dir(&p).map_err(|e| annotate(e, &p))? {
                    let r = rel.join(d.map_err(|e| annotate(e, &p))?.file_name());
                    if !skip.iter().any(|s| r.starts_with(s)) {
                        stack.push(r);
                    }
                }
            }
            s.entries.insert(rel, e);
        }
        Ok(s)
    }
}

fn annotate(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// One entry at `p`.
pub fn capture(p: &Path) -> io::Result<Entry> {
    let m = std::fs::symlink_metadata(p)?;
    let t = m.file_type();
    let kind = if t.is_dir() {
        Kind::Dir
    } else if t.is_file() {
        Kind::File
    } else if t.is_symlink() {
        Kind::Symlink
    } else if t.is_fifo() {
        Kind::Fifo
    } else if t.is_char_device() {
        Kind::Char
    } else if t.is_block_device() {
        Kind::Block
    } else {
        Kind::Socket
    };
    let data = if kind == Kind::File {
        std::fs::read(p)?
    } else {
        Vec::new()
    };
    let target = if kind == Kind::Symlink {
        std::fs::read_link(p)?.as_os_str().as_bytes().to_vec()
    } else {
        Vec::new()
    };
    let xattrs = sys::xattrs(p)?
        .into_iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v))
        .collect();
    Ok(Entry {
        kind,
        perm: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        size: m.size(),
        nlink: m.nlink(),
        rdev: m.rdev(),
        inode: (m.dev(), m.ino()),
        atime: (m.atime(), m.atime_nsec()),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        data,
        target,
        xattrs,
    })
}

fn ignored(xattr: &[u8], opts: &CompareOptions) -> bool {
    opts.ignore_xattrs.iter().any(|i| {
        let i = i.as_bytes();
        if i.ends_with(b".") {
            xattr.starts_with(i)
        } else {
            xattr == i
        }
    })
}

/// Every difference between two snapshots that `opts` asks for, one line
/// each (`path: what: expected X, actual Y`), as
/// [`crate::compare_trees_with`] reports them; atime and ctime are left to
/// the caller (both snapshots hold them).
pub fn diff_snapshots(
    expected: &Snapshot,
    actual: &Snapshot,
    opts: &CompareOptions,
) -> Vec<String> {
    let mut out = Vec::new();
    let skip =
        |p: &Path| !p.as_os_str().is_empty() && opts.ignore_paths.iter().any(|i| p.starts_with(i));
    for (p, e) in &expected.entries {
        if skip(p) {
            continue;
        }
        let Some(a) = actual.entries.get(p) else {
            out.push(format!("{}: missing: expected {:?}", show_path(p), e.kind));
            continue;
        };
        if p.as_os_str().is_empty() && !opts.top_level {
            continue;
        }
        let mut d = |what: &str, ex: String, ac: String| {
            out.push(format!(
                "{}: {what}: expected {ex}, actual {ac}",
                show_path(p)
            ));
        };
        if e.kind != a.kind {
            d("type", format!("{:?}", e.kind), format!("{:?}", a.kind));
            continue;
        }
        let dir = e.kind == Kind::Dir;
        if opts.mode && e.perm != a.perm {
            d("mode", format!("{:o}", e.perm), format!("{:o}", a.perm));
        }
        if opts.uid && e.uid != a.uid {
            d("uid", e.uid.to_string(), a.uid.to_string());
        }
        if opts.gid && e.gid != a.gid {
            d("gid", e.gid.to_string(), a.gid.to_string());
        }
        let size = if dir { opts.dir_size } else { opts.size };
        if size && e.size != a.size {
            d("size", e.size.to_string(), a.size.to_string());
        }
        let nlink = if dir { opts.dir_nlink } else { opts.nlink };
        if nlink && e.nlink != a.nlink {
            d("nlink", e.nlink.to_string(), a.nlink.to_string());
        }
        // The kernel's stand-in directory (inode 2) for a subvolume a
        // snapshot does not hold takes the time it is made in memory: a
        // second look may find a newer one.
        let stand_in = dir && e.inode.1 == 2 && a.inode.1 == 2;
        if opts.mtime && !stand_in && e.mtime.0 != a.mtime.0 {
            d("mtime sec", e.mtime.0.to_string(), a.mtime.0.to_string());
        }
        if opts.mtime_nsec && !stand_in && e.mtime.1 != a.mtime.1 {
            d("mtime nsec", e.mtime.1.to_string(), a.mtime.1.to_string());
        }
        if opts.rdev && matches!(e.kind, Kind::Char | Kind::Block) && e.rdev != a.rdev {
            d("rdev", format!("{:#x}", e.rdev), format!("{:#x}", a.rdev));
        }
        if opts.content && e.data != a.data {
            let at = e.data.iter().zip(&a.data).position(|(x, y)| x != y);
            d(
                "content",
                format!("{} bytes", e.data.len()),
                format!(
                    "{} bytes, first difference at {}",
                    a.data.len(),
                    at.map_or("the end of the shorter".into(), |a| a.to_string())
                ),
            );
        }
        if opts.symlink_targets && e.target != a.target {
            d(
                "symlink target",
                String::from_utf8_lossy(&e.target).into_owned(),
                String::from_utf8_lossy(&a.target).into_owned(),
            );
        }
        if opts.xattrs {
            let keep = |m: &BTreeMap<Vec<u8>, Vec<u8>>| -> BTreeMap<Vec<u8>, Vec<u8>> {
                m.iter()
                    .filter(|(k, _)| !ignored(k, opts))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            };
            let (xe, xa) = (keep(&e.xattrs), keep(&a.xattrs));
            if xe != xa {
                let show = |m: &BTreeMap<Vec<u8>, Vec<u8>>| {
                    m.iter()
                        .map(|(k, v)| format!("{}({} bytes)", String::from_utf8_lossy(k), v.len()))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                d("xattr", show(&xe), show(&xa));
            }
        }
    }
    for (p, a) in &actual.entries {
        if !skip(p) && !expected.entries.contains_key(p) {
            out.push(format!("{}: unexpected: actual {:?}", show_path(p), a.kind));
        }
    }
    if opts.hard_links {
        fn groups<'a>(
            s: &'a Snapshot,
            skip: &dyn Fn(&Path) -> bool,
        ) -> BTreeMap<&'a Path, Vec<&'a Path>> {
            let mut g: HashMap<(u64, u64), Vec<&Path>> = HashMap::new();
            for (p, e) in &s.entries {
                if e.kind != Kind::Dir && !skip(p) {
                    g.entry(e.inode).or_default().push(p);
                }
            }
            s.entries
                .iter()
                .filter(|(p, e)| e.kind != Kind::Dir && !skip(p))
                .map(|(p, e)| (p.as_path(), g[&e.inode].clone()))
                .collect()
        }
        let (ge, ga) = (groups(expected, &skip), groups(actual, &skip));
        for (p, le) in &ge {
            if let Some(la) = ga.get(p)
                && le != la
            {
                out.push(format!(
                    "{}: hard links: expected {:?}, actual {:?}",
                    show_path(p),
                    le,
                    la
                ));
            }
        }
    }
    out
}

/// Two views of one filesystem (ubtrfs's FUSE mount before an unmount and
/// the kernel's mount after, or the other way round): everything
/// [`CompareOptions::strict`] compares, plus atime, ctime and inode
/// numbers, but the top's (FUSE numbers its root 1).
pub fn diff_same_filesystem(expected: &Snapshot, actual: &Snapshot) -> Vec<String> {
    let mut d = diff_snapshots(expected, actual, &CompareOptions::strict());
    for (p, e) in &expected.entries {
        let Some(a) = actual.entries.get(p) else {
            continue;
        };
        let mut t = |what: &str, ex: String, ac: String| {
            d.push(format!(
                "{}: {what}: expected {ex}, actual {ac}",
                show_path(p)
            ));
        };
        if e.atime != a.atime {
            t("atime", format!("{:?}", e.atime), format!("{:?}", a.atime));
        }
        if e.ctime != a.ctime {
            t("ctime", format!("{:?}", e.ctime), format!("{:?}", a.ctime));
        }
        if !p.as_os_str().is_empty() && e.inode.1 != a.inode.1 {
            t("ino", e.inode.1.to_string(), a.inode.1.to_string());
        }
    }
    d
}

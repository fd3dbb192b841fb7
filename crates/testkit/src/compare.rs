//! Comparing two directory trees entry by entry.

use crate::sys;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Which properties [`compare_trees_with`] checks. Names and file types are
/// always compared; atime and ctime never are. [`Default`] is
/// [`CompareOptions::strict`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareOptions {
    /// Regular file contents, byte for byte.
    pub content: bool,
    /// `st_size` of regular files and symlinks.
    pub size: bool,
    /// `st_size` of directories (filesystem specific: btrfs counts name
    /// bytes, ext4 counts blocks).
    pub dir_size: bool,
    /// `st_mode`: the file type and all 12 permission bits (symlinks
    /// included: Linux creates them 0777, and a reader must report that).
    pub mode: bool,
    /// `st_uid`.
    pub uid: bool,
    /// `st_gid`.
    pub gid: bool,
    /// mtime seconds.
    pub mtime: bool,
    /// mtime nanoseconds.
    pub mtime_nsec: bool,
    /// `st_rdev` of character and block devices.
    pub rdev: bool,
    /// Extended attribute names and values.
    pub xattrs: bool,
    /// Xattrs left out of the comparison: an entry ending in `.` is a
    /// namespace prefix (`"security."`), any other an exact name.
    pub ignore_xattrs: Vec<String>,
    /// Symlink targets, byte for byte.
    pub symlink_targets: bool,
    /// Hard-link groups: names that share an inode in one tree share one
    /// in the other.
    pub hard_links: bool,
    /// `st_nlink` of everything but directories.
    pub nlink: bool,
    /// `st_nlink` of directories (btrfs always reports 1, ext4 2 + subdirs).
    pub dir_nlink: bool,
    /// Compare the metadata (mode, owner, mtime, xattrs, size, nlink) of
    /// the two top directories themselves, not only of what is inside.
    pub top_level: bool,
    /// Paths, relative to the tops, skipped entirely (with everything below).
    pub ignore_paths: Vec<PathBuf>,
    /// Stop after this many differences (a note says so).
    pub max_differences: usize,
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self::strict()
    }
}

impl CompareOptions {
    /// Everything but atime and ctime. For two views of the same
    /// filesystem (the kernel's mount and ubtrfs), where even directory
    /// sizes and link counts must agree.
    pub fn strict() -> Self {
        CompareOptions {
            content: true,
            size: true,
            dir_size: true,
            mode: true,
            uid: true,
            gid: true,
            mtime: true,
            mtime_nsec: true,
            rdev: true,
            xattrs: true,
            ignore_xattrs: Vec::new(),
            symlink_targets: true,
            hard_links: true,
            nlink: true,
            dir_nlink: true,
            top_level: true,
            ignore_paths: Vec::new(),
            max_differences: 1000,
        }
    }

    /// For a source tree on another filesystem against its copy on btrfs:
    /// strict, except directory sizes and directory link counts, which
    /// differ between filesystems by design.
    pub fn across_filesystems() -> Self {
        CompareOptions {
            dir_size: false,
            dir_nlink: false,
            ..Self::strict()
        }
    }

    /// For a source tree against the image `mkfs.btrfs --rootdir` made of
    /// it (btrfs-progs 6.2, as found by `tests/corpus.rs`): on top of
    /// [`CompareOptions::across_filesystems`], mtime nanoseconds (truncated
    /// to 0), device numbers (stored as 0) and the top directory's metadata
    /// (mkfs makes its own root directory) are not compared.
    pub fn mkfs_rootdir() -> Self {
        CompareOptions {
            mtime_nsec: false,
            rdev: false,
            top_level: false,
            ..Self::across_filesystems()
        }
    }
}

/// Compare two trees with [`CompareOptions::strict`]; see
/// [`compare_trees_with`].
pub fn compare_trees(expected: &Path, actual: &Path) -> Result<(), Vec<String>> {
    compare_trees_with(expected, actual, &CompareOptions::strict())
}

/// Walk `expected` and `actual` with `lstat` (never following symlinks) and
/// report every difference the options ask for, one line each, as
/// `path: what: expected X, actual Y`, where `what` is one of `missing`,
/// `unexpected`, `type`, `content`, `size`, `dir size`, `mode`, `uid`,
/// `gid`, `mtime sec`, `mtime nsec`, `rdev`, `xattr`, `symlink target`,
/// `hard links`, `nlink`, `dir nlink`, `error`. Paths are relative to the
/// tops (`.` for the tops themselves), non-UTF-8 bytes shown as `\xNN`.
pub fn compare_trees_with(
    expected: &Path,
    actual: &Path,
    opts: &CompareOptions,
) -> Result<(), Vec<String>> {
    let mut c = Cmp {
        opts,
        diffs: Vec::new(),
        links_e: HashMap::new(),
        links_a: HashMap::new(),
        paths: Vec::new(),
        truncated: false,
    };
    c.compare_entry(expected, actual, Path::new(""), true);
    if opts.hard_links && !c.truncated {
        c.compare_hard_links();
    }
    if c.truncated {
        c.diffs.push(format!(
            "... stopped after {} differences",
            opts.max_differences
        ));
    }
    if c.diffs.is_empty() {
        Ok(())
    } else {
        Err(c.diffs)
    }
}

/// A path for messages: relative, `.` for the top, non-UTF-8 bytes and
/// control characters escaped.
pub fn show_path(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        return ".".into();
    }
    escape_bytes(rel.as_os_str().as_bytes())
}

fn escape_bytes(b: &[u8]) -> String {
    let mut out = String::new();
    for chunk in b.utf8_chunks() {
        for ch in chunk.valid().chars() {
            if ch.is_control() {
                out.extend(ch.escape_default());
            } else {
                out.push(ch);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

fn show_value(v: &[u8]) -> String {
    const MAX: usize = 48;
    let s = escape_bytes(&v[..v.len().min(MAX)]);
    if v.len() > MAX {
        format!("\"{s}\"... ({} bytes)", v.len())
    } else {
        format!("\"{s}\"")
    }
}

fn type_name(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "regular file"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_char_device() {
        "char device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "unknown"
    }
}

/// `(st_dev, st_ino)`.
type InodeKey = (u64, u64);

struct Cmp<'a> {
    opts: &'a CompareOptions,
    diffs: Vec<String>,
    /// Inode -> names of it, per tree; non-directories only.
    links_e: HashMap<InodeKey, Vec<PathBuf>>,
    links_a: HashMap<InodeKey, Vec<PathBuf>>,
    /// Non-directory paths present in both trees, with their inode keys.
    paths: Vec<(PathBuf, InodeKey, InodeKey)>,
    truncated: bool,
}

impl Cmp<'_> {
    fn diff(&mut self, rel: &Path, what: &str, detail: String) {
        if self.diffs.len() >= self.opts.max_differences {
            self.truncated = true;
            return;
        }
        self.diffs
            .push(format!("{}: {what}: {detail}", show_path(rel)));
    }

    fn ignored(&self, rel: &Path) -> bool {
        self.opts.ignore_paths.iter().any(|p| rel.starts_with(p)) && !rel.as_os_str().is_empty()
    }

    fn compare_entry(&mut self, e: &Path, a: &Path, rel: &Path, top: bool) {
        if self.truncated || self.ignored(rel) {
            return;
        }
        let me = match std::fs::symlink_metadata(e) {
            Ok(m) => m,
            Err(err) => return self.diff(rel, "error", format!("lstat expected: {err}")),
        };
        let ma = match std::fs::symlink_metadata(a) {
            Ok(m) => m,
            Err(err) => return self.diff(rel, "error", format!("lstat actual: {err}")),
        };
        let (te, ta) = (type_name(&me), type_name(&ma));
        if te != ta {
            return self.diff(rel, "type", format!("expected {te}, actual {ta}"));
        }
        if !top || self.opts.top_level {
            self.compare_meta(e, a, rel, &me, &ma);
        }
        let ft = me.file_type();
        if ft.is_file() && self.opts.content && me.len() == ma.len() {
            self.compare_content(e, a, rel);
        }
        if ft.is_symlink() && self.opts.symlink_targets {
            match (std::fs::read_link(e), std::fs::read_link(a)) {
                (Ok(le), Ok(la)) if le != la => self.diff(
                    rel,
                    "symlink target",
                    format!(
                        "expected {}, actual {}",
                        show_value(le.as_os_str().as_bytes()),
                        show_value(la.as_os_str().as_bytes())
                    ),
                ),
                (Ok(_), Ok(_)) => {}
                (Err(err), _) | (_, Err(err)) => {
                    self.diff(rel, "error", format!("readlink: {err}"))
                }
            }
        }
        if !ft.is_dir() {
            let ke = (me.dev(), me.ino());
            let ka = (ma.dev(), ma.ino());
            self.links_e.entry(ke).or_default().push(rel.to_path_buf());
            self.links_a.entry(ka).or_default().push(rel.to_path_buf());
            self.paths.push((rel.to_path_buf(), ke, ka));
            return;
        }
        // Directory: compare the sets of names, then recurse.
        let names_e = match list_dir(e) {
            Ok(n) => n,
            Err(err) => return self.diff(rel, "error", format!("readdir expected: {err}")),
        };
        let names_a = match list_dir(a) {
            Ok(n) => n,
            Err(err) => return self.diff(rel, "error", format!("readdir actual: {err}")),
        };
        for n in names_e.difference(&names_a) {
            let r = rel.join(n);
            if !self.ignored(&r) {
                let t = std::fs::symlink_metadata(e.join(n))
                    .map(|m| type_name(&m))
                    .unwrap_or("?");
                self.diff(&r, "missing", format!("expected {t}, actual nothing"));
            }
        }
        for n in names_a.difference(&names_e) {
            let r = rel.join(n);
            if !self.ignored(&r) {
                let t = std::fs::symlink_metadata(a.join(n))
                    .map(|m| type_name(&m))
                    .unwrap_or("?");
                self.diff(&r, "unexpected", format!("expected nothing, actual {t}"));
            }
        }
        for n in names_e.intersection(&names_a) {
            self.compare_entry(&e.join(n), &a.join(n), &rel.join(n), false);
        }
    }

    fn compare_meta(&mut self, e: &Path, a: &Path, rel: &Path, me: &Metadata, ma: &Metadata) {
        let o = self.opts;
        let ft = me.file_type();
        let is_dir = ft.is_dir();
        if o.mode && me.mode() != ma.mode() {
            self.diff(
                rel,
                "mode",
                format!("expected {:o}, actual {:o}", me.mode(), ma.mode()),
            );
        }
        if o.uid && me.uid() != ma.uid() {
            self.diff(
                rel,
                "uid",
                format!("expected {}, actual {}", me.uid(), ma.uid()),
            );
        }
        if o.gid && me.gid() != ma.gid() {
            self.diff(
                rel,
                "gid",
                format!("expected {}, actual {}", me.gid(), ma.gid()),
            );
        }
        let size_check = if is_dir { o.dir_size } else { o.size };
        if size_check && me.len() != ma.len() {
            let what = if is_dir { "dir size" } else { "size" };
            self.diff(
                rel,
                what,
                format!("expected {}, actual {}", me.len(), ma.len()),
            );
        }
        let nlink_check = if is_dir { o.dir_nlink } else { o.nlink };
        if nlink_check && me.nlink() != ma.nlink() {
            let what = if is_dir { "dir nlink" } else { "nlink" };
            self.diff(
                rel,
                what,
                format!("expected {}, actual {}", me.nlink(), ma.nlink()),
            );
        }
        if o.mtime && me.mtime() != ma.mtime() {
            self.diff(
                rel,
                "mtime sec",
                format!("expected {}, actual {}", me.mtime(), ma.mtime()),
            );
        }
        if o.mtime_nsec && me.mtime_nsec() != ma.mtime_nsec() {
            self.diff(
                rel,
                "mtime nsec",
                format!("expected {}, actual {}", me.mtime_nsec(), ma.mtime_nsec()),
            );
        }
        if o.rdev && (ft.is_char_device() || ft.is_block_device()) && me.rdev() != ma.rdev() {
            let (je, ne) = sys::major_minor(me.rdev());
            let (ja, na) = sys::major_minor(ma.rdev());
            self.diff(rel, "rdev", format!("expected {je}:{ne}, actual {ja}:{na}"));
        }
        if o.xattrs {
            self.compare_xattrs(e, a, rel);
        }
    }

    fn xattr_ignored(&self, name: &OsString) -> bool {
        let n = name.as_bytes();
        self.opts.ignore_xattrs.iter().any(|i| {
            if i.ends_with('.') {
                n.starts_with(i.as_bytes())
            } else {
                n == i.as_bytes()
            }
        })
    }

    fn compare_xattrs(&mut self, e: &Path, a: &Path, rel: &Path) {
        let xe = match sys::xattrs(e) {
            Ok(x) => x,
            Err(err) => return self.diff(rel, "error", format!("xattrs expected: {err}")),
        };
        let xa = match sys::xattrs(a) {
            Ok(x) => x,
            Err(err) => return self.diff(rel, "error", format!("xattrs actual: {err}")),
        };
        let me: BTreeMap<OsString, Vec<u8>> = xe
            .into_iter()
            .filter(|(n, _)| !self.xattr_ignored(n))
            .collect();
        let ma: BTreeMap<OsString, Vec<u8>> = xa
            .into_iter()
            .filter(|(n, _)| !self.xattr_ignored(n))
            .collect();
        for (n, ve) in &me {
            let name = escape_bytes(n.as_bytes());
            match ma.get(n) {
                None => self.diff(rel, "xattr", format!("{name} expected, actual missing")),
                Some(va) if va != ve => self.diff(
                    rel,
                    "xattr",
                    format!(
                        "{name}: expected {}, actual {}",
                        show_value(ve),
                        show_value(va)
                    ),
                ),
                Some(_) => {}
            }
        }
        for n in ma.keys().filter(|n| !me.contains_key(*n)) {
            let name = escape_bytes(n.as_bytes());
            self.diff(rel, "xattr", format!("{name} not expected, actual present"));
        }
    }

    fn compare_content(&mut self, e: &Path, a: &Path, rel: &Path) {
        let open = |p: &Path| {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
        };
        let (mut fe, mut fa): (File, File) = match (open(e), open(a)) {
            (Ok(x), Ok(y)) => (x, y),
            (Err(err), _) => return self.diff(rel, "error", format!("open expected: {err}")),
            (_, Err(err)) => return self.diff(rel, "error", format!("open actual: {err}")),
        };
        const CHUNK: usize = 1 << 20;
        let mut be = vec![0u8; CHUNK];
        let mut ba = vec![0u8; CHUNK];
        let mut off = 0u64;
        loop {
            let ne = match read_full(&mut fe, &mut be) {
                Ok(n) => n,
                Err(err) => return self.diff(rel, "error", format!("read expected: {err}")),
            };
            let na = match read_full(&mut fa, &mut ba) {
                Ok(n) => n,
                Err(err) => {
                    return self.diff(rel, "error", format!("read actual at offset {off}: {err}"));
                }
            };
            let n = ne.min(na);
            if let Some(i) = (0..n).find(|&i| be[i] != ba[i]) {
                return self.diff(
                    rel,
                    "content",
                    format!(
                        "first difference at offset {}: expected byte {:#04x}, actual {:#04x}",
                        off + i as u64,
                        be[i],
                        ba[i]
                    ),
                );
            }
            if ne != na {
                return self.diff(
                    rel,
                    "content",
                    format!(
                        "expected {} bytes, actual read returned {} bytes",
                        off + ne as u64,
                        off + na as u64
                    ),
                );
            }
            if ne == 0 {
                return;
            }
            off += ne as u64;
        }
    }

    fn compare_hard_links(&mut self) {
        let mut reported: BTreeSet<(u64, u64)> = BTreeSet::new();
        let paths = std::mem::take(&mut self.paths);
        for (rel, ke, ka) in &paths {
            if reported.contains(ke) {
                continue;
            }
            let ge: BTreeSet<&PathBuf> = self.links_e[ke].iter().collect();
            let ga: BTreeSet<&PathBuf> = self.links_a[ka].iter().collect();
            if ge != ga {
                reported.insert(*ke);
                let show = |g: &BTreeSet<&PathBuf>| {
                    g.iter()
                        .map(|p| show_path(p))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let (se, sa) = (show(&ge), show(&ga));
                self.diff(
                    rel,
                    "hard links",
                    format!("expected names sharing the inode [{se}], actual [{sa}]"),
                );
            }
        }
    }
}

fn list_dir(p: &Path) -> std::io::Result<BTreeSet<OsString>> {
    std::fs::read_dir(p)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Every entry below `root`, by path relative to it: `None` for a
/// directory, a file's bytes, a symlink's target. Panics on I/O errors
/// (for tests comparing whole trees with `assert_eq!`).
pub fn dir_contents(
    root: &std::path::Path,
) -> std::collections::BTreeMap<std::path::PathBuf, Option<Vec<u8>>> {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let rel = rel.join(e.file_name());
            let t = e.file_type().unwrap();
            if t.is_dir() {
                out.insert(rel.clone(), None);
                walk(root, &rel, out);
            } else if t.is_symlink() {
                let target = std::fs::read_link(e.path()).unwrap();
                out.insert(rel, Some(target.into_os_string().into_encoded_bytes()));
            } else {
                out.insert(rel, Some(std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{NodeKind, Timestamp};
    use crate::{TestDir, TreeSpec, gen_tree};
    use std::os::unix::ffi::OsStringExt;

    /// A pair of identical generated trees.
    fn pair(t: &TestDir, name: &str) -> (PathBuf, PathBuf) {
        let e = t.join(format!("{name}-e"));
        let a = t.join(format!("{name}-a"));
        gen_tree(&e, 99, &TreeSpec::small()).unwrap();
        gen_tree(&a, 99, &TreeSpec::small()).unwrap();
        (e, a)
    }

    fn walk(top: &Path) -> Vec<(PathBuf, Metadata)> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for ent in std::fs::read_dir(top.join(&rel)).unwrap() {
                let ent = ent.unwrap();
                let r = rel.join(ent.file_name());
                let m = std::fs::symlink_metadata(top.join(&r)).unwrap();
                if m.is_dir() {
                    stack.push(r.clone());
                }
                out.push((r, m));
            }
        }
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }

    /// The first entry of `top` satisfying `f`.
    fn find(top: &Path, f: impl Fn(&Path, &Metadata) -> bool) -> PathBuf {
        walk(top)
            .into_iter()
            .find(|(r, m)| f(r, m))
            .map(|(r, _)| top.join(r))
            .expect("no such entry in generated tree")
    }

    fn plain_file(r: &Path, m: &Metadata) -> bool {
        m.is_file()
            && m.nlink() == 1
            && m.len() > 10
            && m.mode() & 0o7000 == 0
            && r.to_str().is_some()
    }

    /// Apply `change` to a fresh copy, undo collateral changes to directory
    /// mtimes, and check that every reported difference has one of the
    /// `tags` and at least one is reported.
    fn perturb(t: &TestDir, name: &str, tags: &[&str], change: impl FnOnce(&Path)) {
        let (e, a) = pair(t, name);
        compare_trees(&e, &a).unwrap();
        let dirs: Vec<(PathBuf, Timestamp)> = walk(&a)
            .into_iter()
            .filter(|(_, m)| m.is_dir())
            .map(|(r, m)| (a.join(r), Timestamp::new(m.mtime(), m.mtime_nsec() as u32)))
            .chain(std::iter::once((a.clone(), sys::mtime(&a).unwrap())))
            .collect();
        change(&a);
        for (d, ts) in dirs {
            if std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
                sys::set_mtime(&d, ts).unwrap();
            }
        }
        let diffs = compare_trees(&e, &a).expect_err(&format!("{name}: not reported"));
        for d in &diffs {
            assert!(
                tags.iter().any(|t| d.contains(&format!(": {t}: "))),
                "{name}: unexpected report {d:?} (all: {diffs:#?})"
            );
        }
    }

    /// Rewrite a file keeping its mtime.
    fn keep_mtime(p: &Path, f: impl FnOnce(&Path)) {
        let ts = sys::mtime(p).unwrap();
        f(p);
        sys::set_mtime(p, ts).unwrap();
    }

    #[test]
    fn identical_trees_compare_equal() {
        let t = TestDir::new("cmp-equal").unwrap();
        let (e, a) = pair(&t, "x");
        compare_trees(&e, &a).unwrap();
        compare_trees_with(&e, &a, &CompareOptions::mkfs_rootdir()).unwrap();
    }

    #[test]
    fn every_perturbation_is_reported() {
        let t = TestDir::new("cmp-perturb").unwrap();
        let root = sys::is_root();

        perturb(&t, "extra", &["unexpected"], |a| {
            std::fs::write(a.join("zzz-extra"), b"x").unwrap();
        });
        perturb(&t, "missing", &["missing"], |a| {
            std::fs::remove_file(find(a, plain_file)).unwrap();
        });
        perturb(&t, "type", &["type", "dir nlink"], |a| {
            let f = find(a, plain_file);
            std::fs::remove_file(&f).unwrap();
            std::fs::create_dir(&f).unwrap();
        });
        perturb(&t, "content", &["content"], |a| {
            let f = find(a, plain_file);
            keep_mtime(&f, |f| {
                let mut d = std::fs::read(f).unwrap();
                d[5] ^= 0x40;
                std::fs::write(f, d).unwrap();
            });
        });
        perturb(&t, "size", &["size"], |a| {
            let f = find(a, plain_file);
            keep_mtime(&f, |f| crate::generate::append(f, b"more").unwrap());
        });
        perturb(&t, "mode", &["mode"], |a| {
            let f = find(a, plain_file);
            let m = std::fs::metadata(&f).unwrap().mode();
            sys::chmod(&f, (m ^ 0o4001) & 0o7777).unwrap();
        });
        perturb(&t, "mtime sec", &["mtime sec"], |a| {
            let f = find(a, plain_file);
            let ts = sys::mtime(&f).unwrap();
            sys::set_mtime(&f, Timestamp::new(ts.sec + 1, ts.nsec)).unwrap();
        });
        perturb(&t, "mtime nsec", &["mtime nsec"], |a| {
            let f = find(a, |_, m| m.file_type().is_symlink());
            let ts = sys::mtime(&f).unwrap();
            let nsec = if ts.nsec == 0 { 1 } else { ts.nsec - 1 };
            sys::set_mtime(&f, Timestamp::new(ts.sec, nsec)).unwrap();
        });
        {
            // A directory's own mtime (perturb() restores those, so by hand).
            let (e, a) = pair(&t, "dir-mtime");
            let d = find(&a, |_, m| m.is_dir());
            let ts = sys::mtime(&d).unwrap();
            sys::set_mtime(&d, Timestamp::new(ts.sec - 10, ts.nsec)).unwrap();
            let diffs = compare_trees(&e, &a).unwrap_err();
            let rel = show_path(d.strip_prefix(&a).unwrap());
            assert_eq!(diffs.len(), 1, "{diffs:?}");
            assert!(
                diffs[0].starts_with(&format!("{rel}: mtime sec: ")),
                "{diffs:?}"
            );
        }
        perturb(&t, "symlink target", &["symlink target"], |a| {
            let l = find(a, |_, m| m.file_type().is_symlink());
            let old = std::fs::read_link(&l).unwrap().into_os_string().into_vec();
            let mut new = old.clone();
            let last = new.len() - 1;
            new[last] = if new[last] == b'q' { b'r' } else { b'q' };
            let m = std::fs::symlink_metadata(&l).unwrap();
            let xattrs = sys::xattrs(&l).unwrap();
            std::fs::remove_file(&l).unwrap();
            std::os::unix::fs::symlink(OsString::from_vec(new), &l).unwrap();
            for (n, v) in xattrs {
                sys::set_xattr(&l, n, &v).unwrap();
            }
            if sys::is_root() {
                sys::lchown(&l, m.uid(), m.gid()).unwrap();
            }
            sys::set_times(
                &l,
                Timestamp::new(m.atime(), 0),
                Timestamp::new(m.mtime(), m.mtime_nsec() as u32),
            )
            .unwrap();
        });
        perturb(&t, "xattr value", &["xattr"], |a| {
            let f = find(a, |_, m| m.is_file() && m.nlink() == 1);
            sys::set_xattr(&f, "user.binary", b"changed").unwrap();
        });
        perturb(&t, "xattr removed", &["xattr"], |a| {
            sys::remove_xattr(a, "user.empty").unwrap();
        });
        perturb(&t, "xattr added", &["xattr"], |a| {
            let d = find(a, |_, m| m.is_dir());
            sys::set_xattr(&d, "user.extra", b"").unwrap();
        });
        perturb(&t, "hard link broken", &["hard links", "nlink"], |a| {
            let f = find(a, |_, m| m.is_file() && m.nlink() > 1);
            let tmp = a.join("..").join("copy-tmp");
            crate::run_args("cp", ["-a", f.to_str().unwrap(), tmp.to_str().unwrap()]).unwrap();
            std::fs::rename(&tmp, &f).unwrap();
        });
        perturb(&t, "top-level mode", &["mode"], |a| {
            let m = std::fs::metadata(a).unwrap().mode();
            sys::chmod(a, (m ^ 0o1000) & 0o7777).unwrap();
        });

        if root {
            perturb(&t, "uid", &["uid"], |a| {
                let f = find(a, plain_file);
                let m = std::fs::metadata(&f).unwrap();
                sys::lchown(&f, m.uid() + 1, m.gid()).unwrap();
                sys::chmod(&f, m.mode() & 0o7777).unwrap();
            });
            perturb(&t, "gid", &["gid"], |a| {
                let f = find(a, |_, m| m.file_type().is_symlink());
                let m = std::fs::symlink_metadata(&f).unwrap();
                sys::lchown(&f, m.uid(), m.gid() ^ 1).unwrap();
            });
            perturb(&t, "rdev", &["rdev"], |a| {
                let d = find(a, |_, m| m.file_type().is_char_device());
                let m = std::fs::symlink_metadata(&d).unwrap();
                let xattrs = sys::xattrs(&d).unwrap();
                std::fs::remove_file(&d).unwrap();
                let (maj, min) = sys::major_minor(m.rdev());
                sys::mknod(&d, NodeKind::Char, m.mode(), sys::makedev(maj, min + 1)).unwrap();
                sys::lchown(&d, m.uid(), m.gid()).unwrap();
                sys::chmod(&d, m.mode() & 0o7777).unwrap();
                for (n, v) in xattrs {
                    sys::set_xattr(&d, n, &v).unwrap();
                }
                sys::set_times(
                    &d,
                    Timestamp::new(m.atime(), 0),
                    Timestamp::new(m.mtime(), m.mtime_nsec() as u32),
                )
                .unwrap();
            });
        }
    }

    #[test]
    fn options_switch_checks_off() {
        let t = TestDir::new("cmp-opts").unwrap();
        let (e, a) = pair(&t, "o");
        let f = find(&a, plain_file);
        let ts = sys::mtime(&f).unwrap();
        sys::set_mtime(&f, Timestamp::new(ts.sec, (ts.nsec + 1) % 1_000_000_000)).unwrap();
        let m = std::fs::metadata(&a).unwrap().mode();
        sys::chmod(&a, (m ^ 0o1000) & 0o7777).unwrap();
        sys::set_xattr(&f, "security.ubtrfs-test", b"v").ok();
        let all = compare_trees(&e, &a).unwrap_err();
        assert!(all.iter().any(|d| d.contains("mtime nsec")), "{all:?}");
        assert!(all.iter().any(|d| d.starts_with(".: mode")), "{all:?}");

        let opts = CompareOptions {
            mtime_nsec: false,
            top_level: false,
            ignore_xattrs: vec!["security.".into()],
            ..CompareOptions::strict()
        };
        compare_trees_with(&e, &a, &opts).unwrap();

        let rel = f.strip_prefix(&a).unwrap().to_path_buf();
        let opts = CompareOptions {
            top_level: false,
            ignore_xattrs: vec!["security.ubtrfs-test".into()],
            ignore_paths: vec![rel],
            ..CompareOptions::strict()
        };
        compare_trees_with(&e, &a, &opts).unwrap();
    }

    #[test]
    fn report_is_capped_and_paths_escaped() {
        let t = TestDir::new("cmp-cap").unwrap();
        let e = t.mkdir("e").unwrap();
        let a = t.mkdir("a").unwrap();
        for i in 0..20 {
            std::fs::write(e.join(format!("f{i}")), b"").unwrap();
        }
        std::fs::write(e.join(OsString::from_vec(b"n\xffx\n".to_vec())), b"").unwrap();
        let opts = CompareOptions {
            max_differences: 5,
            top_level: false,
            ..CompareOptions::strict()
        };
        let d = compare_trees_with(&e, &a, &opts).unwrap_err();
        assert_eq!(d.len(), 6, "{d:?}");
        assert!(d[5].contains("stopped after 5"));
        let d = compare_trees_with(
            &e,
            &a,
            &CompareOptions {
                top_level: false,
                ..CompareOptions::strict()
            },
        )
        .unwrap_err();
        assert!(
            d.iter().any(|x| x.starts_with("n\\xffx\\n: missing")),
            "{d:?}"
        );
    }
}

//! A deterministic generated source tree: every kind of file, name, link,
//! attribute and timestamp that btrfs has to store.

use crate::sys::{self, NodeKind, Timestamp};
use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, symlink};
use std::path::{Path, PathBuf};

/// A small, fast, deterministic pseudo-random generator (SplitMix64).
/// Same seed, same sequence, on every platform and Rust version.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        let span = hi - lo;
        if span == u64::MAX {
            return self.next_u64();
        }
        lo + self.next_u64() % (span + 1)
    }

    /// Uniform index in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }

    /// Fill `buf` with random (incompressible) bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

/// Deterministic bytes, `len` of them: a xorshift stream seeded with
/// `seed` (cheap, and a different stream from [`Rng`]'s).
pub fn xorshift_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Deterministic compressible data: text-like lines with a little
/// variation, `n` bytes, derived from `seed`.
pub fn compressible_bytes(seed: u64, n: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "extent",
        "inode",
        "subvolume",
        "checksum",
        "chunk",
        "stripe",
        "leaf",
        "node",
        "root",
        "generation",
        "transaction",
        "ordered",
        "delalloc",
        "reflink",
        "snapshot",
        "xattr",
    ];
    let mut rng = Rng::new(seed ^ 0x5eed_c0de);
    let mut out = Vec::with_capacity(n + 64);
    let mut line = 0u64;
    while out.len() < n {
        line += 1;
        out.extend_from_slice(format!("{line:08} ").as_bytes());
        for _ in 0..8 {
            out.extend_from_slice(rng.pick(WORDS).as_bytes());
            out.push(b' ');
        }
        out.push(b'\n');
    }
    out.truncate(n);
    out
}

/// What [`gen_tree`] creates. Counts are totals over the whole tree; every
/// entry goes into a randomly chosen directory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TreeSpec {
    /// Directories besides the top one.
    pub dirs: usize,
    /// Maximum nesting depth of those directories (1 = all in the top one).
    pub max_depth: usize,
    /// Zero-length regular files.
    pub empty_files: usize,
    /// Files of 1..2000 bytes (stored inline in the tree by btrfs).
    pub tiny_files: usize,
    /// Files of 4 KiB+1 .. 256 KiB with unaligned sizes.
    pub mid_files: usize,
    /// Files of `large_file_size` bytes, alternating compressible text,
    /// random bytes and written zeros in 128 KiB pieces.
    pub large_files: usize,
    /// Size of each large file.
    pub large_file_size: u64,
    /// Sparse files; they cycle through: hole at the start, hole in the
    /// middle, hole at the end, all hole, several holes with unaligned data.
    pub sparse_files: usize,
    /// Symbolic links (relative, absolute, dangling, to directories).
    pub symlinks: usize,
    /// If non-zero, one more symlink whose target is exactly this many
    /// bytes (at most 4095; btrfs stores it inline, so see
    /// [`max_symlink_len`] for small node sizes).
    pub long_symlink_len: usize,
    /// Groups of 2 or 3 hard links to one file, often across directories.
    pub hardlink_groups: usize,
    /// Fifos.
    pub fifos: usize,
    /// Character and block device nodes, alternating, plus one socket node
    /// (root only; skipped otherwise).
    pub device_nodes: usize,
    /// `user.*` xattrs: binary values, empty values, many on one file,
    /// on files and directories.
    pub xattrs: bool,
    /// Also `security.*` and `trusted.*` xattrs, where allowed (on symlinks
    /// too); silently skipped where the kernel refuses them.
    pub system_xattrs: bool,
    /// 255-byte names (a file and a directory, ASCII and multi-byte UTF-8).
    pub long_names: bool,
    /// Names with bytes that are not UTF-8.
    pub non_utf8_names: bool,
    /// Modes with setuid, setgid and sticky bits and unusual permissions.
    pub special_modes: bool,
    /// Various uids and gids (root only; skipped otherwise).
    pub owners: bool,
    /// Deterministic atime and mtime with nanoseconds on every entry,
    /// including directories, symlinks and the top directory, set last.
    /// When false, times are whatever creation left.
    pub times: bool,
}

impl Default for TreeSpec {
    /// A medium tree: every feature on, a few MiB in total.
    fn default() -> Self {
        TreeSpec {
            dirs: 24,
            max_depth: 5,
            empty_files: 8,
            tiny_files: 40,
            mid_files: 12,
            large_files: 2,
            large_file_size: 3 << 20,
            sparse_files: 5,
            symlinks: 12,
            long_symlink_len: 4095,
            hardlink_groups: 5,
            fifos: 2,
            device_nodes: 4,
            xattrs: true,
            system_xattrs: true,
            long_names: true,
            non_utf8_names: true,
            special_modes: true,
            owners: true,
            times: true,
        }
    }
}

impl TreeSpec {
    /// A small tree with every feature but large files: fast enough for
    /// unit tests.
    pub fn small() -> Self {
        TreeSpec {
            dirs: 6,
            max_depth: 3,
            empty_files: 2,
            tiny_files: 8,
            mid_files: 3,
            large_files: 0,
            sparse_files: 5,
            symlinks: 5,
            hardlink_groups: 2,
            fifos: 1,
            device_nodes: 2,
            ..TreeSpec::default()
        }
    }

    /// Caps [`TreeSpec::long_symlink_len`] at what a filesystem with this
    /// node size can store (see [`max_symlink_len`]).
    pub fn for_nodesize(mut self, nodesize: u32) -> Self {
        self.long_symlink_len = self.long_symlink_len.min(max_symlink_len(nodesize));
        self
    }
}

/// The longest symlink target btrfs can store with this node size: the
/// target is an inline extent, so it must fit in one leaf item (header 101
/// bytes, item 25 bytes, inline extent header 21 bytes), and the VFS limit
/// is 4095.
pub fn max_symlink_len(nodesize: u32) -> usize {
    (nodesize as usize).saturating_sub(101 + 25 + 21).min(4095)
}

/// What [`gen_tree`] made.
#[derive(Clone, Debug, Default)]
pub struct GenSummary {
    /// Paths of all entries created, relative to the top directory.
    pub entries: Vec<PathBuf>,
    /// Bytes of regular file data (apparent sizes).
    pub bytes: u64,
    /// Things the spec asked for that could not be made here (no root, an
    /// xattr namespace refused, ...).
    pub skipped: Vec<String>,
}

struct Gen<'a> {
    top: &'a Path,
    rng: Rng,
    spec: &'a TreeSpec,
    root: bool,
    dirs: Vec<(PathBuf, usize)>, // relative path, depth
    files: Vec<PathBuf>,         // regular files (for link targets, xattrs)
    out: GenSummary,
    serial: usize,
}

/// Build a deterministic tree in `dir` (created if missing; must be empty)
/// from `seed` and `spec`. The same seed and spec give the same names,
/// contents, links, modes, owners, xattrs and times. Needs root for
/// device nodes and owners (skipped otherwise, see
/// [`GenSummary::skipped`]).
pub fn gen_tree(dir: &Path, seed: u64, spec: &TreeSpec) -> Result<GenSummary> {
    std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    if std::fs::read_dir(dir)?.next().is_some() {
        bail!("gen_tree: {} is not empty", dir.display());
    }
    let mut g = Gen {
        top: dir,
        rng: Rng::new(seed),
        spec,
        root: sys::is_root(),
        dirs: vec![(PathBuf::new(), 0)],
        files: Vec::new(),
        out: GenSummary::default(),
        serial: 0,
    };
    // Each phase draws from its own generator, so a phase that does less
    // (not root, say) leaves the others unchanged.
    let phase = |n: u64| Rng::new(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    g.make_dirs()?;
    g.rng = phase(1);
    g.make_files()?;
    g.rng = phase(2);
    g.make_links()?;
    g.rng = phase(3);
    g.make_special()?;
    g.rng = phase(4);
    g.make_names()?;
    g.rng = phase(5);
    g.make_owners_and_modes()?;
    g.rng = phase(6);
    g.make_xattrs()?;
    g.rng = phase(7);
    g.make_times()?;
    Ok(g.out)
}

impl Gen<'_> {
    fn abs(&self, rel: &Path) -> PathBuf {
        self.top.join(rel)
    }

    /// A fresh name: a prefix, a serial number (for uniqueness) and a random
    /// tail of variable length.
    fn name(&mut self, prefix: &str) -> OsString {
        self.serial += 1;
        let tail_len = self.rng.range(0, 12) as usize;
        let tail: String = (0..tail_len)
            .map(|_| *self.rng.pick(b"abcdefghijklmnopqrstuvwxyz0123456789_-.") as char)
            .collect();
        OsString::from(format!("{prefix}{:04}{tail}", self.serial))
    }

    fn random_dir(&mut self) -> PathBuf {
        let i = self.rng.below(self.dirs.len());
        self.dirs[i].0.clone()
    }

    fn record(&mut self, rel: &Path) {
        self.out.entries.push(rel.to_path_buf());
    }

    fn make_dirs(&mut self) -> Result<()> {
        let max_depth = self.spec.max_depth.max(1);
        for _ in 0..self.spec.dirs {
            let parents: Vec<usize> = (0..self.dirs.len())
                .filter(|&i| self.dirs[i].1 < max_depth)
                .collect();
            let p = *self.rng.pick(&parents);
            let (parent, depth) = self.dirs[p].clone();
            let rel = parent.join(self.name("d"));
            std::fs::create_dir(self.abs(&rel))
                .with_context(|| format!("mkdir {}", rel.display()))?;
            self.record(&rel);
            self.dirs.push((rel, depth + 1));
        }
        Ok(())
    }

    fn new_file(&mut self, prefix: &str) -> Result<(PathBuf, File)> {
        let rel = self.random_dir().join(self.name(prefix));
        let f =
            File::create(self.abs(&rel)).with_context(|| format!("create {}", rel.display()))?;
        self.record(&rel);
        self.files.push(rel.clone());
        Ok((rel, f))
    }

    fn make_files(&mut self) -> Result<()> {
        for _ in 0..self.spec.empty_files {
            self.new_file("empty")?;
        }
        for _ in 0..self.spec.tiny_files {
            let (_, mut f) = self.new_file("tiny")?;
            let n = self.rng.range(1, 1999) as usize;
            let data = if self.rng.chance(1, 2) {
                compressible_bytes(self.rng.next_u64(), n)
            } else {
                self.rng.bytes(n)
            };
            f.write_all(&data)?;
            self.out.bytes += n as u64;
        }
        for _ in 0..self.spec.mid_files {
            let (_, mut f) = self.new_file("mid")?;
            let n = self.rng.range(4097, 256 << 10) as usize;
            let data = if self.rng.chance(1, 2) {
                compressible_bytes(self.rng.next_u64(), n)
            } else {
                self.rng.bytes(n)
            };
            f.write_all(&data)?;
            self.out.bytes += n as u64;
        }
        for _ in 0..self.spec.large_files {
            let (_, mut f) = self.new_file("large")?;
            let size = self.spec.large_file_size;
            let mut off = 0u64;
            let mut piece = 0u64;
            while off < size {
                let n = (128u64 << 10).min(size - off) as usize;
                let data = match piece % 3 {
                    0 => compressible_bytes(self.rng.next_u64(), n),
                    1 => self.rng.bytes(n),
                    _ => vec![0; n],
                };
                f.write_all(&data)?;
                off += n as u64;
                piece += 1;
            }
            // An unaligned tail.
            let tail = self.rng.range(1, 4095) as usize;
            f.write_all(&self.rng.bytes(tail))?;
            self.out.bytes += size + tail as u64;
        }
        for i in 0..self.spec.sparse_files {
            let (_, f) = self.new_file("sparse")?;
            let len = self.make_sparse(&f, i % 5)?;
            self.out.bytes += len;
        }
        Ok(())
    }

    /// Writes one sparse layout; returns the file size.
    fn make_sparse(&mut self, f: &File, layout: usize) -> Result<u64> {
        const MIB: u64 = 1 << 20;
        let data = self.rng.bytes(70_000);
        let size = match layout {
            // Hole at the start.
            0 => {
                f.write_all_at(&data[..8192], 2 * MIB)?;
                2 * MIB + 8192
            }
            // Hole in the middle.
            1 => {
                f.write_all_at(&data[..5000], 0)?;
                f.write_all_at(&data[5000..20000], 3 * MIB + 100)?;
                3 * MIB + 15100
            }
            // Hole at the end.
            2 => {
                f.write_all_at(&data[..12288], 0)?;
                f.set_len(5 * MIB)?;
                5 * MIB
            }
            // Nothing but a hole.
            3 => {
                f.set_len(7 * MIB + 123)?;
                7 * MIB + 123
            }
            // Several unaligned data islands, then a hole at the end.
            _ => {
                f.write_all_at(&data[..100], 10)?;
                f.write_all_at(&data[100..40100], 300_001)?;
                f.write_all_at(&data[40100..70000], MIB + 4095)?;
                f.set_len(2 * MIB + 1)?;
                2 * MIB + 1
            }
        };
        Ok(size)
    }

    fn make_links(&mut self) -> Result<()> {
        // Symlinks.
        const ABS: &[&str] = &["/", "/etc/passwd", "/nonexistent/target", "/usr/bin/../lib"];
        for i in 0..self.spec.symlinks {
            let dir = self.random_dir();
            let rel = dir.join(self.name("sl"));
            let target: PathBuf = match i % 4 {
                0 if !self.files.is_empty() => {
                    // Relative path to an existing file, from this directory.
                    let t = self.rng.pick(&self.files).clone();
                    let ups = dir.components().count();
                    let mut p = PathBuf::new();
                    for _ in 0..ups {
                        p.push("..");
                    }
                    p.join(t)
                }
                1 => PathBuf::from(*self.rng.pick(ABS)),
                2 => PathBuf::from(format!("dangling-{}", self.rng.range(0, 999))),
                _ => PathBuf::from("."),
            };
            symlink(&target, self.abs(&rel))
                .with_context(|| format!("symlink {}", rel.display()))?;
            self.record(&rel);
        }
        if self.spec.long_symlink_len > 0 {
            let n = self.spec.long_symlink_len.min(4095);
            let rel = self.random_dir().join(self.name("longlink"));
            // Components of at most 200 bytes joined by '/'.
            let mut t = Vec::with_capacity(n);
            while t.len() < n {
                if !t.is_empty() && t.len() % 201 == 200 {
                    t.push(b'/');
                } else {
                    t.push(b'a' + (t.len() % 26) as u8);
                }
            }
            if t.last() == Some(&b'/') {
                t.pop();
                t.push(b'z');
            }
            symlink(OsString::from_vec(t), self.abs(&rel))
                .with_context(|| format!("symlink {}", rel.display()))?;
            self.record(&rel);
        }
        // Hard link groups.
        for _ in 0..self.spec.hardlink_groups {
            let (first, mut f) = self.new_file("hl")?;
            let n = self.rng.range(1, 6000) as usize;
            f.write_all(&self.rng.bytes(n))?;
            self.out.bytes += n as u64;
            let extra = self.rng.range(1, 2);
            for _ in 0..extra {
                let rel = self.random_dir().join(self.name("hl"));
                std::fs::hard_link(self.abs(&first), self.abs(&rel))
                    .with_context(|| format!("link {}", rel.display()))?;
                self.record(&rel);
            }
        }
        Ok(())
    }

    fn make_special(&mut self) -> Result<()> {
        for _ in 0..self.spec.fifos {
            let rel = self.random_dir().join(self.name("fifo"));
            sys::mkfifo(&self.abs(&rel), 0o644)
                .with_context(|| format!("mkfifo {}", rel.display()))?;
            self.record(&rel);
        }
        if self.spec.device_nodes == 0 {
            return Ok(());
        }
        if !self.root {
            self.out.skipped.push("device nodes (not root)".into());
            return Ok(());
        }
        // Majors below 4096 and minors below 2^20: the range of the kernel's
        // device number encoding.
        const DEVS: &[(u32, u32)] = &[(1, 3), (7, 200), (259, 70_000), (4095, 0xfffff), (8, 0)];
        for i in 0..self.spec.device_nodes {
            let (major, minor) = DEVS[i % DEVS.len()];
            let (kind, prefix) = if i % 2 == 0 {
                (NodeKind::Char, "chr")
            } else {
                (NodeKind::Block, "blk")
            };
            let rel = self.random_dir().join(self.name(prefix));
            sys::mknod(&self.abs(&rel), kind, 0o640, sys::makedev(major, minor))
                .with_context(|| format!("mknod {}", rel.display()))?;
            self.record(&rel);
        }
        let rel = self.random_dir().join(self.name("sock"));
        sys::mknod(&self.abs(&rel), NodeKind::Socket, 0o755, 0)
            .with_context(|| format!("mknod {}", rel.display()))?;
        self.record(&rel);
        Ok(())
    }

    fn make_names(&mut self) -> Result<()> {
        if self.spec.long_names {
            // 255 ASCII bytes: a file with data.
            let name: String = (0..255).map(|i| (b'A' + (i % 26) as u8) as char).collect();
            let rel = self.random_dir().join(&name);
            std::fs::write(self.abs(&rel), b"long name\n")?;
            self.record(&rel);
            self.files.push(rel);
            // 255 bytes of multi-byte UTF-8: 85 three-byte characters, a dir
            // with a file in it.
            let name: String = std::iter::repeat_n('\u{20ac}', 85).collect();
            assert_eq!(name.len(), 255);
            let rel = self.random_dir().join(&name);
            std::fs::create_dir(self.abs(&rel))?;
            self.record(&rel);
            let inner = rel.join("inside");
            std::fs::write(self.abs(&inner), b"in a long-named dir\n")?;
            self.record(&inner);
            self.dirs.push((rel, usize::MAX));
        }
        if self.spec.non_utf8_names {
            let rel = self
                .random_dir()
                .join(OsString::from_vec(b"bad-\xff\xfe-\x80name".to_vec()));
            std::fs::write(self.abs(&rel), b"latin1 \xe9t\xe9\n")?;
            self.record(&rel);
            self.files.push(rel);
            let rel = self
                .random_dir()
                .join(OsString::from_vec(b"dir-\xc3\x28-\xa0".to_vec()));
            std::fs::create_dir(self.abs(&rel))?;
            self.record(&rel);
            let inner = rel.join(OsString::from_vec(b"\xf0\x28\x8c\xbc".to_vec()));
            std::fs::write(self.abs(&inner), b"")?;
            self.record(&inner);
            // Names with spaces, a newline, a leading dash, a backslash.
            for n in ["with space", "new\nline", "-dash", "back\\slash"] {
                let rel = self.random_dir().join(n);
                if self.abs(&rel).symlink_metadata().is_err() {
                    std::fs::write(self.abs(&rel), n.as_bytes())?;
                    self.record(&rel);
                }
            }
        }
        Ok(())
    }

    fn make_owners_and_modes(&mut self) -> Result<()> {
        const IDS: &[u32] = &[0, 1, 1000, 65534, 123_456, 4_294_967_294];
        const FILE_MODES: &[u32] = &[
            0o644, 0o600, 0o755, 0o4755, 0o2755, 0o6711, 0o1644, 0o7777, 0o000, 0o444,
        ];
        const DIR_MODES: &[u32] = &[0o755, 0o700, 0o1777, 0o2775, 0o3770];
        let entries = self.out.entries.clone();
        if self.spec.owners && !self.root {
            self.out.skipped.push("owners (not root)".into());
        }
        for rel in &entries {
            let p = self.abs(rel);
            let m = std::fs::symlink_metadata(&p)?;
            if self.spec.owners && self.root && self.rng.chance(2, 3) {
                let uid = *self.rng.pick(IDS);
                let gid = *self.rng.pick(IDS);
                sys::lchown(&p, uid, gid).with_context(|| format!("lchown {}", rel.display()))?;
            }
            // chown clears setuid/setgid, so modes come after owners.
            if self.spec.special_modes && !m.file_type().is_symlink() && self.rng.chance(1, 2) {
                let mode = if m.is_dir() {
                    *self.rng.pick(DIR_MODES)
                } else {
                    *self.rng.pick(FILE_MODES)
                };
                sys::chmod(&p, mode).with_context(|| format!("chmod {}", rel.display()))?;
            }
        }
        Ok(())
    }

    fn make_xattrs(&mut self) -> Result<()> {
        let entries = self.out.entries.clone();
        if self.spec.xattrs {
            // Values are drawn before any is set, so that a refusal never
            // changes what comes next.
            let mut plan: Vec<(PathBuf, &'static str, Vec<u8>)> = Vec::new();
            let mut targets: Vec<PathBuf> = Vec::new();
            for rel in &entries {
                let m = std::fs::symlink_metadata(self.abs(rel))?;
                // user.* is only allowed on regular files and directories.
                if (m.is_file() || m.is_dir()) && self.rng.chance(1, 4) {
                    targets.push(rel.clone());
                }
            }
            targets.push(PathBuf::new()); // the top directory
            for (i, rel) in targets.iter().enumerate() {
                let n = self.rng.range(1, 64) as usize;
                plan.push((rel.clone(), "user.binary", self.rng.bytes(n)));
                plan.push((rel.clone(), "user.empty", Vec::new()));
                plan.push((rel.clone(), "user.nul", b"a\0b\0".to_vec()));
                if i % 3 == 0 {
                    let n = self.rng.range(200, 1000) as usize;
                    plan.push((rel.clone(), "user.medium", self.rng.bytes(n)));
                }
            }
            for (rel, name, value) in &plan {
                if let Err(e) = sys::set_xattr(&self.abs(rel), name, value) {
                    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                        self.out.skipped.push(format!("user xattrs: {e}"));
                        break;
                    }
                    return Err(e).with_context(|| format!("{name} on {}", rel.display()));
                }
            }
            // Many xattrs on a file of their own, with names of varied
            // length (kept under 3 KiB in total, so that ext4 can hold the
            // source tree too).
            if !self
                .out
                .skipped
                .iter()
                .any(|s| s.starts_with("user xattrs"))
            {
                let rel = self.random_dir().join(self.name("xattrs"));
                std::fs::write(self.abs(&rel), b"many xattrs\n")?;
                for k in 0..24 {
                    let name = format!("user.many.{k:03}.{}", "x".repeat(k));
                    let v = self.rng.bytes(30 + k * 2);
                    sys::set_xattr(&self.abs(&rel), &name, &v)
                        .with_context(|| format!("{name} on {}", rel.display()))?;
                }
                // Recorded last: the modes and owners phase is over, and
                // times are set from the entry list.
                self.record(&rel);
            }
        }
        if self.spec.system_xattrs {
            let mut plan = Vec::new();
            for rel in &entries {
                if self.rng.chance(1, 6) {
                    plan.push((rel.clone(), self.rng.bytes(16)));
                }
            }
            for (rel, v) in plan {
                for name in ["security.ubtrfs", "trusted.ubtrfs"] {
                    if let Err(e) = sys::set_xattr(&self.abs(&rel), name, &v) {
                        self.out
                            .skipped
                            .push(format!("{name} on {}: {e}", rel.display()));
                    }
                }
            }
        }
        Ok(())
    }

    fn make_times(&mut self) -> Result<()> {
        if !self.spec.times {
            return Ok(());
        }
        // Before 1970, after 2038, and ordinary times, with nanoseconds.
        const SECS: &[(i64, i64)] = &[
            (-1_000_000, -1),
            (0, 0),
            (1_000_000_000, 1_700_000_000),
            (2_200_000_000, 4_102_444_800),
        ];
        let mut entries = self.out.entries.clone();
        entries.push(PathBuf::new());
        for rel in &entries {
            let &(lo, hi) = self.rng.pick(SECS);
            let span = (hi - lo) as u64;
            let sec = lo + self.rng.range(0, span) as i64;
            let nsec = self.rng.range(0, 999_999_999) as u32;
            let asec = 1_600_000_000 + self.rng.range(0, 1 << 20) as i64;
            let ansec = self.rng.range(0, 999_999_999) as u32;
            sys::set_times(
                &self.abs(rel),
                Timestamp::new(asec, ansec),
                Timestamp::new(sec, nsec),
            )
            .with_context(|| format!("utimensat {}", rel.display()))?;
        }
        Ok(())
    }
}

/// Append `data` at the end of the file at `path` (helper for populate
/// functions and tests).
pub fn append(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    f.seek(SeekFrom::End(0))?;
    f.write_all(data)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestDir;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn rng_is_deterministic() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let va: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(Rng::new(43).next_u64(), va[0]);
        for _ in 0..1000 {
            let v = a.range(5, 9);
            assert!((5..=9).contains(&v));
        }
    }

    #[test]
    fn compressible_is_compressible_and_deterministic() {
        let a = compressible_bytes(1, 100_000);
        assert_eq!(a, compressible_bytes(1, 100_000));
        assert_eq!(a.len(), 100_000);
        let distinct: std::collections::HashSet<&[u8]> = a.split(|&b| b == b' ').collect();
        assert!(distinct.len() < 20_000);
    }

    #[test]
    fn max_symlink_lengths() {
        assert_eq!(max_symlink_len(4096), 3949);
        assert_eq!(max_symlink_len(16384), 4095);
        assert_eq!(max_symlink_len(65536), 4095);
    }

    #[test]
    fn gen_tree_makes_everything_deterministically() {
        let t = TestDir::new("gen-unit").unwrap();
        let a = t.join("a");
        let b = t.join("b");
        let sa = gen_tree(&a, 7, &TreeSpec::small()).unwrap();
        let sb = gen_tree(&b, 7, &TreeSpec::small()).unwrap();
        assert_eq!(sa.entries, sb.entries);
        assert_eq!(sa.bytes, sb.bytes);
        crate::compare_trees(&a, &b).unwrap_or_else(|d| panic!("{d:#?}"));

        // Kinds present.
        let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
        let mut max_name = 0;
        let mut non_utf8 = false;
        let mut long_link = 0;
        for rel in &sa.entries {
            let p = a.join(rel);
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            use std::os::unix::fs::FileTypeExt;
            let k = if ft.is_dir() {
                "dir"
            } else if ft.is_symlink() {
                long_link = long_link.max(std::fs::read_link(&p).unwrap().as_os_str().len());
                "symlink"
            } else if ft.is_fifo() {
                "fifo"
            } else if ft.is_char_device() {
                "chr"
            } else if ft.is_block_device() {
                "blk"
            } else if ft.is_socket() {
                "sock"
            } else if m.nlink() > 1 {
                "hardlink"
            } else {
                "file"
            };
            *kinds.entry(k).or_default() += 1;
            let name = rel.file_name().unwrap();
            max_name = max_name.max(name.len());
            non_utf8 |= name.to_str().is_none();
        }
        for k in ["dir", "symlink", "fifo", "hardlink", "file"] {
            assert!(kinds.contains_key(k), "no {k}: {kinds:?}");
        }
        if sys::is_root() {
            for k in ["chr", "blk", "sock"] {
                assert!(kinds.contains_key(k), "no {k}: {kinds:?}");
            }
        }
        assert_eq!(max_name, 255);
        assert!(non_utf8);
        assert_eq!(long_link, 4095);

        // A different seed gives a different tree.
        let c = t.join("c");
        gen_tree(&c, 8, &TreeSpec::small()).unwrap();
        assert!(crate::compare_trees(&a, &c).is_err());

        // Not into a non-empty directory.
        assert!(gen_tree(&a, 7, &TreeSpec::small()).is_err());
    }

    #[test]
    fn sparse_files_are_sparse() {
        let t = TestDir::new("gen-sparse").unwrap();
        let spec = TreeSpec {
            dirs: 0,
            empty_files: 0,
            tiny_files: 0,
            mid_files: 0,
            sparse_files: 5,
            symlinks: 0,
            long_symlink_len: 0,
            hardlink_groups: 0,
            fifos: 0,
            device_nodes: 0,
            xattrs: false,
            system_xattrs: false,
            long_names: false,
            non_utf8_names: false,
            ..TreeSpec::small()
        };
        let s = gen_tree(t.path(), 1, &spec).unwrap();
        assert_eq!(s.entries.len(), 5);
        for rel in &s.entries {
            let m = std::fs::metadata(t.join(rel)).unwrap();
            assert!(
                m.blocks() * 512 < m.len(),
                "{} not sparse: {} blocks, {} bytes",
                rel.display(),
                m.blocks(),
                m.len()
            );
        }
    }
}

//! Corpus images: made by `mkfs.btrfs --rootdir` and by the kernel
//! through a loop mount, built fresh into a test's directory or shared
//! through an on-disk cache.
//!
//! # What `mkfs.btrfs --rootdir` keeps (btrfs-progs 6.2)
//!
//! Found empirically (and checked by `tests/corpus.rs`): it keeps names
//! (255 bytes, non-UTF-8), file contents, sizes, all 12 mode bits, uid,
//! gid, symlink targets, hard links (one inode, right link count, across
//! directories), fifos, sockets, device node *types*, and xattrs (`user.*`,
//! `security.*`, `trusted.*`, empty and binary values). It does **not**
//! keep: mtime nanoseconds (truncated to 0), device numbers (`rdev` is
//! stored as 0), holes (sparse files become fully allocated zeros), and the
//! top directory's own mode, owner, times and xattrs (mkfs makes its own
//! root directory). It refuses several devices (`-r` is "limited to a
//! single device"), has no `--compress` or reflink options, and symlinks
//! longer than about 4000 bytes break it: a 4095-byte target gives an
//! image that `btrfs check` rejects ("inline file extent too large"), and
//! with 4 KiB nodes a 3949-byte target (which the kernel accepts) crashes
//! mkfs. [`TreeSpec::for_rootdir`]
//! keeps generated trees inside these limits.

use crate::cmd::{command, run};
use crate::generate::{TreeSpec, gen_tree, max_symlink_len};
use crate::loopdev::Loop;
use crate::mount::Mount;
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Data and metadata checksum algorithm (`mkfs.btrfs --csum`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Csum {
    /// CRC32C, 4 bytes (the default).
    Crc32c,
    /// xxHash64, 8 bytes.
    Xxhash,
    /// SHA-256, 32 bytes.
    Sha256,
    /// BLAKE2b-256, 32 bytes.
    Blake2,
}

impl Csum {
    /// All algorithms.
    pub const ALL: [Csum; 4] = [Csum::Crc32c, Csum::Xxhash, Csum::Sha256, Csum::Blake2];

    /// The name `mkfs.btrfs --csum` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Csum::Crc32c => "crc32c",
            Csum::Xxhash => "xxhash",
            Csum::Sha256 => "sha256",
            Csum::Blake2 => "blake2",
        }
    }
}

/// Block group profile (`mkfs.btrfs -m/-d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Profile {
    /// One copy.
    Single,
    /// Two copies on one device.
    Dup,
    /// Striped.
    Raid0,
    /// Two copies on two devices.
    Raid1,
    /// Three copies.
    Raid1c3,
    /// Four copies.
    Raid1c4,
    /// Striped mirrors.
    Raid10,
}

impl Profile {
    /// The name `mkfs.btrfs` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "dup",
            Profile::Raid0 => "raid0",
            Profile::Raid1 => "raid1",
            Profile::Raid1c3 => "raid1c3",
            Profile::Raid1c4 => "raid1c4",
            Profile::Raid10 => "raid10",
        }
    }

    /// Devices the corpus uses for this profile (the minimum mkfs accepts,
    /// 4 for RAID10).
    pub fn devices(self) -> usize {
        match self {
            Profile::Single | Profile::Dup => 1,
            Profile::Raid0 | Profile::Raid1 => 2,
            Profile::Raid1c3 => 3,
            Profile::Raid1c4 | Profile::Raid10 => 4,
        }
    }
}

/// Options for `mkfs.btrfs`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MkfsOptions {
    /// `--csum`.
    pub csum: Csum,
    /// `-n`: 4096 to 65536, a power of two, at least the sector size.
    pub nodesize: u32,
    /// `-s`: 4096 (the page size; other sizes may not mount).
    pub sectorsize: u32,
    /// `-m`.
    pub metadata: Profile,
    /// `-d`.
    pub data: Profile,
    /// Number of image files (devices).
    pub devices: usize,
    /// Size of each image file (sparse). mkfs needs at least 109 MiB for
    /// one device (dup metadata; 114294784 bytes with 64 KiB nodes) and
    /// 125 MiB (131072000 bytes) per device with several.
    pub device_size: u64,
    /// `-M`: mixed data and metadata block groups (needs nodesize ==
    /// sectorsize and equal profiles).
    pub mixed: bool,
    /// `-O`: features, e.g. `"^no-holes"` for explicit hole extents.
    pub features: Vec<String>,
    /// `-L`.
    pub label: Option<String>,
}

impl Default for MkfsOptions {
    /// crc32c, 16 KiB nodes, 4 KiB sectors, DUP metadata, single data, one
    /// 256 MiB device: what `mkfs.btrfs` does by default.
    fn default() -> Self {
        MkfsOptions {
            csum: Csum::Crc32c,
            nodesize: 16384,
            sectorsize: 4096,
            metadata: Profile::Dup,
            data: Profile::Single,
            devices: 1,
            device_size: 256 << 20,
            mixed: false,
            features: Vec::new(),
            label: None,
        }
    }
}

impl MkfsOptions {
    /// Default options with another checksum.
    pub fn with_csum(csum: Csum) -> Self {
        MkfsOptions {
            csum,
            ..Self::default()
        }
    }

    /// Default options with another node size.
    pub fn with_nodesize(nodesize: u32) -> Self {
        MkfsOptions {
            nodesize,
            ..Self::default()
        }
    }

    /// `profile` for data and metadata on [`Profile::devices`] devices of
    /// 160 MiB.
    pub fn multi(profile: Profile) -> Self {
        MkfsOptions {
            metadata: profile,
            data: profile,
            devices: profile.devices(),
            device_size: 160 << 20,
            ..Self::default()
        }
    }

    /// The `mkfs.btrfs` arguments, without devices and `--rootdir`.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "-f".to_string(),
            "-q".into(),
            "--csum".into(),
            self.csum.as_str().into(),
            "-n".into(),
            self.nodesize.to_string(),
            "-s".into(),
            self.sectorsize.to_string(),
            "-m".into(),
            self.metadata.as_str().into(),
            "-d".into(),
            self.data.as_str().into(),
        ];
        if self.mixed {
            a.push("-M".into());
        }
        if !self.features.is_empty() {
            a.push("-O".into());
            a.push(self.features.join(","));
        }
        if let Some(l) = &self.label {
            a.push("-L".into());
            a.push(l.clone());
        }
        a
    }

    /// A short name for file names and messages, e.g.
    /// `crc32c-n16k-dup-single-1x256m`.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{}-n{}k-{}-{}-{}x{}m",
            self.csum.as_str(),
            self.nodesize / 1024,
            self.metadata.as_str(),
            self.data.as_str(),
            self.devices,
            self.device_size >> 20
        );
        if self.sectorsize != 4096 {
            s.push_str(&format!("-s{}", self.sectorsize));
        }
        if self.mixed {
            s.push_str("-mixed");
        }
        for f in &self.features {
            s.push('-');
            s.push_str(&f.replace('^', "no_"));
        }
        s
    }
}

impl TreeSpec {
    /// This spec limited to what `mkfs.btrfs --rootdir` (6.2) stores
    /// correctly with these options: symlink targets of at most 4000 bytes,
    /// and one byte less than the kernel allows for the node size (3948
    /// with 4 KiB nodes).
    pub fn for_rootdir(mut self, opts: &MkfsOptions) -> Self {
        self.long_symlink_len = self
            .long_symlink_len
            .min(4000)
            .min(max_symlink_len(opts.nodesize) - 1);
        self
    }
}

/// Options for [`kernel_image`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelImageOptions {
    /// How to make the empty filesystem.
    pub mkfs: MkfsOptions,
    /// Mount options while populating, e.g. `compress-force=zstd`.
    pub mount_options: String,
}

/// How an [`Image`] was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builder {
    /// `mkfs.btrfs --rootdir`.
    MkfsRootdir,
    /// `mkfs.btrfs`, then written by the kernel through a loop mount.
    Kernel,
}

/// A btrfs filesystem in one or more image files.
#[derive(Clone, Debug)]
pub struct Image {
    /// The image files, devid order (device 1 first).
    pub devices: Vec<PathBuf>,
    /// The source tree it was made from, when there is one.
    pub source: Option<PathBuf>,
    /// The mkfs options.
    pub mkfs: MkfsOptions,
    /// Mount options it was populated with (kernel images).
    pub mount_options: String,
    /// How it was made.
    pub builder: Builder,
}

impl Image {
    /// The first device.
    pub fn path(&self) -> &Path {
        &self.devices[0]
    }

    /// Mount with the kernel on `target` (see [`Mount::new`]). Use `"ro"`
    /// for shared (cached) images: it attaches the loop devices read-only.
    pub fn mount(&self, target: &Path, options: &str) -> Result<Mount> {
        Mount::new(&self.devices, target, options)
    }

    /// `btrfs check --readonly` (see [`btrfs_check`]).
    pub fn check(&self) -> Result<String> {
        btrfs_check(self)
    }
}

/// `mkfs.btrfs --version`, e.g. `mkfs.btrfs, part of btrfs-progs v6.2`.
pub fn mkfs_version() -> Result<String> {
    Ok(run(command("mkfs.btrfs").arg("--version"))?
        .trim()
        .to_string())
}

/// Run `mkfs.btrfs` with `opts` on `devices`, creating them as sparse files
/// of `opts.device_size` (existing files are truncated and re-extended),
/// with `--rootdir rootdir` if given. Returns mkfs's output.
pub fn mkfs(devices: &[PathBuf], opts: &MkfsOptions, rootdir: Option<&Path>) -> Result<String> {
    if devices.len() != opts.devices {
        bail!(
            "mkfs: {} image files for {} devices",
            devices.len(),
            opts.devices
        );
    }
    for d in devices {
        crate::tmp::sparse_file(d, opts.device_size)?;
    }
    let mut cmd = command("mkfs.btrfs");
    cmd.args(opts.args());
    if let Some(r) = rootdir {
        cmd.arg("--rootdir").arg(r);
    }
    cmd.args(devices);
    run(&mut cmd).with_context(|| format!("mkfs.btrfs {}", opts.label()))
}

/// A fresh sparse image file of `size` bytes at `img`, made by
/// `mkfs.btrfs -q -f ARGS IMG`: the tool's defaults but for `args`, and no
/// root needed (nothing is mounted).
pub fn mkfs_file(img: &Path, size: u64, args: &[&str]) -> Result<()> {
    crate::tmp::sparse_file(img, size)?;
    run(command("mkfs.btrfs").args(["-q", "-f"]).args(args).arg(img))?;
    Ok(())
}

/// `n` fresh sparse images `DIR/devI.img` of `size` bytes each, made into
/// one filesystem by `mkfs.btrfs -q -f ARGS`; the kernel then mounts it on
/// `DIR/mnt` and writes `files` (absolute path, content) into it. Needs
/// root.
pub fn mkfs_devices_with_files(
    dir: &Path,
    n: usize,
    size: u64,
    args: &[&str],
    files: &[(String, Vec<u8>)],
) -> Result<Vec<PathBuf>> {
    let imgs: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("dev{i}.img"))).collect();
    for img in &imgs {
        crate::tmp::sparse_file(img, size)?;
    }
    run(command("mkfs.btrfs")
        .args(["-q", "-f"])
        .args(args)
        .args(&imgs))?;
    let mnt = dir.join("mnt");
    let m = Mount::new(&imgs, &mnt, "").context("the kernel mounts the fresh filesystem")?;
    for (path, data) in files {
        let p = mnt.join(path.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("mkdir {}", parent.display()))?;
        }
        std::fs::write(&p, data).with_context(|| format!("write {}", p.display()))?;
    }
    m.unmount()?;
    Ok(imgs)
}

/// `btrfs check --readonly [ARGS] IMG` of a single-device image file: an
/// error, with all it printed, unless it exits 0 saying "no error found".
pub fn btrfs_check_file(img: &Path, args: &[&str]) -> Result<()> {
    let out = crate::cmd::output_of(
        command("btrfs")
            .args(["check", "--readonly"])
            .args(args)
            .arg(img),
    )
    .context("run btrfs check")?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !(out.status.success() && text.contains("no error found")) {
        bail!("btrfs check {} ({}):\n{text}", img.display(), out.status);
    }
    Ok(())
}

fn device_paths(out_dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| out_dir.join(format!("disk{i}.img")))
        .collect()
}

/// Make an image of the tree `src` with `mkfs.btrfs --rootdir`, as
/// `out_dir/disk0.img` (created with `out_dir` if missing).
///
/// mkfs 6.2 refuses `--rootdir` with several devices, so for
/// `opts.devices > 1` the image set is made by `mkfs.btrfs` and the tree
/// copied in by the kernel (`cp -a`, see [`crate::populate::copy_tree`]);
/// [`Image::builder`] tells which happened. See the module docs for what
/// `--rootdir` keeps.
pub fn mkfs_rootdir_image(out_dir: &Path, src: &Path, opts: &MkfsOptions) -> Result<Image> {
    std::fs::create_dir_all(out_dir)?;
    let devices = device_paths(out_dir, opts.devices);
    if opts.devices > 1 {
        let kopts = KernelImageOptions {
            mkfs: opts.clone(),
            mount_options: String::new(),
        };
        let mut img = kernel_image(out_dir, &kopts, crate::populate::copy_tree(src))?;
        img.source = Some(src.to_path_buf());
        return Ok(img);
    }
    mkfs(&devices, opts, Some(src))?;
    Ok(Image {
        devices,
        source: Some(src.to_path_buf()),
        mkfs: opts.clone(),
        mount_options: String::new(),
        builder: Builder::MkfsRootdir,
    })
}

/// Make an empty filesystem with `opts.mkfs` as `out_dir/disk<i>.img`,
/// mount it with the kernel with `opts.mount_options`, run `populate` on
/// the mount point, unmount, and return the image.
pub fn kernel_image(
    out_dir: &Path,
    opts: &KernelImageOptions,
    populate: impl FnOnce(&Path) -> Result<()>,
) -> Result<Image> {
    std::fs::create_dir_all(out_dir)?;
    let devices = device_paths(out_dir, opts.mkfs.devices);
    mkfs(&devices, &opts.mkfs, None)?;
    let mnt = tempfile::Builder::new()
        .prefix("populate-")
        .tempdir_in(out_dir)?;
    let m = Mount::new(&devices, mnt.path(), &opts.mount_options)?;
    populate(m.path()).with_context(|| {
        format!(
            "populating a kernel image ({}, mount options {:?})",
            opts.mkfs.label(),
            opts.mount_options
        )
    })?;
    m.unmount()?;
    mnt.close()?;
    Ok(Image {
        devices,
        source: None,
        mkfs: opts.mkfs.clone(),
        mount_options: opts.mount_options.clone(),
        builder: Builder::Kernel,
    })
}

/// `btrfs check --readonly` on the image; multi-device images are attached
/// to read-only loop devices and registered with `btrfs device scan`
/// first. Fails, with the checker's output, on any error found.
pub fn btrfs_check(image: &Image) -> Result<String> {
    if image.devices.len() == 1 {
        return run(command("btrfs")
            .args(["check", "--readonly"])
            .arg(image.path()))
        .with_context(|| format!("btrfs check {}", image.path().display()));
    }
    let _lease = crate::corpus::lease(&image.devices)?;
    let loops = image
        .devices
        .iter()
        .map(|d| Loop::attach_read_only(d))
        .collect::<Result<Vec<_>>>()?;
    let devs: Vec<&Path> = loops.iter().map(|l| l.device()).collect();
    run(command("btrfs").args(["device", "scan"]).args(&devs))?;
    let r = run(command("btrfs").args(["check", "--readonly"]).arg(devs[0]))
        .with_context(|| format!("btrfs check {}", image.path().display()));
    let _ = run(command("btrfs")
        .args(["device", "scan", "--forget"])
        .args(&devs));
    r
}

/// Copy an image's files into `out_dir` (sparse, reflinked where the
/// filesystem can), for a test that wants to write to a shared image.
/// Single-device copies may be mounted beside the original (the kernel
/// gives the copy a temporary fsid); multi-device copies may not.
pub fn copy_image(image: &Image, out_dir: &Path) -> Result<Image> {
    std::fs::create_dir_all(out_dir)?;
    let devices = device_paths(out_dir, image.devices.len());
    for (s, d) in image.devices.iter().zip(&devices) {
        run(command("cp")
            .arg("--reflink=auto")
            .arg("--sparse=always")
            .arg(s)
            .arg(d))?;
    }
    Ok(Image {
        devices,
        ..image.clone()
    })
}

// ---------------------------------------------------------------------------
// Leases: multi-device images must not be assembled twice at once.

fn leases() -> &'static (Mutex<Vec<PathBuf>>, Condvar) {
    static L: OnceLock<(Mutex<Vec<PathBuf>>, Condvar)> = OnceLock::new();
    L.get_or_init(|| (Mutex::new(Vec::new()), Condvar::new()))
}

/// Exclusive use, within this process, of a multi-device image set (the
/// kernel cannot assemble one filesystem from two sets of loop devices at
/// once). Released on drop. Waits up to two minutes.
#[derive(Debug)]
pub(crate) struct Lease(Option<PathBuf>);

pub(crate) fn lease(devices: &[PathBuf]) -> Result<Lease> {
    if devices.len() < 2 {
        return Ok(Lease(None));
    }
    let key = devices[0]
        .canonicalize()
        .unwrap_or_else(|_| devices[0].clone());
    let (m, cv) = leases();
    let mut held = m.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while held.contains(&key) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            bail!(
                "multi-device image {} is in use (mounted or checked) elsewhere in this process",
                key.display()
            );
        }
        held = cv
            .wait_timeout(held, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    held.push(key.clone());
    Ok(Lease(Some(key)))
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(k) = self.0.take() {
            let (m, cv) = leases();
            let mut held = m.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|p| *p != k);
            cv.notify_all();
        }
    }
}

// ---------------------------------------------------------------------------
// The kernel corpus.

/// A compression algorithm of the kernel (`compress-force=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compression {
    /// zlib (deflate).
    Zlib,
    /// LZO, in btrfs's own segment framing.
    Lzo,
    /// Zstandard.
    Zstd,
}

impl Compression {
    /// All algorithms.
    pub const ALL: [Compression; 3] = [Compression::Zlib, Compression::Lzo, Compression::Zstd];

    /// The mount option name.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Zlib => "zlib",
            Compression::Lzo => "lzo",
            Compression::Zstd => "zstd",
        }
    }
}

/// The kernel-made images of the corpus: each is a fresh filesystem
/// populated by one function of [`crate::populate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelCorpus {
    /// [`crate::populate::sparse_files`] (no-holes: holes are implicit).
    Sparse,
    /// Sparse files with `-O ^no-holes`: explicit hole extents.
    SparseHoleExtents,
    /// [`crate::populate::fallocated_files`].
    Fallocate,
    /// [`crate::populate::inline_files`].
    Inline,
    /// [`crate::populate::compressible_files`] on a `compress-force=` mount.
    Compressed(Compression),
    /// [`crate::populate::reflinked_files`].
    Reflink,
    /// [`crate::populate::snapshots`].
    Snapshot,
    /// [`crate::populate::nested_subvolumes`].
    NestedSubvolumes,
    /// [`crate::populate::big_directory`]: 20,000 entries.
    BigDirectory,
    /// [`crate::populate::odd_names`].
    Names,
    /// [`crate::populate::xattrs`].
    Xattrs,
    /// [`crate::populate::hard_links`].
    HardLinks,
    /// [`crate::populate::symlinks`].
    Symlinks,
    /// [`crate::populate::special_files`].
    Special,
    /// [`gen_tree`] with seed 1 and [`TreeSpec::default`], written by the
    /// kernel (so, unlike mkfs, with nanosecond times and device numbers).
    GeneratedTree,
    /// [`gen_tree`] with seed 2 and [`TreeSpec::small`] on a multi-device
    /// filesystem with this profile for data and metadata.
    MultiDevice(Profile),
}

impl KernelCorpus {
    /// Every member of the corpus.
    pub fn all() -> Vec<KernelCorpus> {
        use KernelCorpus::*;
        let mut v = vec![Sparse, SparseHoleExtents, Fallocate, Inline];
        v.extend(Compression::ALL.map(Compressed));
        v.extend([
            Reflink,
            Snapshot,
            NestedSubvolumes,
            BigDirectory,
            Names,
            Xattrs,
            HardLinks,
            Symlinks,
            Special,
            GeneratedTree,
        ]);
        v.extend(
            [
                Profile::Raid0,
                Profile::Raid1,
                Profile::Raid10,
                Profile::Raid1c3,
            ]
            .map(MultiDevice),
        );
        v
    }

    /// A short name, e.g. `compressed-zstd`.
    pub fn name(self) -> String {
        use KernelCorpus::*;
        match self {
            Sparse => "sparse".into(),
            SparseHoleExtents => "sparse-hole-extents".into(),
            Fallocate => "fallocate".into(),
            Inline => "inline".into(),
            Compressed(c) => format!("compressed-{}", c.as_str()),
            Reflink => "reflink".into(),
            Snapshot => "snapshot".into(),
            NestedSubvolumes => "nested-subvolumes".into(),
            BigDirectory => "big-directory".into(),
            Names => "names".into(),
            Xattrs => "xattrs".into(),
            HardLinks => "hard-links".into(),
            Symlinks => "symlinks".into(),
            Special => "special".into(),
            GeneratedTree => "generated-tree".into(),
            MultiDevice(p) => format!("multi-{}", p.as_str()),
        }
    }

    /// The mkfs and mount options of this member.
    pub fn options(self) -> KernelImageOptions {
        use KernelCorpus::*;
        let mut o = KernelImageOptions::default();
        match self {
            SparseHoleExtents => o.mkfs.features = vec!["^no-holes".into()],
            Compressed(c) => o.mount_options = format!("compress-force={}", c.as_str()),
            MultiDevice(p) => o.mkfs = MkfsOptions::multi(p),
            _ => {}
        }
        o
    }

    /// Fill the mounted filesystem `dir`.
    pub fn populate(self, dir: &Path) -> Result<()> {
        use crate::populate as p;
        use KernelCorpus::*;
        match self {
            Sparse | SparseHoleExtents => p::sparse_files(dir),
            Fallocate => p::fallocated_files(dir),
            Inline => p::inline_files(dir),
            Compressed(_) => p::compressible_files(dir),
            Reflink => p::reflinked_files(dir),
            Snapshot => p::snapshots(dir),
            NestedSubvolumes => p::nested_subvolumes(dir),
            BigDirectory => p::big_directory(dir),
            Names => p::odd_names(dir),
            Xattrs => p::xattrs(dir),
            HardLinks => p::hard_links(dir),
            Symlinks => p::symlinks(dir),
            Special => p::special_files(dir),
            GeneratedTree => gen_tree(dir, 1, &TreeSpec::default()).map(|_| ()),
            MultiDevice(_) => gen_tree(dir, 2, &TreeSpec::small()).map(|_| ()),
        }
    }

    /// Build this member fresh into `out_dir`.
    pub fn build(self, out_dir: &Path) -> Result<Image> {
        kernel_image(out_dir, &self.options(), |d| self.populate(d))
            .with_context(|| format!("kernel corpus image {}", self.name()))
    }
}

// ---------------------------------------------------------------------------
// The cache.

/// The directory holding cached corpus images: `UBTRFS_CORPUS_DIR` if set,
/// else `testkit-corpus` in the cargo profile directory of the running test
/// binary (`target/release/testkit-corpus`), else under [`crate::base_dir`].
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UBTRFS_CORPUS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(deps) = exe.parent()
        && deps.file_name().is_some_and(|n| n == "deps")
        && let Some(profile) = deps.parent()
    {
        return profile.join("testkit-corpus");
    }
    crate::tmp::base_dir().join("ubtrfs-corpus")
}

/// Changes whenever the test kit's sources do (see `build.rs`), so that a
/// changed generator never serves stale images.
const SRC_HASH: &str = env!("TESTKIT_SRC_HASH");

type Slot = Arc<Mutex<Option<Arc<Image>>>>;

fn slots() -> &'static Mutex<HashMap<String, Slot>> {
    static S: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

fn stamp_of(devices: &[PathBuf]) -> Result<String> {
    let mut s = String::new();
    for d in devices {
        let m = std::fs::metadata(d)?;
        s.push_str(&format!(
            "{} {} {} {}\n",
            d.file_name().unwrap_or_default().to_string_lossy(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ));
    }
    Ok(s)
}

fn relocate(p: &Path, from: &Path, to: &Path) -> PathBuf {
    match p.strip_prefix(from) {
        Ok(rel) => to.join(rel),
        Err(_) => p.to_path_buf(),
    }
}

/// Return the cached image for `key`, building it with `build(dir)` into a
/// fresh directory when absent or modified since it was built. The stamp
/// (sizes and mtimes of the image files) catches images written to by a
/// test; mount shared images read-only or use [`copy_image`].
fn cached(
    label: &str,
    key: &str,
    build: impl FnOnce(&Path) -> Result<Image>,
) -> Result<Arc<Image>> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let name = format!("{label}-{:016x}", h.finish());

    let slot = {
        let mut s = slots().lock().unwrap_or_else(|e| e.into_inner());
        s.entry(name.clone()).or_default().clone()
    };
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());

    let root = cache_dir().join(SRC_HASH);
    prune_old_versions(&root);
    let dir = root.join(&name);
    let stamp_path = dir.join("stamp");
    if let Some(img) = slot.as_ref() {
        if std::fs::read_to_string(&stamp_path).ok() == stamp_of(&img.devices).ok() {
            return Ok(img.clone());
        }
        eprintln!("testkit: cached image {name} was modified; rebuilding");
        *slot = None;
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Built by an earlier run (or another process)?
    if let Ok(saved) = std::fs::read_to_string(dir.join("image")) {
        if let Ok(img) = decode_image(&saved, &dir)
            && std::fs::read_to_string(&stamp_path).ok() == stamp_of(&img.devices).ok()
        {
            let img = Arc::new(img);
            *slot = Some(img.clone());
            return Ok(img);
        }
        eprintln!("testkit: cached image {name} is stale or modified; rebuilding");
        let _ = std::fs::remove_dir_all(&dir);
    }

    std::fs::create_dir_all(&root)?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!("building-{name}-"))
        .tempdir_in(&root)?;
    let img = build(tmp.path())?;
    let saved = encode_image(&img, tmp.path());
    std::fs::write(tmp.path().join("image"), saved)?;
    std::fs::write(tmp.path().join("key"), key)?;
    std::fs::write(tmp.path().join("stamp"), stamp_of(&img.devices)?)?;
    let tmp_path = tmp.keep();
    if std::fs::rename(&tmp_path, &dir).is_err() {
        // Another process finished first; use its image.
        let _ = std::fs::remove_dir_all(&tmp_path);
    }
    let saved = std::fs::read_to_string(dir.join("image"))?;
    let img = Arc::new(decode_image(&saved, &dir)?);
    *slot = Some(img.clone());
    Ok(img)
}

/// Serialize the parts of an image that are not implied by the key: the
/// device and source paths relative to the cache entry, and the options.
fn encode_image(img: &Image, dir: &Path) -> String {
    let rel = |p: &Path| relocate(p, dir, Path::new("")).display().to_string();
    let mut s = String::new();
    for d in &img.devices {
        s.push_str(&format!("device {}\n", rel(d)));
    }
    if let Some(src) = &img.source {
        s.push_str(&format!("source {}\n", rel(src)));
    }
    s.push_str(&format!("mount_options {}\n", img.mount_options));
    s.push_str(&format!("builder {:?}\n", img.builder));
    s.push_str(&format!("mkfs {:?}\n", img.mkfs));
    s
}

fn decode_image(s: &str, dir: &Path) -> Result<Image> {
    // The mkfs options are not parsed back: the caller knows them (they
    // are part of the cache key) and fills them in.
    let mut devices = Vec::new();
    let mut source = None;
    let mut mount_options = String::new();
    let mut builder = Builder::Kernel;
    for line in s.lines() {
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        match k {
            "device" => devices.push(dir.join(v)),
            "source" => source = Some(dir.join(v)),
            "mount_options" => mount_options = v.to_string(),
            "builder" => {
                builder = if v == "MkfsRootdir" {
                    Builder::MkfsRootdir
                } else {
                    Builder::Kernel
                }
            }
            _ => {}
        }
    }
    if devices.is_empty() {
        bail!("cache entry {} lists no device", dir.display());
    }
    Ok(Image {
        devices,
        source,
        mkfs: MkfsOptions::default(),
        mount_options,
        builder,
    })
}

fn prune_old_versions(root: &Path) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(parent) = root.parent() else { return };
        let Ok(rd) = std::fs::read_dir(parent) else {
            return;
        };
        for e in rd.flatten() {
            if e.path() != root && e.file_type().is_ok_and(|t| t.is_dir()) {
                let p = e.path();
                if crate::tmp::mounts_below(&p).is_empty() {
                    let _ = std::fs::remove_dir_all(&p);
                }
            }
        }
    });
}

/// A shared, cached image of the tree [`gen_tree`]`(seed, spec)` made with
/// [`mkfs_rootdir_image`] (the source tree is kept beside it, see
/// [`Image::source`]). Built once per test-kit version and options, then
/// reused across tests and runs. Do not write to it: mount it `"ro"`, open
/// it read-only, or [`copy_image`] it.
pub fn cached_rootdir_image(seed: u64, spec: &TreeSpec, opts: &MkfsOptions) -> Result<Arc<Image>> {
    let version = mkfs_version()?;
    let key = format!("rootdir\n{version}\n{seed}\n{spec:?}\n{opts:?}\n");
    let mut img = cached(&format!("rootdir-{}", opts.label()), &key, |dir| {
        let src = dir.join("src");
        gen_tree(&src, seed, spec)?;
        mkfs_rootdir_image(dir, &src, opts)
    })?;
    Arc::make_mut(&mut img).mkfs = opts.clone();
    Ok(img)
}

/// A shared, cached image of one member of the kernel corpus (see
/// [`cached_rootdir_image`] for the rules).
pub fn cached_kernel_image(kind: KernelCorpus) -> Result<Arc<Image>> {
    let version = mkfs_version()?;
    let opts = kind.options();
    let key = format!("kernel\n{version}\n{kind:?}\n{opts:?}\n");
    let mut img = cached(&format!("kernel-{}", kind.name()), &key, |dir| {
        kind.build(dir)
    })?;
    Arc::make_mut(&mut img).mkfs = opts.mkfs;
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkfs_args() {
        let o = MkfsOptions {
            features: vec!["^no-holes".into()],
            mixed: true,
            label: Some("lbl".into()),
            ..MkfsOptions::with_csum(Csum::Blake2)
        };
        let a = o.args().join(" ");
        assert_eq!(
            a,
            "-f -q --csum blake2 -n 16384 -s 4096 -m dup -d single -M -O ^no-holes -L lbl"
        );
        assert_eq!(o.label(), "blake2-n16k-dup-single-1x256m-mixed-no_no-holes");
        let m = MkfsOptions::multi(Profile::Raid10);
        assert_eq!(m.devices, 4);
        assert!(m.args().join(" ").contains("-m raid10 -d raid10"));
    }

    #[test]
    fn corpus_names_are_unique() {
        let all = KernelCorpus::all();
        let names: std::collections::HashSet<String> = all.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), all.len());
        assert!(
            KernelCorpus::Compressed(Compression::Lzo)
                .options()
                .mount_options
                .contains("compress-force=lzo")
        );
    }

    #[test]
    fn image_index_roundtrip() {
        let dir = Path::new("/x/y");
        let img = Image {
            devices: vec![dir.join("disk0.img"), dir.join("disk1.img")],
            source: Some(dir.join("src")),
            mkfs: MkfsOptions::default(),
            mount_options: "compress-force=zstd".into(),
            builder: Builder::MkfsRootdir,
        };
        let s = encode_image(&img, dir);
        let back = decode_image(&s, Path::new("/z")).unwrap();
        assert_eq!(
            back.devices,
            vec![PathBuf::from("/z/disk0.img"), PathBuf::from("/z/disk1.img")]
        );
        assert_eq!(back.source, Some(PathBuf::from("/z/src")));
        assert_eq!(back.mount_options, "compress-force=zstd");
        assert_eq!(back.builder, Builder::MkfsRootdir);
    }
}

//! Ready-made `populate` functions for [`crate::kernel_image`]: each fills
//! a freshly mounted btrfs (the kernel's) with one family of on-disk
//! structures. They are deterministic (fixed seeds), and work on any
//! directory, but the interesting extents appear only on btrfs.
//!
//! Each takes the mount point and returns `anyhow::Result<()>`.

use crate::cmd::{command, run};
use crate::generate::{Rng, TreeSpec, compressible_bytes, gen_tree};
use crate::sys::{self, NodeKind, falloc};
use anyhow::{Context, Result};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, symlink};
use std::path::{Path, PathBuf};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn create(p: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)
        .with_context(|| format!("create {}", p.display()))
}

fn mkdir(p: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(p).with_context(|| format!("mkdir {}", p.display()))?;
    Ok(p.to_path_buf())
}

/// Write at `off` and make it durable, so that successive writes become
/// separate extents.
fn write_sync(f: &File, data: &[u8], off: u64) -> Result<()> {
    f.write_all_at(data, off)?;
    f.sync_all()?;
    Ok(())
}

/// Sparse files: holes at the start, in the middle, at the end, a file
/// that is all hole, unaligned data islands, a file truncated into the
/// middle of an extent and extended again, and a small (inline) start
/// followed by a hole and data.
pub fn sparse_files(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("sparse"))?;
    let mut rng = Rng::new(0x5ba5e);
    let data = rng.bytes(MIB as usize);

    let f = create(&d.join("hole-start"))?;
    write_sync(&f, &data[..64 * KIB as usize], MIB)?;

    let f = create(&d.join("hole-middle"))?;
    write_sync(&f, &data[..64 * KIB as usize], 0)?;
    write_sync(&f, &data[..64 * KIB as usize], 4 * MIB)?;

    let f = create(&d.join("hole-end"))?;
    write_sync(&f, &data[..64 * KIB as usize], 0)?;
    f.set_len(3 * MIB)?;

    let f = create(&d.join("all-hole"))?;
    f.set_len(10 * MIB + 5)?;

    let f = create(&d.join("unaligned-islands"))?;
    write_sync(&f, &data[..3000], 1000)?;
    write_sync(&f, &data[..10], 70_000)?;
    write_sync(&f, &data[..5000], MIB + 1)?;

    let f = create(&d.join("truncated-into-extent"))?;
    write_sync(&f, &data, 0)?;
    f.set_len(300_001)?;
    f.sync_all()?;
    f.set_len(2 * MIB)?;

    let f = create(&d.join("inline-then-hole"))?;
    write_sync(&f, &data[..100], 0)?;
    write_sync(&f, &data[..4096], MIB)?;

    let f = create(&d.join("many-holes"))?;
    for i in 0..64u64 {
        write_sync(&f, &data[..4096], i * 64 * KIB)?;
    }
    Ok(())
}

/// `fallocate`: preallocated (unwritten) extents, partly written ones,
/// `KEEP_SIZE` preallocation beyond EOF, punched holes, zeroed ranges and
/// unaligned ranges.
pub fn fallocated_files(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("falloc"))?;
    let mut rng = Rng::new(0xfa11);
    let data = rng.bytes(MIB as usize);

    let f = create(&d.join("prealloc"))?;
    sys::fallocate(&f, 0, 0, MIB)?;

    let f = create(&d.join("prealloc-partly-written"))?;
    sys::fallocate(&f, 0, 0, MIB)?;
    write_sync(&f, &data[..4096], 256 * KIB)?;
    write_sync(&f, &data[..100], 700_000)?;

    let f = create(&d.join("keep-size-beyond-eof"))?;
    write_sync(&f, &data[..10_000], 0)?;
    sys::fallocate(&f, falloc::KEEP_SIZE, 0, 2 * MIB)?;

    let f = create(&d.join("keep-size-empty"))?;
    sys::fallocate(&f, falloc::KEEP_SIZE, 0, MIB)?;

    let f = create(&d.join("punched"))?;
    write_sync(&f, &data, 0)?;
    sys::fallocate(
        &f,
        falloc::PUNCH_HOLE | falloc::KEEP_SIZE,
        64 * KIB,
        128 * KIB,
    )?;
    sys::fallocate(&f, falloc::PUNCH_HOLE | falloc::KEEP_SIZE, 500_000, 3000)?;

    let f = create(&d.join("zero-range"))?;
    write_sync(&f, &data[..512 * KIB as usize], 0)?;
    sys::fallocate(&f, falloc::ZERO_RANGE, 100_000, 200_000)?;
    f.sync_all()?;

    let f = create(&d.join("prealloc-in-hole"))?;
    f.set_len(4 * MIB)?;
    sys::fallocate(&f, 0, MIB, MIB)?;

    let f = create(&d.join("prealloc-unaligned"))?;
    sys::fallocate(&f, 0, 1000, 5000)?;
    Ok(())
}

/// Small files around the inline-extent limits (0 to 8 KiB, random and
/// compressible), a file grown out of inline, one shrunk to inline size,
/// and an inline file overwritten in place.
pub fn inline_files(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("inline"))?;
    let mut rng = Rng::new(0x1411e);
    for size in [
        0usize, 1, 100, 1000, 2047, 2048, 2049, 3000, 4095, 4096, 4097, 8192,
    ] {
        std::fs::write(d.join(format!("random-{size}")), rng.bytes(size))?;
        std::fs::write(
            d.join(format!("text-{size}")),
            compressible_bytes(size as u64, size),
        )?;
    }
    let f = create(&d.join("grown-from-inline"))?;
    write_sync(&f, &rng.bytes(500), 0)?;
    write_sync(&f, &rng.bytes(10_000), 500)?;

    let f = create(&d.join("shrunk-to-small"))?;
    write_sync(&f, &rng.bytes(10_000), 0)?;
    f.set_len(100)?;

    let f = create(&d.join("inline-overwritten"))?;
    write_sync(&f, &rng.bytes(1000), 0)?;
    write_sync(&f, b"0123456789", 500)?;

    let f = create(&d.join("inline-extended-by-truncate"))?;
    write_sync(&f, &rng.bytes(700), 0)?;
    f.set_len(1500)?;
    Ok(())
}

/// Files meant for a `compress-force=` mount: compressed inline extents,
/// single and many 128 KiB compressed extents, mixed compressible and
/// random data, zeros, a compressed extent partly overwritten (references
/// into the middle of a compressed extent), one truncated inside a
/// compressed extent, and sparse compressed data.
pub fn compressible_files(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("compress"))?;
    let mut rng = Rng::new(0xc0417e55);
    std::fs::write(d.join("tiny-text"), compressible_bytes(1, 1000))?;
    std::fs::write(d.join("text-100k"), compressible_bytes(2, 100_000))?;
    std::fs::write(d.join("text-128k"), compressible_bytes(3, 128 * 1024))?;
    std::fs::write(d.join("text-129k"), compressible_bytes(4, 129 * 1024))?;
    std::fs::write(d.join("text-4m"), compressible_bytes(5, 4 * MIB as usize))?;
    std::fs::write(d.join("text-unaligned"), compressible_bytes(6, 12_345))?;
    std::fs::write(d.join("random-1m"), rng.bytes(MIB as usize))?;
    std::fs::write(d.join("zeros-2m"), vec![0u8; 2 * MIB as usize])?;

    let mut mixed = Vec::new();
    for i in 0..64u64 {
        if i % 2 == 0 {
            mixed.extend(compressible_bytes(100 + i, 64 * 1024));
        } else {
            mixed.extend(rng.bytes(64 * 1024));
        }
    }
    std::fs::write(d.join("mixed-4m"), mixed)?;

    let f = create(&d.join("overwritten-inside"))?;
    write_sync(&f, &compressible_bytes(7, MIB as usize), 0)?;
    write_sync(&f, &rng.bytes(4096), 200 * KIB)?;
    write_sync(&f, &rng.bytes(10), 600_003)?;

    let f = create(&d.join("truncated-inside"))?;
    write_sync(&f, &compressible_bytes(8, 512 * 1024), 0)?;
    f.set_len(300_001)?;

    let f = create(&d.join("sparse-compressed"))?;
    write_sync(&f, &compressible_bytes(9, 200_000), 0)?;
    write_sync(&f, &compressible_bytes(10, 200_000), 2 * MIB)?;
    Ok(())
}

/// Reflinks: whole-file clones (`FICLONE` and `cp --reflink=always`),
/// partial clones into a hole and into existing data (`FICLONERANGE`), a
/// clone within one file, a clone modified afterwards, and a clone whose
/// source was deleted.
pub fn reflinked_files(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("reflink"))?;
    let mut rng = Rng::new(0x4ef1);
    let mut src_data = rng.bytes(MIB as usize);
    src_data.extend(compressible_bytes(11, MIB as usize));
    let src = create(&d.join("source"))?;
    write_sync(&src, &src_data, 0)?;

    let c = create(&d.join("clone-whole"))?;
    sys::reflink(&src, &c).context("FICLONE")?;

    run(command("cp")
        .arg("--reflink=always")
        .arg(d.join("source"))
        .arg(d.join("clone-cp")))?;

    let c = create(&d.join("clone-range-into-hole"))?;
    sys::reflink_range(&src, 256 * KIB, 512 * KIB, &c, MIB).context("FICLONERANGE")?;

    let c = create(&d.join("clone-range-into-data"))?;
    write_sync(&c, &rng.bytes(2 * MIB as usize), 0)?;
    sys::reflink_range(&src, 0, 128 * KIB, &c, 512 * KIB)?;

    let s2 = create(&d.join("clone-within-file"))?;
    write_sync(&s2, &rng.bytes(256 * KIB as usize), 0)?;
    sys::reflink_range(&s2, 0, 64 * KIB, &s2, MIB)?;

    let c = create(&d.join("clone-then-modified"))?;
    sys::reflink(&src, &c)?;
    write_sync(&c, &rng.bytes(4096), 100 * KIB)?;
    write_sync(&c, &rng.bytes(3), 1_500_000)?;

    // Unaligned tail: clone to EOF (len 0) of a file whose size is not a
    // multiple of the block size.
    let odd = create(&d.join("odd-size-source"))?;
    write_sync(&odd, &rng.bytes(10_000 + 4096), 0)?;
    let c = create(&d.join("clone-unaligned-eof"))?;
    sys::reflink_range(&odd, 4096, 0, &c, 0)?;

    let orphan_src = d.join("deleted-source");
    let s = create(&orphan_src)?;
    write_sync(&s, &rng.bytes(300_000), 0)?;
    let c = create(&d.join("clone-of-deleted"))?;
    sys::reflink(&s, &c)?;
    drop(s);
    std::fs::remove_file(&orphan_src)?;
    Ok(())
}

fn btrfs(args: &[&std::ffi::OsStr]) -> Result<String> {
    run(command("btrfs").args(args))
}

/// `btrfs subvolume create`.
pub fn subvolume_create(path: &Path) -> Result<()> {
    btrfs(&["subvolume".as_ref(), "create".as_ref(), path.as_os_str()])?;
    Ok(())
}

/// `btrfs subvolume snapshot [-r] src dst`.
pub fn snapshot(src: &Path, dst: &Path, read_only: bool) -> Result<()> {
    let mut a: Vec<&std::ffi::OsStr> = vec!["subvolume".as_ref(), "snapshot".as_ref()];
    if read_only {
        a.push("-r".as_ref());
    }
    a.push(src.as_os_str());
    a.push(dst.as_os_str());
    btrfs(&a)?;
    Ok(())
}

fn small_files(d: &Path, seed: u64, n: usize) -> Result<()> {
    let mut rng = Rng::new(seed);
    for i in 0..n {
        let size = match i % 3 {
            0 => rng.range(0, 2000),
            1 => rng.range(4097, 100_000),
            _ => rng.range(100_000, 400_000),
        } as usize;
        std::fs::write(d.join(format!("file-{i:02}")), rng.bytes(size))?;
    }
    Ok(())
}

/// A subvolume with files, a read-write and a read-only snapshot of it,
/// then changes to the original after the snapshot (overwrite, append,
/// delete, create, rename, chmod) and to the read-write snapshot; and a
/// snapshot of the top-level subvolume (where the nested subvolume shows
/// as an empty directory).
pub fn snapshots(dir: &Path) -> Result<()> {
    let sv = dir.join("subvol");
    subvolume_create(&sv)?;
    small_files(&sv, 0x54a9, 9)?;
    mkdir(&sv.join("sub/deeper"))?;
    std::fs::write(sv.join("sub/deeper/leaf"), b"leaf\n")?;
    sys::syncfs(dir)?;
    snapshot(&sv, &dir.join("snap-rw"), false)?;
    snapshot(&sv, &dir.join("snap-ro"), true)?;

    let mut rng = Rng::new(0x54a90);
    let f = OpenOptions::new().write(true).open(sv.join("file-01"))?;
    write_sync(&f, &rng.bytes(5000), 1000)?;
    crate::generate::append(&sv.join("file-02"), &rng.bytes(70_000))?;
    std::fs::remove_file(sv.join("file-03"))?;
    std::fs::write(sv.join("new-after-snapshot"), rng.bytes(3000))?;
    std::fs::rename(sv.join("file-04"), sv.join("sub/file-04-renamed"))?;
    sys::chmod(&sv.join("file-05"), 0o600)?;
    std::fs::write(dir.join("snap-rw/written-in-snapshot"), b"snap\n")?;
    std::fs::remove_file(dir.join("snap-rw/file-06"))?;

    snapshot(dir, &dir.join("snap-of-top"), true)?;
    Ok(())
}

/// Nested subvolumes: a subvolume in a directory, one inside it, one deep
/// inside that; files in each; a snapshot of the middle one.
pub fn nested_subvolumes(dir: &Path) -> Result<()> {
    let a = mkdir(&dir.join("plain-dir"))?;
    let sv1 = a.join("sv1");
    subvolume_create(&sv1)?;
    small_files(&sv1, 1, 3)?;
    let sv2 = sv1.join("sv2");
    subvolume_create(&sv2)?;
    small_files(&sv2, 2, 3)?;
    let deep = mkdir(&sv2.join("deep/er"))?;
    let sv3 = deep.join("sv3");
    subvolume_create(&sv3)?;
    small_files(&sv3, 3, 3)?;
    std::fs::hard_link(sv3.join("file-00"), sv3.join("link-00"))?;
    sys::syncfs(dir)?;
    snapshot(&sv1, &dir.join("snap-of-sv1"), false)?;
    Ok(())
}

/// A directory of `n` entries (the corpus uses 20,000): empty and tiny
/// files with names of varied length, some subdirectories.
pub fn big_directory_n(dir: &Path, n: usize) -> Result<()> {
    let d = mkdir(&dir.join("big"))?;
    let mut rng = Rng::new(0xb16);
    for i in 0..n {
        let pad = "p".repeat(rng.range(0, 40) as usize);
        let name = format!("entry-{i:05}-{pad}");
        if i % 500 == 0 {
            std::fs::create_dir(d.join(&name))?;
        } else if i % 7 == 0 {
            let n = rng.range(1, 300) as usize;
            std::fs::write(d.join(&name), rng.bytes(n))?;
        } else {
            File::create(d.join(&name))?;
        }
    }
    Ok(())
}

/// [`big_directory_n`] with 20,000 entries.
pub fn big_directory(dir: &Path) -> Result<()> {
    big_directory_n(dir, 20_000)
}

/// Names: 255 bytes (ASCII, 3-byte and 4-byte UTF-8), bytes that are not
/// UTF-8, control characters, spaces, a leading dash, backslash, names
/// differing only in case or in Unicode normalization, dot names, and a
/// deep path of 255-byte directory names.
pub fn odd_names(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("names"))?;
    let mut names: Vec<Vec<u8>> = vec![
        vec![b'a'; 255],
        "\u{20ac}".repeat(85).into_bytes(),
        {
            let mut v = "\u{1f980}".repeat(63).into_bytes();
            v.extend(b"abc");
            v
        },
        b"bad-\xff\xfe".to_vec(),
        b"\x80\x81\x82".to_vec(),
        b"latin1-caf\xe9".to_vec(),
        b"tab\there".to_vec(),
        b"new\nline".to_vec(),
        b"with space ".to_vec(),
        b"-leading-dash".to_vec(),
        b"back\\slash".to_vec(),
        b"Case".to_vec(),
        b"case".to_vec(),
        "caf\u{e9}".as_bytes().to_vec(),
        "cafe\u{301}".as_bytes().to_vec(),
        b"...".to_vec(),
        b".hidden".to_vec(),
        b"x".to_vec(),
        b"*?[]{}$'\"".to_vec(),
    ];
    for (i, n) in names.drain(..).enumerate() {
        std::fs::write(d.join(OsString::from_vec(n)), format!("name {i}\n"))?;
    }
    let mut deep = d.clone();
    for c in [b'p', b'q', b'r'] {
        deep = deep.join(OsString::from_vec(vec![c; 255]));
        std::fs::create_dir(&deep)?;
    }
    std::fs::write(deep.join(OsString::from_vec(vec![b'z'; 255])), b"deep\n")?;
    Ok(())
}

/// Extended attributes: binary, empty and large values; the largest value
/// the filesystem accepts; 100 xattrs on one file; xattrs on directories;
/// `trusted.*` and `security.*` on files, directories, symlinks and
/// fifos (where allowed); a replaced and a removed xattr.
pub fn xattrs(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("xattrs"))?;
    let mut rng = Rng::new(0xa77);
    let f = d.join("file");
    std::fs::write(&f, b"has xattrs\n")?;
    sys::set_xattr(&f, "user.binary", &[0, 1, 2, 255, 0])?;
    sys::set_xattr(&f, "user.empty", b"")?;
    sys::set_xattr(&f, "user.text", b"hello")?;
    sys::set_xattr(&f, "user.4k", &rng.bytes(4000))?;
    sys::set_xattr(&f, "user.replaced", b"first")?;
    sys::set_xattr(&f, "user.replaced", b"second value")?;
    sys::set_xattr(&f, "user.removed", b"gone")?;
    sys::remove_xattr(&f, "user.removed")?;

    // The largest value accepted (depends on the node size).
    let big = d.join("largest-xattr");
    std::fs::write(&big, b"")?;
    let (mut lo, mut hi) = (0usize, 65536usize);
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if sys::set_xattr(&big, "user.big", &vec![0xab; mid]).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    sys::set_xattr(&big, "user.big", &rng.bytes(lo))?;

    let many = d.join("many");
    std::fs::write(&many, b"")?;
    for i in 0..100 {
        let name = format!("user.attr-{i:03}-{}", "n".repeat(i % 50));
        sys::set_xattr(&many, &name, &rng.bytes(50 + i * 3))?;
    }

    let sub = mkdir(&d.join("dir"))?;
    sys::set_xattr(&sub, "user.on-dir", b"dir value")?;
    let l = d.join("symlink");
    symlink("file", &l)?;
    let fifo = d.join("fifo");
    sys::mkfifo(&fifo, 0o600)?;
    for p in [&f, &sub, &l, &fifo] {
        // Not every kernel or security module allows these; best effort.
        let _ = sys::set_xattr(p, "trusted.ubtrfs", b"trusted value");
        let _ = sys::set_xattr(p, "security.ubtrfs", b"security value");
    }
    Ok(())
}

/// Hard links: pairs and triples across directories, 300 links with long
/// names to one file (more than one inode-ref item holds: extended refs),
/// a link whose first name was removed, and hard links to a fifo and to a
/// symlink.
pub fn hard_links(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("links"))?;
    let a = mkdir(&d.join("a"))?;
    let b = mkdir(&d.join("b/c"))?;
    std::fs::write(a.join("pair"), b"pair\n")?;
    std::fs::hard_link(a.join("pair"), b.join("pair-2"))?;
    std::fs::write(a.join("triple"), vec![3u8; 10_000])?;
    std::fs::hard_link(a.join("triple"), a.join("triple-2"))?;
    std::fs::hard_link(a.join("triple"), d.join("triple-3"))?;

    let many = mkdir(&d.join("many"))?;
    std::fs::write(many.join("target"), b"many names\n")?;
    for i in 0..300 {
        let name = format!("link-{i:03}-{}", "l".repeat(100));
        std::fs::hard_link(many.join("target"), many.join(name))?;
    }

    std::fs::write(d.join("first-name"), b"renamed away\n")?;
    std::fs::hard_link(d.join("first-name"), b.join("second-name"))?;
    std::fs::remove_file(d.join("first-name"))?;

    sys::mkfifo(&d.join("fifo"), 0o644)?;
    std::fs::hard_link(d.join("fifo"), a.join("fifo-link"))?;
    symlink("pair", a.join("symlink"))?;
    // link(2) without AT_SYMLINK_FOLLOW links the symlink itself.
    std::fs::hard_link(a.join("symlink"), b.join("symlink-link"))?;
    Ok(())
}

/// Symlinks: relative, absolute, dangling, to a directory, `.` and `..`,
/// one byte, 4095 bytes, non-UTF-8 target, a chain, with owners and
/// nanosecond times.
pub fn symlinks(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("symlinks"))?;
    let sub = mkdir(&d.join("sub/deeper"))?;
    std::fs::write(d.join("target"), b"target\n")?;
    let long: Vec<u8> = (0..4095)
        .map(|i| {
            if i % 100 == 99 {
                b'/'
            } else {
                b'a' + (i % 26) as u8
            }
        })
        .collect();
    let links: Vec<(&str, Vec<u8>)> = vec![
        ("relative", b"target".to_vec()),
        ("absolute", b"/etc/hostname".to_vec()),
        ("dangling", b"does/not/exist".to_vec()),
        ("to-dir", b"sub".to_vec()),
        ("dot", b".".to_vec()),
        ("dotdot", b"..".to_vec()),
        ("one", b"x".to_vec()),
        ("long-4095", long),
        ("non-utf8", b"\xff\xfe-target".to_vec()),
        ("chain-1", b"chain-2".to_vec()),
        ("chain-2", b"relative".to_vec()),
    ];
    for (name, t) in links {
        symlink(OsString::from_vec(t), d.join(name))?;
    }
    symlink("../../target", sub.join("up"))?;
    if sys::is_root() {
        sys::lchown(&d.join("relative"), 1234, 5678)?;
    }
    sys::set_times(
        &d.join("relative"),
        sys::Timestamp::new(1_000_000_000, 1),
        sys::Timestamp::new(1_234_567_890, 123_456_789),
    )?;
    Ok(())
}

/// Fifos, character and block devices (small, large and maximal major and
/// minor numbers), a socket node, with various modes and owners. Device
/// nodes need root.
pub fn special_files(dir: &Path) -> Result<()> {
    let d = mkdir(&dir.join("special"))?;
    sys::mkfifo(&d.join("fifo"), 0o644)?;
    sys::mkfifo(&d.join("fifo-sticky"), 0o1600)?;
    sys::chmod(&d.join("fifo-sticky"), 0o1600)?;
    let devs: &[(&str, NodeKind, u32, u32)] = &[
        ("null-like", NodeKind::Char, 1, 3),
        ("char-big", NodeKind::Char, 259, 70_000),
        ("char-max", NodeKind::Char, 4095, 0xfffff),
        ("block-loop", NodeKind::Block, 7, 0),
        ("block-big", NodeKind::Block, 259, 65_536),
        ("socket", NodeKind::Socket, 0, 0),
    ];
    for &(name, kind, major, minor) in devs {
        let p = d.join(name);
        sys::mknod(&p, kind, 0o640, sys::makedev(major, minor))
            .with_context(|| format!("mknod {}", p.display()))?;
    }
    if sys::is_root() {
        sys::lchown(&d.join("char-big"), 42, 4242)?;
        sys::lchown(&d.join("fifo"), 65534, 65534)?;
    }
    Ok(())
}

/// A populate function that generates [`gen_tree`]`(dir, seed, spec)`.
pub fn generated_tree(seed: u64, spec: TreeSpec) -> impl FnOnce(&Path) -> Result<()> {
    move |dir| gen_tree(dir, seed, &spec).map(|_| ())
}

/// A populate function that copies `src` into the filesystem with
/// `cp -a --sparse=always` (contents, holes as holes, modes, owners,
/// nanosecond times, xattrs, hard links, device nodes).
pub fn copy_tree(src: &Path) -> impl FnOnce(&Path) -> Result<()> + '_ {
    move |dir| {
        let mut from = src.as_os_str().to_owned();
        from.push("/.");
        run(command("cp")
            .arg("-a")
            .arg("--sparse=always")
            .arg(from)
            .arg(dir))?;
        Ok(())
    }
}

/// Everything above except the 20,000-entry directory and subvolumes.
pub fn everything(dir: &Path) -> Result<()> {
    sparse_files(dir)?;
    fallocated_files(dir)?;
    inline_files(dir)?;
    compressible_files(dir)?;
    reflinked_files(dir)?;
    odd_names(dir)?;
    xattrs(dir)?;
    hard_links(dir)?;
    symlinks(dir)?;
    special_files(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestDir;

    /// The functions that need no btrfs run on any filesystem.
    #[test]
    fn populate_on_plain_dir() {
        let t = TestDir::new("populate-plain").unwrap();
        let d = t.path();
        sparse_files(d).unwrap();
        inline_files(d).unwrap();
        compressible_files(d).unwrap();
        odd_names(d).unwrap();
        hard_links(d).unwrap();
        symlinks(d).unwrap();
        big_directory_n(d, 600).unwrap();
        assert_eq!(std::fs::read_dir(d.join("big")).unwrap().count(), 600);
        if sys::is_root() {
            special_files(d).unwrap();
        }
        let n = std::fs::read_dir(d.join("links/many")).unwrap().count();
        assert_eq!(n, 301);
    }
}

//! The kernel as the oracle for `data::compression`.
//!
//! For each of zlib, LZO and zstd: make an image with `mkfs.btrfs`, loop-mount
//! it with `compress-force`, and write files of text, random and mixed data
//! in several sizes (inline, one sector, 128 KiB + 1, 1 MiB, ...). Also write
//! the same contents a second time with `BTRFS_IOC_ENCODED_WRITE`, handing the
//! kernel extents compressed by [`compress`]. After unmounting:
//!
//! 1. every file extent item in `btrfs inspect-internal dump-tree` is read
//!    raw from the image (logical to physical through the chunk items: single
//!    and DUP, first stripe) and [`decompress`] must give the file's bytes;
//! 2. the image is mounted again and the kernel must read back every file,
//!    including the ones compressed by ubtrfs;
//! 3. `btrfs check --readonly` must pass.
//!
//! Needs root, btrfs-progs and loop devices. Without them the test says so
//! and passes, unless `UBTRFS_REQUIRE_KERNEL=1` is set, where it fails.

#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use ubtrfs::data::compression::{Compression, compress, compress_stream, decompress};

const SECTOR: u32 = 4096;
const MAX_EXTENT: usize = 128 * 1024;
const SIZES: [usize; 7] = [1, 3000, 4096, 10_000, 131_073, 200_000, 1 << 20];
const CONTENTS: [&str; 3] = ["text", "random", "mixed"];

// ------------------------------------------------------------ test data

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn content(kind: &str, n: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(n + 64);
    let mut i = 0u64;
    while text.len() < n {
        text.extend_from_slice(
            format!(
                "{i:08} a fairly compressible line of text, number {} of many\n",
                i % 97
            )
            .as_bytes(),
        );
        i += 1;
    }
    text.truncate(n);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    match kind {
        "text" => text,
        "random" => (0..n).map(|_| rng.next() as u8).collect(),
        "mixed" => {
            for (i, chunk) in text.chunks_mut(1000).enumerate() {
                if i % 2 == 1 {
                    chunk.iter_mut().for_each(|b| *b = rng.next() as u8);
                }
            }
            text
        }
        _ => unreachable!(),
    }
}

// ------------------------------------------------------------ environment

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Why the kernel test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices (/dev/loop-control)".into());
    }
    for tool in ["mkfs.btrfs", "btrfs", "mount", "umount"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// A scratch directory with an image and a mount point; unmounts and
/// removes everything when dropped, also when the test fails.
struct Scratch {
    dir: PathBuf,
    image: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "ubtrfs-compression-kernel-{}-{tag}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("mnt")).unwrap();
        let image = dir.join("image");
        File::create(&image).unwrap().set_len(512 << 20).unwrap();
        Scratch {
            mnt: dir.join("mnt"),
            dir,
            image,
            mounted: false,
        }
    }

    fn mount(&mut self, options: &str) -> Result<(), String> {
        let opts = format!("loop,{options}");
        run(
            "mount",
            &[
                "-t",
                "btrfs",
                "-o",
                &opts,
                self.image.to_str().unwrap(),
                self.mnt.to_str().unwrap(),
            ],
        )?;
        self.mounted = true;
        Ok(())
    }

    fn umount(&mut self) {
        if self.mounted {
            run("umount", &[self.mnt.to_str().unwrap()]).unwrap();
            self.mounted = false;
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------ encoded write

/// `struct btrfs_ioctl_encoded_io_args` of the btrfs ioctl interface.
#[repr(C)]
struct EncodedIoArgs {
    iov: *const libc::iovec,
    iovcnt: libc::c_ulong,
    offset: i64,
    flags: u64,
    len: u64,
    unencoded_len: u64,
    unencoded_offset: u64,
    compression: u32,
    encryption: u32,
    reserved: [u8; 64],
}

/// `_IOW(0x94, 64, struct btrfs_ioctl_encoded_io_args)`.
const BTRFS_IOC_ENCODED_WRITE: libc::c_ulong =
    (1 << 30) | ((std::mem::size_of::<EncodedIoArgs>() as libc::c_ulong) << 16) | (0x94 << 8) | 64;

/// The compression codes of the encoded I/O interface (not the on-disk ones).
fn encoded_io_compression(kind: Compression) -> u32 {
    match kind {
        Compression::None => 0,
        Compression::Zlib => 1,
        Compression::Zstd => 2,
        Compression::Lzo => match SECTOR {
            4096 => 3,
            8192 => 4,
            16384 => 5,
            32768 => 6,
            _ => 7,
        },
    }
}

fn encoded_write(file: &File, offset: u64, data_len: usize, kind: Compression, stream: &[u8]) {
    let iov = libc::iovec {
        iov_base: stream.as_ptr() as *mut libc::c_void,
        iov_len: stream.len(),
    };
    let args = EncodedIoArgs {
        iov: &iov,
        iovcnt: 1,
        offset: offset as i64,
        flags: 0,
        len: data_len as u64,
        unencoded_len: data_len as u64,
        unencoded_offset: 0,
        compression: encoded_io_compression(kind),
        encryption: 0,
        reserved: [0; 64],
    };
    // SAFETY: args and the iovec it points to outlive the call; the kernel
    // only reads them and the stream buffer.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BTRFS_IOC_ENCODED_WRITE as _, &args) };
    assert!(
        ret >= 0,
        "BTRFS_IOC_ENCODED_WRITE {kind} at {offset}, {data_len} bytes from {}: {}",
        stream.len(),
        std::io::Error::last_os_error()
    );
}

/// Write `data` as ubtrfs would: each 128 KiB piece compressed by
/// [`compress`] when that saves a sector, a small file's only piece by
/// [`compress_stream`] when that is shorter (the kernel may make it inline).
/// Returns how many pieces went in compressed.
fn write_with_ubtrfs(path: &Path, data: &[u8], kind: Compression) -> usize {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap();
    let mut compressed = 0;
    for (i, piece) in data.chunks(MAX_EXTENT).enumerate() {
        let offset = (i * MAX_EXTENT) as u64;
        let stream = if data.len() < SECTOR as usize {
            compress_stream(kind, None, piece, SECTOR)
                .unwrap()
                .filter(|s| s.len() < piece.len())
        } else {
            compress(kind, None, piece, SECTOR).unwrap()
        };
        match stream {
            Some(stream) => {
                encoded_write(&file, offset, piece.len(), kind, &stream);
                compressed += 1;
            }
            None => file.write_all_at(piece, offset).unwrap(),
        }
    }
    compressed
}

// ------------------------------------------------------------ dump-tree

/// One chunk: logical start, length, physical offset of its first stripe.
struct Chunk {
    logical: u64,
    length: u64,
    physical: u64,
}

fn number_after(line: &str, word: &str) -> Option<u64> {
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == word {
            return it.next()?.trim_end_matches([')', ',']).parse().ok();
        }
    }
    None
}

fn parse_chunks(dump: &str) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut current: Option<(u64, u64)> = None;
    for line in dump.lines() {
        let t = line.trim();
        if t.starts_with("item ") && t.contains("CHUNK_ITEM") {
            let logical = t
                .split("CHUNK_ITEM ")
                .nth(1)
                .and_then(|s| s.split(')').next())
                .and_then(|s| s.parse().ok())
                .expect("chunk item key");
            current = Some((logical, 0));
        } else if t.starts_with("length ") && current.is_some() {
            let ty = t.split("type ").nth(1).unwrap_or("");
            assert!(
                !ty.contains("RAID"),
                "chunk profile {ty}: this test maps only single and DUP"
            );
            current.as_mut().unwrap().1 = number_after(t, "length").unwrap();
        } else if t.starts_with("stripe 0 ") {
            let Some((logical, length)) = current.take() else {
                continue;
            };
            chunks.push(Chunk {
                logical,
                length,
                physical: number_after(t, "offset").unwrap(),
            });
        }
    }
    chunks
}

fn physical(chunks: &[Chunk], logical: u64) -> u64 {
    let c = chunks
        .iter()
        .find(|c| logical >= c.logical && logical < c.logical + c.length)
        .unwrap_or_else(|| panic!("logical {logical} is in no chunk"));
    logical - c.logical + c.physical
}

#[derive(Debug)]
enum Extent {
    Inline {
        leaf: u64,
        itemoff: u64,
        itemsize: u64,
        ram: u64,
        compression: u8,
    },
    Regular {
        disk_bytenr: u64,
        disk_len: u64,
        offset: u64,
        len: u64,
        ram: u64,
        compression: u8,
    },
}

/// File extents by inode and file offset, and names by inode.
type FsTree = (BTreeMap<(u64, u64), Extent>, HashMap<u64, String>);

fn parse_fs_tree(dump: &str) -> FsTree {
    let mut extents = BTreeMap::new();
    let mut names = HashMap::new();
    let mut leaf = 0u64;
    let lines: Vec<&str> = dump.lines().map(str::trim).collect();
    for (i, t) in lines.iter().enumerate() {
        if t.starts_with("leaf ") {
            leaf = number_after(t, "leaf").unwrap();
            continue;
        }
        if !t.starts_with("item ") {
            continue;
        }
        let key = t
            .split("key (")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .unwrap_or("");
        let parts: Vec<&str> = key.split_whitespace().collect();
        if parts.len() != 3 {
            continue;
        }
        let Ok(ino) = parts[0].parse::<u64>() else {
            continue;
        };
        let next = |k: usize| lines.get(i + k).copied().unwrap_or("");
        match parts[1] {
            "INODE_REF" => {
                if let Some(name) = next(1).split("name: ").nth(1) {
                    names.insert(ino, name.to_string());
                }
            }
            "EXTENT_DATA" => {
                let file_offset: u64 = parts[2].parse().unwrap();
                let itemoff = number_after(t, "itemoff").unwrap();
                let itemsize = number_after(t, "itemsize").unwrap();
                let kind_line = next(1);
                let extent = if kind_line.contains("(inline)") {
                    let l = next(2);
                    Extent::Inline {
                        leaf,
                        itemoff,
                        itemsize,
                        ram: number_after(l, "ram_bytes").unwrap(),
                        compression: number_after(l, "compression").unwrap() as u8,
                    }
                } else if kind_line.contains("(regular)") {
                    let (a, b, c) = (next(2), next(3), next(4));
                    Extent::Regular {
                        disk_bytenr: number_after(a, "byte").unwrap(),
                        disk_len: number_after(a, "nr").unwrap(),
                        offset: number_after(b, "offset").unwrap(),
                        len: number_after(b, "nr").unwrap(),
                        ram: number_after(b, "ram").unwrap(),
                        compression: number_after(c, "compression").unwrap() as u8,
                    }
                } else {
                    panic!("unexpected file extent: {kind_line}");
                };
                extents.insert((ino, file_offset), extent);
            }
            _ => {}
        }
    }
    (extents, names)
}

// ------------------------------------------------------------ the test

#[derive(Default, Debug)]
struct Seen {
    inline_compressed: usize,
    regular_compressed: usize,
    multi_sector_compressed: usize,
    past_eof: usize,
    uncompressed: usize,
}

fn check_algorithm(kind: Compression) {
    let mut s = Scratch::new(kind.name());
    let image = s.image.to_str().unwrap().to_string();
    run(
        "mkfs.btrfs",
        &[
            "-q",
            "-f",
            "-s",
            &SECTOR.to_string(),
            "-d",
            "single",
            "-m",
            "dup",
            &image,
        ],
    )
    .unwrap();
    // The kernel compresses these files.
    s.mount(&format!("compress-force={}", kind.name())).unwrap();
    let mut expected: HashMap<String, Vec<u8>> = HashMap::new();
    for what in CONTENTS {
        for n in SIZES {
            let data = content(what, n);
            let name = format!("{what}-{n}");
            fs::write(s.mnt.join(&name), &data).unwrap();
            expected.insert(name, data);
        }
    }
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    s.umount();

    // ubtrfs compresses these; mounted without compression, so every
    // compressed extent of theirs is ours.
    s.mount("noatime").unwrap();
    let mut ours_compressed = 0;
    for what in CONTENTS {
        for n in SIZES {
            let data = content(what, n);
            let name = format!("ubtrfs-{what}-{n}");
            ours_compressed += write_with_ubtrfs(&s.mnt.join(&name), &data, kind);
            expected.insert(name, data);
        }
    }
    assert!(
        ours_compressed > 10,
        "{kind}: too few pieces compressed by ubtrfs"
    );
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    s.umount();

    // 1. Our decoder on every extent, as the kernel wrote it.
    let chunks = parse_chunks(
        &run(
            "btrfs",
            &["inspect-internal", "dump-tree", "-t", "chunk", &image],
        )
        .unwrap(),
    );
    let (extents, names) = parse_fs_tree(
        &run(
            "btrfs",
            &["inspect-internal", "dump-tree", "-t", "5", &image],
        )
        .unwrap(),
    );
    let raw = File::open(&s.image).unwrap();
    let read = |at: u64, len: u64| {
        let mut buf = vec![0u8; len as usize];
        raw.read_exact_at(&mut buf, at).unwrap();
        buf
    };
    // Counted apart: extents the kernel compressed, and ubtrfs's.
    let (mut by_kernel, mut by_ubtrfs) = (Seen::default(), Seen::default());
    let mut covered: HashMap<String, u64> = HashMap::new();
    for (&(ino, file_offset), extent) in &extents {
        let name = names
            .get(&ino)
            .unwrap_or_else(|| panic!("inode {ino} has no name"));
        let data = &expected[name];
        let what = format!("{kind} {name} extent at {file_offset}");
        let (compression, stream, ram, skip, len) = match *extent {
            Extent::Inline {
                leaf,
                itemoff,
                itemsize,
                ram,
                compression,
            } => {
                // Leaf header 101 bytes; inline data after the 21-byte
                // file extent header.
                let at = physical(&chunks, leaf) + 101 + itemoff + 21;
                (compression, read(at, itemsize - 21), ram, 0, ram)
            }
            Extent::Regular {
                disk_bytenr,
                disk_len,
                offset,
                len,
                ram,
                compression,
            } => {
                assert_ne!(disk_bytenr, 0, "{what}: unexpected hole");
                (
                    compression,
                    read(physical(&chunks, disk_bytenr), disk_len),
                    ram,
                    offset,
                    len,
                )
            }
        };
        let ckind = Compression::from_disk(compression).unwrap();
        assert!(
            ckind == kind || ckind == Compression::None,
            "{what}: compression {ckind}"
        );
        let out = decompress(ckind, &stream, ram as usize, SECTOR)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(out.len() as u64, ram);
        let got = &out[skip as usize..(skip + len) as usize];
        let start = file_offset as usize;
        let end = (start + len as usize).min(data.len());
        assert!(
            got[..end - start] == data[start..end],
            "{what}: wrong bytes"
        );
        assert!(
            got[end - start..].iter().all(|&b| b == 0),
            "{what}: bytes past the end of the file are not zero"
        );
        *covered.entry(name.clone()).or_default() += len;
        let seen = if name.starts_with("ubtrfs-") {
            &mut by_ubtrfs
        } else {
            &mut by_kernel
        };
        match extent {
            _ if ckind == Compression::None => seen.uncompressed += 1,
            Extent::Inline { .. } => seen.inline_compressed += 1,
            Extent::Regular { .. } => {
                seen.regular_compressed += 1;
                if ram > SECTOR as u64 {
                    seen.multi_sector_compressed += 1;
                }
                // The file ends inside the extent: the tail must read as zeros.
                if (end - start) < len as usize {
                    seen.past_eof += 1;
                }
            }
        }
    }
    for (name, data) in &expected {
        let c = covered.get(name).copied().unwrap_or(0);
        assert!(
            c >= data.len() as u64,
            "{kind} {name}: extents cover {c} of {} bytes",
            data.len()
        );
    }
    eprintln!("{kind}: kernel {by_kernel:?}");
    eprintln!("{kind}: ubtrfs {by_ubtrfs:?}");
    for (who, seen) in [("kernel", &by_kernel), ("ubtrfs", &by_ubtrfs)] {
        assert!(seen.inline_compressed >= 2, "{kind} {who}: {seen:?}");
        assert!(seen.multi_sector_compressed >= 20, "{kind} {who}: {seen:?}");
        assert!(seen.past_eof >= 4, "{kind} {who}: {seen:?}");
        assert!(seen.uncompressed >= 1, "{kind} {who}: {seen:?}");
    }

    // 2. The kernel reads back everything, ours included.
    s.mount("ro").unwrap();
    for (name, data) in &expected {
        let got = fs::read(s.mnt.join(name)).unwrap();
        assert!(
            got == *data,
            "{kind} {name}: the kernel read different bytes"
        );
    }
    s.umount();

    // 3. The filesystem is consistent (data checksums included).
    run(
        "btrfs",
        &["check", "--readonly", "--check-data-csum", &image],
    )
    .unwrap();
}

#[test]
fn kernel_compressed_extents() {
    if let Some(why) = missing_prerequisite() {
        panic!(
            "the kernel compression test needs root, loop devices and btrfs-progs (scripts/test.sh installs them): {why}"
        );
    }
    for kind in [Compression::Zlib, Compression::Lzo, Compression::Zstd] {
        check_algorithm(kind);
    }
}

#[test]
fn encoded_io_ioctl_size() {
    // The ioctl number encodes the argument size: 128 bytes on 64-bit.
    if cfg!(target_pointer_width = "64") {
        assert_eq!(std::mem::size_of::<EncodedIoArgs>(), 128);
    }
}

//! Differential tests of the `ubtrfs` binary against the kernel: images
//! made by `mkfs.btrfs --rootdir` and by the kernel through loop mounts are
//! read back by `ubtrfs restore`, `ubtrfs mount --ro` (FUSE), `ubtrfs cat`
//! and `ubtrfs ls`, and what ubtrfs shows is compared, entry by entry, with
//! what the kernel shows of the same image mounted read-only.
//!
//! 1. mkfs corpus: every checksum type with every node size, DUP metadata
//!    and data, over the generated tree; mixed block groups; fat extent
//!    items.
//! 2. Multi-device corpus, filled by the kernel: RAID0, RAID1, RAID10,
//!    RAID1C3, RAID1C4, RAID5, RAID6, with compressed extents across
//!    stripes; mirrored profiles also read degraded; RAID10 also via FUSE.
//! 3. Kernel corpus: one image holding every kind of extent and inode the
//!    kernel writes (sparse, fallocate, inline, zlib/lzo/zstd, NOCOW,
//!    reflinks, snapshots, nested subvolumes, 20,000 entries, hash
//!    collisions, odd names, xattrs, links, special files, nanosecond
//!    times), on three node sizes; a default subvolume after quotas, a
//!    subvolume deletion and a balance; an image without `no-holes`.
//! 4. The kernel corpus and others through the read-only FUSE mount,
//!    compared strictly (and `st_blocks`, `d_type`); reads at offsets past
//!    4 GiB and 16 TiB.
//! 5. `cat` and `ls` of chosen paths against the kernel's bytes and names.
//! 6. Exit codes and messages on errors.
//!
//! The one difference allowed: a nested subvolume seen through a snapshot
//! is an empty directory that the kernel makes up with the current time
//! ([`PLACEHOLDERS`]); its times are not compared. Restores go to a tmpfs
//! (see `common::Tmpfs`) and are compared without directory sizes and link
//! counts, and without `btrfs.*` properties, which only btrfs holds.
//! Needs root, loop devices, the btrfs module, btrfs-progs and fuse3.

mod common;

use common::*;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use testkit::populate;
use testkit::*;

/// Seed of the generated tree of the mkfs corpus.
const MKFS_SEED: u64 = 7;
/// Seed of the generated trees of the multi-device corpus.
const MULTI_SEED: u64 = 8;

/// How a restored tree is compared with the kernel's view: directory sizes
/// and link counts of the host's tmpfs are its own, and it cannot hold
/// btrfs properties (`btrfs.compression`), which restore skips (the FUSE
/// mount shows them).
fn restored_view() -> CompareOptions {
    CompareOptions {
        ignore_xattrs: vec!["btrfs.".into()],
        ..CompareOptions::across_filesystems()
    }
}

/// Restore `img` into a tmpfs and compare the result with the kernel's
/// read-only mount of it. Returns the kernel mount for further checks.
fn restore_and_compare(t: &TestDir, what: &str, img: &Image, times_exempt: &[&str]) -> Mount {
    let out_fs = Tmpfs::new(&t.join("restore-fs"));
    // A DESTDIR that restore creates gets the root directory's attributes.
    let out = out_fs.path().join("out");
    restore(&img.devices, &out);
    let m = img.mount(&t.join("kernel"), "ro").unwrap();
    assert_same_view(
        &format!("{what}: restore"),
        m.path(),
        &out,
        &restored_view(),
        times_exempt,
    );
    drop(out_fs);
    m
}

/// Serve `img` through FUSE and compare the mount with the kernel's mount
/// `kernel` of the same image, as strictly as two views of one filesystem
/// can be compared (only inode numbers differ, which link groups absorb).
fn fuse_compare(t: &TestDir, what: &str, img: &Image, kernel: &Path, times_exempt: &[&str]) {
    let f = FuseMount::new(&img.devices, &t.join("fuse"));
    assert_same_view(
        &format!("{what}: FUSE mount"),
        kernel,
        f.path(),
        &CompareOptions::strict(),
        times_exempt,
    );
    assert_same_blocks_and_dtypes(&format!("{what}: FUSE mount"), kernel, f.path());
    f.unmount();
}

// ---------------------------------------------------------------------------
// 1. mkfs --rootdir corpus.

fn mkfs_case(name: &str, csum: Csum, nodesize: u32) {
    let opts = MkfsOptions {
        csum,
        nodesize,
        metadata: Profile::Dup,
        data: Profile::Dup,
        ..MkfsOptions::default()
    };
    let spec = TreeSpec::default().for_rootdir(&opts);
    let img = cached_rootdir_image(MKFS_SEED, &spec, &opts).unwrap();
    let t = TestDir::new(name).unwrap();
    let m = restore_and_compare(&t, &opts.label(), &img, &[]);
    m.unmount().unwrap();
}

macro_rules! mkfs_tests {
    ($($name:ident: $csum:expr, $nodesize:expr;)*) => {$(
        #[test]
        fn $name() {
            require_privileged!();
            mkfs_case(stringify!($name), $csum, $nodesize);
        }
    )*};
}

mkfs_tests! {
    mkfs_crc32c_4k: Csum::Crc32c, 4096;
    mkfs_crc32c_16k: Csum::Crc32c, 16384;
    mkfs_crc32c_64k: Csum::Crc32c, 65536;
    mkfs_xxhash_4k: Csum::Xxhash, 4096;
    mkfs_xxhash_16k: Csum::Xxhash, 16384;
    mkfs_xxhash_64k: Csum::Xxhash, 65536;
    mkfs_sha256_4k: Csum::Sha256, 4096;
    mkfs_sha256_16k: Csum::Sha256, 16384;
    mkfs_sha256_64k: Csum::Sha256, 65536;
    mkfs_blake2_4k: Csum::Blake2, 4096;
    mkfs_blake2_16k: Csum::Blake2, 16384;
    mkfs_blake2_64k: Csum::Blake2, 65536;
}

/// Other mkfs layouts: mixed data and metadata block groups, and extent
/// items without skinny metadata.
#[test]
fn mkfs_mixed_and_fat_extents() {
    require_privileged!();
    let layouts = [
        MkfsOptions {
            mixed: true,
            nodesize: 4096,
            metadata: Profile::Dup,
            data: Profile::Dup,
            ..MkfsOptions::default()
        },
        MkfsOptions {
            features: vec!["^skinny-metadata".into()],
            ..MkfsOptions::with_csum(Csum::Xxhash)
        },
    ];
    for opts in layouts {
        let spec = TreeSpec::default().for_rootdir(&opts);
        let img = cached_rootdir_image(MKFS_SEED, &spec, &opts).unwrap();
        let label = opts.label();
        let t = TestDir::new(&label).unwrap();
        let m = restore_and_compare(&t, &label, &img, &[]);
        m.unmount().unwrap();
    }
}

// ---------------------------------------------------------------------------
// 2. Multi-device corpus.

/// The generated tree (with 3 MiB files, so data is striped), then
/// compressed files written through `compress-force=ALGO`: compressed
/// extents that straddle stripes.
fn populate_multi(dir: &Path, algo: Compression) -> anyhow::Result<()> {
    gen_tree(dir, MULTI_SEED, &TreeSpec::default())?;
    remount(dir, &format!("compress-force={}", algo.as_str()))?;
    populate::compressible_files(dir)?;
    sys::syncfs(dir)?;
    Ok(())
}

/// `mkfs.btrfs -d P -m P` on the devices the profile needs, filled by the
/// kernel (see [`populate_multi`]).
fn multi_image(t: &TestDir, profile: Profile) -> Image {
    let opts = KernelImageOptions {
        mkfs: MkfsOptions::multi(profile),
        mount_options: String::new(),
    };
    kernel_image(&t.join("img"), &opts, |d| {
        populate_multi(d, Compression::Zstd)
    })
    .unwrap()
}

/// Restore from `devices`, a subset of the image's, and compare with the
/// kernel's view `kernel` of the whole filesystem: every copy that the
/// missing devices held is still on the others.
fn degraded_restore_and_compare(t: &TestDir, what: &str, devices: &[PathBuf], kernel: &Path) {
    let out_fs = Tmpfs::new(&t.join("degraded-restore-fs"));
    let out = out_fs.path().join("out");
    restore_allowing(devices, &out, &["missing; reading degraded"]);
    assert_same_view(
        &format!("{what}: degraded restore"),
        kernel,
        &out,
        &restored_view(),
        &[],
    );
}

/// `missing`: how many devices a degraded read may do without (the
/// profile's redundancy).
fn multi_case(profile: Profile, fuse: bool, missing: usize) {
    let name = format!("multi-{}", profile.as_str());
    let t = TestDir::new(&name).unwrap();
    let img = multi_image(&t, profile);
    let m = restore_and_compare(&t, &name, &img, &[]);
    if fuse {
        fuse_compare(&t, &name, &img, m.path(), &[]);
    }
    if missing > 0 {
        // Without the first devices (device 1 holds the primary superblock
        // copy that is read first), then without the last ones.
        let n = img.devices.len();
        degraded_restore_and_compare(&t, &name, &img.devices[missing..], m.path());
        degraded_restore_and_compare(&t, &name, &img.devices[..n - missing], m.path());
    }
    // The devices in another order are the same filesystem.
    let mut rev = img.devices.clone();
    rev.reverse();
    let path = "/";
    let o = ubtrfs(args_with_devices(&["ls"], &rev, &[OsStr::new(path)]));
    assert_success("ubtrfs ls with the devices reversed", &o);
    assert_eq!(
        o.stdout,
        sorted_names(m.path()),
        "{name}: ls / (devices reversed)"
    );
    m.unmount().unwrap();
}

#[test]
fn multi_raid0() {
    require_privileged!();
    multi_case(Profile::Raid0, false, 0);
}

#[test]
fn multi_raid1() {
    require_privileged!();
    multi_case(Profile::Raid1, false, 1);
}

#[test]
fn multi_raid10() {
    require_privileged!();
    multi_case(Profile::Raid10, true, 1);
}

#[test]
fn multi_raid1c3() {
    require_privileged!();
    multi_case(Profile::Raid1c3, false, 2);
}

#[test]
fn multi_raid1c4() {
    require_privileged!();
    multi_case(Profile::Raid1c4, false, 3);
}

/// RAID5 and RAID6 (data and metadata), which the test kit's profiles
/// leave out: mkfs by hand, filled by the kernel.
fn raid56_case(profile: &str, ndev: usize) {
    let name = format!("multi-{profile}");
    let t = TestDir::new(&name).unwrap();
    let dir = t.mkdir("img").unwrap();
    let devices: Vec<_> = (0..ndev)
        .map(|i| {
            t.sparse_file(format!("img/disk{i}.img"), 160 << 20)
                .unwrap()
        })
        .collect();
    run(command("mkfs.btrfs")
        .args(["-f", "-q", "-d", profile, "-m", profile])
        .args(&devices))
    .unwrap();
    {
        let m = Mount::new(&devices, &dir.join("populate"), "").unwrap();
        populate_multi(m.path(), Compression::Lzo).unwrap();
        m.unmount().unwrap();
    }
    let img = Image {
        devices,
        source: None,
        mkfs: MkfsOptions::default(),
        mount_options: String::new(),
        builder: testkit::corpus::Builder::Kernel,
    };
    let m = restore_and_compare(&t, &name, &img, &[]);
    m.unmount().unwrap();
}

#[test]
fn multi_raid5() {
    require_privileged!();
    raid56_case("raid5", 3);
}

#[test]
fn multi_raid6() {
    require_privileged!();
    raid56_case("raid6", 4);
}

// ---------------------------------------------------------------------------
// 3-5. Kernel corpus.

/// Directories that the kernel shows as empty placeholders with made-up
/// times: nested subvolumes seen through a snapshot of their parent.
const PLACEHOLDERS: &[&str] = &[
    "snap-of-top/subvol",
    "snap-of-top/snap-rw",
    "snap-of-top/snap-ro",
    "snap-of-sv1/sv2",
];

/// `mount -o remount,OPTS` of a kernel mount.
fn remount(mnt: &Path, opts: &str) -> anyhow::Result<()> {
    run(command("mount")
        .arg("-o")
        .arg(format!("remount,{opts}"))
        .arg(mnt))?;
    Ok(())
}

/// Set `FS_NOCOW_FL` (`chattr +C`) on an empty file or a directory (whose
/// new files inherit it): no copy-on-write and no data checksums.
fn set_nocow(p: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    const FS_NOCOW_FL: libc::c_int = 0x0080_0000;
    let f = std::fs::File::open(p)?;
    let mut flags: libc::c_int = 0;
    // SAFETY: the fd is open; both ioctls read or write one int.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        flags |= FS_NOCOW_FL;
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    Ok(())
}

/// The name hash of btrfs directory and xattr items: CRC32C (Castagnoli,
/// reflected) of the name with the register started at !1 and no final
/// inversion. Bitwise; only the test's collision search uses it.
fn btrfs_name_hash(name: &[u8]) -> u32 {
    let mut crc: u32 = !1;
    for &b in name {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// The first `pairs` pairs of names `{prefix}{n}` with equal name hashes.
fn hash_collisions(prefix: &str, pairs: usize) -> Vec<(String, String)> {
    let mut seen = std::collections::HashMap::new();
    let mut out = Vec::new();
    for i in 0u64.. {
        let name = format!("{prefix}{i}");
        if let Some(other) = seen.insert(btrfs_name_hash(name.as_bytes()), name.clone()) {
            out.push((other, name));
            if out.len() == pairs {
                break;
            }
        }
    }
    out
}

/// Names whose hashes collide share one DIR_ITEM (or XATTR_ITEM) key, so a
/// lookup must look past the first name in the item: a directory with
/// colliding file names, and a file with colliding xattr names.
fn populate_collisions(dir: &Path) -> anyhow::Result<()> {
    let d = dir.join("collisions");
    std::fs::create_dir(&d)?;
    for (i, (a, b)) in hash_collisions("name-", 3).into_iter().enumerate() {
        std::fs::write(d.join(&a), format!("first of pair {i}: {a}\n"))?;
        std::fs::write(d.join(&b), format!("second of pair {i}: {b}\n"))?;
    }
    let f = d.join("xattrs");
    std::fs::write(&f, b"")?;
    for (a, b) in hash_collisions("user.x", 3) {
        sys::set_xattr(&f, &a, a.as_bytes())?;
        sys::set_xattr(&f, &b, b.as_bytes())?;
    }
    Ok(())
}

/// What the test kit's populate functions leave out: files without data
/// checksums (NOCOW), a file of 4,000 extents, a file whose extent is
/// referenced piecemeal after many small overwrites, a directory whose
/// index has gaps after deletions and renames, a file with a per-file
/// compression property, and a 256 MiB file that is mostly hole.
fn populate_extra(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut rng = Rng::new(0xe7a);
    let d = dir.join("extra");
    std::fs::create_dir(&d)?;

    let nocow = d.join("nocow");
    std::fs::create_dir(&nocow)?;
    set_nocow(&nocow)?;
    std::fs::write(nocow.join("small"), rng.bytes(3000))?;
    std::fs::write(nocow.join("one-mib"), rng.bytes(1 << 20))?;
    sys::syncfs(dir)?;
    // Overwritten in place (NOCOW), and preallocated then partly written.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(nocow.join("one-mib"))?;
    f.write_all_at(&rng.bytes(10_000), 300_000)?;
    let f = std::fs::File::create(nocow.join("prealloc"))?;
    sys::fallocate(&f, 0, 0, 1 << 20)?;
    f.write_all_at(&rng.bytes(8192), 65536)?;

    let f = std::fs::File::create(d.join("fragmented"))?;
    let block = rng.bytes(4096);
    for i in 0..4000u64 {
        f.write_all_at(&block[(i % 7) as usize..], i * 8192)?;
    }

    let f = std::fs::File::create(d.join("overwritten-in-pieces"))?;
    f.write_all_at(&rng.bytes(1 << 20), 0)?;
    f.sync_all()?;
    for _ in 0..30 {
        let off = rng.range(0, (1 << 20) - 5000);
        let len = rng.range(1, 5000) as usize;
        f.write_all_at(&rng.bytes(len), off)?;
        f.sync_all()?;
    }

    let churn = d.join("churn");
    let other = d.join("churn-other");
    std::fs::create_dir(&churn)?;
    std::fs::create_dir(&other)?;
    for i in 0..3000 {
        std::fs::write(churn.join(format!("f{i:04}")), format!("{i}\n"))?;
    }
    for i in 0..3000 {
        let p = churn.join(format!("f{i:04}"));
        match i % 5 {
            0 | 1 => std::fs::remove_file(&p)?,
            2 => std::fs::rename(&p, other.join(format!("moved-{i:04}")))?,
            3 => std::fs::rename(
                &p,
                churn.join(format!("renamed-{i:04}-{}", "r".repeat(i % 90))),
            )?,
            _ => {}
        }
    }

    let prop = d.join("property-zstd");
    std::fs::File::create(&prop)?;
    run(command("btrfs")
        .args(["property", "set"])
        .arg(&prop)
        .args(["compression", "zstd"]))?;
    std::fs::write(&prop, testkit::generate::compressible_bytes(77, 1 << 20))?;

    let f = std::fs::File::create(d.join("mostly-hole"))?;
    f.write_all_at(b"start", 0)?;
    f.write_all_at(&rng.bytes(70_000), 100 << 20)?;
    f.write_all_at(b"end", (256 << 20) - 3)?;
    Ok(())
}

/// Everything the kernel corpus holds, written through one mount. Node
/// sizes below 8 KiB hold neither a 4095-byte symlink target nor a
/// 4000-byte xattr value, so there symlinks and xattrs come from the
/// generated tree only.
fn populate_everything(dir: &Path, nodesize: u32) -> anyhow::Result<()> {
    // First, so the snapshot of the top level holds only the subvolumes.
    populate::snapshots(dir)?;
    populate::nested_subvolumes(dir)?;
    // Each algorithm on its own files; written back before the next
    // remount, since the algorithm is chosen at writeback.
    for c in Compression::ALL {
        remount(dir, &format!("compress-force={}", c.as_str()))?;
        let d = dir.join(format!("compressed-{}", c.as_str()));
        std::fs::create_dir(&d)?;
        populate::compressible_files(&d)?;
        sys::syncfs(dir)?;
    }
    remount(dir, "compress=no")?;
    populate::sparse_files(dir)?;
    populate::fallocated_files(dir)?;
    populate::inline_files(dir)?;
    // Uncompressed here.
    populate::compressible_files(dir)?;
    populate::reflinked_files(dir)?;
    populate::odd_names(dir)?;
    populate::hard_links(dir)?;
    if nodesize >= 8192 {
        populate::xattrs(dir)?;
        populate::symlinks(dir)?;
    }
    populate::special_files(dir)?;
    populate::big_directory(dir)?;
    populate_extra(dir)?;
    populate_collisions(dir)?;
    gen_tree(
        &dir.join("generated"),
        1,
        &TreeSpec::default().for_nodesize(nodesize),
    )?;
    // The root directory's own attributes, last: populating changes its times.
    sys::set_xattr(dir, "user.on-root", b"root value")?;
    sys::lchown(dir, 4321, 8765)?;
    sys::chmod(dir, 0o1751)?;
    sys::set_times(
        dir,
        sys::Timestamp::new(1_111_111_111, 1),
        sys::Timestamp::new(-12_345, 999_999_999),
    )?;
    Ok(())
}

fn kernel_corpus_image(t: &TestDir, csum: Csum, nodesize: u32) -> Image {
    let opts = KernelImageOptions {
        mkfs: MkfsOptions {
            csum,
            nodesize,
            device_size: 1 << 30,
            ..MkfsOptions::default()
        },
        mount_options: String::new(),
    };
    kernel_image(&t.join("img"), &opts, |d| populate_everything(d, nodesize)).unwrap()
}

/// What `ls` prints for the directory `dir` of the kernel's mount: every
/// name, sorted bytewise, one per line.
fn sorted_names(dir: &Path) -> Vec<u8> {
    let mut names: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_vec())
        .collect();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        out.extend(n);
        out.push(b'\n');
    }
    out
}

/// `ubtrfs cat` of `paths` equals the kernel's bytes.
fn check_cat(img: &Image, kernel: &Path, paths: &[&[u8]]) {
    for p in paths {
        let path = Path::new(OsStr::from_bytes(p));
        let expected = std::fs::read(kernel.join(OsStr::from_bytes(&p[1..])))
            .unwrap_or_else(|e| panic!("kernel read {}: {e}", path.display()));
        let o = ubtrfs(args_with_devices(
            &["cat"],
            &img.devices,
            &[path.as_os_str()],
        ));
        assert_success(&format!("ubtrfs cat {}", path.display()), &o);
        assert!(
            o.stdout == expected,
            "ubtrfs cat {}: {} bytes, the kernel reads {} bytes{}",
            path.display(),
            o.stdout.len(),
            expected.len(),
            o.stdout
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
                .map(|i| format!(", first difference at offset {i}"))
                .unwrap_or_default()
        );
    }
}

/// `ubtrfs ls` of `dirs` lists the kernel's names.
fn check_ls(img: &Image, kernel: &Path, dirs: &[&[u8]]) {
    for d in dirs {
        let path = Path::new(OsStr::from_bytes(d));
        let o = ubtrfs(args_with_devices(
            &["ls"],
            &img.devices,
            &[path.as_os_str()],
        ));
        assert_success(&format!("ubtrfs ls {}", path.display()), &o);
        let rel = OsStr::from_bytes(d.strip_prefix(b"/").unwrap());
        let expected = sorted_names(&kernel.join(rel));
        if o.stdout != expected {
            let got: Vec<&[u8]> = o.stdout.split(|&b| b == b'\n').collect();
            let want: Vec<&[u8]> = expected.split(|&b| b == b'\n').collect();
            let missing: Vec<String> = want
                .iter()
                .filter(|n| !got.contains(n))
                .take(10)
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            let extra: Vec<String> = got
                .iter()
                .filter(|n| !want.contains(n))
                .take(10)
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            panic!(
                "ubtrfs ls {}: {} lines, the kernel has {}; missing {missing:?}, extra {extra:?}",
                path.display(),
                got.len(),
                want.len()
            );
        }
    }
}

/// The kernel corpus: restore and FUSE against the kernel's view of one
/// image the kernel wrote.
fn kernel_corpus_case(name: &str, csum: Csum, nodesize: u32) -> (TestDir, Image, Mount) {
    let t = TestDir::new(name).unwrap();
    let img = kernel_corpus_image(&t, csum, nodesize);
    let m = restore_and_compare(&t, name, &img, PLACEHOLDERS);
    fuse_compare(&t, name, &img, m.path(), PLACEHOLDERS);
    (t, img, m)
}

/// The kernel corpus with the default checksum and node size, plus `cat`
/// and `ls` of chosen paths.
#[test]
fn kernel_corpus() {
    require_privileged!();
    let (_t, img, m) = kernel_corpus_case("kernel-corpus", Csum::Crc32c, 16384);
    let cat: &[&[u8]] = &[
        b"/compressed-zlib/compress/text-4m",
        b"/compressed-lzo/compress/mixed-4m",
        b"/compressed-zstd/compress/overwritten-inside",
        b"/compressed-zstd/compress/tiny-text",
        b"/compress/sparse-compressed",
        b"/sparse/hole-middle",
        b"/sparse/truncated-into-extent",
        b"/falloc/punched",
        b"/falloc/keep-size-beyond-eof",
        b"/inline/random-2048",
        b"/reflink/clone-range-into-data",
        b"/reflink/clone-of-deleted",
        b"/extra/nocow/one-mib",
        b"/extra/fragmented",
        b"/extra/property-zstd",
        b"/subvol/file-01",
        b"/snap-ro/file-01",
        b"/plain-dir/sv1/sv2/deep/er/sv3/link-00",
        b"/names/bad-\xff\xfe",
        b"/symlinks/chain-1",
    ];
    let collisions: Vec<Vec<u8>> = hash_collisions("name-", 3)
        .into_iter()
        .flat_map(|(a, b)| [a, b])
        .map(|n| format!("/collisions/{n}").into_bytes())
        .collect();
    let cat: Vec<&[u8]> = cat
        .iter()
        .copied()
        .chain(collisions.iter().map(Vec::as_slice))
        .collect();
    let cat = &cat[..];
    check_cat(&img, m.path(), cat);
    let ls: &[&[u8]] = &[
        b"/",
        b"/big",
        b"/names",
        b"/links/many",
        b"/extra/churn",
        b"/collisions",
        b"/snap-of-top",
        b"/snap-of-top/subvol",
        b"/plain-dir/sv1",
    ];
    check_ls(&img, m.path(), ls);
    m.unmount().unwrap();
}

/// The kernel corpus on 64 KiB nodes with SHA-256.
#[test]
fn kernel_corpus_sha256_64k() {
    require_privileged!();
    let (_t, _img, m) = kernel_corpus_case("kernel-corpus-64k", Csum::Sha256, 65536);
    m.unmount().unwrap();
}

/// The kernel corpus on 4 KiB nodes (deep trees) with BLAKE2b.
#[test]
fn kernel_corpus_blake2_4k() {
    require_privileged!();
    let (_t, _img, m) = kernel_corpus_case("kernel-corpus-4k", Csum::Blake2, 4096);
    m.unmount().unwrap();
}

/// A default subvolume other than the top level: the kernel mounts it, and
/// ubtrfs shows it as the root. The filesystem has also been through what
/// changes its trees without changing its files: quotas (qgroup tree), a
/// deleted subvolume, and a full balance (every chunk relocated).
#[test]
fn kernel_default_subvolume() {
    require_privileged!();
    let t = TestDir::new("default-subvol").unwrap();
    let img = kernel_image(&t.join("img"), &KernelImageOptions::default(), |d| {
        let btrfs = |args: &[&OsStr]| run(command("btrfs").args(args)).map(|_| ());
        btrfs(&["quota".as_ref(), "enable".as_ref(), d.as_os_str()])?;
        std::fs::write(d.join("in-top-level"), b"top\n")?;
        populate::nested_subvolumes(d)?;
        let sv2 = d.join("plain-dir/sv1/sv2");
        gen_tree(&sv2.join("generated"), 4, &TreeSpec::small())?;
        populate::reflinked_files(&sv2)?;
        let doomed = d.join("doomed");
        populate::subvolume_create(&doomed)?;
        std::fs::write(doomed.join("file"), vec![1u8; 300_000])?;
        sys::syncfs(d)?;
        btrfs(&["subvolume".as_ref(), "delete".as_ref(), doomed.as_os_str()])?;
        btrfs(&[
            "balance".as_ref(),
            "start".as_ref(),
            "--full-balance".as_ref(),
            d.as_os_str(),
        ])?;
        btrfs(&[
            "subvolume".as_ref(),
            "set-default".as_ref(),
            sv2.as_os_str(),
        ])?;
        Ok(())
    })
    .unwrap();
    let m = restore_and_compare(&t, "default subvolume", &img, &[]);
    assert!(
        m.path().join("generated").is_dir(),
        "the kernel did not mount the default subvolume"
    );
    fuse_compare(&t, "default subvolume", &img, m.path(), &[]);
    check_ls(&img, m.path(), &[b"/", b"/deep/er"]);
    m.unmount().unwrap();
}

/// Without the `no-holes` feature every hole is an explicit extent.
#[test]
fn kernel_hole_extents() {
    require_privileged!();
    let t = TestDir::new("hole-extents").unwrap();
    let opts = KernelImageOptions {
        mkfs: MkfsOptions {
            features: vec!["^no-holes".into()],
            ..MkfsOptions::default()
        },
        mount_options: String::new(),
    };
    let img = kernel_image(&t.join("img"), &opts, |d| {
        populate::sparse_files(d)?;
        populate::fallocated_files(d)?;
        gen_tree(&d.join("generated"), 3, &TreeSpec::small())?;
        Ok(())
    })
    .unwrap();
    let m = restore_and_compare(&t, "no-holes off", &img, &[]);
    check_cat(
        &img,
        m.path(),
        &[
            b"/sparse/many-holes",
            b"/sparse/hole-start",
            b"/falloc/punched",
        ],
    );
    m.unmount().unwrap();
}

/// Where the large-offset files hold data: across the 4 GiB boundary (32-bit
/// byte offsets) and the 16 TiB one (32-bit page indexes).
const FAR_SPOTS: [(u64, usize); 5] = [
    (0, 4096),
    ((4 << 30) - 2048, 8192),
    ((4 << 30) + 5, 100),
    ((16 << 40) - 4096, 12_288),
    ((17 << 40) + 12_345, 70_000),
];

/// Files with data beyond 4 GiB and 16 TiB, plain and compressed, read at
/// those offsets through FUSE and compared with the kernel's bytes. (No
/// restore or full comparison: both would read terabytes of hole.)
#[test]
fn fuse_large_offsets() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    require_privileged!();
    let t = TestDir::new("large-offsets").unwrap();
    let img = kernel_image(&t.join("img"), &KernelImageOptions::default(), |d| {
        let mut rng = Rng::new(0xfa4);
        let f = std::fs::File::create(d.join("far"))?;
        for (off, len) in FAR_SPOTS {
            f.write_all_at(&rng.bytes(len), off)?;
        }
        sys::syncfs(d)?;
        remount(d, "compress-force=zstd")?;
        let f = std::fs::File::create(d.join("far-compressed"))?;
        for (i, (off, len)) in FAR_SPOTS.into_iter().enumerate() {
            let data = testkit::generate::compressible_bytes(i as u64, len + 300_000);
            f.write_all_at(&data, off)?;
        }
        sys::syncfs(d)?;
        Ok(())
    })
    .unwrap();
    let m = img.mount(&t.join("kernel"), "ro").unwrap();
    let fm = FuseMount::new(&img.devices, &t.join("fuse"));
    for name in ["far", "far-compressed"] {
        let k = std::fs::File::open(m.path().join(name)).unwrap();
        let u = std::fs::File::open(fm.path().join(name)).unwrap();
        let (mk, mu) = (k.metadata().unwrap(), u.metadata().unwrap());
        assert_eq!(mk.len(), mu.len(), "{name}: size");
        assert_eq!(mk.blocks(), mu.blocks(), "{name}: st_blocks");
        for (off, len) in FAR_SPOTS {
            let start = off.saturating_sub(5000);
            let n = len + 310_000;
            let (mut bk, mut bu) = (vec![0u8; n], vec![0u8; n]);
            let gk = k.read_at(&mut bk, start).unwrap();
            let gu = u.read_at(&mut bu, start).unwrap();
            assert_eq!(gk, gu, "{name}: bytes read at {start}");
            if let Some(i) = (0..gk).find(|&i| bk[i] != bu[i]) {
                panic!("{name}: first difference at offset {}", start + i as u64);
            }
        }
    }
    fm.unmount();
    m.unmount().unwrap();
}

// ---------------------------------------------------------------------------
// 6. Exit codes and messages.

#[test]
fn errors_exit_nonzero_with_a_message() {
    require_privileged!();
    let opts = MkfsOptions::default();
    let img =
        cached_rootdir_image(MKFS_SEED, &TreeSpec::small().for_rootdir(&opts), &opts).unwrap();
    let t = TestDir::new("exit-codes").unwrap();

    let o = ubtrfs(args_with_devices(
        &["cat"],
        &img.devices,
        &[OsStr::new("/missing")],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "cat /missing succeeded");
    assert!(
        err.contains("/missing"),
        "cat /missing: message names no path: {err}"
    );
    assert!(o.stdout.is_empty());

    let o = ubtrfs(args_with_devices(
        &["ls"],
        &img.devices,
        &[OsStr::new("/missing/dir")],
    ));
    assert!(!o.status.success(), "ls /missing/dir succeeded");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/missing"), "ls: message names no path: {err}");

    // Not a btrfs: a file of zeros, and a file of text.
    let zeros = t.sparse_file("zeros.img", 64 << 20).unwrap();
    let text = t.join("text.img");
    std::fs::write(&text, "not a filesystem\n".repeat(10_000)).unwrap();
    for bad in [&zeros, &text] {
        let out = t.join("out");
        let o = ubtrfs([
            OsString::from("restore"),
            bad.clone().into_os_string(),
            out.clone().into_os_string(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "restore of {} succeeded",
            bad.display()
        );
        assert!(
            err.contains(&*bad.to_string_lossy()) && err.contains("btrfs"),
            "restore of a non-btrfs file: unclear message: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            !out.exists(),
            "restore created {} for a bad image",
            out.display()
        );
    }

    let o = ubtrfs([
        OsStr::new("restore"),
        t.join("does-not-exist.img").as_os_str(),
        t.join("out").as_os_str(),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does-not-exist.img"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

//! The read-write FUSE mount, checked against the kernel: `ubtrfs mount
//! IMG MNT` runs as a child process, the test changes the filesystem
//! through the mount with ordinary system calls, and afterwards
//! `btrfs check` must find no error and the kernel, mounting the image,
//! must show exactly what was written.
//!
//! - every kind of change (mkdir, create, small and 5 MiB writes,
//!   overwrite, append, truncate, fallocate, chmod, chown, utimens, rename
//!   with and without flags, hard and symbolic links, xattrs, device nodes
//!   and fifos, unlink, rmdir) applied the same way to a reference tmpfs
//!   and to the mount, with the attributes each leaves checked at once
//!   (no stale cache), SEEK_DATA/SEEK_HOLE, everything compared through
//!   the mount, then through the kernel after `fusermount3 -u`, then ubtrfs
//!   read-only against the kernel, strictly (times, directory sizes, link
//!   counts), then a second read-write mount on top;
//! - files, directories, links and fifos made by another user belong to
//!   that user (set-group-ID directories give their group), and the kernel
//!   checks permissions (`default_permissions`);
//! - SIGTERM and SIGINT unmount and commit, exit 0;
//! - the commit timer (`-o commit=1`) and fsync make changes durable
//!   without an unmount (the process is then killed with SIGKILL);
//! - a final commit that fails makes the process exit non-zero, saying so;
//! - a read-only mount (`--ro`, `-o ro`) refuses every change with EROFS.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3 and
//! util-linux (`setpriv`, `blockdev`).

mod common;

use common::{FuseMount, Tmpfs, assert_same_view, check_image, start_mount, ubtrfs_bin};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use testkit::fuse_mount::{self, UbtrfsMount};
use testkit::sys::{self, NodeKind, falloc};
use testkit::*;

/// How long the mount may take to appear, and the process to exit.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Size of the test images (sparse).
const IMAGE_SIZE: u64 = 300 << 20;
/// A commit interval long enough that no periodic commit happens during a
/// test (the longest that draws no warning).
const NO_TIMER: [&str; 2] = ["-o", "commit=300"];

/// A fresh single-device image made by `mkfs.btrfs` with its defaults.
fn new_image(t: &TestDir) -> PathBuf {
    common::new_image(t, "disk.img", IMAGE_SIZE)
}

/// `ubtrfs mount [ARGS] DEV MNT` running in the foreground as a child
/// process (testkit's [`UbtrfsMount`]), with this file's ways of ending it,
/// which panic on failure.
struct RwMount(UbtrfsMount);

impl RwMount {
    /// Start the child and wait until `mnt` is a mount point.
    fn start(dev: &Path, mnt: &Path, args: &[&str]) -> RwMount {
        RwMount(start_mount(dev, mnt, args))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Wait for the child to exit by itself; returns its status and stderr.
    fn wait(self) -> (ExitStatus, String) {
        self.0.wait_exit().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Send `sig` and wait for the child to exit.
    fn signal(self, sig: libc::c_int) -> (ExitStatus, String) {
        self.0.send_signal(sig).unwrap();
        self.wait()
    }

    /// `fusermount3 -u` and wait for the child to exit.
    fn unmount(self) -> (ExitStatus, String) {
        self.0.unmount_status().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Unmount, and assert that the child exits 0, printing nothing, and
    /// that the mount is gone.
    fn unmount_cleanly(self) {
        let mnt = self.path().to_path_buf();
        let (status, err) = self.unmount();
        assert_clean_exit("fusermount3 -u", &mnt, status, &err);
    }

    /// SIGKILL: the process dies without a last commit; the dead mount is
    /// detached.
    fn kill(mut self) {
        let status = self.0.sigkill().unwrap();
        assert_eq!(status.code(), None, "killed by a signal");
        self.0.kill();
    }
}

fn assert_clean_exit(how: &str, mnt: &Path, status: ExitStatus, err: &str) {
    assert!(
        status.success(),
        "ubtrfs mount exited with {status} after {how}:\n{err}"
    );
    assert!(
        err.trim().is_empty(),
        "ubtrfs mount printed on stderr after {how}:\n{err}"
    );
    assert!(!is_mount_point(mnt), "{} still mounted", mnt.display());
}

/// The generation (last committed transaction) in the primary superblock
/// of an image: at offset 0x48 of the superblock, which is at 64 KiB.
fn superblock_generation(img: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    File::open(img)
        .unwrap()
        .read_exact_at(&mut b, 0x1_0000 + 0x48)
        .unwrap();
    u64::from_le_bytes(b)
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn len_of(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().len()
}

fn nlink_of(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().nlink()
}

/// The errno of a failed call.
fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("the call should fail")
        .raw_os_error()
        .expect("an OS error")
}

/// Which tree [`apply_changes`] changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    /// The reference tmpfs.
    Reference,
    /// The ubtrfs mount.
    Mount,
}

/// Every kind of change, applied under `root`. The same calls run against
/// the reference tmpfs and the FUSE mount; the attributes each call must
/// leave behind are checked right away (through the mount, they come from
/// the reply to that call or a fresh lookup: the kernel's cache must not be
/// stale).
fn apply_changes(root: &Path, view: View) {
    let p = |rel: &str| root.join(rel);
    // Directories.
    fs::create_dir(p("d")).unwrap();
    fs::create_dir(p("d/sub")).unwrap();
    fs::create_dir(p("d/empty")).unwrap();
    fs::create_dir(p("d/gone")).unwrap();
    fs::create_dir_all(p("deep/a/b/c/d")).unwrap();

    // Small files: inline in the metadata.
    fs::write(p("small.txt"), b"hello\n").unwrap();
    assert_eq!(len_of(&p("small.txt")), 6);
    fs::write(p("empty"), b"").unwrap();
    fs::write(p("d/sub/note"), b"a note in a subdirectory\n").unwrap();

    // A 5 MiB file, in one write call (the kernel splits it).
    let mut big = pattern(5 << 20, 1);
    fs::write(p("big.bin"), &big).unwrap();
    assert_eq!(len_of(&p("big.bin")), 5 << 20);

    // Overwrite in the middle, across sector boundaries.
    let at = (5 << 20) / 2 - 1000;
    let patch = vec![0xab; 10_000];
    {
        let mut f = OpenOptions::new().write(true).open(p("big.bin")).unwrap();
        f.seek(SeekFrom::Start(at as u64)).unwrap();
        f.write_all(&patch).unwrap();
    }
    big[at..at + patch.len()].copy_from_slice(&patch);
    assert_eq!(len_of(&p("big.bin")), 5 << 20);

    // Appends, to the big file and to the inline one.
    let tail = pattern(12_345, 2);
    OpenOptions::new()
        .append(true)
        .open(p("big.bin"))
        .unwrap()
        .write_all(&tail)
        .unwrap();
    big.extend_from_slice(&tail);
    assert_eq!(len_of(&p("big.bin")), big.len() as u64);
    OpenOptions::new()
        .append(true)
        .open(p("small.txt"))
        .unwrap()
        .write_all(b"world\n")
        .unwrap();
    assert_eq!(len_of(&p("small.txt")), 12);
    assert_eq!(fs::read(p("small.txt")).unwrap(), b"hello\nworld\n");

    // An inline file that outgrows the inline limit, written in pieces.
    {
        let mut f = File::create(p("grown.txt")).unwrap();
        for i in 0..50 {
            writeln!(f, "line {i:04} of a file that stops being inline").unwrap();
        }
    }

    // Many small writes at scattered offsets, leaving holes.
    {
        let f = File::create(p("sparse.bin")).unwrap();
        use std::os::unix::fs::FileExt;
        for (i, off) in [0u64, 70_000, 4096 * 40 + 17, 1 << 20].iter().enumerate() {
            f.write_all_at(&pattern(3000, 10 + i as u64), *off).unwrap();
        }
    }
    assert_eq!(len_of(&p("sparse.bin")), (1 << 20) + 3000);
    // Where the data is, sector by sector (4 KiB in both views).
    {
        let f = File::open(p("sparse.bin")).unwrap();
        let seek = |off: i64, whence| seek_in(&f, off, whence);
        assert_eq!(seek(0, libc::SEEK_DATA), Ok(0));
        assert_eq!(seek(0, libc::SEEK_HOLE), Ok(4096));
        assert_eq!(seek(4096, libc::SEEK_DATA), Ok(69_632));
        assert_eq!(seek(70_000, libc::SEEK_HOLE), Ok(73_728));
        assert_eq!(seek(200_000, libc::SEEK_DATA), Ok(1 << 20));
        assert_eq!(seek((1 << 20) + 3000, libc::SEEK_DATA), Err(libc::ENXIO));
    }
    // The same of a file open for writing, whose writes the kernel may
    // still cache (it asks the mount without writing them back first).
    {
        use std::os::unix::fs::FileExt;
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(p("cached.bin"))
            .unwrap();
        f.write_all_at(&pattern(4096, 7), 65_536).unwrap();
        let other = File::open(p("cached.bin")).unwrap();
        assert_eq!(seek_in(&f, 0, libc::SEEK_DATA), Ok(65_536));
        assert_eq!(seek_in(&other, 65_536, libc::SEEK_HOLE), Ok(69_632));
        f.set_len(0).unwrap();
        f.write_all_at(b"a", 2).unwrap();
        assert_eq!(seek_in(&f, 0, libc::SEEK_DATA), Ok(0));
        assert_eq!(seek_in(&other, 0, libc::SEEK_HOLE), Ok(3));
    }

    // Truncate: shrink, shrink to 0, grow (a hole at the end), and through
    // O_TRUNC.
    fs::write(p("shrink.bin"), pattern(300_000, 3)).unwrap();
    File::options()
        .write(true)
        .open(p("shrink.bin"))
        .unwrap()
        .set_len(100_001)
        .unwrap();
    assert_eq!(len_of(&p("shrink.bin")), 100_001);
    fs::write(p("zero.bin"), pattern(8192, 4)).unwrap();
    File::options()
        .write(true)
        .open(p("zero.bin"))
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(len_of(&p("zero.bin")), 0);
    fs::write(p("grow.bin"), b"0123456789").unwrap();
    File::options()
        .write(true)
        .open(p("grow.bin"))
        .unwrap()
        .set_len(1_000_000)
        .unwrap();
    assert_eq!(len_of(&p("grow.bin")), 1_000_000);
    fs::write(p("otrunc.bin"), pattern(50_000, 5)).unwrap();
    fs::write(p("otrunc.bin"), b"short now").unwrap();
    assert_eq!(len_of(&p("otrunc.bin")), 9);

    // fallocate: allocate (growing the file), allocate past the end
    // keeping the size, punch a hole, zero a range.
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(p("falloc.bin"))
            .unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&pattern(64 << 10, 8), 0).unwrap();
        sys::fallocate(&f, 0, 32 << 10, 256 << 10).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (32 + 256) << 10);
        sys::fallocate(&f, falloc::KEEP_SIZE, 288 << 10, 100 << 10).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (32 + 256) << 10);
        sys::fallocate(&f, falloc::PUNCH_HOLE | falloc::KEEP_SIZE, 10_000, 20_000).unwrap();
        let (at, len) = (40_000, 12_345);
        if view == View::Mount {
            sys::fallocate(&f, falloc::ZERO_RANGE, at, len).unwrap();
        } else {
            // tmpfs has no ZERO_RANGE: the same result by hand.
            f.write_all_at(&vec![0; len as usize], at).unwrap();
        }
        f.write_all_at(b"after", 100_000).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (32 + 256) << 10);
    }

    // chmod, including set-user-ID and sticky bits.
    fs::set_permissions(p("small.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(mode_of(&p("small.txt")), 0o640);
    fs::set_permissions(p("d/sub"), fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(mode_of(&p("d/sub")), 0o750);
    fs::write(p("tool"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(p("tool"), fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(mode_of(&p("tool")), 0o4755);
    fs::set_permissions(p("d/empty"), fs::Permissions::from_mode(0o1777)).unwrap();
    // Created with an explicit mode (umask applies).
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p("private"))
        .unwrap();
    // chown.
    sys::lchown(&p("empty"), 1234, 5678).unwrap();
    assert_eq!(fs::symlink_metadata(p("empty")).unwrap().uid(), 1234);

    // utimens.
    sys::set_times(
        &p("d/sub/note"),
        sys::Timestamp::new(1_000_000_000, 5),
        sys::Timestamp::new(1_234_567_890, 123_456_789),
    )
    .unwrap();
    let m = fs::symlink_metadata(p("d/sub/note")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_234_567_890, 123_456_789));

    // Renames: within a directory, across directories, over an existing
    // file, a directory with contents, and the two flags.
    fs::write(p("d/gone/file"), b"moved twice").unwrap();
    fs::rename(p("d/gone/file"), p("d/gone/file2")).unwrap();
    fs::rename(p("d/gone/file2"), p("d/sub/moved")).unwrap();
    fs::write(p("victim.txt"), b"replaced").unwrap();
    fs::write(p("winner.txt"), b"the winner").unwrap();
    fs::rename(p("winner.txt"), p("victim.txt")).unwrap();
    assert!(fs::symlink_metadata(p("winner.txt")).is_err());
    fs::rename(p("deep/a"), p("d/deep-a")).unwrap();
    fs::write(p("swap1"), b"first").unwrap();
    fs::create_dir(p("swap2")).unwrap();
    renameat2(&p("swap1"), &p("swap2"), libc::RENAME_EXCHANGE).unwrap();
    assert!(fs::symlink_metadata(p("swap1")).unwrap().is_dir());
    assert_eq!(fs::read(p("swap2")).unwrap(), b"first");
    assert_eq!(
        errno_of(renameat2(
            &p("swap2"),
            &p("small.txt"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    renameat2(&p("swap2"), &p("swapped"), libc::RENAME_NOREPLACE).unwrap();
    // A whiteout (overlayfs asks for them): the old name becomes a 0:0
    // character device with mode 0; not with an exchange.
    fs::write(p("wh-src"), b"moving").unwrap();
    renameat2(&p("wh-src"), &p("wh-dst"), libc::RENAME_WHITEOUT).unwrap();
    {
        use std::os::unix::fs::FileTypeExt;
        let wh = fs::symlink_metadata(p("wh-src")).unwrap();
        assert!(wh.file_type().is_char_device(), "{wh:?}");
        assert_eq!((wh.rdev(), wh.mode() & 0o7777), (0, 0));
    }
    assert_eq!(fs::read(p("wh-dst")).unwrap(), b"moving");
    assert_eq!(
        errno_of(renameat2(
            &p("wh-dst"),
            &p("swapped"),
            libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE
        )),
        libc::EINVAL
    );

    // Hard links: the link count is fresh on every name.
    fs::hard_link(p("big.bin"), p("d/sub/big.link")).unwrap();
    assert_eq!(nlink_of(&p("big.bin")), 2);
    assert_eq!(nlink_of(&p("d/sub/big.link")), 2);
    fs::hard_link(p("small.txt"), p("small.link1")).unwrap();
    fs::hard_link(p("small.txt"), p("d/small.link2")).unwrap();
    assert_eq!(nlink_of(&p("small.txt")), 3);
    fs::remove_file(p("small.link1")).unwrap();
    assert_eq!(nlink_of(&p("small.txt")), 2);
    assert_eq!(nlink_of(&p("d/small.link2")), 2);

    // Symbolic links: relative, absolute, dangling, long.
    std::os::unix::fs::symlink("small.txt", p("link.rel")).unwrap();
    std::os::unix::fs::symlink("/etc/nowhere/at/all", p("link.abs")).unwrap();
    std::os::unix::fs::symlink("../big.bin", p("d/link.up")).unwrap();
    let long: String = (0..1000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    std::os::unix::fs::symlink(&long, p("link.long")).unwrap();
    assert_eq!(fs::read(p("link.rel")).unwrap(), b"hello\nworld\n");
    assert_eq!(fs::read_link(p("link.long")).unwrap(), Path::new(&long));
    assert_eq!(len_of(&p("link.long")), 1000);

    // Extended attributes: set, replace, empty value, large value, remove,
    // on files, directories and symlinks.
    sys::set_xattr(&p("small.txt"), "user.a", b"1").unwrap();
    sys::set_xattr(&p("small.txt"), "user.a", b"replaced").unwrap();
    sys::set_xattr(&p("small.txt"), "user.empty", b"").unwrap();
    sys::set_xattr(&p("small.txt"), "user.big", &pattern(3000, 6)).unwrap();
    sys::set_xattr(&p("small.txt"), "user.gone", b"soon").unwrap();
    sys::remove_xattr(&p("small.txt"), "user.gone").unwrap();
    assert_eq!(
        errno_of(sys::remove_xattr(&p("small.txt"), "user.gone")),
        libc::ENODATA
    );
    assert_eq!(
        errno_of(sys::get_xattr(&p("small.txt"), "user.gone")),
        libc::ENODATA
    );
    assert_eq!(
        sys::get_xattr(&p("small.txt"), "user.a").unwrap(),
        b"replaced"
    );
    sys::set_xattr(&p("d"), "user.dir", b"yes").unwrap();
    sys::set_xattr(&p("big.bin"), "trusted.t", b"root only").unwrap();

    // Device nodes and fifos (the mount is nodev: they cannot be opened,
    // only made and listed).
    sys::mkfifo(&p("fifo"), 0o644).unwrap();
    sys::mknod(&p("null-dev"), NodeKind::Char, 0o666, sys::makedev(1, 3)).unwrap();
    sys::mknod(
        &p("d/disk-dev"),
        NodeKind::Block,
        0o660,
        sys::makedev(259, 70_000),
    )
    .unwrap();

    // Unlink and rmdir.
    fs::write(p("unlinked"), pattern(100_000, 7)).unwrap();
    fs::remove_file(p("unlinked")).unwrap();
    assert_eq!(errno_of(fs::symlink_metadata(p("unlinked"))), libc::ENOENT);
    fs::remove_dir(p("d/gone")).unwrap();
    assert_eq!(errno_of(fs::remove_dir(p("d/sub"))), libc::ENOTEMPTY);
    fs::remove_dir_all(p("deep")).unwrap();

    // Read back what was written, through this view.
    assert_eq!(fs::read(p("big.bin")).unwrap(), big);
    assert_eq!(fs::read(p("d/sub/big.link")).unwrap(), big);
}

/// `renameat2(2)` with `flags`.
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let f = std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap();
    let t = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: both are valid NUL-terminated paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What a tree on another filesystem and a btrfs view of the same changes
/// share: everything but times (the two were made at different moments)
/// and directory sizes and link counts (filesystem specific).
fn same_changes() -> CompareOptions {
    CompareOptions {
        mtime: false,
        mtime_nsec: false,
        ..CompareOptions::across_filesystems()
    }
}

fn assert_same(what: &str, expected: &Path, actual: &Path, opts: &CompareOptions) {
    if let Err(d) = compare_trees_with(expected, actual, opts) {
        panic!(
            "{what}: {} differences between {} and {}:\n{}",
            d.len(),
            expected.display(),
            actual.display(),
            d.join("\n")
        );
    }
}

#[test]
fn changes_reach_the_kernel() {
    require_privileged!();
    let t = TestDir::new("mount-rw").unwrap();
    let img = new_image(&t);

    // The reference: the same changes on a tmpfs.
    let reference = Tmpfs::new(&t.join("reference"));
    apply_changes(reference.path(), View::Reference);

    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    apply_changes(m.path(), View::Mount);
    assert_same(
        "through the mount",
        reference.path(),
        m.path(),
        &same_changes(),
    );
    m.unmount_cleanly();

    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_same(
        "the kernel's mount",
        reference.path(),
        kernel.path(),
        &same_changes(),
    );
    // ubtrfs reading the image back agrees with the kernel on everything,
    // times to the nanosecond, directory sizes and link counts included.
    let ro = FuseMount::new(&[&img], &t.join("fuse-ro"));
    assert_same_view(
        "ubtrfs read-only against the kernel",
        kernel.path(),
        ro.path(),
        &CompareOptions::strict(),
        &[],
    );
    ro.unmount();
    drop(kernel);

    // And mounted read-write again: more changes on top of committed ones.
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    fs::remove_file(m.path().join("big.bin")).unwrap();
    fs::write(m.path().join("d/second-mount"), b"again").unwrap();
    fs::remove_file(reference.path().join("big.bin")).unwrap();
    fs::write(reference.path().join("d/second-mount"), b"again").unwrap();
    m.unmount_cleanly();
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_same(
        "the kernel's mount after a second mount",
        reference.path(),
        kernel.path(),
        &same_changes(),
    );
}

/// Small changes of every kind for the durability tests.
fn a_few_changes(root: &Path, data: &[u8]) {
    fs::create_dir(root.join("dir")).unwrap();
    fs::write(root.join("dir/data"), data).unwrap();
    fs::write(root.join("inline"), b"inline bytes").unwrap();
    std::os::unix::fs::symlink("dir/data", root.join("link")).unwrap();
    sys::set_xattr(&root.join("dir/data"), "user.k", b"v").unwrap();
}

/// The kernel's view of the image must hold exactly [`a_few_changes`].
fn assert_has_a_few_changes(t: &TestDir, img: &Path, data: &[u8]) {
    check_image(img);
    let kernel = Mount::single(img, &t.join("kernel"), "ro").unwrap();
    let k = kernel.path();
    assert_eq!(fs::read(k.join("dir/data")).unwrap(), data);
    assert_eq!(fs::read(k.join("inline")).unwrap(), b"inline bytes");
    assert_eq!(
        fs::read_link(k.join("link")).unwrap(),
        Path::new("dir/data")
    );
    assert_eq!(sys::get_xattr(&k.join("dir/data"), "user.k").unwrap(), b"v");
}

#[test]
fn stop_signals_commit() {
    require_privileged!();
    for (name, sig) in [("SIGTERM", libc::SIGTERM), ("SIGINT", libc::SIGINT)] {
        let t = TestDir::new(&format!("mount-rw-{name}")).unwrap();
        let img = new_image(&t);
        let data = pattern(300_000, 11);
        let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
        let mnt = m.path().to_path_buf();
        a_few_changes(&mnt, &data);
        let (status, err) = m.signal(sig);
        assert_clean_exit(name, &mnt, status, &err);
        assert_has_a_few_changes(&t, &img, &data);
    }
}

/// A busy mount cannot be unmounted: the first signal detaches it lazily
/// (it lives on while in use), the second commits and ends the process.
#[test]
fn second_signal_commits_a_busy_mount() {
    require_privileged!();
    let t = TestDir::new("mount-rw-busy").unwrap();
    let img = new_image(&t);
    let data = pattern(100_000, 14);
    let mut m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let mnt = m.path().to_path_buf();
    a_few_changes(&mnt, &data);
    // Something working in the mount keeps it busy.
    let mut busy = Command::new("sleep")
        .arg("60")
        .current_dir(&mnt)
        .spawn()
        .unwrap();
    m.0.send_signal(libc::SIGTERM).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while is_mount_point(&mnt) {
        assert!(Instant::now() < deadline, "not detached after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still serving the detached mount.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        m.0.try_wait().unwrap().is_none(),
        "the mount process exited after the first signal on a busy mount"
    );
    let (status, err) = m.signal(libc::SIGTERM);
    let _ = busy.kill();
    let _ = busy.wait();
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "second SIGTERM; stderr:\n{err}"
    );
    assert!(!err.contains("ubtrfs: error"), "{err}");
    assert_has_a_few_changes(&t, &img, &data);
}

#[test]
fn commit_timer_commits() {
    require_privileged!();
    let t = TestDir::new("mount-rw-timer").unwrap();
    let img = new_image(&t);
    let data = pattern(200_000, 12);
    let m = RwMount::start(&img, &t.join("fuse"), &["-o", "commit=1"]);
    let before = superblock_generation(&img);
    a_few_changes(m.path(), &data);
    // Wait until the image itself holds a newer commit than when the
    // changes were made (another ubtrfs process may not open an image that
    // one is writing: read the superblock's generation directly).
    let deadline = Instant::now() + TIMEOUT;
    while superblock_generation(&img) <= before {
        assert!(
            Instant::now() < deadline,
            "no commit {TIMEOUT:?} after the changes with commit=1"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // No last commit: what is on disk came from the timer.
    m.kill();
    assert_has_a_few_changes(&t, &img, &data);
}

/// fsync of the files and of the directory that names them makes them
/// durable (through the log tree: a read-write mount replays it).
#[test]
fn fsync_makes_changes_durable() {
    require_privileged!();
    let t = TestDir::new("mount-rw-fsync").unwrap();
    let img = new_image(&t);
    let data = pattern(150_000, 13);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    a_few_changes(m.path(), &data);
    for f in ["dir/data", "inline"] {
        File::open(m.path().join(f)).unwrap().sync_all().unwrap();
    }
    // The root directory's fsync makes the names in it durable (the
    // symlink with its target).
    File::open(m.path()).unwrap().sync_all().unwrap();
    // Not fsync'd, and no commit before the kill: lost.
    fs::write(m.path().join("after-fsync"), b"not durable").unwrap();
    m.kill();
    check_image(&img);
    // The kernel replays a log only on a read-write mount.
    Mount::single(&img, &t.join("replay"), "")
        .unwrap()
        .unmount()
        .unwrap();
    assert_has_a_few_changes(&t, &img, &data);
    let kernel = Mount::single(&img, &t.join("kernel2"), "ro").unwrap();
    assert!(
        !kernel.path().join("after-fsync").exists(),
        "a change after the last fsync was committed without a commit"
    );
}

#[test]
fn failed_final_commit_exits_non_zero() {
    require_privileged!();
    let t = TestDir::new("mount-rw-fail").unwrap();
    let img = new_image(&t);
    let dev = Loop::attach(&img).unwrap();
    let m = RwMount::start(dev.device(), &t.join("fuse"), &NO_TIMER);
    fs::write(m.path().join("doomed"), b"never committed").unwrap();
    // Writes to the device now fail (EPERM).
    run(command("blockdev").arg("--setro").arg(dev.device())).unwrap();
    let (status, err) = m.unmount();
    let _ = run(command("blockdev").arg("--setrw").arg(dev.device()));
    assert!(
        !status.success(),
        "ubtrfs mount exited 0 though its last commit failed:\n{err}"
    );
    assert!(
        err.contains("final commit failed") && err.contains("lost"),
        "no clear message about the failed commit:\n{err}"
    );
    dev.detach().unwrap();
    // The image still holds the last committed state, consistent.
    check_image(&img);
}

/// A commit that fails in the middle of a session (the device refuses
/// writes) stops the mount taking changes, as the kernel's transaction
/// abort turns a filesystem read-only: later changes answer EROFS, reads go
/// on, the unmount says what was lost and exits non-zero, and the image
/// holds the last commit, whole.
#[test]
fn a_failed_commit_stops_all_changes() {
    require_privileged!();
    let t = TestDir::new("mount-rw-abort").unwrap();
    let img = new_image(&t);
    let dev = Loop::attach(&img).unwrap();
    let m = RwMount::start(dev.device(), &t.join("fuse"), &NO_TIMER);
    let kept = pattern(200_000, 71);
    fs::write(m.path().join("kept"), &kept).unwrap();
    run(Command::new(ubtrfs_bin()).arg("sync").arg(m.path())).unwrap();
    fs::write(m.path().join("doomed"), b"never committed").unwrap();
    // Writes to the device now fail (EPERM): the commit stops half-way.
    run(command("blockdev").arg("--setro").arg(dev.device())).unwrap();
    let out = Command::new(ubtrfs_bin())
        .arg("sync")
        .arg(m.path())
        .output()
        .unwrap();
    let _ = run(command("blockdev").arg("--setrw").arg(dev.device()));
    assert!(
        !out.status.success(),
        "ubtrfs sync succeeded though its commit failed"
    );
    // The device takes writes again; the mount does not.
    for (what, r) in [
        ("create", File::create(m.path().join("new")).map(drop)),
        ("mkdir", fs::create_dir(m.path().join("newdir"))),
        ("unlink", fs::remove_file(m.path().join("kept"))),
    ] {
        assert_eq!(errno_of(r), libc::EROFS, "{what}");
    }
    assert!(fs::read(m.path().join("kept")).unwrap() == kept);
    let (status, err) = m.unmount();
    assert!(
        !status.success()
            && err.contains("no more changes")
            && err.contains("lost")
            && err.contains("not permitted"),
        "the unmount after a failed commit: {status}\n{err}"
    );
    dev.detach().unwrap();
    check_image(&img);
    let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert!(fs::read(k.path().join("kept")).unwrap() == kept);
    assert!(!k.path().join("doomed").exists());
    k.unmount().unwrap();
}

/// A directory entry whose inode cannot be read (the key of its inode
/// item damaged): the listing still shows every name (that one without
/// attributes), the others read as before, and only that one fails.
#[test]
fn a_damaged_inode_spoils_only_its_own_entry() {
    require_privileged!();
    let t = TestDir::new("mount-rw-damaged-inode").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    fs::create_dir(m.path().join("d")).unwrap();
    for n in ["a", "b", "c"] {
        fs::write(m.path().join("d").join(n), n).unwrap();
    }
    m.unmount_cleanly();
    // The inode item of d/b becomes a key of type 0, in every copy.
    {
        let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
        let ino = fs.resolve_path(b"/d/b").unwrap().ino;
        let dump = run(command("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "fs"])
            .arg(&img))
        .unwrap();
        let mut leaf = None;
        for line in dump.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"leaf") {
                leaf = w.get(1).and_then(|a| a.parse::<u64>().ok());
            }
            if line.contains(&format!("key ({ino} INODE_ITEM 0)")) {
                break;
            }
        }
        let leaf = leaf.expect("the leaf of the inode item");
        let nodesize = fs.geometry().nodesize as usize;
        let chunk = fs.tree_reader().volume().chunks.lookup(leaf).unwrap();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        for mirror in 0..chunk.num_copies() {
            let at = chunk.map(leaf, 1, mirror).unwrap().physical;
            let mut b = vec![0u8; nodesize];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, at).unwrap();
            let nritems = u32::from_le_bytes(b[0x60..0x64].try_into().unwrap()) as usize;
            let slot = (0..nritems)
                .map(|i| 0x65 + i * 25)
                .find(|&o| {
                    u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) == ino && b[o + 8] == 1
                })
                .expect("the inode item is in the leaf");
            assert!(slot > 0x65, "the inode item is the leaf's first");
            b[slot + 8] = 0;
            let sum = ubtrfs::format::csum::CsumType::Crc32c.compute(&b[32..]);
            b[..32].copy_from_slice(&sum);
            std::os::unix::fs::FileExt::write_all_at(&f, &b, at).unwrap();
        }
    }
    let m = RwMount::start(&img, &t.join("fuse"), &["--ro"]);
    let d = m.path().join("d");
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(fs::read(d.join("a")).unwrap(), b"a");
    assert_eq!(fs::read(d.join("c")).unwrap(), b"c");
    assert!(fs::metadata(d.join("b")).is_err());
    m.unmount_cleanly();
}

#[test]
fn read_only_mounts_refuse_changes() {
    require_privileged!();
    let t = TestDir::new("mount-rw-ro").unwrap();
    let img = new_image(&t);
    // Something to try to change.
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    fs::write(m.path().join("file"), b"content").unwrap();
    fs::create_dir(m.path().join("dir")).unwrap();
    m.unmount_cleanly();

    let refuse = |root: &Path| {
        let p = |rel: &str| root.join(rel);
        let erofs = |what: &str, e: i32| assert_eq!(e, libc::EROFS, "{what}");
        erofs("create", errno_of(File::create(p("new"))));
        erofs("mkdir", errno_of(fs::create_dir(p("newdir"))));
        erofs(
            "open for writing",
            errno_of(OpenOptions::new().write(true).open(p("file"))),
        );
        erofs("unlink", errno_of(fs::remove_file(p("file"))));
        erofs("rmdir", errno_of(fs::remove_dir(p("dir"))));
        erofs("rename", errno_of(fs::rename(p("file"), p("renamed"))));
        erofs("link", errno_of(fs::hard_link(p("file"), p("link"))));
        erofs(
            "symlink",
            errno_of(std::os::unix::fs::symlink("file", p("sym"))),
        );
        erofs(
            "chmod",
            errno_of(fs::set_permissions(
                p("file"),
                fs::Permissions::from_mode(0o600),
            )),
        );
        erofs(
            "setxattr",
            errno_of(sys::set_xattr(&p("file"), "user.x", b"1")),
        );
        assert_eq!(fs::read(p("file")).unwrap(), b"content");
    };
    let ro = FuseMount::new(&[&img], &t.join("fuse-ro"));
    refuse(ro.path());
    ro.unmount();
    let m = RwMount::start(&img, &t.join("fuse"), &["-o", "ro"]);
    refuse(m.path());
    m.unmount_cleanly();
    check_image(&img);
}

/// Run `script` with `sh -c` as user `uid`, group `gid` and no
/// supplementary groups; returns whether it succeeded and its stderr.
fn run_as(uid: u32, gid: u32, script: &str) -> (bool, String) {
    let out = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .args(["sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn callers_own_what_they_create() {
    require_privileged!();
    if which("setpriv").is_none() {
        eprintln!("skipping: setpriv (util-linux) not found");
        return;
    }
    let t = TestDir::new("mount-rw-owner").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(
        &img,
        &t.join("fuse"),
        &["-o", "allow_other", "-o", "commit=300"],
    );
    let p = |rel: &str| m.path().join(rel);
    fs::create_dir(p("open")).unwrap();
    fs::set_permissions(p("open"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::create_dir(p("sgid")).unwrap();
    sys::lchown(&p("sgid"), 0, 3000).unwrap();
    fs::set_permissions(p("sgid"), fs::Permissions::from_mode(0o2777)).unwrap();
    fs::create_dir(p("closed")).unwrap();
    fs::write(p("closed/root-file"), b"root's").unwrap();

    let (ok, err) = run_as(
        1000,
        2000,
        &format!(
            "cd '{}' && echo x > open/f && mkdir open/d && ln -s f open/l && mkfifo open/p \
             && chmod 600 open/f && echo y > sgid/g && mkdir sgid/sd",
            m.path().display()
        ),
    );
    assert!(ok, "changes as uid 1000 failed: {err}");
    // default_permissions: the kernel checks the mode bits.
    for script in [
        "touch closed/x",
        "echo z >> closed/root-file",
        "rm closed/root-file",
        "chmod 777 closed",
    ] {
        let (ok, err) = run_as(
            1000,
            2000,
            &format!("cd '{}' && {script}", m.path().display()),
        );
        assert!(!ok, "uid 1000 could {script:?}");
        assert!(
            err.contains("Permission denied") || err.contains("Operation not permitted"),
            "{script:?} failed for another reason: {err}"
        );
    }

    let expect = |root: &Path| {
        let q = |rel: &str| root.join(rel);
        for rel in ["open/f", "open/d", "open/l", "open/p"] {
            assert_eq!(owner(&q(rel)), (1000, 2000), "{rel}");
        }
        assert_eq!(mode_of(&q("open/f")), 0o600);
        assert_eq!(owner(&q("sgid/g")), (1000, 3000));
        assert_eq!(owner(&q("sgid/sd")), (1000, 3000));
        assert_eq!(
            mode_of(&q("sgid/sd")) & 0o2000,
            0o2000,
            "sgid/sd is set-group-ID"
        );
        assert!(!q("closed/x").exists());
        assert_eq!(fs::read(q("closed/root-file")).unwrap(), b"root's");
    };
    expect(m.path());
    m.unmount_cleanly();
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    expect(kernel.path());
}

/// POSIX keeps an unlinked inode while it is open: the library keeps it as
/// an orphan until the last close, then deletes it.
#[test]
fn unlinked_open_files_live_on() {
    require_privileged!();
    let t = TestDir::new("mount-rw-orphan").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = m.path().join("orphan");
    {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        f.write_all(b"still here").unwrap();
        fs::remove_file(&p).unwrap();
        f.write_all(b", and more").unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut back = String::new();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "still here, and more");
    }
    // A fifo is opened without FUSE seeing an open: it lives on too.
    let fifo = m.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        fs::remove_file(&fifo).unwrap();
        let st = f.metadata().unwrap();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()),
            "fstat of the unlinked fifo"
        );
        assert_eq!(st.nlink(), 0);
        f.write_all(b"through").unwrap();
        let mut back = [0u8; 7];
        f.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"through");
    }
    // Nor when a rename replaces its last name.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        fs::write(m.path().join("plain"), b"x").unwrap();
        fs::rename(m.path().join("plain"), &fifo).unwrap();
        let st = f.metadata().unwrap();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()),
            "fstat of the replaced fifo"
        );
        assert_eq!(st.nlink(), 0);
    }
    fs::remove_file(&fifo).unwrap();
    m.unmount_cleanly();
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_eq!(fs::read_dir(kernel.path()).unwrap().count(), 0);
}

/// `chattr`/`lsattr` through FS_IOC_GETFLAGS/SETFLAGS: no-COW on an empty
/// file, compression, and a refusal (not a pretence) for flags not kept.
#[test]
fn chattr_and_lsattr() {
    require_privileged!();
    let t = TestDir::new("mount-rw-chattr").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let a = m.path().join("a");
    let b = m.path().join("b");
    fs::write(&a, b"").unwrap();
    fs::write(&b, b"data").unwrap();
    let chattr = |flag: &str, p: &Path| {
        Command::new("chattr")
            .arg(flag)
            .arg(p)
            .status()
            .unwrap()
            .success()
    };
    let lsattr = |p: &Path| {
        let out = Command::new("lsattr").arg("-d").arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string()
    };
    assert!(chattr("+C", &a));
    assert!(lsattr(&a).contains('C'), "{}", lsattr(&a));
    // As the kernel: no-COW on a file with data is not set, silently.
    assert!(chattr("+C", &b));
    assert!(!lsattr(&b).contains('C'), "{}", lsattr(&b));
    assert!(chattr("+c", &b));
    assert!(lsattr(&b).contains('c'));
    // Synchronous writes (see `synchronous_file_writes_survive_sigkill`).
    assert!(chattr("+S", &a));
    assert!(lsattr(&a).contains('S'), "{}", lsattr(&a));
    m.unmount_cleanly();
    check_image(&img);
    let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
    let st = fs.stat(fs.resolve_path(b"/a").unwrap()).unwrap();
    assert_ne!(st.flags & ubtrfs::format::consts::INODE_NODATACOW, 0);
}

// ---------------------------------------------------------------------
// The mount's own account of the requests it served: the ioctl of
// `crates/ubtrfs-cli/src/fuse/control.rs`, whose layout is repeated here.

/// `UBTRFS_IOC_SERVER_INFO`: 16 little-endian words.
const IOC_SERVER_INFO: u32 = 0x8080_75e0;
/// Word indexes of its reply.
mod info {
    pub const MAGIC: usize = 0;
    pub const PID: usize = 1;
    pub const FLAGS: usize = 2;
    pub const LOOKUP: usize = 3;
    pub const GETATTR: usize = 4;
    pub const READDIR: usize = 5;
    pub const READDIRPLUS: usize = 6;
    pub const READ: usize = 7;
    pub const MAX_WRITE: usize = 9;
    pub const MAX_READ: usize = 10;
    pub const GETXATTR: usize = 11;
    pub const COPY_FILE_RANGE: usize = 12;
    pub const REFLINKED: usize = 13;
    pub const IOCTL: usize = 15;
    /// "ubtrfs", format 1.
    pub const MAGIC_VALUE: u64 = u64::from_le_bytes(*b"ubtrfs\x00\x01");
    pub const FLAG_WRITEBACK_CACHE: u64 = 1;
    pub const FLAG_KILLPRIV_V2: u64 = 2;
    pub const FLAG_READ_WRITE: u64 = 4;
    pub const FLAG_URING: u64 = 16;
}

/// What the mount serving `path` says about itself.
fn server_info(path: &Path) -> [u64; 16] {
    use std::os::fd::AsRawFd;
    let f = File::open(path).unwrap();
    let mut buf = [0u8; 128];
    // SAFETY: the ioctl writes at most the 128 bytes its number encodes.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), IOC_SERVER_INFO as _, buf.as_mut_ptr()) };
    assert_eq!(
        rc,
        0,
        "server info ioctl: {}",
        std::io::Error::last_os_error()
    );
    let mut words = [0u64; 16];
    for (w, b) in words.iter_mut().zip(buf.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().unwrap());
    }
    assert_eq!(words[info::MAGIC], info::MAGIC_VALUE);
    words
}

/// Drop the clean cached pages of `f` (so the kernel must read them again).
fn drop_cached_pages(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain calls on an open descriptor.
    unsafe {
        assert_eq!(libc::fdatasync(f.as_raw_fd()), 0);
        assert_eq!(
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED),
            0
        );
    }
}

/// Write `data` at `at` of the shared mapping of `f`, growing nothing
/// (the file must be large enough), then unmap; with `sync`, msync first.
fn mmap_write(f: &File, at: usize, data: &[u8], sync: bool) {
    use std::os::fd::AsRawFd;
    let len = f.metadata().unwrap().len() as usize;
    assert!(at + data.len() <= len);
    // SAFETY: a shared read-write mapping of the whole (non-empty) file,
    // written only inside its bounds, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        std::ptr::copy_nonoverlapping(data.as_ptr(), (p as *mut u8).add(at), data.len());
        if sync {
            assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0);
        }
        assert_eq!(libc::munmap(p, len), 0);
    }
}

/// `data` put at `at` into `m`, growing it with zeros.
fn put(m: &mut Vec<u8>, at: usize, data: &[u8]) {
    if m.len() < at + data.len() {
        m.resize(at + data.len(), 0);
    }
    m[at..at + data.len()].copy_from_slice(data);
}

/// Every file of `model` reads as it says under `root`.
fn assert_files(what: &str, root: &Path, model: &[(&str, Vec<u8>)]) {
    for (name, want) in model {
        let got = fs::read(root.join(name)).unwrap();
        assert!(
            got == *want,
            "{what}: {name}: {} bytes, expected {}",
            got.len(),
            want.len()
        );
    }
}

impl RwMount {
    /// `ubtrfs umount`: it must succeed, printing nothing, and return only
    /// once this process has exited, cleanly.
    fn umount_command(mut self) {
        let mnt = self.path().to_path_buf();
        let out = Command::new(ubtrfs_bin())
            .arg("umount")
            .arg(&mnt)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "ubtrfs umount {}: {}\n{}",
            mnt.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let exited = self.0.try_wait().unwrap();
        assert!(
            exited.is_some(),
            "ubtrfs umount returned before the mount process exited"
        );
        let (status, err) = self.wait();
        assert_clean_exit("ubtrfs umount", &mnt, status, &err);
    }
}

/// The kernel's writeback cache: writes reach the mount later, in large
/// requests; partial-page writes make it read the page first; O_APPEND,
/// truncate of dirty data and writes through shared mappings all end up
/// on disk as written, and `ubtrfs umount` commits them.
#[test]
fn writeback_cache() {
    require_privileged!();
    let t = TestDir::new("mount-rw-wbc").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = |n: &str| m.path().join(n);
    let i = server_info(m.path());
    assert_eq!(i[info::PID], u64::from(m.0.pid().unwrap()));
    let want = info::FLAG_WRITEBACK_CACHE | info::FLAG_KILLPRIV_V2 | info::FLAG_READ_WRITE;
    assert_eq!(i[info::FLAGS] & want, want, "flags {:#x}", i[info::FLAGS]);
    let mut model: Vec<(&str, Vec<u8>)> = Vec::new();

    // One 4 MiB write(2): written back in requests of 1 MiB (the kernel's
    // default page limit), not page by page.
    let big = pattern(4 << 20, 20);
    let mut f = File::create(p("big")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let i = server_info(m.path());
    assert!(
        i[info::MAX_WRITE] >= 1 << 20,
        "largest write request {} bytes",
        i[info::MAX_WRITE]
    );
    // Read back sequentially from the mount, not the page cache: the
    // readahead the mount raised to match brings 1 MiB per request.
    let f = File::open(p("big")).unwrap();
    drop_cached_pages(&f);
    let mut back = Vec::new();
    (&f).read_to_end(&mut back).unwrap();
    drop(f);
    assert!(back == big);
    let i = server_info(m.path());
    assert!(
        i[info::MAX_READ] >= 1 << 20,
        "largest read request {} bytes",
        i[info::MAX_READ]
    );
    model.push(("big", big));

    // A write into part of a page that is not cached: the kernel reads it.
    let mut partial = pattern(64 << 10, 21);
    fs::write(p("partial"), &partial).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("partial"))
        .unwrap();
    drop_cached_pages(&f);
    let reads = server_info(m.path())[info::READ];
    {
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"a partial page", 5000).unwrap();
        f.write_all_at(b"past the end", 70_000).unwrap();
    }
    assert!(
        server_info(m.path())[info::READ] > reads,
        "the partly written page was not read"
    );
    put(&mut partial, 5000, b"a partial page");
    put(&mut partial, 70_000, b"past the end");
    drop(f);
    model.push(("partial", partial));

    // O_APPEND through two descriptors: the kernel places each write.
    let mut a1 = OpenOptions::new()
        .create(true)
        .append(true)
        .open(p("log"))
        .unwrap();
    let mut a2 = OpenOptions::new().append(true).open(p("log")).unwrap();
    let mut log = Vec::new();
    for i in 0..50 {
        let line = format!("line {i} from {}\n", if i % 2 == 0 { "one" } else { "two" });
        if i % 2 == 0 { &mut a1 } else { &mut a2 }
            .write_all(line.as_bytes())
            .unwrap();
        log.extend_from_slice(line.as_bytes());
    }
    assert_eq!(len_of(&p("log")), log.len() as u64);
    drop((a1, a2));
    model.push(("log", log));

    // Truncate while the data is still dirty, then write past the end.
    let mut trunc = pattern(200_000, 22);
    let mut f = File::create(p("trunc")).unwrap();
    f.write_all(&trunc).unwrap();
    f.set_len(70_001).unwrap();
    trunc.truncate(70_001);
    {
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"after a hole", 100_000).unwrap();
    }
    put(&mut trunc, 100_000, b"after a hole");
    drop(f);
    model.push(("trunc", trunc));

    // Writes through a shared mapping, one of them into the last, partial page.
    let mut mapped = pattern(3 * 4096 + 100, 23);
    fs::write(p("mapped"), &mapped).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("mapped"))
        .unwrap();
    mmap_write(&f, 10, b"mapped write", false);
    mmap_write(&f, 3 * 4096 + 50, b"tail", false);
    drop(f);
    put(&mut mapped, 10, b"mapped write");
    put(&mut mapped, 3 * 4096 + 50, b"tail");
    model.push(("mapped", mapped));

    assert_files("through the mount", m.path(), &model);
    m.umount_command();
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_files("the kernel's mount", kernel.path(), &model);
}

/// st_blocks through the mount follows what fsync wrote back: a new
/// file's data and an append change it, an overwrite in place does not
/// (then the kernel's cached attributes are kept).
#[test]
fn fsync_settles_st_blocks() {
    use std::os::unix::fs::FileExt;
    require_privileged!();
    let t = TestDir::new("mount-rw-blocks").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = m.path().join("f");
    let mut f = File::create(&p).unwrap();
    let blocks = || fs::metadata(&p).unwrap().blocks();
    f.write_all(&pattern(1 << 20, 40)).unwrap();
    f.sync_all().unwrap();
    assert_eq!(blocks(), 2048, "1 MiB written and fsync'd");
    f.write_all_at(&pattern(4096, 41), 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(blocks(), 2048, "an overwrite in place");
    f.write_all_at(&pattern(1 << 20, 42), 1 << 20).unwrap();
    f.sync_all().unwrap();
    assert_eq!(blocks(), 4096, "1 MiB appended and fsync'd");
    drop(f);
    m.unmount_cleanly();
}

/// A commit still refreshes st_blocks of the files written before it when
/// an unlinked file's last close (which deletes it, and commits nothing)
/// came in between.
#[test]
fn st_blocks_settle_at_a_commit_after_an_orphan_goes() {
    use std::os::fd::AsRawFd;
    require_privileged!();
    let t = TestDir::new("mount-rw-blocks-orphan").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let a = m.path().join("a");
    fs::write(&a, pattern(4 << 20, 43)).unwrap();
    let before = fs::metadata(&a).unwrap().blocks();
    let b = m.path().join("b");
    let mut f = File::create(&b).unwrap();
    f.write_all(b"x").unwrap();
    fs::remove_file(&b).unwrap();
    drop(f);
    let _ = fs::metadata(&a).unwrap();
    let top = File::open(m.path()).unwrap();
    // BTRFS_IOC_SYNC: commit now.
    // SAFETY: an argument-less ioctl on a descriptor open for this scope.
    assert_eq!(unsafe { libc::ioctl(top.as_raw_fd(), 0x9408) }, 0);
    let after = fs::metadata(&a).unwrap().blocks();
    assert_eq!(
        after, 8192,
        "4 MiB on disk after the commit (before: {before})"
    );
    drop(top);
    m.unmount_cleanly();
}

/// An fsync when metadata space is down to its reserve answers, and the
/// mount goes on: files can still be removed, and the last commit at
/// unmount succeeds.
#[test]
fn fsync_on_full_metadata_keeps_the_mount() {
    require_privileged!();
    let t = TestDir::new("mount-rw-full-fsync").unwrap();
    let img = common::new_image(&t, "disk.img", 128 << 20);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let value = vec![b'x'; 3000];
    let mut made = Vec::new();
    // Names with big xattrs until metadata runs out (each is a
    // synchronous request, so ENOSPC comes back here).
    let full = (0..100_000).find_map(|i| {
        let p = m.path().join(format!("f{i:05}"));
        let r = File::create(&p).and_then(|_| sys::set_xattr(&p, "user.fill", &value));
        match r {
            Ok(()) => {
                made.push(p);
                None
            }
            Err(e) => Some(e),
        }
    });
    let e = full.expect("100,000 files with 3,000-byte xattrs fit in 128 MiB");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "filling up: {e}");
    assert!(made.len() > 1000, "only {} files fit", made.len());
    // It commits, as the kernel does when it cannot log; ENOSPC at worst.
    if let Err(e) = File::open(&made[0]).and_then(|f| f.sync_all()) {
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ENOSPC),
            "fsync on a full filesystem: {e}"
        );
    }
    // The mount still takes changes.
    for p in &made[..100] {
        fs::remove_file(p).unwrap_or_else(|e| panic!("removing {}: {e}", p.display()));
    }
    m.unmount_cleanly();
    check_image(&img);
}

/// The bytes `statvfs` says an unprivileged user may still write under
/// `dir`.
fn avail_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a zeroed statvfs filled in by the call, on a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// A seed device is mounted read-only, with a warning, as the kernel
/// mounts it: a filesystem sprouted from it holds its blocks, and a
/// write to it would break that filesystem. Writes get EROFS and the
/// image is left as it was.
#[test]
fn a_seed_device_is_mounted_read_only() {
    require_privileged!();
    let t = TestDir::new("mount-rw-seed").unwrap();
    let img = new_image(&t);
    let out = Command::new("btrfstune")
        .args(["-S", "1"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let before = std::fs::read(&img).unwrap();
    let mnt = t.join("mnt");
    let m = start_mount(&img, &mnt, &[]);
    let err = File::create(mnt.join("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let printed = m.unmount_verbose().unwrap();
    assert!(
        printed.contains("seed device: mounted read-only"),
        "{printed}"
    );
    assert!(std::fs::read(&img).unwrap() == before, "the seed changed");
}

/// Fill `dir` with file `fill` (written in pieces of `piece`, synced)
/// until `left` bytes are available.
fn fill_to_within(dir: &Path, left: u64, piece: &[u8]) {
    let avail = avail_bytes(dir);
    let mut f = File::create(dir.join("fill")).unwrap();
    let mut todo = avail - left;
    while todo > 0 {
        let n = todo.min(piece.len() as u64) as usize;
        f.write_all(&piece[..n]).unwrap();
        todo -= n as u64;
    }
    f.sync_all().unwrap();
}

/// Near full, a write that does not fit is refused by write(2) itself, as
/// on kernel btrfs, not later by close(2) or fsync: a file opened
/// write-only while free data space is below what the kernel may hold
/// dirty for the mount bypasses the page cache. The file keeps exactly the
/// bytes accepted and its times move, and the mount goes on; once space is
/// back, writes fit again. The same steps run on kernel btrfs first.
#[test]
fn writes_that_do_not_fit_are_refused_by_write() {
    require_privileged!();
    let t = TestDir::new("mount-rw-full-write").unwrap();
    let size = 256 << 20;
    let data = pattern(64 << 20, 45);
    let fill = pattern(1 << 20, 46);
    // Fill `dir` to within 3 MiB of full, durably; then write a new file in
    // 1 MiB writes until one is refused. Returns how many bytes it took.
    let fill_up = |dir: &Path| -> u64 {
        fill_to_within(dir, 3 << 20, &fill);
        let mut f = File::create(dir.join("last")).unwrap();
        let made = f.metadata().unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        let mut taken = 0usize;
        let err = loop {
            assert!(taken < 32 << 20, "{taken} bytes taken with 3 MiB free");
            let end = (taken + (1 << 20)).min(data.len());
            match f.write(&data[taken..end]) {
                Ok(n) => taken += n,
                Err(e) => break e,
            }
        };
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ENOSPC),
            "the refused write: {err}"
        );
        // Nothing accepted is refused later.
        f.sync_all().unwrap();
        use std::os::fd::IntoRawFd;
        // SAFETY: closing the descriptor taken from `f`, once.
        let closed = unsafe { libc::close(f.into_raw_fd()) };
        assert_eq!(closed, 0, "close: {}", std::io::Error::last_os_error());
        let meta = fs::metadata(dir.join("last")).unwrap();
        assert_eq!(
            meta.len(),
            taken as u64,
            "the file's size against the bytes accepted"
        );
        // The writes moved its modification time, past the cache too
        // (which the kernel sees once it looks the file up again, after
        // the close reached the mount).
        let deadline = Instant::now() + Duration::from_secs(5);
        while fs::metadata(dir.join("last")).unwrap().modified().unwrap() <= made {
            assert!(
                Instant::now() < deadline,
                "mtime did not move in {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        meta.len()
    };

    let kimg = common::new_image(&t, "kernel.img", size);
    let kernel = Mount::single(&kimg, &t.join("kernel"), "").unwrap();
    let kernel_took = fill_up(kernel.path());
    kernel.unmount().unwrap();

    let img = common::new_image(&t, "disk.img", size);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let took = fill_up(m.path());
    assert!(took <= 4 << 20, "{took} bytes taken with 3 MiB free");
    // Space back (after a commit), a new file takes what it is given.
    fs::remove_file(m.path().join("fill")).unwrap();
    run(Command::new(ubtrfs_bin()).arg("sync").arg(m.path())).unwrap();
    fs::write(m.path().join("after"), &data[..16 << 20]).unwrap();
    m.unmount_cleanly();
    check_image(&img);
    let k = Mount::single(&img, &t.join("kernel-reads"), "ro").unwrap();
    assert!(
        fs::read(k.path().join("last")).unwrap() == data[..took as usize],
        "the refused file's data"
    );
    assert!(fs::read(k.path().join("after")).unwrap() == data[..16 << 20]);
    k.unmount().unwrap();
    eprintln!("bytes taken after the fill: kernel btrfs {kernel_took}, ubtrfs {took}");
}

/// Space `fallocate` reserved stays the file's: once the rest of the
/// filesystem is full, writes into the preallocated range still succeed,
/// through a descriptor opened write-only (past the page cache then) and
/// through one opened for reading too (written back from the cache), and
/// the file holds them after the unmount. Kernel btrfs first.
#[test]
fn writes_into_preallocated_space_fit_a_full_filesystem() {
    require_privileged!();
    let t = TestDir::new("mount-rw-full-prealloc").unwrap();
    let size = 256 << 20;
    let data = pattern(24 << 20, 47);
    let fill = pattern(1 << 20, 48);
    let steps = |dir: &Path| {
        let pre = File::create(dir.join("pre")).unwrap();
        sys::fallocate(&pre, 0, 0, data.len() as u64).unwrap();
        pre.sync_all().unwrap();
        drop(pre);
        // Full: within 3 MiB, then a file written until it is refused.
        fill_to_within(dir, 3 << 20, &fill);
        let mut f = File::create(dir.join("last")).unwrap();
        let mut taken = 0;
        let err = loop {
            assert!(taken < 32 << 20, "{taken} bytes taken with 3 MiB free");
            match f.write(&fill) {
                Ok(n) => taken += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        drop(f);
        let half = data.len() / 2;
        let mut w = OpenOptions::new()
            .write(true)
            .open(dir.join("pre"))
            .unwrap();
        for piece in data[..half].chunks(1 << 20) {
            w.write_all(piece)
                .unwrap_or_else(|e| panic!("{}: write-only: {e}", dir.display()));
        }
        w.sync_all().unwrap();
        let mut rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("pre"))
            .unwrap();
        rw.seek(SeekFrom::Start(half as u64)).unwrap();
        for piece in data[half..].chunks(1 << 20) {
            rw.write_all(piece)
                .unwrap_or_else(|e| panic!("{}: read-write: {e}", dir.display()));
        }
        rw.sync_all()
            .unwrap_or_else(|e| panic!("{}: fsync: {e}", dir.display()));
    };

    let kimg = common::new_image(&t, "kernel.img", size);
    let kernel = Mount::single(&kimg, &t.join("kernel"), "").unwrap();
    steps(kernel.path());
    kernel.unmount().unwrap();

    let img = common::new_image(&t, "disk.img", size);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    steps(m.path());
    m.unmount_cleanly();
    check_image(&img);
    let k = Mount::single(&img, &t.join("kernel-reads"), "ro").unwrap();
    assert!(fs::read(k.path().join("pre")).unwrap() == data);
    k.unmount().unwrap();
}

/// Small files (inline data, written back only at the commit) until the
/// metadata space runs out: the writes that do not fit get ENOSPC, and
/// the commit still has room for everything accepted before. Before the
/// dirty data's metadata was counted, the commit ran out of space half
/// way and every later commit failed: all since the last one was lost.
#[test]
fn small_files_until_full_all_reach_the_disk() {
    require_privileged!();
    let t = TestDir::new("mount-rw-full-inline").unwrap();
    let img = common::new_image(&t, "disk.img", 128 << 20);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let data = pattern(1500, 44);
    let mut made = 0usize;
    // The data reaches the mount when the file is closed (the kernel's
    // writeback cache): a refusal comes from close(2), which must be seen.
    let write = |p: &Path| -> std::io::Result<()> {
        use std::os::fd::IntoRawFd;
        let mut f = File::create(p)?;
        f.write_all(&data)?;
        // SAFETY: closing the descriptor taken from `f`, once.
        match unsafe { libc::close(f.into_raw_fd()) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let full = (0..200_000).find_map(|i| match write(&m.path().join(format!("f{i:06}"))) {
        Ok(()) => {
            made += 1;
            None
        }
        Err(e) => Some(e),
    });
    let e = full.expect("200,000 files of 1,500 bytes fit in 128 MiB");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "filling up: {e}");
    assert!(made > 1000, "only {made} files fit");
    m.unmount_cleanly();
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    for i in (0..made).step_by(997).chain([made - 1]) {
        let p = kernel.path().join(format!("f{i:06}"));
        assert_eq!(fs::read(&p).unwrap(), data, "{}", p.display());
    }
}

/// With the writeback cache, fsync still makes data durable: the kernel
/// writes the dirty pages back first. What was written after is lost on
/// SIGKILL, as after a crash.
#[test]
fn fsync_durable_after_sigkill() {
    require_privileged!();
    let t = TestDir::new("mount-rw-fsync-kill").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = |n: &str| m.path().join(n);
    let data = pattern((3 << 20) + 123, 30);
    let mut f = File::create(p("synced")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    // Through a shared mapping, made durable by msync.
    let mut mapped = pattern(2 * 4096, 31);
    fs::write(p("mapped"), &mapped).unwrap();
    let g = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("mapped"))
        .unwrap();
    mmap_write(&g, 4000, b"msync'd", true);
    put(&mut mapped, 4000, b"msync'd");
    // Not synced: the file stays open, its pages dirty in the kernel.
    f.write_all(b"never synced").unwrap();
    m.kill();
    drop((f, g));
    check_image(&img);
    // The fsyncs left a log tree, which the kernel replays only on a
    // writable mount.
    let kernel = Mount::single(&img, &t.join("kernel"), "").unwrap();
    assert_eq!(fs::read(kernel.path().join("synced")).unwrap(), data);
    assert_eq!(fs::read(kernel.path().join("mapped")).unwrap(), mapped);
}

/// A write to a file with the synchronous flag (`chattr +S`) is durable
/// when it returns, as in the kernel: the mount makes it so before it
/// answers. SIGKILL right after loses nothing of it.
#[test]
fn synchronous_file_writes_survive_sigkill() {
    use std::os::unix::fs::FileExt;
    require_privileged!();
    let t = TestDir::new("mount-rw-sync-flag").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = m.path().join("s");
    File::create(&p).unwrap();
    let out = Command::new("chattr").arg("+S").arg(&p).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut data = pattern(300_000, 40);
    let mut f = OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all(&data).unwrap();
    f.write_all_at(b"overwritten", 1000).unwrap();
    put(&mut data, 1000, b"overwritten");
    m.kill();
    drop(f);
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "").unwrap();
    assert_eq!(fs::read(kernel.path().join("s")).unwrap(), data);
}

/// Held for writing by a test that empties the kernel's dentry and inode
/// caches (for every mount on the machine), for reading by a test that
/// counts the requests a cached listing saves: tests run in parallel.
static KERNEL_CACHES: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `ls -l` of a directory not cached yet: one READDIRPLUS brings names and
/// attributes, so no lookup or getattr per entry.
#[test]
fn readdirplus_lists_without_lookups() {
    require_privileged!();
    let _caches = KERNEL_CACHES.read().unwrap_or_else(|e| e.into_inner());
    let t = TestDir::new("mount-rw-rdplus").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    fs::create_dir(m.path().join("dir")).unwrap();
    for i in 0..200 {
        fs::write(m.path().join(format!("dir/file-{i:03}")), format!("{i}")).unwrap();
    }
    m.unmount_cleanly();
    // A fresh mount: nothing cached.
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let before = server_info(m.path());
    let out = Command::new("ls")
        .args(["-l", "--color=never"])
        .arg(m.path().join("dir"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(lines, 201, "total and 200 entries");
    let after = server_info(m.path());
    let d = |w: usize| after[w] - before[w];
    assert!(d(info::READDIRPLUS) >= 1, "no READDIRPLUS");
    assert_eq!(d(info::READDIR), 0, "plain READDIR used");
    // The listing moves the directory's access time (relatime: its
    // entries changed since), and the kernel fetches its attributes again.
    assert!(
        d(info::LOOKUP) + d(info::GETATTR) <= 3,
        "{} lookups and {} getattrs for 200 entries",
        d(info::LOOKUP),
        d(info::GETATTR)
    );
    m.unmount_cleanly();
}

/// Count EXTENT_CSUM items of the checksum tree.
fn csum_items(img: &Path) -> usize {
    let out = run(command("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "csum"])
        .arg(img))
    .unwrap();
    out.lines().filter(|l| l.contains("EXTENT_CSUM")).count()
}

/// The first letters of `lsattr -d`.
fn lsattr(p: &Path) -> String {
    let out = Command::new("lsattr").arg("-d").arg(p).output().unwrap();
    assert!(out.status.success(), "lsattr {}", p.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// `-o nodatacow` and `-o nodatasum`: new regular files get the kernel's
/// flags for them and their data gets no checksums.
#[test]
fn nodatacow_and_nodatasum() {
    require_privileged!();
    let t = TestDir::new("mount-rw-nodatacow").unwrap();
    let img = new_image(&t);
    let (nc, ns, sum) = (
        pattern(1 << 20, 40),
        pattern(1 << 20, 41),
        pattern(1 << 20, 42),
    );
    let m = RwMount::start(&img, &t.join("fuse"), &["-o", "nodatacow,commit=300"]);
    fs::write(m.path().join("nc"), &nc).unwrap();
    fs::create_dir(m.path().join("dir")).unwrap();
    fs::write(m.path().join("dir/nc2"), &nc).unwrap();
    assert!(lsattr(&m.path().join("nc")).contains('C'));
    assert!(lsattr(&m.path().join("dir/nc2")).contains('C'));
    assert!(
        !lsattr(&m.path().join("dir")).contains('C'),
        "directories keep COW"
    );
    m.unmount_cleanly();
    let m = RwMount::start(
        &img,
        &t.join("fuse"),
        &["-o", "nodatasum", "-o", "commit=300"],
    );
    fs::write(m.path().join("ns"), &ns).unwrap();
    assert!(!lsattr(&m.path().join("ns")).contains('C'));
    m.unmount_cleanly();
    check_image(&img);
    assert_eq!(csum_items(&img), 0, "checksums of no-checksum files");
    {
        use ubtrfs::format::consts::{INODE_NODATACOW, INODE_NODATASUM};
        let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
        let flags = |p: &[u8]| fs.stat(fs.resolve_path(p).unwrap()).unwrap().flags;
        let both = INODE_NODATACOW | INODE_NODATASUM;
        assert_eq!(flags(b"/nc") & both, both);
        assert_eq!(flags(b"/dir/nc2") & both, both);
        assert_eq!(flags(b"/dir") & both, 0);
        assert_eq!(flags(b"/ns") & both, INODE_NODATASUM);
    }
    // Without the options, data is checksummed again.
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    fs::write(m.path().join("sum"), &sum).unwrap();
    m.unmount_cleanly();
    check_image(&img);
    assert!(csum_items(&img) > 0, "no checksums for an ordinary file");
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_files(
        "the kernel's mount",
        kernel.path(),
        &[
            ("nc", nc.clone()),
            ("dir/nc2", nc),
            ("ns", ns),
            ("sum", sum),
        ],
    );
}

/// `ubtrfs mount -d OPTS DEV MNT` expected to fail: its stderr.
fn mount_fails(dev: &Path, mnt: &Path, opts: &str) -> String {
    let out = Command::new(ubtrfs_bin())
        .args(["mount", "-d", "-o", opts])
        .arg(dev)
        .arg(mnt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        fuse_mount::detach(mnt);
        panic!("mount -o {opts} succeeded");
    }
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `subvol=` and `subvolid=` on an image whose subvolumes the kernel made.
#[test]
fn subvolume_mount_options() {
    require_privileged!();
    let t = TestDir::new("mount-rw-subvol").unwrap();
    let img = new_image(&t);
    {
        let k = Mount::single(&img, &t.join("kernel"), "rw").unwrap();
        let kp = |n: &str| k.path().join(n);
        run(command("btrfs").args(["subvolume", "create"]).arg(kp("sv"))).unwrap();
        run(command("btrfs")
            .args(["subvolume", "create"])
            .arg(kp("sv/nested")))
        .unwrap();
        fs::write(kp("top-file"), b"top").unwrap();
        fs::write(kp("sv/in-sv"), b"in sv").unwrap();
        fs::write(kp("sv/nested/in-nested"), b"nested").unwrap();
        fs::create_dir(kp("plain")).unwrap();
        run(command("btrfs")
            .args(["subvolume", "create"])
            .arg(kp("empty-sv")))
        .unwrap();
        // The default subvolume becomes sv: subvolid=5 reaches the top.
        run(command("btrfs")
            .args(["subvolume", "set-default"])
            .arg(kp("sv")))
        .unwrap();
        k.unmount().unwrap();
    }
    let names = |p: &Path| {
        let mut n: Vec<String> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    let sv_id = {
        let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
        fs.subvolumes()
            .unwrap()
            .iter()
            .find(|s| s.name == b"sv")
            .unwrap()
            .id
    };
    let mnt = t.join("fuse");
    let m = RwMount::start(&img, &mnt, &NO_TIMER);
    assert_eq!(
        names(m.path()),
        ["in-sv", "nested"],
        "the default subvolume"
    );
    m.unmount_cleanly();
    let m = RwMount::start(&img, &mnt, &["-o", "subvol=sv,commit=300"]);
    assert_eq!(fs::read(m.path().join("in-sv")).unwrap(), b"in sv");
    assert!(m.path().join("nested/in-nested").exists());
    assert!(!m.path().join("top-file").exists());
    fs::write(m.path().join("from-fuse"), b"written in sv").unwrap();
    m.unmount_cleanly();
    let m = RwMount::start(&img, &mnt, &["-o", "subvol=/sv/nested"]);
    assert_eq!(fs::read(m.path().join("in-nested")).unwrap(), b"nested");
    m.unmount_cleanly();
    let m = RwMount::start(&img, &mnt, &["-o", &format!("ro,subvolid={sv_id}")]);
    assert_eq!(
        fs::read(m.path().join("from-fuse")).unwrap(),
        b"written in sv"
    );
    m.unmount_cleanly();
    let m = RwMount::start(&img, &mnt, &["-o", "subvolid=5,subvol=/"]);
    // rmdir deletes an empty subvolume, as the kernel's does; a full one stays.
    fs::remove_dir(m.path().join("empty-sv")).unwrap();
    assert_eq!(
        errno_of(fs::remove_dir(m.path().join("sv/nested"))),
        libc::ENOTEMPTY
    );
    assert_eq!(fs::read(m.path().join("top-file")).unwrap(), b"top");
    assert_eq!(names(m.path()), ["plain", "sv", "top-file"]);
    assert!(m.path().join("sv/in-sv").exists());
    m.unmount_cleanly();
    // Errors name what is wrong.
    let err = mount_fails(&img, &mnt, "subvol=nope/deeper");
    assert!(
        err.contains("nope/deeper") && err.contains("does not exist"),
        "{err}"
    );
    let err = mount_fails(&img, &mnt, "subvolid=999");
    assert!(
        err.contains("999") && err.contains("does not exist"),
        "{err}"
    );
    let err = mount_fails(&img, &mnt, "subvol=plain");
    assert!(err.contains("not a subvolume"), "{err}");
    let err = mount_fails(&img, &mnt, &format!("subvol=sv/nested,subvolid={sv_id}"));
    assert!(err.contains("not subvolid"), "{err}");
    check_image(&img);
    let k = Mount::single(&img, &t.join("kernel"), "ro,subvolid=5").unwrap();
    assert_eq!(
        fs::read(k.path().join("sv/from-fuse")).unwrap(),
        b"written in sv"
    );
    assert!(!k.path().join("empty-sv").exists(), "deleted subvolume");
    let list = run(command("btrfs").args(["subvolume", "list"]).arg(k.path())).unwrap();
    assert!(!list.contains("empty-sv"), "{list}");
}

/// Whether process `pid` has exited (gone, or a zombie not yet reaped).
fn exited(pid: u64) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Unmounted the moment it is mounted, while its io_uring queues may
/// still be starting (the kernel then refuses their entries): the mount
/// still ends cleanly, with its last commit, as after any unmount. (A
/// race: under load, other tests here met it once in a few runs.)
#[test]
fn unmount_right_after_mount_is_clean() {
    require_privileged!();
    let t = TestDir::new("mount-rw-quick").unwrap();
    let img = new_image(&t);
    for _ in 0..10 {
        RwMount::start(&img, &t.join("fuse"), &NO_TIMER).unmount_cleanly();
    }
    check_image(&img);
}

/// `ubtrfs sync` makes everything durable, the pages of a file still open
/// in the kernel's cache included (`syncfs(2)` alone cannot: the kernel
/// sends a FUSE mount no FUSE_SYNCFS); `btrfs filesystem sync` commits what
/// reached the mount. Neither needs an unmount: the process is killed.
#[test]
fn sync_command_commits() {
    require_privileged!();
    let t = TestDir::new("mount-rw-sync").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let closed = pattern(300_000, 60);
    fs::write(m.path().join("closed"), &closed).unwrap();
    let gen_before = superblock_generation(&img);
    run(command("btrfs").args(["filesystem", "sync"]).arg(m.path())).unwrap();
    let gen_after_btrfs_sync = superblock_generation(&img);
    assert!(
        gen_after_btrfs_sync > gen_before,
        "btrfs filesystem sync wrote no superblock"
    );
    let open_data = pattern(2 << 20, 61);
    let mut f = File::create(m.path().join("open")).unwrap();
    f.write_all(&open_data).unwrap();
    // Any path in the mount will do, as for btrfs filesystem sync.
    fs::create_dir(m.path().join("dir")).unwrap();
    let out = Command::new(ubtrfs_bin())
        .arg("sync")
        .arg(m.path().join("dir"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "ubtrfs sync: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        superblock_generation(&img) > gen_after_btrfs_sync,
        "ubtrfs sync wrote no superblock"
    );
    m.kill();
    drop(f);
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_eq!(fs::read(kernel.path().join("closed")).unwrap(), closed);
    assert_eq!(fs::read(kernel.path().join("open")).unwrap(), open_data);
    drop(kernel);
    // Not in a ubtrfs mount: refused, non-zero, saying why.
    let out = Command::new(ubtrfs_bin())
        .arg("sync")
        .arg(t.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not in a ubtrfs mount"),
        "{err}"
    );
}

/// `ubtrfs umount`: waits for a daemon mount's process to commit and exit;
/// refuses what is not a ubtrfs mount.
#[test]
fn umount_command() {
    require_privileged!();
    let t = TestDir::new("mount-rw-umount").unwrap();
    let img = new_image(&t);
    let mnt = t.join("fuse");
    fs::create_dir_all(&mnt).unwrap();
    let out = Command::new(ubtrfs_bin())
        .args(["mount", "--daemon", "-o", "commit=300"])
        .arg(&img)
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = server_info(&mnt)[info::PID];
    let data = pattern(2 << 20, 50);
    // Left in the kernel's cache: the unmount must write it back.
    let mut f = File::create(mnt.join("data")).unwrap();
    f.write_all(&data).unwrap();
    drop(f);
    let before = superblock_generation(&img);
    let umount = |p: &Path| {
        Command::new(ubtrfs_bin())
            .arg("umount")
            .arg(p)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = umount(&mnt);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mount_point(&mnt));
    assert!(
        exited(pid),
        "ubtrfs umount returned before process {pid} exited"
    );
    assert!(superblock_generation(&img) > before, "nothing committed");
    check_image(&img);
    {
        let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
        assert_eq!(fs::read(k.path().join("data")).unwrap(), data);
        // Not ubtrfs: a kernel btrfs mount and a tmpfs stay mounted.
        let out = umount(k.path());
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not a ubtrfs mount"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(is_mount_point(k.path()));
    }
    let tmp = Tmpfs::new(&t.join("tmpfs"));
    let out = umount(tmp.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a ubtrfs mount"));
    assert!(is_mount_point(tmp.path()));
    // Not mounted at all.
    let out = umount(&mnt);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not mounted"));
    // A mount whose process was killed: unmounted, with a warning.
    let mut m = RwMount::start(&img, &mnt, &NO_TIMER);
    m.0.sigkill().unwrap();
    let out = umount(&mnt);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("gone"), "{err}");
    assert!(!is_mount_point(&mnt));
}

/// (file offset, disk bytenr) of the regular extents of inode `ino` in
/// the output of `btrfs inspect-internal dump-tree -t 5`.
fn disk_extents(dump: &str, ino: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut current = None;
    for line in dump.lines() {
        let l = line.trim();
        if let Some(rest) = l.split_once("key (").map(|(_, r)| r) {
            let f: Vec<&str> = rest.split([' ', ')']).collect();
            current = (f.len() > 2 && f[1] == "EXTENT_DATA" && f[0] == ino.to_string())
                .then(|| f[2].parse::<u64>().unwrap());
        } else if let (Some(off), Some(rest)) = (current, l.strip_prefix("extent data disk byte "))
        {
            let disk: u64 = rest.split(' ').next().unwrap().parse().unwrap();
            out.push((off, disk));
        }
    }
    out
}

/// copy_file_range(2) from `src` to `dst` over the whole range, as many
/// calls as it takes; returns how many calls.
fn copy_range(src: &File, so: u64, dst: &File, d_o: u64, len: u64) -> usize {
    use std::os::fd::AsRawFd;
    let (mut so, mut d_o, mut left) = (so as i64, d_o as i64, len as usize);
    let mut calls = 0;
    while left > 0 {
        // SAFETY: both descriptors are open; the offsets are ours.
        let n = unsafe {
            libc::copy_file_range(src.as_raw_fd(), &mut so, dst.as_raw_fd(), &mut d_o, left, 0)
        };
        assert!(
            n > 0,
            "copy_file_range: {n} ({})",
            std::io::Error::last_os_error()
        );
        left -= n as usize;
        calls += 1;
    }
    calls
}

/// copy_file_range shares extents where the ranges allow (so `cp`
/// reflinks), copies bytes elsewhere; FICLONE never reaches the mount.
#[test]
fn copy_file_range_reflinks() {
    require_privileged!();
    let t = TestDir::new("mount-rw-reflink").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = |n: &str| m.path().join(n);
    let src = pattern((3 << 20) + 1000, 60);
    fs::write(p("src"), &src).unwrap();
    let s = File::open(p("src")).unwrap();
    let before = server_info(m.path());
    // Whole file, aligned (ends at the source's end).
    let d = File::create(p("dst")).unwrap();
    copy_range(&s, 0, &d, 0, src.len() as u64);
    // coreutils cp: FICLONE fails, then copy_file_range.
    let out = Command::new("cp")
        .args(["--reflink=auto", "--sparse=never"])
        .arg(p("src"))
        .arg(p("dst2"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Unaligned: bytes copied.
    let odd = File::create(p("odd")).unwrap();
    copy_range(&s, 1000, &odd, 333, 70_000);
    let mut odd_model = vec![0; 333];
    odd_model.extend_from_slice(&src[1000..71_000]);
    // Equally misaligned: the head is copied, the rest shared.
    let mis = File::create(p("mis")).unwrap();
    let calls = copy_range(&s, 5000, &mis, 904, 300_000);
    assert!(calls >= 2, "head and rest in {calls} calls");
    let mut mis_model = vec![0; 904];
    mis_model.extend_from_slice(&src[5000..305_000]);
    let after = server_info(m.path());
    assert!(
        after[info::REFLINKED] - before[info::REFLINKED] >= 3,
        "{} of {} copy_file_range requests shared extents",
        after[info::REFLINKED] - before[info::REFLINKED],
        after[info::COPY_FILE_RANGE] - before[info::COPY_FILE_RANGE]
    );
    // FICLONE: answered by the kernel, never seen by the mount.
    {
        use std::os::fd::AsRawFd;
        let c = File::create(p("ficlone")).unwrap();
        let before = server_info(m.path())[info::IOCTL];
        // SAFETY: FICLONE takes the source descriptor as its argument.
        let rc = unsafe { libc::ioctl(c.as_raw_fd(), libc::FICLONE as _, s.as_raw_fd()) };
        let e = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, e), (-1, Some(libc::EOPNOTSUPP)));
        assert_eq!(server_info(m.path())[info::IOCTL], before);
    }
    // No-COW files share extents too; rewriting the source in place must
    // then leave the copy as it was (the new reference is still pending).
    let nc = pattern(256 << 10, 61);
    let nc_new = pattern(8 << 10, 62);
    for n in ["nc", "nc_copy"] {
        File::create(p(n)).unwrap();
        run(command("chattr").arg("+C").arg(p(n))).unwrap();
    }
    fs::write(p("nc"), &nc).unwrap();
    // Committed first: an extent of the running transaction is never
    // rewritten in place anyway.
    File::open(p("nc")).unwrap().sync_all().unwrap();
    {
        let ns = File::open(p("nc")).unwrap();
        let nd = OpenOptions::new().write(true).open(p("nc_copy")).unwrap();
        let before = server_info(m.path())[info::REFLINKED];
        copy_range(&ns, 0, &nd, 0, nc.len() as u64);
        assert!(
            server_info(m.path())[info::REFLINKED] > before,
            "no-COW files were copied, not shared"
        );
        let mut w = OpenOptions::new().write(true).open(p("nc")).unwrap();
        w.seek(SeekFrom::Start(4096)).unwrap();
        w.write_all(&nc_new).unwrap();
        w.sync_all().unwrap();
    }
    let mut nc_model = nc.clone();
    nc_model[4096..4096 + nc_new.len()].copy_from_slice(&nc_new);
    drop((s, d, odd, mis));
    let model = vec![
        ("src", src.clone()),
        ("dst", src.clone()),
        ("dst2", src.clone()),
        ("odd", odd_model),
        ("mis", mis_model),
        ("nc", nc_model),
        ("nc_copy", nc),
    ];
    assert_files("through the mount", m.path(), &model);
    m.unmount_cleanly();
    check_image(&img);
    let dump = run(command("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "5"])
        .arg(&img))
    .unwrap();
    let ino = |n: &str| {
        let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
        fs.resolve_path(format!("/{n}").as_bytes()).unwrap().ino
    };
    let src_ext = disk_extents(&dump, ino("src"));
    assert!(!src_ext.is_empty());
    assert_eq!(
        disk_extents(&dump, ino("dst")),
        src_ext,
        "dst shares src's extents"
    );
    assert_eq!(
        disk_extents(&dump, ino("dst2")),
        src_ext,
        "cp's copy shares them"
    );
    let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert_files("the kernel's mount", kernel.path(), &model);
}

/// Set-user-ID bits are cleared by the mount (FUSE_HANDLE_KILLPRIV_V2)
/// where a local filesystem clears them, and the kernel stops asking for
/// `security.capability` before every write.
#[test]
fn setuid_bits_cleared() {
    require_privileged!();
    let t = TestDir::new("mount-rw-killpriv").unwrap();
    let img = new_image(&t);
    let reference = Tmpfs::new(&t.join("reference"));
    let m = RwMount::start(
        &img,
        &t.join("fuse"),
        &["-o", "allow_other", "-o", "commit=300"],
    );
    let cases: [(&str, u32, &str); 11] = [
        ("w-suid", 0o4777, "user-write"),
        ("w-sgid", 0o2777, "user-write"),
        ("w-root", 0o4755, "root-write"),
        ("chown", 0o6755, "chown"),
        ("chown-nogx", 0o2745, "chown"),
        ("chown-none", 0o6755, "chown-none"),
        ("fifo", 0o6755, "chown-fifo"),
        ("t-user", 0o4777, "user-truncate"),
        ("t-root", 0o4755, "root-truncate"),
        ("f-user", 0o6777, "user-fallocate"),
        ("f-root", 0o6777, "root-fallocate"),
    ];
    for root in [reference.path(), m.path()] {
        for (name, mode, what) in cases {
            let f = root.join(name);
            if what == "chown-fifo" {
                sys::mkfifo(&f, 0o644).unwrap();
            } else {
                fs::write(&f, b"content\n").unwrap();
            }
            fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
            let path = f.display().to_string();
            let as_user = |script: String| {
                let (ok, err) = run_as(1000, 1000, &script);
                assert!(ok, "{script}: {err}");
            };
            match what {
                "user-write" => as_user(format!("echo more >> '{path}'")),
                "user-truncate" => as_user(format!("truncate -s 3 '{path}'")),
                "user-fallocate" => as_user(format!("fallocate -l 65536 '{path}'")),
                "root-fallocate" => sys::fallocate(
                    &OpenOptions::new().write(true).open(&f).unwrap(),
                    0,
                    0,
                    65536,
                )
                .unwrap(),
                // chown(f, -1, -1) changes no owner, yet clears the bits.
                "chown-none" => sys::lchown(&f, u32::MAX, u32::MAX).unwrap(),
                "chown-fifo" => sys::lchown(&f, u32::MAX, 0).unwrap(),
                "root-write" => OpenOptions::new()
                    .append(true)
                    .open(&f)
                    .unwrap()
                    .write_all(b"more\n")
                    .unwrap(),
                "root-truncate" => File::options()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_len(3)
                    .unwrap(),
                "chown" => sys::lchown(&f, 1000, 1000).unwrap(),
                _ => unreachable!(),
            }
        }
    }
    for (name, _, _) in cases {
        assert_eq!(
            mode_of(&m.path().join(name)),
            mode_of(&reference.path().join(name)),
            "{name}: mode through the mount vs tmpfs"
        );
    }
    // Many small writes: one probe for security.capability at most.
    let before = server_info(m.path())[info::GETXATTR];
    let mut f = File::create(m.path().join("appended")).unwrap();
    for i in 0..200 {
        writeln!(f, "line {i}").unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let probes = server_info(m.path())[info::GETXATTR] - before;
    assert!(probes <= 1, "{probes} getxattr requests for 200 writes");
    m.unmount_cleanly();
    check_image(&img);
    let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    for (name, _, _) in cases {
        assert_eq!(
            mode_of(&k.path().join(name)),
            mode_of(&reference.path().join(name)),
            "{name}: mode in the kernel's mount vs tmpfs"
        );
    }
}

/// Streams that outrun writeback (their writes then wait for room on a
/// thread of their own) beside small writes and fsyncs of another file,
/// plain and compressed: each stream is rewritten in places after it was
/// written, and every file reads back as last written, through the mount
/// with its cache dropped and through the kernel's mount.
#[test]
fn streams_beside_small_writes_read_back() {
    require_privileged!();
    for (tag, args) in [
        ("plain", vec!["-o", "commit=300"]),
        ("zstd", vec!["-o", "commit=300,compress=zstd"]),
    ] {
        let t = TestDir::new(&format!("mount-rw-streams-{tag}")).unwrap();
        let img = common::new_image(&t, "disk.img", 1 << 30);
        let m = RwMount::start(&img, &t.join("fuse"), &args);
        let root = m.path().to_path_buf();
        const LEN: usize = 96 << 20;
        let writers: Vec<_> = (0..2u64)
            .map(|k| {
                let path = root.join(format!("stream{k}"));
                std::thread::spawn(move || {
                    // Half text (compresses), half noise (does not).
                    let mut data = pattern(LEN, 40 + k);
                    for (i, c) in data.chunks_mut(128 << 10).enumerate() {
                        if i % 2 == 0 {
                            c.fill(b'a' + (i % 26) as u8);
                        }
                    }
                    let mut f = File::create(&path).unwrap();
                    for c in data.chunks(1 << 20) {
                        f.write_all(c).unwrap();
                    }
                    // Later writes over earlier ones must win.
                    for i in 0..24usize {
                        let at = (i * 7919 * 4096) % (LEN - (1 << 20));
                        let piece = pattern(1 << 20, 1000 + k * 100 + i as u64);
                        f.seek(SeekFrom::Start(at as u64)).unwrap();
                        f.write_all(&piece).unwrap();
                        put(&mut data, at, &piece);
                    }
                    f.sync_all().unwrap();
                    (path, data)
                })
            })
            .collect();
        let small = root.join("small");
        let mut model = vec![0u8; 1 << 20];
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&small)
            .unwrap();
        f.write_all(&model).unwrap();
        for i in 0..300usize {
            let at = (i * 4099) % ((1 << 20) - 4096);
            let piece = pattern(4096, 5000 + i as u64);
            f.seek(SeekFrom::Start(at as u64)).unwrap();
            f.write_all(&piece).unwrap();
            put(&mut model, at, &piece);
            if i % 3 == 0 {
                f.sync_all().unwrap();
            }
        }
        drop(f);
        let mut files: Vec<(PathBuf, Vec<u8>)> =
            writers.into_iter().map(|w| w.join().unwrap()).collect();
        files.push((small.clone(), model));
        for (path, data) in &files {
            let g = File::open(path).unwrap();
            drop_cached_pages(&g);
            assert!(
                fs::read(path).unwrap() == *data,
                "{tag}: {} reads back other bytes through the mount",
                path.display()
            );
        }
        m.unmount_cleanly();
        check_image(&img);
        let kernel = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
        for (path, data) in &files {
            let name = path.file_name().unwrap();
            assert!(
                fs::read(kernel.path().join(name)).unwrap() == *data,
                "{tag}: the kernel reads other bytes in {}",
                name.to_string_lossy()
            );
        }
    }
}

/// The mount lets the kernel queue 64 background requests (page
/// writeback, readahead), not its default 12 (its flusher still holds
/// back past 9), so a small file's writeback
/// at an fsync does not queue behind a stream's long writes (they wait on
/// the deferred-write thread instead). Read from the kernel's FUSE
/// control filesystem.
#[test]
fn the_kernel_may_queue_64_background_requests() {
    require_privileged!();
    let ctl = Path::new("/sys/fs/fuse/connections");
    if fs::read_dir(ctl)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        // Not mounted here yet (systemd usually mounts it); a second mount
        // attempt over a mounted one fails harmlessly.
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(ctl)
            .status();
    }
    let t = TestDir::new("mount-rw-max-background").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &[]);
    let dev = fs::metadata(m.path()).unwrap().dev();
    let conn = ctl.join(libc::minor(dev).to_string());
    let read = |name: &str| {
        fs::read_to_string(conn.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", conn.join(name).display()))
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    assert_eq!(read("max_background"), 64);
    assert_eq!(read("congestion_threshold"), 9);
    m.unmount_cleanly();
}

/// Where the kernel says whether it offers FUSE over io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The birth time `statx` reports for `path`, if it reports one.
fn birth_time(path: &Path) -> Option<(i64, u32)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a zeroed statx is a valid buffer for the call to fill.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_BTIME, &mut sx) };
    assert_eq!(
        rc,
        0,
        "statx {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    (sx.stx_mask & libc::STATX_BTIME != 0).then_some((sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec))
}

/// Threads of process `pid` whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// With the kernel offering FUSE over io_uring the mount takes its
/// requests over it (four threads per possible CPU, fewer on machines
/// with many), and with `nouring` through /dev/fuse; either way the same
/// work reads back, through the mount and through the kernel's btrfs, and
/// the image is clean. Over the ring `statx` reports the birth time the
/// kernel's btrfs reports; through /dev/fuse it cannot (fuser answers the
/// kernel's STATX request with ENOSYS).
#[test]
fn requests_come_over_io_uring_when_the_kernel_offers_it() {
    require_privileged!();
    assert!(
        Path::new(ENABLE_URING).exists(),
        "this kernel has no FUSE over io_uring (Linux 6.14 or later with CONFIG_FUSE_IO_URING): \
         {ENABLE_URING} is missing"
    );
    // Only ever switched on: other tests may be mounting meanwhile.
    fs::write(ENABLE_URING, "Y").unwrap();
    let possible = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus = 1 + possible
        .trim()
        .split([',', '-'])
        .map(|n| n.parse::<usize>().unwrap())
        .max()
        .unwrap();
    for (label, args, ring) in [
        ("uring", &[][..], true),
        ("nouring", &["-o", "nouring"][..], false),
    ] {
        let t = TestDir::new(&format!("mount-rw-{label}")).unwrap();
        let img = new_image(&t);
        let m = RwMount::start(&img, &t.join("fuse"), args);
        let i = server_info(m.path());
        assert_eq!(
            i[info::FLAGS] & info::FLAG_URING != 0,
            ring,
            "{label}: flags {:#x}",
            i[info::FLAGS]
        );
        let pid = m.0.pid().unwrap();
        let want_threads = if ring {
            cpus * (16 / cpus).clamp(1, 4)
        } else {
            0
        };
        assert_eq!(threads_named(pid, "fuse-ring-"), want_threads, "{label}");
        // Names, attributes, data, xattrs, listings and renames, each
        // with its own kind of request and reply.
        let p = |n: &str| m.path().join(n);
        fs::create_dir(p("d")).unwrap();
        let mut files = Vec::new();
        for n in 0..300u64 {
            let data = pattern((n as usize * 977) % 70_000, n);
            fs::write(p(&format!("d/f{n}")), &data).unwrap();
            files.push((format!("d/f{n}"), data));
        }
        let big = pattern(3 << 20, 99);
        fs::write(p("big"), &big).unwrap();
        fs::set_permissions(p("d/f1"), fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("f2", p("d/link")).unwrap();
        fs::rename(p("d/f3"), p("moved")).unwrap();
        fs::remove_file(p("d/f4")).unwrap();
        sys::set_xattr(&p("d/f5"), "user.k", b"value").unwrap();
        File::open(p("big")).unwrap().sync_all().unwrap();
        drop_cached_pages(&File::open(p("big")).unwrap());
        assert!(fs::read(p("big")).unwrap() == big, "{label}: big file");
        assert_eq!(fs::read_dir(p("d")).unwrap().count(), 299, "{label}");
        assert_eq!(fs::metadata(p("d/f1")).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(fs::read_link(p("d/link")).unwrap(), Path::new("f2"));
        assert_eq!(sys::get_xattr(&p("d/f5"), "user.k").unwrap(), b"value");
        assert!(fs::read(p("moved")).unwrap() == files[3].1);
        let after = server_info(m.path());
        assert!(
            after[info::LOOKUP] > i[info::LOOKUP],
            "{label}: lookups counted"
        );
        // Both ways answer statx with btrfs' birth time (the otime).
        let born = birth_time(&p("d/f7"));
        assert!(born.is_some(), "{label}: no birth time");
        m.unmount_cleanly();
        check_image(&img);
        let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
        for (name, data) in &files {
            let name = match name.as_str() {
                "d/f3" => "moved",
                "d/f4" => continue,
                n => n,
            };
            assert!(
                fs::read(k.path().join(name)).unwrap() == *data,
                "{label}: {name}"
            );
        }
        assert!(fs::read(k.path().join("big")).unwrap() == big);
        if let Some(born) = born {
            assert_eq!(Some(born), birth_time(&k.path().join("d/f7")), "{label}");
        }
    }
}

/// A directory listed a page at a time (each page read and looked up on
/// its own): every name once, with names of every length, in plain and
/// attribute-carrying listings, cold and warm, over io_uring and through
/// /dev/fuse.
#[test]
fn large_directories_list_every_name_once() {
    require_privileged!();
    let _caches = KERNEL_CACHES.write().unwrap_or_else(|e| e.into_inner());
    for args in [&[][..], &["-o", "nouring"][..]] {
        list_a_large_directory(args);
    }
}

fn list_a_large_directory(args: &[&str]) {
    let t = TestDir::new("mount-rw-bigdir").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), args);
    let d = m.path().join("big");
    fs::create_dir(&d).unwrap();
    let mut want = std::collections::BTreeSet::new();
    for i in 0..3000usize {
        let name = format!("{i}{}", "n".repeat(i % 200));
        File::create(d.join(&name)).unwrap();
        want.insert(name);
    }
    let list = || {
        let mut seen = std::collections::BTreeSet::new();
        for e in fs::read_dir(&d).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(seen.insert(name.clone()), "{name} listed twice");
        }
        seen
    };
    let before = server_info(m.path());
    assert!(list() == want, "warm listing differs");
    // Dentries and inodes go: the next listing reaches the mount cold.
    fs::write("/proc/sys/vm/drop_caches", b"2\n").unwrap();
    assert!(list() == want, "cold listing differs");
    // ls -l: a listing with a stat of each name.
    for e in fs::read_dir(&d).unwrap() {
        let e = e.unwrap();
        assert!(e.metadata().unwrap().is_file());
    }
    assert!(list() == want, "listing after stats differs");
    let after = server_info(m.path());
    assert!(
        after[info::READDIRPLUS] + after[info::READDIR]
            > before[info::READDIRPLUS] + before[info::READDIR],
        "no listing reached the mount"
    );
    m.unmount_cleanly();
    check_image(&img);
}

/// `O_TMPFILE`, as on kernel btrfs: a file with no name (nlink 0) that
/// `linkat` names (then it outlives its close, its data intact), that goes
/// with its close otherwise, and that `O_EXCL` keeps from being named.
/// The same script on both prints the same. Then a tmpfile held open over
/// a commit and a crash (SIGKILL) is an orphan: `btrfs check` is clean
/// and the next open deletes it.
#[test]
fn o_tmpfile_works_as_in_the_kernel() {
    require_privileged!();
    const SCRIPT: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def linkat_fd(fd, dst):
    if libc.linkat(-100, ("/proc/self/fd/%d" % fd).encode(), -100, dst.encode(), 0x400) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
d = sys.argv[1]
fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o640)
os.write(fd, b"hello tmpfile")
print("tmpfile", oct(os.fstat(fd).st_mode), os.fstat(fd).st_nlink)
linkat_fd(fd, d + "/linked")
print("linked", os.fstat(fd).st_nlink)
os.write(fd, b" more")
os.fsync(fd)
os.close(fd)
fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(fd, b"gone")
os.close(fd)
fd = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
try:
    linkat_fd(fd, d + "/excl")
except OSError as e:
    print("excl:", e.strerror)
os.close(fd)
print(sorted(os.listdir(d)), open(d + "/linked").read())
"#;
    let run_script = |dir: &Path| {
        let out = Command::new("/usr/bin/python3")
            .args(["-c", SCRIPT])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let t = TestDir::new("mount-rw-tmpfile").unwrap();
    let kernel_img = common::new_image(&t, "kernel.img", IMAGE_SIZE);
    let kernel = Mount::single(&kernel_img, &t.join("kernel"), "").unwrap();
    let expected = run_script(kernel.path());
    kernel.unmount().unwrap();
    assert!(expected.contains("linked 1"), "{expected}");

    // Through /dev/fuse (the kernel's default) and over io_uring.
    let dev_img = common::new_image(&t, "dev.img", IMAGE_SIZE);
    let m = RwMount::start(&dev_img, &t.join("fuse-dev"), &["-o", "commit=300,nouring"]);
    assert_eq!(run_script(m.path()), expected, "through /dev/fuse");
    m.unmount_cleanly();
    check_image(&dev_img);
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    assert_eq!(run_script(m.path()), expected);
    m.unmount_cleanly();
    check_image(&img);
    let kernel = Mount::single(&img, &t.join("kernel-reads"), "ro").unwrap();
    assert_eq!(
        fs::read(kernel.path().join("linked")).unwrap(),
        b"hello tmpfile more"
    );
    assert_eq!(fs::read_dir(kernel.path()).unwrap().count(), 1);
    kernel.unmount().unwrap();

    // Held open over a commit, then a crash: an orphan the next open
    // deletes.
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let fd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(m.path())
        .unwrap();
    (&fd).write_all(&vec![7u8; 300_000]).unwrap();
    fd.sync_all().unwrap();
    common::assert_success(
        "ubtrfs sync",
        &common::ubtrfs([std::ffi::OsStr::new("sync"), m.path().as_os_str()]),
    );
    let orphans = |img: &Path| {
        run(Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "5"])
            .arg(img))
        .unwrap()
        .matches("ORPHAN_ITEM")
        .count()
    };
    m.kill();
    drop(fd);
    check_image(&img);
    assert_eq!(orphans(&img), 1, "the committed tmpfile is an orphan");
    let fs = ubtrfs::fs::Filesystem::open_read_write(&[&img]).unwrap();
    fs.commit().unwrap();
    drop(fs);
    assert_eq!(orphans(&img), 0, "the next open deleted it");
    check_image(&img);
}

/// `lseek(f, off, whence)`: the offset, or the errno.
fn seek_in(f: &File, off: i64, whence: i32) -> Result<i64, i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain lseek on a descriptor the caller holds open.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r)
    }
}

/// `fstrim` on the mount (FITRIM): the space of a deleted file becomes a
/// hole in the image, what is kept reads back, `btrfs check` is clean;
/// only root may trim, as in the kernel.
#[test]
fn fstrim_makes_holes_of_free_space() {
    use std::os::fd::AsRawFd;
    require_privileged!();
    let t = TestDir::new("mount-rw-fstrim").unwrap();
    let img = new_image(&t);
    let args = ["-o", "commit=300", "-o", "allow_other"];
    let m = RwMount::start(&img, &t.join("fuse"), &args);
    let kept = pattern(300_000, 5);
    fs::write(m.path().join("kept"), &kept).unwrap();
    fs::write(m.path().join("big"), pattern(64 << 20, 6)).unwrap();
    let top = File::open(m.path()).unwrap();
    // BTRFS_IOC_SYNC: commit now.
    // SAFETY: an argument-less ioctl on a descriptor open for this scope.
    let commit = || assert_eq!(unsafe { libc::ioctl(top.as_raw_fd(), 0x9408) }, 0);
    commit();
    fs::remove_file(m.path().join("big")).unwrap();
    let on_host = || fs::metadata(&img).unwrap().blocks() * 512;
    let before = on_host();
    // The deletion comes with the file's release, which the kernel sends
    // when it likes; its space is trimmed once a commit after it is done.
    let mut after = before;
    for _ in 0..50 {
        commit();
        let out = Command::new("fstrim")
            .arg("-v")
            .arg(m.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("trimmed"));
        after = on_host();
        if before - after >= 60 << 20 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        before - after >= 60 << 20,
        "the image took {before} bytes before fstrim, {after} after"
    );
    let (ok, out) = run_as(1000, 1000, &format!("fstrim {}", m.path().display()));
    assert!(
        !ok && out.contains("not permitted"),
        "fstrim by another user: {out}"
    );
    assert_eq!(fs::read(m.path().join("kept")).unwrap(), kept);
    drop(top);
    m.unmount_cleanly();
    check_image(&img);
}

/// `nologreplay` (and its old name `norecovery`) shows what the last
/// commit left, not what was fsync'd since, and leaves the log on disk;
/// it needs `ro`, and fstrim is refused under it (the log's blocks look
/// free). The kernel shows the same and refuses the same.
#[test]
fn nologreplay_shows_the_last_commit() {
    use std::os::fd::AsRawFd;
    require_privileged!();
    let t = TestDir::new("mount-rw-nologreplay").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let kept = pattern(10_000, 7);
    fs::write(m.path().join("kept"), &kept).unwrap();
    // BTRFS_IOC_SYNC: commit now (FUSE passes no syncfs on).
    let top = File::open(m.path()).unwrap();
    // SAFETY: an argument-less ioctl on a descriptor open for this scope.
    assert_eq!(unsafe { libc::ioctl(top.as_raw_fd(), 0x9408) }, 0);
    drop(top);
    let logged = pattern(20_000, 8);
    let mut f = File::create(m.path().join("logged")).unwrap();
    f.write_all(&logged).unwrap();
    f.sync_all().unwrap();
    m.kill();
    drop(f);
    // The superblock's log_root (offset 0x60) names the fsync's log.
    let log_root = || {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        File::open(&img)
            .unwrap()
            .read_exact_at(&mut b, 0x1_0000 + 0x60)
            .unwrap();
        u64::from_le_bytes(b)
    };
    assert_ne!(log_root(), 0, "the fsync left no log");

    let out = Command::new(ubtrfs_bin())
        .args(["mount", "-o", "nologreplay"])
        .arg(&img)
        .arg(t.join("fuse"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nologreplay needs a read-only mount"),
        "read-write nologreplay: {out:?}"
    );
    assert!(!is_mount_point(&t.join("fuse")));

    let fstrim = |mnt: &Path| {
        let out = Command::new("fstrim").arg(mnt).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for opts in ["ro,nologreplay", "ro,norecovery", "ro,rescue=nologreplay"] {
        let m = RwMount::start(&img, &t.join("fuse"), &["-o", opts]);
        assert_eq!(fs::read(m.path().join("kept")).unwrap(), kept, "{opts}");
        assert!(
            !m.path().join("logged").exists(),
            "{opts}: the log was replayed"
        );
        let (ok, err) = fstrim(m.path());
        assert!(
            !ok && err.contains("Read-only file system"),
            "{opts}: fstrim: {err}"
        );
        let (status, err) = m.unmount();
        assert!(status.success(), "{opts}: {err}");
        assert!(err.contains("not replayed"), "{opts}: no warning: {err}");
        assert_ne!(log_root(), 0, "{opts}: the log is gone");
    }
    // The kernel, on a copy: the image stays as ubtrfs alone left it.
    let copy = t.join("copy.img");
    fs::copy(&img, &copy).unwrap();
    {
        let k = Mount::single(&copy, &t.join("kernel"), "ro,rescue=nologreplay").unwrap();
        assert_eq!(fs::read(k.path().join("kept")).unwrap(), kept);
        assert!(!k.path().join("logged").exists());
        let (ok, err) = fstrim(k.path());
        assert!(
            !ok && err.contains("Read-only file system"),
            "kernel fstrim: {err}"
        );
    }
    // Without the option the log is replayed (in memory, read-only).
    let m = RwMount::start(&img, &t.join("fuse"), &["--ro"]);
    assert_eq!(fs::read(m.path().join("logged")).unwrap(), logged);
    let (status, err) = m.unmount();
    assert!(
        status.success() && err.contains("replayed in memory"),
        "{err}"
    );
    check_image(&img);
}

/// The first read of each file on a fresh mount moves its access time
/// (relatime) without the kernel fetching the file's attributes again for
/// it: the kernel holds none of its pages, so the read reaches the mount,
/// and the kernel drops its cached access time after such a read by
/// itself. A file whose pages the kernel holds (written on this mount) is
/// read from them; the mount then has the kernel fetch its attributes, so
/// its moved access time shows too.
#[test]
fn first_reads_move_access_times_without_fetching_attributes() {
    require_privileged!();
    const FILES: usize = 100;
    let t = TestDir::new("mount-rw-first-read").unwrap();
    let img = new_image(&t);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    fs::create_dir(m.path().join("d")).unwrap();
    for i in 0..FILES {
        fs::write(
            m.path().join(format!("d/f{i}")),
            pattern(3000 + i, i as u64),
        )
        .unwrap();
    }
    fs::write(m.path().join("empty"), b"").unwrap();
    m.unmount_cleanly();
    std::thread::sleep(Duration::from_millis(50));

    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    let p = |i: usize| m.path().join(format!("d/f{i}"));
    let atime = |md: &fs::Metadata| (md.atime(), md.atime_nsec());
    let mtime = |md: &fs::Metadata| (md.mtime(), md.mtime_nsec());
    let was: Vec<_> = (0..FILES)
        .map(|i| {
            let md = fs::metadata(p(i)).unwrap();
            assert!(atime(&md) <= mtime(&md), "f{i}: atime after mtime already");
            atime(&md)
        })
        .collect();
    let getattrs = server_info(m.path())[info::GETATTR];
    // As cat(1) reads: open, fstat, read to the end.
    for i in 0..FILES {
        let mut f = File::open(p(i)).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 3000 + i as u64);
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert!(back == pattern(3000 + i, i as u64), "f{i} read back wrong");
    }
    let fetched = server_info(m.path())[info::GETATTR] - getattrs;
    assert!(
        fetched < FILES as u64 / 10,
        "{fetched} attribute fetches for {FILES} first reads"
    );
    for (i, was) in was.iter().enumerate() {
        let md = fs::metadata(p(i)).unwrap();
        assert!(atime(&md) > *was, "f{i}: the read did not move its atime");
        assert!(atime(&md) >= mtime(&md), "f{i}: atime before mtime");
    }

    // Empty: no read reaches the mount, so the open has the kernel fetch
    // the moved time (seen on the open descriptor, as in the kernel).
    let empty = m.path().join("empty");
    let before = atime(&fs::metadata(&empty).unwrap());
    let mut f = File::open(&empty).unwrap();
    assert_eq!(f.read(&mut [0u8; 16]).unwrap(), 0);
    assert!(
        atime(&f.metadata().unwrap()) > before,
        "reading an empty file did not move its atime"
    );
    drop(f);

    // Written on this mount: its pages are cached, and read from there.
    let w = m.path().join("w");
    fs::write(&w, b"cached").unwrap();
    let before = atime(&fs::metadata(&w).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(fs::read(&w).unwrap(), b"cached");
    assert!(
        atime(&fs::metadata(&w).unwrap()) > before,
        "a read from cached pages did not move the atime"
    );
    m.unmount_cleanly();
    check_image(&img);
}

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

use common::{FuseMount, Tmpfs, assert_same_view, ubtrfs_bin};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
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
    let img = t.join("disk.img");
    let opts = MkfsOptions {
        device_size: IMAGE_SIZE,
        ..MkfsOptions::default()
    };
    mkfs(std::slice::from_ref(&img), &opts, None).expect("mkfs.btrfs");
    img
}

/// `ubtrfs mount [ARGS] DEV MNT` running in the foreground as a child
/// process, stderr to `MNT.stderr`. Dropping it without one of the ways
/// of ending it (a failed test) detaches the mount and kills the child.
struct RwMount {
    child: Option<Child>,
    mnt: PathBuf,
    stderr: PathBuf,
}

impl RwMount {
    /// Start the child and wait until `mnt` is a mount point.
    fn start(dev: &Path, mnt: &Path, args: &[&str]) -> RwMount {
        fs::create_dir_all(mnt).unwrap();
        let mnt = mnt.canonicalize().unwrap();
        let stderr = mnt.with_extension("stderr");
        let child = Command::new(ubtrfs_bin())
            .arg("mount")
            .args(args)
            .arg(dev)
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .expect("start ubtrfs mount");
        let mut m = RwMount {
            child: Some(child),
            mnt,
            stderr,
        };
        let deadline = Instant::now() + TIMEOUT;
        while !is_mount_point(&m.mnt) {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                panic!(
                    "ubtrfs mount exited ({status}) before the mount appeared:\n{}",
                    m.stderr_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not mounted after {TIMEOUT:?}:\n{}",
                m.mnt.display(),
                m.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn path(&self) -> &Path {
        &self.mnt
    }

    fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn pid(&self) -> libc::pid_t {
        self.child.as_ref().unwrap().id() as libc::pid_t
    }

    /// Wait for the child to exit by itself; returns its status and stderr.
    fn wait(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + TIMEOUT;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ubtrfs mount still running after {TIMEOUT:?}:\n{}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, self.stderr_text())
    }

    /// Send `sig` and wait for the child to exit.
    fn signal(self, sig: libc::c_int) -> (ExitStatus, String) {
        // SAFETY: signalling our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
        self.wait()
    }

    /// `fusermount3 -u` and wait for the child to exit.
    fn unmount(self) -> (ExitStatus, String) {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output()
            .expect("run fusermount3");
        assert!(
            out.status.success(),
            "fusermount3 -u {}: {}",
            self.mnt.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait()
    }

    /// Unmount, and assert that the child exits 0, printing nothing, and
    /// that the mount is gone.
    fn unmount_cleanly(self) {
        let mnt = self.mnt.clone();
        let (status, err) = self.unmount();
        assert_clean_exit("fusermount3 -u", &mnt, status, &err);
    }

    /// SIGKILL: the process dies without a last commit; the dead mount is
    /// detached.
    fn kill(self) {
        let mnt = self.mnt.clone();
        let (status, _) = self.signal(libc::SIGKILL);
        assert_eq!(status.code(), None, "killed by a signal");
        detach(&mnt);
    }
}

impl Drop for RwMount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        detach(&self.mnt);
    }
}

/// Lazily detach whatever is mounted on `mnt` (a dead FUSE mount too).
fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mnt)
        .stdin(Stdio::null())
        .output();
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

/// `btrfs check --readonly` of a single-device image must find no error.
fn check_image(img: &Path) {
    if let Err(e) = run(command("btrfs").args(["check", "--readonly"]).arg(img)) {
        panic!("btrfs check {}: {e:#}", img.display());
    }
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
        let seek = |off: i64, whence| {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain lseek on a descriptor open for this scope.
            let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
            if r < 0 {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap())
            } else {
                Ok(r)
            }
        };
        assert_eq!(seek(0, libc::SEEK_DATA), Ok(0));
        assert_eq!(seek(0, libc::SEEK_HOLE), Ok(4096));
        assert_eq!(seek(4096, libc::SEEK_DATA), Ok(69_632));
        assert_eq!(seek(70_000, libc::SEEK_HOLE), Ok(73_728));
        assert_eq!(seek(200_000, libc::SEEK_DATA), Ok(1 << 20));
        assert_eq!(seek((1 << 20) + 3000, libc::SEEK_DATA), Err(libc::ENXIO));
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
    // SAFETY: signalling our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(m.pid(), libc::SIGTERM) }, 0);
    let deadline = Instant::now() + TIMEOUT;
    while is_mount_point(&mnt) {
        assert!(Instant::now() < deadline, "not detached after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still serving the detached mount.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        m.child.as_mut().unwrap().try_wait().unwrap().is_none(),
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

#[test]
fn fsync_commits() {
    require_privileged!();
    let t = TestDir::new("mount-rw-fsync").unwrap();
    let img = new_image(&t);
    let data = pattern(150_000, 13);
    let m = RwMount::start(&img, &t.join("fuse"), &NO_TIMER);
    a_few_changes(m.path(), &data);
    File::open(m.path().join("dir/data"))
        .unwrap()
        .sync_all()
        .unwrap();
    File::open(m.path()).unwrap().sync_all().unwrap();
    // Not fsync'd, and no commit before the kill: lost.
    fs::write(m.path().join("after-fsync"), b"not durable").unwrap();
    m.kill();
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
    assert!(!chattr("+C", &b), "no-COW on a file with data is refused");
    assert!(chattr("+c", &b));
    assert!(lsattr(&b).contains('c'));
    assert!(!chattr("+i", &a), "immutable is not kept, so it is refused");
    m.unmount_cleanly();
    check_image(&img);
    let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
    let st = fs.stat(fs.resolve_path(b"/a").unwrap()).unwrap();
    assert_ne!(st.flags & ubtrfs::format::consts::INODE_NODATACOW, 0);
}

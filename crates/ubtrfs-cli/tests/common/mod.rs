//! Helpers shared by the integration tests of the `ubtrfs` binary: running
//! it, restoring into a scratch tmpfs, comparing two views of one
//! filesystem, and a read-only FUSE mount served by a child process.

#![allow(dead_code)]

pub mod copies;
pub mod steps;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use testkit::fuse_mount::UbtrfsMount;
use testkit::{CompareOptions, MkfsOptions, TestDir, command, compare_trees_with, mkfs, run};

/// A command's status, stdout and stderr, for a failed assertion.
pub fn show(out: &Output) -> String {
    format!(
        "status {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `ubtrfs` binary under test.
pub fn ubtrfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ubtrfs")
}

/// Run `ubtrfs` with `args` (stdin from /dev/null) and return its output,
/// whatever the exit status.
pub fn ubtrfs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(ubtrfs_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the ubtrfs binary starts")
}

/// `ubtrfs` arguments for a command: the command words, then the devices,
/// then the rest.
pub fn args_with_devices<P: AsRef<Path>>(
    cmd: &[&str],
    devices: &[P],
    rest: &[&OsStr],
) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = cmd.iter().map(Into::into).collect();
    a.extend(devices.iter().map(|d| d.as_ref().as_os_str().to_owned()));
    a.extend(rest.iter().map(|r| r.to_os_string()));
    a
}

/// Panic with the command's status and output unless it succeeded.
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stderr ---\n{}--- stdout (first 4000 bytes) ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(4000)])
    );
}

/// The one warning a restore onto a host filesystem other than btrfs may
/// print: btrfs properties (`btrfs.*` xattrs) have no place there.
pub const PROPERTIES_SKIPPED: &str = "btrfs.* properties were not restored";

/// `ubtrfs restore DEV... OUT`, asserting success and that nothing was
/// reported as an error or skipped, but for [`PROPERTIES_SKIPPED`].
pub fn restore<P: AsRef<Path>>(devices: &[P], out: &Path) {
    restore_allowing(devices, out, &[]);
}

/// [`restore`], also allowing warnings that contain one of `allowed`;
/// each of those must appear.
pub fn restore_allowing<P: AsRef<Path>>(devices: &[P], out: &Path, allowed: &[&str]) {
    let o = ubtrfs(args_with_devices(&["restore"], devices, &[out.as_os_str()]));
    assert_success("ubtrfs restore", &o);
    let err = String::from_utf8_lossy(&o.stderr);
    let bad: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("ubtrfs: restore:") || l.contains("warning"))
        .filter(|l| !l.contains(PROPERTIES_SKIPPED))
        .filter(|l| !allowed.iter().any(|a| l.contains(a)))
        .collect();
    assert!(
        bad.is_empty(),
        "ubtrfs restore reported problems:\n{}",
        bad.join("\n")
    );
    for a in allowed {
        assert!(err.contains(a), "ubtrfs restore did not warn {a:?}:\n{err}");
    }
}

/// A tmpfs mounted on a directory for the lifetime of the value.
/// Restores go there, not into the test directory: the host's ext4 holds
/// neither btrfs's large extended attributes (up to a node's size) nor
/// 100 of them on one file, while tmpfs does.
pub struct Tmpfs {
    path: PathBuf,
    mounted: bool,
}

impl Tmpfs {
    /// Mount a fresh tmpfs on `path` (created if missing).
    pub fn new(path: &Path) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        testkit::run(
            testkit::command("mount")
                .args(["-t", "tmpfs", "-o", "mode=0755,size=4g", "ubtrfs-test"])
                .arg(path),
        )
        .expect("mount a tmpfs for restore output");
        Tmpfs {
            path: path.to_path_buf(),
            mounted: true,
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            self.mounted = false;
            if let Err(e) = testkit::umount(&self.path) {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

/// Compare two views of one filesystem (`expected` is the kernel's) with
/// `opts`, and panic listing every difference.
///
/// `times_exempt` are paths (relative to the tops) of directories whose
/// times alone are not compared, everything else about them is: where a
/// snapshot holds a nested subvolume, the kernel shows an empty directory
/// that it makes up on the spot, with the current time.
pub fn assert_same_view(
    what: &str,
    expected: &Path,
    actual: &Path,
    opts: &CompareOptions,
    times_exempt: &[&str],
) {
    let mut o = opts.clone();
    o.ignore_paths
        .extend(times_exempt.iter().map(PathBuf::from));
    let mut diffs = compare_trees_with(expected, actual, &o)
        .err()
        .unwrap_or_default();
    for p in times_exempt {
        let (e, a) = (expected.join(p), actual.join(p));
        assert!(
            std::fs::symlink_metadata(&e).is_ok_and(|m| m.is_dir()),
            "{what}: {} is not a directory in the kernel's view; the list of \
             nested-subvolume placeholders is out of date",
            e.display()
        );
        let o = CompareOptions {
            mtime: false,
            mtime_nsec: false,
            top_level: true,
            ..opts.clone()
        };
        if let Err(d) = compare_trees_with(&e, &a, &o) {
            diffs.extend(d.into_iter().map(|d| format!("{p}/{d}")));
        }
    }
    if !diffs.is_empty() {
        panic!(
            "{what}: {} differences between the kernel ({}) and ubtrfs ({}):\n{}",
            diffs.len(),
            expected.display(),
            actual.display(),
            diffs.join("\n")
        );
    }
}

/// What [`testkit::compare_trees`] does not look at, for two views of one
/// filesystem: the file type each directory entry reports (`d_type`, which
/// `find` and `ls` trust) and, for regular files, `st_blocks` (what `du`
/// shows). Panics listing the differences.
pub fn assert_same_blocks_and_dtypes(what: &str, expected: &Path, actual: &Path) {
    use std::os::unix::fs::MetadataExt;
    let mut diffs = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let entries = std::fs::read_dir(actual.join(&rel)).unwrap();
        for e in entries {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let dtype = e.file_type().unwrap();
            let ma = std::fs::symlink_metadata(actual.join(&r)).unwrap();
            if dtype != ma.file_type() {
                diffs.push(format!(
                    "{}: readdir type {dtype:?}, lstat type {:?}",
                    r.display(),
                    ma.file_type()
                ));
            }
            let Ok(me) = std::fs::symlink_metadata(expected.join(&r)) else {
                continue;
            };
            if ma.is_file() && me.blocks() != ma.blocks() {
                diffs.push(format!(
                    "{}: st_blocks: expected {}, actual {}",
                    r.display(),
                    me.blocks(),
                    ma.blocks()
                ));
            }
            if ma.is_dir() {
                stack.push(r);
            }
        }
    }
    if !diffs.is_empty() {
        panic!(
            "{what}: {} differences between {} and {}:\n{}",
            diffs.len(),
            expected.display(),
            actual.display(),
            diffs.join("\n")
        );
    }
}

/// `ubtrfs mount [ARGS] DEV MNT` running in the foreground as a child
/// process (see [`UbtrfsMount`]); panics if the mount does not appear.
pub fn start_mount(dev: &Path, mnt: &Path, args: &[&str]) -> UbtrfsMount {
    UbtrfsMount::start(Path::new(ubtrfs_bin()), &[dev], mnt, args)
        .unwrap_or_else(|e| panic!("ubtrfs mount {}: {e:#}", dev.display()))
}

/// `ubtrfs mount --ro DEV... MNT` running in the foreground as a child
/// process. [`FuseMount::unmount`] unmounts with `fusermount3 -u` and
/// checks that the child exits 0; dropping it without that (a failed test)
/// kills the child and detaches the mount.
pub struct FuseMount(UbtrfsMount);

impl FuseMount {
    /// Start the child and wait until the mount appears. `mnt` is created
    /// if missing; its stderr goes to `mnt` + `.stderr`.
    pub fn new<P: AsRef<Path>>(devices: &[P], mnt: &Path) -> FuseMount {
        FuseMount(
            UbtrfsMount::start(Path::new(ubtrfs_bin()), devices, mnt, &["--ro"])
                .unwrap_or_else(|e| panic!("ubtrfs mount --ro: {e:#}")),
        )
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `fusermount3 -u`, then wait for the child and assert it exits 0 and
    /// printed nothing on stderr.
    pub fn unmount(self) {
        if let Err(e) = self.0.unmount() {
            panic!("{e:#}");
        }
    }
}

/// A fresh single-device image of `size` bytes made by `mkfs.btrfs` with
/// its defaults.
pub fn new_image(t: &TestDir, name: &str, size: u64) -> PathBuf {
    let img = t.join(name);
    let opts = MkfsOptions {
        device_size: size,
        ..MkfsOptions::default()
    };
    mkfs(std::slice::from_ref(&img), &opts, None).expect("mkfs.btrfs");
    img
}

/// `btrfs check --readonly` of a single-device image must find no error,
/// and neither must `ubtrfs check`.
pub fn check_image(img: &Path) {
    if let Err(e) = run(command("btrfs").args(["check", "--readonly"]).arg(img)) {
        panic!("btrfs check {}: {e:#}", img.display());
    }
    let out = ubtrfs([OsStr::new("check"), OsStr::new("-q"), img.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("no errors found"),
        "ubtrfs check {} ({}), where btrfs check found nothing:\n{text}{}",
        img.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

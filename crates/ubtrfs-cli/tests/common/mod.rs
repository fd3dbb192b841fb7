//! Helpers shared by the integration tests of the `ubtrfs` binary: running
//! it, restoring into a scratch tmpfs, comparing two views of one
//! filesystem, and a read-only FUSE mount served by a child process.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::{CompareOptions, compare_trees_with};

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

/// Whether `/proc/mounts` lists a FUSE mount on `mnt`.
fn fuse_mounted_at(mnt: &Path) -> bool {
    let mounts = std::fs::read("/proc/mounts").unwrap_or_default();
    mounts.split(|&b| b == b'\n').any(|line| {
        let mut f = line.split(|&b| b == b' ');
        let (_src, point, fstype) = (f.next(), f.next(), f.next());
        point.is_some_and(|p| unescape_mount_field(p) == mnt.as_os_str().as_bytes())
            && fstype.is_some_and(|t| t.starts_with(b"fuse"))
    })
}

/// `/proc/mounts` writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_field(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push(
                b[i + 1..i + 4]
                    .iter()
                    .fold(0u32, |a, c| a * 8 + u32::from(c - b'0')) as u8,
            );
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// How long the FUSE mount may take to appear, and the child to exit after
/// `fusermount3 -u`.
const FUSE_TIMEOUT: Duration = Duration::from_secs(30);

/// `ubtrfs mount --ro DEV... MNT` running in the foreground as a child
/// process. [`FuseMount::unmount`] unmounts with `fusermount3 -u` and
/// checks that the child exits 0; dropping it without that (a failed test)
/// detaches the mount lazily and kills the child.
pub struct FuseMount {
    child: Option<Child>,
    mnt: PathBuf,
    stderr: PathBuf,
}

impl FuseMount {
    /// Start the child and wait until the mount is listed in
    /// `/proc/mounts`. `mnt` is created if missing; its stderr goes to
    /// `mnt` + `.stderr`.
    pub fn new<P: AsRef<Path>>(devices: &[P], mnt: &Path) -> FuseMount {
        std::fs::create_dir_all(mnt).unwrap();
        let mnt = mnt.canonicalize().unwrap();
        let stderr = mnt.with_extension("stderr");
        let err_file = std::fs::File::create(&stderr).unwrap();
        let child = Command::new(ubtrfs_bin())
            .args(args_with_devices(
                &["mount", "--ro"],
                devices,
                &[mnt.as_os_str()],
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err_file)
            .spawn()
            .expect("start ubtrfs mount");
        let mut m = FuseMount {
            child: Some(child),
            mnt,
            stderr,
        };
        let deadline = Instant::now() + FUSE_TIMEOUT;
        loop {
            if fuse_mounted_at(&m.mnt) {
                return m;
            }
            let status = m.child.as_mut().unwrap().try_wait().unwrap();
            if let Some(status) = status {
                m.child = None;
                panic!(
                    "ubtrfs mount exited ({status}) before the mount appeared:\n{}",
                    m.stderr_text()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "ubtrfs mount: {} not mounted after {FUSE_TIMEOUT:?}:\n{}",
                    m.mnt.display(),
                    m.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `fusermount3 -u`, then wait for the child and assert it exits 0 and
    /// printed nothing on stderr.
    pub fn unmount(mut self) {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output()
            .expect("run fusermount3");
        assert_success("fusermount3 -u", &out);
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + FUSE_TIMEOUT;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ubtrfs mount still running {FUSE_TIMEOUT:?} after fusermount3 -u:\n{}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self.stderr_text();
        assert!(
            status.success(),
            "ubtrfs mount exited with {status} after fusermount3 -u:\n{err}"
        );
        assert!(
            err.trim().is_empty(),
            "ubtrfs mount printed on stderr:\n{err}"
        );
        assert!(
            !fuse_mounted_at(&self.mnt),
            "still mounted after the child exited"
        );
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

//! Support for the external test suites (`pjdfstest.rs`, `fsx.rs`): where
//! their programs are, fresh images, and a read-write `ubtrfs mount`
//! running as a child process.

#![allow(dead_code)]

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::{MkfsOptions, TestDir, command, is_mount_point, mkfs, run};

/// How long a mount may take to appear, and the child to exit after an
/// unmount (a final commit included).
const TIMEOUT: Duration = Duration::from_secs(60);

/// The installed program `name` of an external suite: in
/// `$UBTRFS_TOOLS_DIR/bin`, else in `test-tools/bin` of the cargo target
/// directory (where `scripts/test.sh` installs it), else on `$PATH`.
/// Panics, saying how to install it, if it is nowhere.
pub fn tool(name: &str, version: &str) -> PathBuf {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("UBTRFS_TOOLS_DIR") {
        dirs.push(PathBuf::from(d).join("bin"));
    }
    // The binary under test is TARGET/PROFILE/ubtrfs.
    if let Some(target) = Path::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .parent()
        .and_then(Path::parent)
    {
        dirs.push(target.join("test-tools/bin"));
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .or_else(|| testkit::which(name))
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed (scripts/test.sh installs it; by hand: \
                 cargo install --locked {name} --version ={version} --root target/test-tools)"
            )
        })
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

/// `btrfs check --readonly` of a single-device image must find no error.
pub fn check_image(img: &Path) {
    if let Err(e) = run(command("btrfs").args(["check", "--readonly"]).arg(img)) {
        panic!("btrfs check {}: {e:#}", img.display());
    }
}

/// `echo 3 > /proc/sys/vm/drop_caches`: the next reads of every file
/// reach the filesystem (through FUSE: the ubtrfs process).
pub fn drop_caches() {
    // SAFETY: no arguments; flushes dirty pages first, as drop_caches wants.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", b"3\n").expect("write /proc/sys/vm/drop_caches");
}

/// `ubtrfs mount [ARGS] IMG MNT` running in the foreground as a child
/// process, stderr to `MNT.stderr`. Dropping it without
/// [`RwMount::unmount_cleanly`] (a failed test) detaches the mount and
/// kills the child.
pub struct RwMount {
    child: Option<Child>,
    mnt: PathBuf,
    stderr: PathBuf,
}

impl RwMount {
    /// Start the child and wait until `mnt` (created if missing) is a
    /// mount point.
    pub fn start(img: &Path, mnt: &Path, args: &[&str]) -> RwMount {
        fs::create_dir_all(mnt).unwrap();
        let mnt = mnt.canonicalize().unwrap();
        let stderr = mnt.with_extension("stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
            .arg("mount")
            .args(args)
            .arg(img)
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

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// What the child printed on stderr so far.
    pub fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `fusermount3 -u`; the child must then exit 0 (its last commit
    /// succeeded), having printed nothing, and the mount must be gone.
    pub fn unmount_cleanly(mut self) {
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
                    "ubtrfs mount still running {TIMEOUT:?} after fusermount3 -u:\n{}",
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
            !is_mount_point(&self.mnt),
            "{} still mounted",
            self.mnt.display()
        );
    }
}

impl Drop for RwMount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output();
    }
}

/// A thread that, every `period`, writes dirty pages back (`sync`) and
/// drops the clean ones from the page cache, so that through a mount with
/// the kernel's writeback cache the filesystem keeps seeing writes and
/// reads while a workload runs, not only at its end. Stops when dropped.
pub struct CacheDropper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl CacheDropper {
    /// Start the thread.
    pub fn start(period: Duration) -> CacheDropper {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut rounds = 0;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                // SAFETY: no arguments.
                unsafe { libc::sync() };
                // 1: the page cache only (not dentries and inodes).
                fs::write("/proc/sys/vm/drop_caches", b"1\n")
                    .expect("write /proc/sys/vm/drop_caches");
                rounds += 1;
            }
            rounds
        });
        CacheDropper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop the thread; how many times it dropped the caches.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let t = self.thread.take().expect("running");
        t.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

impl Drop for CacheDropper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

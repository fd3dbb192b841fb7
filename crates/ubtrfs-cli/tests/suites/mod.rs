//! Support for the external test suites (`pjdfstest.rs`, `fsx.rs`): where
//! their programs are, and dropping the page cache while they run.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// `echo 3 > /proc/sys/vm/drop_caches`: the next reads of every file
/// reach the filesystem (through FUSE: the ubtrfs process).
pub fn drop_caches() {
    // SAFETY: no arguments; flushes dirty pages first, as drop_caches wants.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", b"3\n").expect("write /proc/sys/vm/drop_caches");
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

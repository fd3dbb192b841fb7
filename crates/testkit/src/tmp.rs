//! Per-test temporary directories.

use anyhow::{Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The directory under which every [`TestDir`] is created: the value of
/// `UBTRFS_TEST_DIR` if set and non-empty, else [`std::env::temp_dir`].
pub fn base_dir() -> PathBuf {
    match std::env::var_os("UBTRFS_TEST_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => std::env::temp_dir(),
    }
}

/// A temporary directory for one test: images, mount points, generated
/// source trees. Removed on drop, after lazily unmounting anything still
/// mounted below it (so a leaked mount never has its contents deleted and
/// never keeps the directory alive). Set `UBTRFS_KEEP_TEST_DIR=1` to keep
/// it for inspection (its path is printed on stderr).
#[derive(Debug)]
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TestDir {
    /// Create `<base_dir>/ubtrfs-<name>-XXXXXX` (see [`base_dir`]).
    pub fn new(name: &str) -> Result<TestDir> {
        let base = base_dir();
        std::fs::create_dir_all(&base)
            .with_context(|| format!("cannot create test base dir {}", base.display()))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("ubtrfs-{name}-"))
            .tempdir_in(&base)
            .with_context(|| format!("cannot create a temp dir in {}", base.display()))?;
        let path = dir.path().to_path_buf();
        Ok(TestDir {
            dir: Some(dir),
            path,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(rel)`.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// Create the directory `rel` (and parents) inside, return its path.
    pub fn mkdir(&self, rel: impl AsRef<Path>) -> Result<PathBuf> {
        let p = self.path.join(rel);
        std::fs::create_dir_all(&p).with_context(|| format!("mkdir {}", p.display()))?;
        Ok(p)
    }

    /// Create (or truncate) a sparse file of `size` bytes inside, return
    /// its path.
    pub fn sparse_file(&self, rel: impl AsRef<Path>, size: u64) -> Result<PathBuf> {
        let p = self.path.join(rel);
        sparse_file(&p, size)?;
        Ok(p)
    }

    /// Keep the directory on disk; returns its path.
    pub fn keep(mut self) -> PathBuf {
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        self.path.clone()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        unmount_below(&self.path);
        if std::env::var_os("UBTRFS_KEEP_TEST_DIR").is_some_and(|v| !v.is_empty() && v != "0") {
            eprintln!("keeping test dir {}", self.path.display());
            let _ = dir.keep();
            return;
        }
        if let Err(e) = dir.close() {
            eprintln!("warning: cannot remove {}: {e}", self.path.display());
        }
    }
}

/// Create (or truncate to zero and re-extend) a sparse file of `size`
/// bytes.
pub fn sparse_file(path: &Path, size: u64) -> Result<()> {
    let f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    f.set_len(size)
        .with_context(|| format!("set_len {} on {}", size, path.display()))?;
    Ok(())
}

/// Mount points listed in `/proc/self/mountinfo`.
fn mount_points() -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let info = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    info.split(|&b| b == b'\n')
        .filter_map(|l| l.split(|&b| b == b' ').nth(4))
        .map(|m| PathBuf::from(std::ffi::OsString::from_vec(unescape_mountinfo(m))))
        .collect()
}

/// Mount points at or below `dir`, deepest first, from
/// `/proc/self/mountinfo`.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut found: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|m| m.starts_with(&dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Whether `path` is a mount point (listed in `/proc/self/mountinfo`).
pub fn is_mount_point(path: &Path) -> bool {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mount_points().contains(&path)
}

fn unescape_mountinfo(b: &[u8]) -> Vec<u8> {
    // Spaces, tabs, newlines and backslashes appear as \ooo octal escapes.
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Lazily unmount everything mounted at or below `dir` (best effort).
pub fn unmount_below(dir: &Path) {
    for m in mounts_below(dir) {
        eprintln!("warning: {} still mounted, lazy unmount", m.display());
        if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
            // SAFETY: c is a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn testdir_lifecycle() {
        let t = TestDir::new("tmp-unit").unwrap();
        let p = t.path().to_path_buf();
        assert!(p.starts_with(base_dir()));
        assert!(
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ubtrfs-tmp-unit-")
        );
        let img = t.sparse_file("a.img", 1 << 30).unwrap();
        let m = std::fs::metadata(&img).unwrap();
        assert_eq!(m.len(), 1 << 30);
        assert!(m.blocks() < 16, "not sparse: {} blocks", m.blocks());
        let d = t.mkdir("x/y").unwrap();
        assert!(d.is_dir());
        drop(t);
        assert!(!p.exists());
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo(b"/a\\040b"), b"/a b");
        assert_eq!(unescape_mountinfo(b"/plain"), b"/plain");
        assert_eq!(unescape_mountinfo(b"/tail\\"), b"/tail\\");
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
        let t = TestDir::new("tmp-mp").unwrap();
        assert!(!is_mount_point(t.path()));
        assert!(mounts_below(t.path()).is_empty());
    }
}

//! Pieces shared by the model-based random tests (the library's
//! `tests/model.rs` and the FUSE mount's `tests/model_fuse.rs`): the data
//! they write, relative paths, and errno values of raw system calls.

use crate::generate::Rng;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Deterministic content for a write of `len` bytes from `seed`, with runs
/// of zeros now and then, so that zero detection is exercised.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 64);
    while out.len() < len {
        let w = r.next_u64();
        if w.is_multiple_of(23) {
            out.extend_from_slice(&[0u8; 64]);
        } else {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

/// `dir/name` for a path relative to the top (`""` is the top itself).
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// `p` for a system call. Panics if it holds a NUL byte: the tests make
/// their own paths, and never such a one.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("a path without NUL bytes")
}

/// The errno the last failed system call left (`EIO` if none).
pub fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The errno behind an I/O error (`EIO` if it has none).
pub fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The result of a system call that returns 0 on success: `Err(errno)`
/// otherwise.
pub fn rc(r: libc::c_int) -> Result<(), i32> {
    if r == 0 { Ok(()) } else { Err(last_errno()) }
}

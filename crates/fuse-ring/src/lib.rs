//! FUSE over io_uring, beside a `fuser` session.
//!
//! Since Linux 6.14 the kernel can hand FUSE requests to the daemon through
//! io_uring instead of `read(2)` on `/dev/fuse`: one queue per CPU, each
//! request completing a command the daemon queued in advance, each reply
//! queued together with the fetch of the next request. A request stays on
//! the CPU that made it and costs no system call of its own, which is what
//! small requests (create, stat, unlink) spend most of their time on.
//!
//! `fuser` negotiates the connection (INIT) and keeps reading `/dev/fuse`
//! for what never goes through the ring (FORGET, INTERRUPT); this crate
//! runs the rings ([`ring::Rings`]) and gives each request to a
//! [`ring::Handler`] as a [`ring::RingEntry`], with the wire layouts of the
//! requests and replies in [`abi`].
//!
//! The kernel offers the transport only when the `fuse` module's
//! `enable_uring` parameter is set ([`kernel_enabled`]).

pub mod abi;
pub mod from_fuser;
pub mod ring;

pub use ring::{Handler, RingConfig, RingEntry, Rings};

use std::path::Path;

/// Where the kernel says whether it offers FUSE over io_uring.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Errors of setting up the rings.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// io_uring itself failed (not built in, out of locked memory, ...).
    #[error("io_uring: {0}")]
    Io(#[from] std::io::Error),
    /// `/sys/devices/system/cpu/possible` could not be read or parsed.
    #[error("cannot tell the possible CPUs: {0}")]
    Cpus(String),
}

/// Whether the running kernel offers FUSE over io_uring to new mounts.
pub fn kernel_enabled() -> bool {
    std::fs::read_to_string(ENABLE_PARAMETER)
        .map(|s| matches!(s.trim(), "Y" | "1"))
        .unwrap_or(false)
}

/// The number of queues the kernel expects: one per possible CPU. It
/// sends nothing over the ring until every one of them has an entry.
pub fn possible_cpus() -> Result<usize, Error> {
    let path = Path::new("/sys/devices/system/cpu/possible");
    let text = std::fs::read_to_string(path).map_err(|e| Error::Cpus(e.to_string()))?;
    parse_cpu_list(text.trim()).ok_or_else(|| Error::Cpus(format!("unexpected {text:?}")))
}

/// The highest CPU of a list like `0-3,8` plus one.
fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut highest = None;
    for part in list.split(',') {
        let last = part.rsplit('-').next()?;
        let n: usize = last.trim().parse().ok()?;
        highest = Some(highest.map_or(n, |h: usize| h.max(n)));
    }
    highest.map(|h| h + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8"), Some(9));
        assert_eq!(parse_cpu_list("0-3,5-6"), Some(7));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}

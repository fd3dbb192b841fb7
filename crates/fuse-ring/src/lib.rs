//! The daemon side of FUSE: requests read from `/dev/fuse`, or taken
//! over io_uring, beside a `fuser` session that mounts and negotiates.
//!
//! Since Linux 6.14 the kernel can hand FUSE requests to the daemon through
//! io_uring instead of `read(2)` on `/dev/fuse`: one queue per CPU, each
//! request completing a command the daemon queued in advance, each reply
//! queued together with the fetch of the next request. A request stays on
//! the CPU that made it and costs no system call of its own, which is what
//! small requests (create, stat, unlink) spend most of their time on.
//!
//! `fuser` mounts and negotiates the connection (INIT); this crate then
//! serves it: threads reading `/dev/fuse` ([`dev::DevThreads`], which also
//! get what never goes through the ring: FORGET, INTERRUPT, DESTROY), and
//! the rings ([`ring::Rings`]) where the kernel offers them. Both give a
//! request as the same [`ring::Request`], with the wire layouts of the
//! requests and replies in [`abi`].
//!
//! The kernel offers the io_uring transport only when the `fuse` module's
//! `enable_uring` parameter is set ([`kernel_enabled`]).

pub mod abi;
pub mod dev;
pub mod from_fuser;
pub mod idle_wait;
pub mod ring;

pub use idle_wait::{can_wait_idle, leave_idle};
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
    /// The kernel refused a ring entry (it then serves the connection
    /// through /dev/fuse only).
    #[error("the kernel refused a FUSE io_uring entry: {0}")]
    Register(std::io::Error),
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

/// Whether rings can be set up here: the CPU list reads and io_uring
/// with 128-byte entries works (a seccomp filter or
/// `kernel.io_uring_disabled` refuses it). Ask the kernel for the
/// transport only then: once it agreed, it holds every request until the
/// queues exist. Gives the number of queues.
pub fn probe() -> Result<usize, Error> {
    let queues = possible_cpus()?;
    let _ring: io_uring::IoUring<io_uring::squeue::Entry128, io_uring::cqueue::Entry> =
        io_uring::IoUring::builder().build(4)?;
    Ok(queues)
}

/// How many CPUs a list like `0-3,8` names (the kernel's count of
/// possible CPUs, which is its number of queues).
fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for part in list.split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (first.trim().parse().ok()?, last.trim().parse().ok()?);
        count += last.checked_sub(first)? + 1;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8"), Some(5));
        assert_eq!(parse_cpu_list("0-3,5-6"), Some(6));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}

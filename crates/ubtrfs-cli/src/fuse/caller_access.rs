//! Whether a caller who is not root may create a subvolume, or a snapshot,
//! where it asks: the kernel's rules, checked by the kernel itself.
//!
//! The kernel lets anyone who may add a name to a directory (write and
//! search permission, through a writable mount) create a subvolume there,
//! and the owner of a subvolume snapshot it. Permission takes in the
//! caller's groups, the directory's ACL and the mount the caller came
//! through (a read-only bind mount), none of which the request carries.
//! So the mount asks the kernel: it takes the caller's own descriptor of
//! the directory (found in `/proc/PID/fdinfo`, reopened through
//! `/proc/PID/fd`, so through the caller's mount), switches this thread
//! to the caller's file-system credentials, and calls `faccessat2` on it.
//! The kernel may then ask the mount for attributes and ACLs, which other
//! threads serve: this runs on the request's own thread.

use fuser::Errno;
use std::os::fd::{AsRawFd, OwnedFd};

/// The file-system identity of a calling process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// `CAP_FOWNER` in effect: the caller acts as any file's owner.
    pub fowner: bool,
}

/// `CAP_FOWNER`'s bit in a capability set.
const CAP_FOWNER: u32 = 3;

impl Credentials {
    /// The credentials in `/proc/PID/status` text: the file-system uid and
    /// gid (the fourth of each line), the groups, the effective
    /// capabilities.
    pub fn parse(status: &str) -> Option<Credentials> {
        let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key));
        let fourth = |key: &str| field(key)?.split_whitespace().nth(3)?.parse().ok();
        let groups = field("Groups:")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
            .ok()?;
        let caps = u64::from_str_radix(field("CapEff:")?.trim(), 16).ok()?;
        Some(Credentials {
            uid: fourth("Uid:")?,
            gid: fourth("Gid:")?,
            groups,
            fowner: caps & (1 << CAP_FOWNER) != 0,
        })
    }

    /// The credentials of process `pid`.
    pub fn of(pid: u32) -> Result<Credentials, Errno> {
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| Errno::EPERM)?;
        Credentials::parse(&status).ok_or(Errno::EPERM)
    }
}

/// The descriptors of process `pid` open on inode `ino` of the device
/// `dev` (the caller's view of the directory its request names).
pub fn descriptors_of(pid: u32, dev: (u32, u32), ino: u64) -> Vec<i64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok())
        .filter(|&fd| super::subvol_ioctl::open_file(pid, fd) == Ok((dev, ino)))
        .collect()
}

/// Whether `who` may add a name to the directory open as `fd` in process
/// `pid`: `faccessat2(W_OK | X_OK)` on that descriptor, as `who`.
/// `EACCES`, or `EROFS` through a read-only mount.
pub fn may_add_name(pid: u32, fd: i64, who: &Credentials) -> Result<(), Errno> {
    // Reopened as this process: the caller's mount and dentry, no lookup.
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(|_| Errno::EPERM)?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(Errno::EPERM);
    }
    // SAFETY: `raw` is a descriptor just opened and owned by nothing else.
    let dir: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
    as_caller(who, || {
        // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH names the
        // open descriptor itself.
        let r = unsafe {
            libc::syscall(
                libc::SYS_faccessat2,
                dir.as_raw_fd(),
                c"".as_ptr(),
                libc::W_OK | libc::X_OK,
                libc::AT_EACCESS | libc::AT_EMPTY_PATH,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(Errno::from_i32(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EACCES),
            ))
        }
    })?
}

/// Run `f` on this thread with `who`'s file-system uid, gid and groups,
/// then put this thread's back. Raw system calls: the C library's
/// `setgroups` would change every thread's groups. `EPERM` if this
/// process may not take them (a mount run by a user, for another).
fn as_caller<T>(who: &Credentials, f: impl FnOnce() -> T) -> Result<T, Errno> {
    // SAFETY: getgroups with a zero size only counts.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut saved = vec![0 as libc::gid_t; n.max(0) as usize];
    // SAFETY: the buffer holds `n` groups.
    let n = unsafe { libc::getgroups(n, saved.as_mut_ptr()) };
    if n < 0 {
        return Err(Errno::EPERM);
    }
    saved.truncate(n as usize);
    let set_groups = |g: &[libc::gid_t]| {
        // SAFETY: `g` holds `g.len()` groups.
        unsafe { libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) == 0 }
    };
    if !set_groups(&who.groups) {
        return Err(Errno::EPERM);
    }
    // setfsuid/setfsgid answer the previous id and fail silently: asked
    // again, they answer the id in force.
    // SAFETY: plain system calls on this thread's credentials.
    let (old_gid, old_uid) = unsafe {
        let g = libc::syscall(libc::SYS_setfsgid, who.gid) as u32;
        let u = libc::syscall(libc::SYS_setfsuid, who.uid) as u32;
        (g, u)
    };
    // SAFETY: as above.
    let took = unsafe {
        libc::syscall(libc::SYS_setfsuid, who.uid) as u32 == who.uid
            && libc::syscall(libc::SYS_setfsgid, who.gid) as u32 == who.gid
    };
    let out = took.then(f);
    // SAFETY: as above: this thread's own ids back.
    unsafe {
        libc::syscall(libc::SYS_setfsuid, old_uid);
        libc::syscall(libc::SYS_setfsgid, old_gid);
    }
    if !set_groups(&saved) {
        // This thread serves only this request and ends with it.
        tracing::warn!("could not restore the groups of a subvolume request's thread");
    }
    out.ok_or(Errno::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_status_lines() {
        let status = "Name:\tsh\nUmask:\t0022\nUid:\t1000\t1000\t1000\t1001\n\
                      Gid:\t100\t100\t100\t101\nGroups:\t4 27 2000 \n\
                      CapEff:\t0000000000000008\n";
        assert_eq!(
            Credentials::parse(status),
            Some(Credentials {
                uid: 1001,
                gid: 101,
                groups: vec![4, 27, 2000],
                fowner: true,
            })
        );
        let none = status.replace("0000000000000008", "0000000000000000");
        let c = Credentials::parse(&none).unwrap();
        assert!(!c.fowner);
        let no_groups = none.replace("Groups:\t4 27 2000 ", "Groups:");
        assert_eq!(
            Credentials::parse(&no_groups).unwrap().groups,
            Vec::<u32>::new()
        );
        assert_eq!(Credentials::parse("Name:\tx\n"), None);
    }

    /// A descriptor of this process, checked as another user: the mode
    /// bits decide, and this thread's credentials come back.
    #[test]
    fn access_is_checked_as_the_caller() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let t = std::env::temp_dir().join(format!("ubtrfs-caller-access-{}", std::process::id()));
        let open = t.join("open");
        let shut = t.join("shut");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::create_dir_all(&shut).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&shut, std::fs::Permissions::from_mode(0o755)).unwrap();
        let who = Credentials {
            uid: 4321,
            gid: 4321,
            groups: vec![],
            fowner: false,
        };
        let pid = std::process::id();
        let a = std::fs::File::open(&open).unwrap();
        let b = std::fs::File::open(&shut).unwrap();
        let fd = |f: &std::fs::File| i64::from(f.as_raw_fd());
        assert_eq!(may_add_name(pid, fd(&a), &who), Ok(()));
        assert_eq!(may_add_name(pid, fd(&b), &who), Err(Errno::EACCES));
        // Root again, groups as before.
        std::fs::create_dir(shut.join("x")).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::syscall(libc::SYS_setfsuid, -1i32) }, 0);
        std::fs::remove_dir_all(&t).unwrap();
    }
}

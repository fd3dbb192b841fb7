//! Whether a caller who is not root may create a subvolume, or a snapshot,
//! where it asks: the kernel's rules, checked by the kernel itself.
//!
//! The kernel lets anyone who may add a name to a directory (write and
//! search permission, through a writable mount) create a subvolume there,
//! and the owner of a subvolume snapshot it. Permission takes in the
//! caller's groups, the directory's ACL and the mount the caller came
//! through (a read-only bind mount), none of which the request carries.
//! So the mount asks the kernel: it takes the caller's own descriptor of
//! the directory (found in `/proc/PID/fdinfo`), switches this thread to
//! the caller's file-system credentials, and calls `faccessat2` on it.
//! The kernel may then ask the mount for attributes and ACLs, which other
//! threads serve: this runs on the request's own thread.
//!
//! A caller's descriptor is taken by reopening `/proc/PID/fd/N` with
//! `O_PATH` (which opens nothing: no device is touched) and checking that
//! what came is what the caller's fdinfo named (mount and inode): another
//! thread of the caller may swap descriptor N at any moment, and the
//! mount must check and use one and the same file ([`Pinned`]).

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
    /// `CAP_SYS_ADMIN` in effect: what the kernel leaves to root
    /// (deleting subvolumes, listing them) is allowed.
    pub admin: bool,
}

/// `CAP_FOWNER`'s and `CAP_SYS_ADMIN`'s bits in a capability set.
const CAP_FOWNER: u32 = 3;
const CAP_SYS_ADMIN: u32 = 21;

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
            admin: caps & (1 << CAP_SYS_ADMIN) != 0,
        })
    }

    /// The credentials of process `pid`. Capabilities count only in the
    /// mount's own user namespace: a caller's in a namespace of its own
    /// (`unshare -Ur`) reach no further than its own files.
    pub fn of(pid: u32) -> Result<Credentials, Errno> {
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| Errno::EPERM)?;
        let mut c = Credentials::parse(&status).ok_or(Errno::EPERM)?;
        let ns = |p: String| std::fs::read_link(p).ok();
        let same = ns(format!("/proc/{pid}/ns/user"))
            .is_some_and(|theirs| ns("/proc/self/ns/user".into()) == Some(theirs));
        c.fowner &= same;
        c.admin &= same;
        Ok(c)
    }

    /// Whether the caller of a request (`uid` as FUSE saw it, process
    /// `pid`) is root as the kernel means it here: uid 0 with
    /// `CAP_SYS_ADMIN` (not a root whose capabilities were dropped).
    pub fn is_admin(uid: u32, pid: u32) -> bool {
        uid == 0 && Credentials::of(pid).is_ok_and(|c| c.admin)
    }
}

/// A caller's open file, held by the mount through a descriptor of its
/// own (`O_PATH`): the one the caller's fdinfo named, on the mount with
/// device `dev`.
pub struct Pinned {
    fd: OwnedFd,
    pub dev: (u32, u32),
    pub ino: u64,
}

/// Mount id, inode number and open flags from fdinfo text.
fn fdinfo(text: &str) -> Option<(u64, u64, u64)> {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
    };
    Some((
        field("mnt_id:")?.parse().ok()?,
        field("ino:")?.parse().ok()?,
        // In octal.
        u64::from_str_radix(field("flags:")?, 8).ok()?,
    ))
}

/// Take the file open as `fd` in process `pid`. `EBADF` if there is
/// none, or it is an `O_PATH` descriptor (the kernel would not take one
/// either). Its device and inode are read from the file taken (`fstat`),
/// never from the caller's tables, which may have changed meanwhile.
pub fn pin(pid: u32, fd: i64) -> Result<Pinned, Errno> {
    if fd < 0 {
        return Err(Errno::EBADF);
    }
    let (_, _, flags) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .ok()
        .and_then(|t| fdinfo(&t))
        .ok_or(Errno::EBADF)?;
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(|_| Errno::EBADF)?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(Errno::EBADF);
    }
    // SAFETY: `raw` was just opened and is owned by nothing else.
    let ours: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
    // The flags may be those of a file swapped out since: that only
    // changes which of the caller's own files is taken, and whatever is
    // taken is checked for what it is (device and inode below).
    if flags & libc::O_PATH as u64 != 0 {
        return Err(Errno::EBADF);
    }
    // SAFETY: fstat fills the struct it is given; the descriptor is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(ours.as_raw_fd(), &mut st) } != 0 {
        return Err(Errno::EBADF);
    }
    Ok(Pinned {
        fd: ours,
        dev: (libc::major(st.st_dev), libc::minor(st.st_dev)),
        ino: st.st_ino,
    })
}

/// The descriptors of process `pid` open on the inode numbered any of
/// `inos` in the mount with device `dev` (the caller's views of the
/// directory its request names), each pinned. Only those whose fdinfo
/// names the inode are taken. (The mount's root goes by two numbers: its
/// node id until the kernel first has its attributes, then its own.)
pub fn descriptors_of(pid: u32, dev: (u32, u32), inos: &[u64]) -> Vec<Pinned> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok())
        .filter(|fd| {
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
                .ok()
                .and_then(|t| fdinfo(&t))
                .is_some_and(|(_, i, _)| inos.contains(&i))
        })
        .filter_map(|fd| pin(pid, fd).ok())
        .filter(|p| p.dev == dev && inos.contains(&p.ino))
        .collect()
}

/// Whether `who` may add a name to the directory `dir`:
/// `faccessat2(W_OK | X_OK)` on it, as `who`. `EACCES`, or `EROFS`
/// through a read-only mount.
pub fn may_add_name(dir: &Pinned, who: &Credentials) -> Result<(), Errno> {
    as_caller(who, || {
        // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH names the
        // open descriptor itself.
        let r = unsafe {
            libc::syscall(
                libc::SYS_faccessat2,
                dir.fd.as_raw_fd(),
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

/// Whether the mount `file` was reached through is read-only.
pub fn read_only_mount(file: &Pinned) -> bool {
    // SAFETY: fstatvfs fills the struct it is given; the descriptor is open
    // (O_PATH descriptors are taken since Linux 3.12).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstatvfs(file.fd.as_raw_fd(), &mut st) == 0 && st.f_flag & libc::ST_RDONLY != 0 }
}

/// Open pinned directory `dir` for reading (the mount's own file: at most
/// an OPENDIR of its own). `None` if it is no directory.
pub fn open_dir(dir: &Pinned) -> Option<std::fs::File> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", dir.fd.as_raw_fd())).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let raw = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    // SAFETY: `raw` was just opened and is owned by nothing else.
    (raw >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) })
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
    // No capability of this process may answer for the caller's: the
    // kernel drops the file ones with the fs uid, unless told not to.
    let caps = took.then(without_capabilities).flatten();
    let out = caps.is_some().then(f);
    if let Some(saved) = caps
        && !set_capabilities(&saved)
    {
        tracing::warn!("could not restore the capabilities of a subvolume request's thread");
    }
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

/// `struct __user_cap_header_struct` and `__user_cap_data_struct`
/// (version 3: two of the latter).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAP_VERSION_3: u32 = 0x2008_0522;

/// Clear this thread's effective capabilities; the ones it had, to put
/// back with [`set_capabilities`], or `None` if that failed.
fn without_capabilities() -> Option<[CapData; 2]> {
    let mut head = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut saved = [CapData::default(); 2];
    // SAFETY: a version-3 header and room for its two data structs; pid 0
    // is this thread.
    if unsafe { libc::syscall(libc::SYS_capget, &mut head, saved.as_mut_ptr()) } != 0 {
        return None;
    }
    let mut none = saved;
    for d in &mut none {
        d.effective = 0;
    }
    set_capabilities(&none).then_some(saved)
}

/// Set this thread's capabilities to `caps`.
fn set_capabilities(caps: &[CapData; 2]) -> bool {
    let mut head = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: as in `without_capabilities`; capset only reads `caps`.
    unsafe { libc::syscall(libc::SYS_capset, &mut head, caps.as_ptr()) == 0 }
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
                admin: false,
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
            admin: false,
        };
        let pid = std::process::id();
        let a = std::fs::File::open(&open).unwrap();
        let b = std::fs::File::open(&shut).unwrap();
        let pinned = |f: &std::fs::File| pin(pid, i64::from(f.as_raw_fd())).unwrap();
        assert_eq!(may_add_name(&pinned(&a), &who), Ok(()));
        assert_eq!(may_add_name(&pinned(&b), &who), Err(Errno::EACCES));
        // Root again, groups and capabilities as before (a directory of
        // another user's, mode 0700, takes a name only with them).
        std::fs::create_dir(shut.join("x")).unwrap();
        std::os::unix::fs::chown(shut.join("x"), Some(4321), Some(4321)).unwrap();
        std::fs::set_permissions(shut.join("x"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(shut.join("x/y")).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::syscall(libc::SYS_setfsuid, -1i32) }, 0);
        std::fs::remove_dir_all(&t).unwrap();
    }

    /// A pinned descriptor is the caller's file, found by device and
    /// inode; an O_PATH descriptor or none at all is refused.
    #[test]
    fn an_open_directory_is_pinned_by_device_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let pid = std::process::id();
        let dir = std::fs::File::open("/proc").unwrap();
        let meta = dir.metadata().unwrap();
        let p = pin(pid, i64::from(dir.as_raw_fd())).unwrap();
        assert_eq!(p.ino, meta.ino());
        let dev = meta.dev() as libc::dev_t;
        assert_eq!(p.dev, (libc::major(dev), libc::minor(dev)));
        assert!(open_dir(&p).is_some());
        assert!(pin(pid, 1 << 20).is_err());
        let c = std::ffi::CString::new("/proc").unwrap();
        // SAFETY: a valid path; the descriptor is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH) };
        assert!(fd >= 0);
        assert!(pin(pid, i64::from(fd)).is_err());
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
    }
}

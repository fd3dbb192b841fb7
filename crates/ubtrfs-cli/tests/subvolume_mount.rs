//! `ubtrfs subvolume create|snapshot|delete` on a live ubtrfs mount,
//! through the btrfs ioctls the mount answers: the subvolumes appear and
//! go in the mount at once, a snapshot holds what was written just before
//! it (still in the kernel's cache until the mount had it written back), a
//! read-only one refuses writes, wrong requests fail with a message and
//! change nothing, only root may change subvolumes through the mount (and
//! not through a read-only bind mount of it), `ubtrfs subvolume list`
//! shows them, and afterwards `btrfs check` is clean and the kernel lists
//! (as `ubtrfs subvolume list` of the image does) and reads the same
//! subvolumes.

mod common;

use common::{check_image, show, start_mount, ubtrfs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use testkit::{Mount, TestDir, require_privileged};

fn ok(args: &[&str]) -> String {
    let out = ubtrfs(args);
    assert!(out.status.success(), "ubtrfs {args:?}: {}", show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command fails, and says so naming `wanted`.
fn fails(args: &[&str], wanted: &str) {
    let out = ubtrfs(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(wanted),
        "ubtrfs {args:?} should fail with {wanted:?}: {}",
        show(&out)
    );
}

fn p(mnt: &Path, rel: &str) -> String {
    mnt.join(rel).to_string_lossy().into_owned()
}

#[test]
fn subvolumes_come_and_go_on_a_live_mount() {
    require_privileged!();
    let t = TestDir::new("subvolume-mount").unwrap();
    let img = common::new_image(&t, "disk.img", 512 << 20);
    let mnt = t.join("mnt");
    // Another user reaches the mount too.
    let m = start_mount(&img, &mnt, &["-o", "allow_other"]);

    // Written, not synced: the kernel may still hold it when the
    // snapshot is asked for.
    std::fs::write(mnt.join("top.txt"), b"top level\n").unwrap();
    let out = ok(&["subvolume", "create", &p(&mnt, "vol")]);
    assert!(out.contains("Create subvolume"), "{out}");
    let vol = std::fs::metadata(mnt.join("vol")).unwrap();
    assert!(vol.is_dir() && vol.mode() & 0o7777 == 0o755, "{vol:?}");
    assert_eq!(std::fs::read_dir(mnt.join("vol")).unwrap().count(), 0);
    // Kept open (a close writes the kernel's pages back), and the mount's
    // writeback held to the system's limits, not FUSE's strict one: the
    // pages stay in the kernel's cache until the mount has it write them
    // back for the snapshot.
    let dev = std::fs::metadata(&mnt).unwrap().dev();
    let bdi = format!("/sys/class/bdi/{}:{}", libc::major(dev), libc::minor(dev));
    std::fs::write(format!("{bdi}/strict_limit"), b"0").unwrap();
    std::fs::write(format!("{bdi}/max_ratio"), b"100").unwrap();
    let mut still_open = std::fs::File::create(mnt.join("vol/data")).unwrap();
    std::io::Write::write_all(&mut still_open, &vec![7u8; 300_000]).unwrap();

    ok(&[
        "subvolume",
        "snapshot",
        "-r",
        &p(&mnt, "vol"),
        &p(&mnt, "ro"),
    ]);
    assert_eq!(
        std::fs::read(mnt.join("ro/data")).unwrap(),
        vec![7u8; 300_000]
    );
    drop(still_open);
    let e = std::fs::write(mnt.join("ro/new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    // Changing the source leaves the snapshot as it was.
    std::fs::write(mnt.join("vol/data"), b"changed").unwrap();
    assert_eq!(std::fs::read(mnt.join("ro/data")).unwrap().len(), 300_000);

    // The top level into an existing directory, under its own name.
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    std::fs::write(mnt.join("late.txt"), b"just before\n").unwrap();
    ok(&["subvolume", "snapshot", &p(&mnt, "vol"), &p(&mnt, "snaps")]);
    ok(&[
        "subvolume",
        "snapshot",
        mnt.to_str().unwrap(),
        &p(&mnt, "top"),
    ]);
    assert_eq!(
        std::fs::read(mnt.join("top/late.txt")).unwrap(),
        b"just before\n"
    );
    assert_eq!(
        std::fs::read(mnt.join("snaps/vol/data")).unwrap(),
        b"changed"
    );
    // A writable snapshot takes writes of its own.
    std::fs::write(mnt.join("top/only-here"), b"mine").unwrap();
    assert!(!mnt.join("only-here").exists());

    // A snapshot another program asks for (the raw ioctl) holds what a
    // file still open wrote just before, still in the kernel's cache.
    let raw = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import fcntl, os, sys\n\
             f = open(sys.argv[1] + '/vol/fresh', 'wb'); f.write(b'5' * 200000)\n\
             src = os.open(sys.argv[1] + '/vol', os.O_RDONLY)\n\
             top = os.open(sys.argv[1], os.O_RDONLY)\n\
             a = bytearray(4096); a[0:8] = src.to_bytes(8, 'little'); a[56:59] = b'raw'\n\
             fcntl.ioctl(top, 0x50009417, a)\n\
             print(os.path.getsize(sys.argv[1] + '/raw/fresh'))\n",
        )
        .arg(&mnt)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&raw.stdout).trim(),
        "200000",
        "{}",
        show(&raw)
    );
    ok(&["subvolume", "delete", &p(&mnt, "raw")]);

    // Wrong requests: an error naming what is wrong, nothing changed.
    fails(
        &["subvolume", "create", &p(&mnt, "vol")],
        "cannot create subvolume",
    );
    fails(
        &[
            "subvolume",
            "snapshot",
            &p(&mnt, "vol/data"),
            &p(&mnt, "bad"),
        ],
        "not the root of a subvolume",
    );
    fails(
        &["subvolume", "snapshot", "/proc", &p(&mnt, "bad")],
        "not in this mount",
    );
    fails(
        &["subvolume", "delete", &p(&mnt, "snaps")],
        "not a subvolume",
    );
    fails(
        &["subvolume", "create", "/proc/new"],
        "not in a ubtrfs mount",
    );
    assert!(!mnt.join("bad").exists());

    // Another user, as in the kernel: creates subvolumes where they may
    // add a name (their directory, their group's, one an ACL opens to
    // them), snapshots their own, deletes and lists none.
    let dir = |name: &str, owner: u32, group: u32, mode: u32| {
        let d = mnt.join(name);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(owner), Some(group)).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    };
    dir("user", 1000, 1000, 0o755);
    dir("grp", 0, 2000, 0o775);
    dir("acl", 0, 0, 0o755);
    let setfacl = Command::new("setfacl")
        .args(["-m", "u:1000:rwx"])
        .arg(mnt.join("acl"))
        .output()
        .unwrap();
    assert!(setfacl.status.success(), "{}", show(&setfacl));
    let as_user = |groups: &str, args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=1000", "--regid=1000", groups])
            .arg(common::ubtrfs_bin())
            .args(args)
            .output()
            .unwrap()
    };
    let user_ok = |groups: &str, args: &[&str]| {
        let out = as_user(groups, args);
        assert!(out.status.success(), "{args:?} as a user: {}", show(&out));
    };
    let user_fails = |groups: &str, args: &[&str], wanted: &str| {
        let out = as_user(groups, args);
        assert!(
            !out.status.success() && show(&out).contains(wanted),
            "{args:?} as a user should fail with {wanted:?}: {}",
            show(&out)
        );
    };
    let none = "--clear-groups";
    user_ok(none, &["subvolume", "create", &p(&mnt, "user/mine")]);
    user_ok("--groups=2000", &["subvolume", "create", &p(&mnt, "grp/g")]);
    user_ok(none, &["subvolume", "create", &p(&mnt, "acl/a")]);
    for v in ["user/mine", "grp/g", "acl/a"] {
        let m = std::fs::metadata(mnt.join(v)).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.ino() & 0xff_ffff_ffff),
            (1000, 1000, 256),
            "{v}"
        );
    }
    user_fails(
        none,
        &["subvolume", "create", &p(&mnt, "grp/g2")],
        "no permission",
    );
    user_fails(
        none,
        &["subvolume", "create", &p(&mnt, "nope")],
        "no permission",
    );
    user_fails(
        none,
        &["subvolume", "create", &p(&mnt, "user/mine")],
        "exists",
    );
    user_ok(
        none,
        &[
            "subvolume",
            "snapshot",
            &p(&mnt, "user/mine"),
            &p(&mnt, "user/mine-snap"),
        ],
    );
    user_fails(
        none,
        &["subvolume", "snapshot", &p(&mnt, "vol"), &p(&mnt, "user/v")],
        "owner",
    );
    // All capabilities in a user namespace of one's own reach no further
    // than one's own files: EPERM (1), from the raw ioctl.
    let in_ns = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .args([
            "unshare",
            "--user",
            "--map-root-user",
            "/usr/bin/python3",
            "-c",
        ])
        .arg(
            "import fcntl, os, sys\n\
             src = os.open(sys.argv[1], os.O_RDONLY)\n\
             d = os.open(sys.argv[2], os.O_RDONLY)\n\
             a = bytearray(4096); a[0:8] = src.to_bytes(8, 'little'); a[56:57] = b'v'\n\
             try:\n    fcntl.ioctl(d, 0x50009417, a); print('made')\n\
             except OSError as e:\n    print('errno', e.errno)\n",
        )
        .arg(mnt.join("vol"))
        .arg(mnt.join("user"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&in_ns.stdout).trim(),
        "errno 1",
        "{}",
        show(&in_ns)
    );
    user_fails(
        none,
        &["subvolume", "delete", &p(&mnt, "user/mine-snap")],
        "only root",
    );
    user_fails(
        none,
        &["subvolume", "delete", &p(&mnt, "snaps/vol")],
        "only root",
    );
    user_fails(none, &["subvolume", "list", &p(&mnt, "user")], "only root");
    // Root without CAP_SYS_ADMIN deletes and lists none either.
    for (args, wanted) in [
        (
            &["subvolume", "delete", &p(&mnt, "snaps/vol")][..],
            "CAP_SYS_ADMIN",
        ),
        (&["subvolume", "list", &p(&mnt, "user")][..], "only root"),
    ] {
        let out = Command::new("setpriv")
            .arg("--bounding-set=-sys_admin")
            .arg(common::ubtrfs_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            !out.status.success() && show(&out).contains(wanted),
            "{args:?} without CAP_SYS_ADMIN: {}",
            show(&out)
        );
    }
    assert!(!mnt.join("user/v").exists() && !mnt.join("nope").exists());
    assert!(!mnt.join("grp/g2").exists());
    assert!(mnt.join("snaps/vol").exists() && mnt.join("user/mine-snap").exists());
    for v in ["user/mine-snap", "user/mine", "grp/g", "acl/a"] {
        ok(&["subvolume", "delete", &p(&mnt, v)]);
    }

    // The caller's umask, as the kernel applies it.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 077 && exec '{}' subvolume create '{}'",
            common::ubtrfs_bin(),
            p(&mnt, "user/private")
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let private = std::fs::metadata(mnt.join("user/private")).unwrap();
    assert_eq!(private.mode() & 0o7777, 0o700);

    // Through a read-only bind mount of the mount: refused.
    let bind = t.join("bind");
    std::fs::create_dir(&bind).unwrap();
    let sh = |cmd: String| {
        let out = Command::new("sh").arg("-c").arg(&cmd).output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", show(&out));
    };
    sh(format!(
        "mount --bind '{}' '{}' && mount -o remount,bind,ro '{}'",
        mnt.display(),
        bind.display(),
        bind.display()
    ));
    fails(&["subvolume", "create", &p(&bind, "via-ro")], "read-only");
    // The mount's own check, for root and for a user sending the ioctl
    // itself (our command would stop at the read-only mount first):
    // EROFS (30), as the kernel answers both.
    let raw_create = |who: &[&str]| {
        let out = Command::new("setpriv")
            .args(who)
            .args(["/usr/bin/python3", "-c"])
            .arg(
                "import fcntl, os, sys\n\
                 fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n\
                 a = bytearray(4096); a[8:14] = b'via-ro'\n\
                 try:\n    fcntl.ioctl(fd, 0x5000940e, a); print('created')\n\
                 except OSError as e:\n    print('errno', e.errno)\n",
            )
            .arg(bind.join("user"))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "errno 30",
            "{who:?}: {}",
            show(&out)
        );
    };
    raw_create(&["--reuid=1000", "--regid=1000", "--clear-groups"]);
    raw_create(&["--reuid=0"]);
    sh(format!("umount '{}'", bind.display()));
    assert!(!mnt.join("via-ro").exists() && !mnt.join("user/via-ro").exists());

    // Deleted: gone from the mount at once, and durable.
    let out = ok(&["subvolume", "delete", &p(&mnt, "ro")]);
    assert!(out.contains("Delete subvolume"), "{out}");
    assert!(!mnt.join("ro").exists());
    // The mount's list, as the kernel will show it below.
    let listed = ok(&["subvolume", "list", mnt.to_str().unwrap()]);
    let ro_listed = ok(&["subvolume", "list", "-r", &p(&mnt, "vol")]);
    assert!(ro_listed.trim().is_empty(), "{ro_listed}");
    m.unmount().unwrap();
    check_image(&img);
    let offline = ok(&["subvolume", "list", img.to_str().unwrap()]);
    assert_eq!(offline, listed, "the image's list and the mount's");

    // The kernel sees the same subvolumes and content.
    let kmnt = t.join("kmnt");
    let k = Mount::new(&[&img], &kmnt, "").unwrap();
    let list = Command::new("btrfs")
        .args(["subvolume", "list", "-r"])
        .arg(&kmnt)
        .output()
        .unwrap();
    assert!(list.status.success(), "{}", show(&list));
    let all = Command::new("btrfs")
        .args(["subvolume", "list"])
        .arg(&kmnt)
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&all.stdout).into_owned();
    let mut paths: Vec<&str> = all
        .lines()
        .filter_map(|l| l.split(" path ").nth(1))
        .collect();
    paths.sort();
    assert_eq!(paths, ["snaps/vol", "top", "user/private", "vol"], "{all}");
    // ID, generation, parent and path: the kernel's list line by line.
    assert_eq!(
        listed, all,
        "ubtrfs subvolume list against btrfs subvolume list"
    );
    assert!(
        String::from_utf8_lossy(&list.stdout).trim().is_empty(),
        "the read-only snapshot was deleted: {}",
        show(&list)
    );
    assert_eq!(std::fs::read(kmnt.join("vol/data")).unwrap(), b"changed");
    assert_eq!(std::fs::read(kmnt.join("top/only-here")).unwrap(), b"mine");
    assert_eq!(
        std::fs::read(kmnt.join("top/late.txt")).unwrap(),
        b"just before\n"
    );
    k.unmount().unwrap();
}

/// Subvolumes created and deleted in a directory while another process
/// makes and removes directories there, on a mount with one thread
/// serving requests: the kernel takes the directory's lock to drop a
/// deleted name, and the thread serving the `mkdir` of the lock's holder
/// must not be the one waiting for it. Fails (the mount aborted) if the
/// work has not finished within a minute.
#[test]
fn subvolume_requests_beside_directory_changes_finish() {
    require_privileged!();
    let t = TestDir::new("subvolume-mount-busy").unwrap();
    let img = common::new_image(&t, "disk.img", 512 << 20);
    let mnt = t.join("mnt");
    let m = start_mount(&img, &mnt, &["--threads", "1", "-o", "nouring"]);
    std::fs::create_dir(mnt.join("d")).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (d, done) = (mnt.join("d"), done.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let x = d.join(format!("x{}", n % 4));
                let _ = std::fs::create_dir(&x);
                let _ = std::fs::remove_dir(&x);
                n += 1;
            }
            n
        })
    };
    // Read now: a stat of a hung mount would hang too.
    let conn = libc::minor(std::fs::metadata(&mnt).unwrap().dev());
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if start.elapsed() > std::time::Duration::from_secs(60) {
                    // Unstick the test: abort the mount's connection.
                    let _ = std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), b"1");
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            true
        })
    };
    for i in 0..40 {
        let s = p(&mnt, &format!("d/s{i}"));
        ok(&["subvolume", "create", &s]);
        ok(&["subvolume", "delete", &s]);
        assert!(!Path::new(&s).exists(), "{s} is gone at once");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let churned = churn.join().unwrap();
    assert!(watchdog.join().unwrap(), "the mount hung");
    assert!(churned > 0);
    m.unmount().unwrap();
    check_image(&img);
}

/// A snapshot of a subvolume that holds two others shows two empty
/// placeholders. They are two directories to the kernel: different inode
/// numbers, and a process working in one keeps it, under its own name,
/// while the other is looked up and removed (with one inode number for
/// both, the kernel moved the first's entry to the second's name, and
/// removing the second took the process's working directory).
#[test]
fn placeholders_in_a_snapshot_are_directories_of_their_own() {
    require_privileged!();
    let t = TestDir::new("subvolume-mount-placeholders").unwrap();
    let img = common::new_image(&t, "disk.img", 512 << 20);
    let mnt = t.join("mnt");
    let m = start_mount(&img, &mnt, &[]);
    ok(&["subvolume", "create", &p(&mnt, "vol")]);
    ok(&["subvolume", "create", &p(&mnt, "vol/a")]);
    ok(&["subvolume", "create", &p(&mnt, "vol/b")]);
    std::fs::write(mnt.join("vol/a/f"), b"in a\n").unwrap();
    ok(&["subvolume", "snapshot", &p(&mnt, "vol"), &p(&mnt, "snap")]);

    let a = std::fs::metadata(mnt.join("snap/a")).unwrap();
    let b = std::fs::metadata(mnt.join("snap/b")).unwrap();
    assert!(a.is_dir() && b.is_dir());
    assert_ne!(a.ino(), b.ino(), "two placeholders share an inode number");
    assert_eq!(std::fs::read_dir(mnt.join("snap/a")).unwrap().count(), 0);
    // As the kernel's: a bare directory with no flags (lsattr -d says
    // "Inappropriate ioctl for device"); the real one has them.
    assert_eq!(get_flags(&mnt.join("snap/a")), Err(libc::ENOTTY));
    assert!(get_flags(&mnt.join("vol/a")).is_ok());
    // No ioctl at all, no xattrs, no names (kernel 6.18's answers).
    {
        let d = std::fs::File::open(mnt.join("snap/a")).unwrap();
        let mut word = 0u64;
        // SAFETY: BTRFS_IOC_SUBVOL_GETFLAGS writes one u64.
        let rc = unsafe { libc::ioctl(d.as_raw_fd(), 0x8008_9419u32 as _, &mut word) };
        let e = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, e), (-1, Some(libc::ENOTTY)));
    }
    let out = Command::new("setfattr")
        .args(["-n", "user.x", "-v", "1"])
        .arg(mnt.join("snap/a"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Operation not supported"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::create_dir(mnt.join("snap/a/x"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EPERM)
    );

    let mut sitter = Command::new("sleep")
        .arg("60")
        .current_dir(mnt.join("snap/a"))
        .spawn()
        .unwrap();
    let cwd = || std::fs::read_link(format!("/proc/{}/cwd", sitter.id())).unwrap();
    assert_eq!(cwd(), mnt.join("snap/a"));
    // Forget the cached entry, so the next stat of b asks the mount.
    drop_caches();
    let _ = std::fs::metadata(mnt.join("snap/b")).unwrap();
    assert_eq!(cwd(), mnt.join("snap/a"), "looking b up moved a");
    std::fs::remove_dir(mnt.join("snap/b")).unwrap();
    assert_eq!(cwd(), mnt.join("snap/a"), "removing b took a");
    assert!(std::fs::metadata(mnt.join("snap/a")).unwrap().is_dir());
    sitter.kill().unwrap();
    sitter.wait().unwrap();
    std::fs::remove_dir(mnt.join("snap/a")).unwrap();
    assert_eq!(std::fs::read_dir(mnt.join("snap")).unwrap().count(), 0);
    // The real ones are untouched.
    assert_eq!(std::fs::read(mnt.join("vol/a/f")).unwrap(), b"in a\n");
    m.unmount().unwrap();
    check_image(&img);
}

/// `FS_IOC_GETFLAGS` of `path`, or the errno.
fn get_flags(path: &Path) -> Result<u32, i32> {
    use std::os::fd::AsRawFd;
    const FS_IOC_GETFLAGS: u64 = 0x8008_6601;
    let f = std::fs::File::open(path).unwrap();
    let mut flags: libc::c_long = 0;
    // SAFETY: the ioctl writes one long.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut flags) };
    if rc == 0 {
        Ok(flags as u32)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
}

/// Subvolumes waiting to be dropped: orphan items in the root tree (read
/// from the image's last commit, the mount still running).
fn dead_roots(img: &Path) -> usize {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "root"])
        .arg(img)
        .output()
        .unwrap();
    assert!(out.status.success(), "dump-tree: {}", show(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("key (ORPHAN ORPHAN_ITEM"))
        .count()
}

/// A subvolume deleted while in use on the mount goes as the kernel's
/// does: gone from view at once, while a process working in it and a file
/// open in it go on (read, write, fsync, create); it cannot be snapshot.
/// Its tree is dropped when the last use ends, and the image is clean.
#[test]
fn a_subvolume_deleted_in_use_lives_on_for_its_users() {
    require_privileged!();
    let t = TestDir::new("subvolume-mount-in-use").unwrap();
    let img = common::new_image(&t, "disk.img", 512 << 20);
    let mnt = t.join("mnt");
    let m = start_mount(&img, &mnt, &[]);
    ok(&["subvolume", "create", &p(&mnt, "vol")]);
    std::fs::create_dir(mnt.join("vol/d")).unwrap();
    std::fs::write(mnt.join("vol/f"), vec![3u8; 300_000]).unwrap();
    let mut open = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("vol/f"))
        .unwrap();
    let mut sitter = Command::new("sleep")
        .arg("60")
        .current_dir(mnt.join("vol/d"))
        .spawn()
        .unwrap();
    let cwd = std::path::PathBuf::from(format!("/proc/{}/cwd", sitter.id()));

    ok(&["subvolume", "delete", &p(&mnt, "vol")]);
    assert!(!mnt.join("vol").exists(), "gone from view at once");
    assert!(!ok(&["subvolume", "list", &p(&mnt, "")]).contains("vol"));
    assert_eq!(dead_roots(&img), 1, "the deletion is committed");

    use std::io::{Read, Seek, SeekFrom, Write};
    let mut back = Vec::new();
    open.read_to_end(&mut back).unwrap();
    assert_eq!(back, vec![3u8; 300_000]);
    open.seek(SeekFrom::Start(10)).unwrap();
    open.write_all(b"still here").unwrap();
    open.sync_all().unwrap();
    std::fs::write(cwd.join("new"), b"made after the deletion").unwrap();
    assert_eq!(
        std::fs::read(cwd.join("new")).unwrap(),
        b"made after the deletion"
    );
    let src = cwd.join("..");
    let src = src.to_string_lossy();
    let out = ubtrfs(["subvolume", "snapshot", &src, &p(&mnt, "s")]);
    assert!(
        !out.status.success(),
        "snapshot of a deleted subvolume: {}",
        show(&out)
    );
    assert!(!mnt.join("s").exists());
    assert_eq!(dead_roots(&img), 1, "kept while in use");

    drop(open);
    std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(dead_roots(&img), 1, "a working directory keeps it");
    sitter.kill().unwrap();
    sitter.wait().unwrap();
    // The kernel forgets the inodes once nothing uses them.
    let start = std::time::Instant::now();
    while dead_roots(&img) != 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the tree was not dropped after its last use"
        );
        std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    m.unmount().unwrap();
    check_image(&img);
    assert_eq!(dead_roots(&img), 0);
}

/// `ubtrfs property get|set PATH ro`: on a mount (the btrfs ioctls) and
/// on an image, as the kernel keeps the flag: a read-only subvolume takes
/// no writes, what was written before it turned read-only is in it, only
/// its owner or root changes it, and the kernel agrees afterwards.
#[test]
fn the_read_only_property_of_subvolumes() {
    require_privileged!();
    let t = TestDir::new("subvolume-mount-property").unwrap();
    let img = common::new_image(&t, "disk.img", 512 << 20);
    let mnt = t.join("mnt");
    let m = start_mount(&img, &mnt, &["-o", "allow_other"]);
    ok(&["subvolume", "create", &p(&mnt, "vol")]);
    assert_eq!(ok(&["property", "get", &p(&mnt, "vol")]).trim(), "ro=false");
    // A file open in it: refused (its writes still to come would be).
    let mut open = std::fs::File::create(mnt.join("vol/before")).unwrap();
    std::io::Write::write_all(&mut open, &vec![9u8; 100_000]).unwrap();
    fails(
        &["property", "set", &p(&mnt, "vol"), "ro", "true"],
        "close them first",
    );
    drop(open);
    ok(&["property", "set", &p(&mnt, "vol"), "ro", "true"]);
    assert_eq!(
        ok(&["property", "get", &p(&mnt, "vol"), "ro"]).trim(),
        "ro=true"
    );
    let e = std::fs::write(mnt.join("vol/new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    // Nor opened for writing, as in the kernel.
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("vol/before"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(
        std::fs::read(mnt.join("vol/before")).unwrap(),
        vec![9u8; 100_000]
    );
    fails(
        &["property", "get", mnt.to_str().unwrap(), "compression"],
        "unknown property",
    );
    std::fs::create_dir(mnt.join("plain")).unwrap();
    fails(
        &["property", "get", &p(&mnt, "plain")],
        "not the root of a subvolume",
    );
    fails(
        &["property", "set", &p(&mnt, "vol"), "ro", "maybe"],
        "true or false",
    );

    // Another user: their own subvolume, not root's.
    std::fs::create_dir(mnt.join("user")).unwrap();
    std::os::unix::fs::chown(mnt.join("user"), Some(1000), Some(1000)).unwrap();
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
            .arg(common::ubtrfs_bin())
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_user(&["property", "set", &p(&mnt, "vol"), "ro", "false"]);
    assert!(
        !out.status.success() && show(&out).contains("owner"),
        "{}",
        show(&out)
    );
    let out = as_user(&["subvolume", "create", &p(&mnt, "user/mine")]);
    assert!(out.status.success(), "{}", show(&out));
    let out = as_user(&["property", "set", &p(&mnt, "user/mine"), "ro", "true"]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        ok(&["property", "get", &p(&mnt, "user/mine")]).trim(),
        "ro=true"
    );

    // Writable again.
    ok(&["property", "set", &p(&mnt, "vol"), "ro", "false"]);
    std::fs::write(mnt.join("vol/after"), b"writable again").unwrap();
    m.unmount().unwrap();
    check_image(&img);

    // The image, then the kernel.
    let image = img.to_str().unwrap();
    assert_eq!(ok(&["property", "get", image, "/vol"]).trim(), "ro=false");
    ok(&["property", "set", image, "/vol", "ro", "true"]);
    assert_eq!(
        ok(&["property", "get", image, "/user/mine", "ro"]).trim(),
        "ro=true"
    );
    check_image(&img);
    let kmnt = t.join("kmnt");
    let k = Mount::new(&[&img], &kmnt, "").unwrap();
    let got = Command::new("btrfs")
        .args(["property", "get"])
        .arg(kmnt.join("vol"))
        .arg("ro")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "ro=true",
        "{}",
        show(&got)
    );
    let e = std::fs::write(kmnt.join("vol/kernel"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(
        std::fs::read(kmnt.join("vol/after")).unwrap(),
        b"writable again"
    );
    assert_eq!(
        std::fs::read(kmnt.join("vol/before")).unwrap(),
        vec![9u8; 100_000]
    );
    k.unmount().unwrap();
}

/// A snapshot `btrfs receive` made (by the kernel) keeps its received
/// UUID, which incremental sends into it rely on: `ubtrfs property set ro
/// false` refuses it, as `btrfs property set` does, and with `-f` makes it
/// writable and forgets it was received (`BTRFS_IOC_SET_RECEIVED_SUBVOL`
/// on a mount, which `BTRFS_IOC_GET_SUBVOL_INFO` told it was received),
/// leaving what the kernel leaves: no received UUID or its UUID tree item,
/// no send transid.
#[test]
fn received_snapshots_stay_read_only_unless_forced() {
    require_privileged!();
    let t = TestDir::new("subvolume-mount-received").unwrap();
    let run = |c: &mut Command| testkit::run(c).unwrap_or_else(|e| panic!("{e:#}"));
    // Sent from one kernel filesystem, received twice into another.
    let src = common::new_image(&t, "src.img", 256 << 20);
    let img = common::new_image(&t, "disk.img", 512 << 20);
    let stream = t.join("stream");
    {
        let k = Mount::new(&[&src], &t.join("ksrc"), "").unwrap();
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(k.path().join("vol")));
        std::fs::write(k.path().join("vol/file"), b"sent\n").unwrap();
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(k.path().join("vol"))
            .arg(k.path().join("snap")));
        run(Command::new("btrfs")
            .args(["send", "-q", "-f"])
            .arg(&stream)
            .arg(k.path().join("snap")));
        k.unmount().unwrap();
        let k = Mount::new(&[&img], &t.join("kdst"), "").unwrap();
        for dir in ["a", "b"] {
            std::fs::create_dir(k.path().join(dir)).unwrap();
            run(Command::new("btrfs")
                .args(["receive", "-f"])
                .arg(&stream)
                .arg(k.path().join(dir)));
        }
        k.unmount().unwrap();
    }
    // Subvolumes the UUID tree lists under a received UUID.
    let received_items = |img: &Path| {
        let dump = run(Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "uuid"])
            .arg(img));
        let mut in_received = false;
        let mut n = 0;
        for line in dump.lines() {
            if line.contains(" key (") {
                in_received = line.contains("UUID_KEY_RECEIVED_SUBVOL");
            } else if in_received {
                n += line.matches("subvol_id").count();
            }
        }
        n
    };
    assert_eq!(received_items(&img), 2);

    // On the image.
    let image = img.to_str().unwrap();
    assert_eq!(ok(&["property", "get", image, "/a/snap"]).trim(), "ro=true");
    fails(
        &["property", "set", image, "/a/snap", "ro", "false"],
        "a received snapshot",
    );
    assert_eq!(ok(&["property", "get", image, "/a/snap"]).trim(), "ro=true");
    ok(&["property", "set", "-f", image, "/a/snap", "ro", "false"]);
    assert_eq!(
        ok(&["property", "get", image, "/a/snap"]).trim(),
        "ro=false"
    );
    assert_eq!(received_items(&img), 1);
    check_image(&img);

    // BTRFS_IOC_GET_SUBVOL_INFO, as the kernel answers it (read-only).
    let subvol_info = |path: &Path| {
        let out = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(
                "import fcntl, os, sys\n\
                 b = bytearray(504)\n\
                 fcntl.ioctl(os.open(sys.argv[1], os.O_RDONLY), 0x81f8943c, b)\n\
                 print(b.hex())",
            )
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let k = Mount::new(&[&img], &t.join("kro"), "ro").unwrap();
    let kernel_info = subvol_info(&k.path().join("b/snap"));
    let kernel_top = subvol_info(k.path());
    k.unmount().unwrap();

    // On a mount.
    let mnt = t.join("mnt");
    let m = start_mount(&img, &mnt, &["-o", "allow_other"]);
    assert_eq!(subvol_info(&mnt.join("b/snap")), kernel_info);
    assert_eq!(subvol_info(&mnt), kernel_top);
    fails(
        &["property", "set", &p(&mnt, "b/snap"), "ro", "false"],
        "a received snapshot",
    );
    // A raw BTRFS_IOC_SET_RECEIVED_SUBVOL (all zero): EROFS on the
    // read-only snapshot; EPERM for a user who does not own it.
    let set_received = |path: &Path, uid: Option<u32>| {
        let mut c = Command::new("setpriv");
        match uid {
            Some(u) => c.args([
                format!("--reuid={u}"),
                format!("--regid={u}"),
                "--clear-groups".into(),
            ]),
            None => c.arg("--"),
        };
        let out = c
            .arg("/usr/bin/python3")
            .arg("-c")
            .arg(
                "import errno, fcntl, os, sys\n\
                 b = bytearray(200)\n\
                 try:\n    fcntl.ioctl(os.open(sys.argv[1], os.O_RDONLY), 0xc0c89425, b)\n\
                 except OSError as e:\n    print(errno.errorcode[e.errno])\n\
                 else:\n    print('OK')",
            )
            .arg(path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(set_received(&mnt.join("b/snap"), None), "EROFS");
    assert_eq!(set_received(&mnt.join("b/snap"), Some(1000)), "EPERM");
    let e = std::fs::write(mnt.join("b/snap/new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    ok(&["property", "set", "-f", &p(&mnt, "b/snap"), "ro", "false"]);
    std::fs::write(mnt.join("b/snap/new"), b"writable\n").unwrap();
    // Asked again: nothing is left to refuse.
    ok(&["property", "set", &p(&mnt, "b/snap"), "ro", "true"]);
    ok(&["property", "set", &p(&mnt, "b/snap"), "ro", "false"]);
    m.unmount().unwrap();
    check_image(&img);
    assert_eq!(received_items(&img), 0);

    // The kernel sees both as never received, and writable.
    let k = Mount::new(&[&img], &t.join("kmnt"), "").unwrap();
    for dir in ["a", "b"] {
        let shown = run(Command::new("btrfs")
            .args(["subvolume", "show"])
            .arg(k.path().join(dir).join("snap")));
        let field = |name: &str| {
            shown
                .lines()
                .find(|l| l.trim_start().starts_with(name))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
                .unwrap_or_else(|| panic!("no {name} in:\n{shown}"))
        };
        assert_eq!(field("Received UUID"), "-", "{dir}:\n{shown}");
        assert_eq!(field("Send transid"), "0", "{dir}:\n{shown}");
        assert_eq!(field("Flags"), "-", "{dir}:\n{shown}");
        assert_eq!(
            std::fs::read(k.path().join(dir).join("snap/file")).unwrap(),
            b"sent\n"
        );
    }
    assert_eq!(
        std::fs::read(k.path().join("b/snap/new")).unwrap(),
        b"writable\n"
    );
    k.unmount().unwrap();
}

/// Through a descriptor opened before its deletion, a deleted
/// subvolume's root has no names and takes none, as the kernel marks it
/// dead: the same steps print the same on kernel btrfs.
#[test]
fn a_deleted_subvolumes_root_is_dead_to_descriptors_opened_before() {
    use common::steps::{Step, Who, against_kernel};
    const SCRIPT: &str = r#"$BTRFS subvolume create sub >/dev/null && touch sub/a sub/b && mkdir sub/d &&
python3 - "$BTRFS" <<'PYEOF'
import errno, os, subprocess, sys
root = os.open("sub", os.O_RDONLY | os.O_DIRECTORY)
os.stat("a", dir_fd=root)
print(sorted(os.listdir(root)))
subprocess.run([sys.argv[1], "subvolume", "delete", "sub"], check=True, capture_output=True)
def attempt(what, f):
    try:
        print(what, f())
    except OSError as e:
        print(what, errno.errorcode[e.errno])
attempt("list", lambda: sorted(os.listdir(root)))
attempt("list by path", lambda: sorted(os.listdir(f"/proc/self/fd/{root}")))
attempt("size", lambda: os.stat(root).st_size)
attempt("stat a", lambda: os.stat("a", dir_fd=root).st_size)
attempt("create a", lambda: os.open("a", os.O_CREAT | os.O_WRONLY, dir_fd=root) > 0)
attempt("create new", lambda: os.open("new", os.O_CREAT | os.O_WRONLY, dir_fd=root) > 0)
attempt("mkdir new", lambda: os.mkdir("newdir", dir_fd=root))
attempt("exists", lambda: os.path.exists("sub"))
PYEOF"#;
    require_privileged!();
    let t = TestDir::new("subvol-dead-root").unwrap();
    let steps = [Step {
        who: Who::Root,
        ok: true,
        script: SCRIPT,
        err: "",
    }];
    let c = against_kernel(&t, &steps, "", &["-o", "commit=300"]);
    assert!(
        c.printed[0].contains("list []") && c.printed[0].contains("create new ENOENT"),
        "{}",
        c.printed[0]
    );
    check_image(&c.ubtrfs_img);
}

/// The mount's root shows inode 256 to `stat` and in its own listing
/// (`.`), as a kernel mount's does, of the top-level subvolume and with
/// `subvol=`: the same steps print the same on kernel btrfs.
#[test]
fn the_mount_root_is_inode_256_as_on_the_kernel() {
    use common::steps::{Step, Who, against_kernel, run_step};
    // stat's number, then the number `.` is listed with (getdents64).
    const SHOW: &str = r#"stat -c %i . && python3 - <<'PYEOF'
import ctypes, os, struct
fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
buf = ctypes.create_string_buffer(1 << 16)
n = ctypes.CDLL(None, use_errno=True).syscall(217, fd, buf, len(buf))
assert n > 0, ctypes.get_errno()
at = 0
while at < n:
    ino, _, reclen = struct.unpack_from("<QqH", buf.raw, at)
    name = buf.raw[at + 19:at + reclen].split(b"\0")[0]
    if name == b".":
        print(". listed as", ino)
    at += reclen
PYEOF"#;
    require_privileged!();
    let t = TestDir::new("mount-root-ino").unwrap();
    // A directory's handle opened with the kernel's caches dropped: the
    // kernel looks up its `..`, which names the root; stat still says 256.
    // (A subvolume made in the root first: the mount has the kernel drop
    // the root's attributes then, and the kernel takes the next it is
    // given.)
    const BY_HANDLE: &str = r#"mkdir -p d && $BTRFS subvolume create sv >/dev/null && python3 - <<'PYEOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("data", ctypes.c_ubyte * 128)]
h, mount_id = Handle(), ctypes.c_int()
h.bytes = 128
assert libc.name_to_handle_at(-100, b"d", ctypes.byref(h), ctypes.byref(mount_id), 0) == 0
root = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
open("/proc/sys/vm/drop_caches", "w").write("2")
fd = libc.open_by_handle_at(root, ctypes.byref(h), os.O_RDONLY)
assert fd >= 0, os.strerror(ctypes.get_errno())
PYEOF
stat -c 'after a handle: %i' ."#;
    let script =
        format!("set -e\n{SHOW}\n{BY_HANDLE}\n$BTRFS subvolume create s >/dev/null\ntouch s/f");
    let steps = [Step {
        who: Who::Root,
        ok: true,
        script: Box::leak(script.into_boxed_str()),
        err: "",
    }];
    let c = against_kernel(&t, &steps, "", &[]);
    assert!(
        c.printed[0].contains("256\n. listed as 256"),
        "{}",
        c.printed[0]
    );

    // Mounted with subvol=s, its root shows 256 on both.
    // A snapshot of that root, through a descriptor of it, is of `s`.
    let script = format!("set -e\n{SHOW}\n$BTRFS subvolume snapshot . snap >/dev/null\nls snap");
    let kernel = Mount::single(&c.kernel_img, &t.join("kernel-s"), "subvol=s").unwrap();
    let (ok, expected, err) = run_step(kernel.path(), Who::Root, &script, "btrfs");
    assert!(ok, "{err}");
    kernel.unmount().unwrap();
    let m = start_mount(&c.ubtrfs_img, &t.join("fuse-s"), &["-o", "subvol=s"]);
    let (ok, printed, err) = run_step(m.path(), Who::Root, &script, common::ubtrfs_bin());
    assert!(ok, "{err}");
    assert!(m.path().join("f").exists());
    m.unmount().unwrap();
    assert_eq!(printed, expected);
    assert_eq!(printed, "256\n. listed as 256\nf\n");
    check_image(&c.ubtrfs_img);
}

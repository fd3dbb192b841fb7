//! `ubtrfs subvolume create|snapshot|delete` on a live ubtrfs mount,
//! through the btrfs ioctls the mount answers: the subvolumes appear and
//! go in the mount at once, a snapshot holds what was written just before
//! it (still in the kernel's cache until the command wrote it back), a
//! read-only one refuses writes, wrong requests fail with a message and
//! change nothing, another user gets the kernel's permission rules, and
//! afterwards `btrfs check` is clean and the kernel lists and reads the
//! same subvolumes.

mod common;

use common::{check_image, start_mount, ubtrfs};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};
use testkit::{Mount, TestDir, require_privileged};

fn show(out: &Output) -> String {
    format!(
        "status {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

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
    std::fs::write(mnt.join("vol/data"), vec![7u8; 300_000]).unwrap();

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
    // A subvolume with a file open in it stays.
    {
        let _open = std::fs::File::open(mnt.join("top/top.txt")).unwrap();
        fails(&["subvolume", "delete", &p(&mnt, "top")], "open");
    }

    // Another user: creates where it may write, snapshots only its own,
    // deletes nothing.
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
    let out = as_user(&["subvolume", "create", &p(&mnt, "user/mine")]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        std::fs::metadata(mnt.join("user/mine")).unwrap().uid(),
        1000
    );
    let out = as_user(&["subvolume", "create", &p(&mnt, "theirs")]);
    assert!(
        !out.status.success() && show(&out).contains("ermission denied"),
        "{}",
        show(&out)
    );
    let out = as_user(&[
        "subvolume",
        "snapshot",
        &p(&mnt, "user/mine"),
        &p(&mnt, "user/copy"),
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let out = as_user(&["subvolume", "snapshot", &p(&mnt, "vol"), &p(&mnt, "user/v")]);
    assert!(
        !out.status.success() && show(&out).contains("owner"),
        "{}",
        show(&out)
    );
    let out = as_user(&["subvolume", "delete", &p(&mnt, "user/copy")]);
    assert!(
        !out.status.success() && show(&out).contains("root"),
        "{}",
        show(&out)
    );

    // Deleted: gone from the mount at once, and durable.
    let out = ok(&["subvolume", "delete", &p(&mnt, "ro")]);
    assert!(out.contains("Delete subvolume"), "{out}");
    assert!(!mnt.join("ro").exists());
    ok(&["subvolume", "delete", &p(&mnt, "user/copy")]);
    m.unmount().unwrap();
    check_image(&img);

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
    assert_eq!(paths, ["snaps/vol", "top", "user/mine", "vol"], "{all}");
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

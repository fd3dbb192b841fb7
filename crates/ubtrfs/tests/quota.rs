//! Writing a filesystem whose quotas (qgroups) the kernel enabled.
//!
//! ubtrfs does not count qgroups. The kernel enables quotas, makes a
//! subvolume, a level-1 qgroup holding the subvolume's, and counts them
//! (a rescan). The library then writes files, makes a subvolume and a
//! snapshot, deletes a subvolume and commits: the counts are stale, so the
//! quota tree must say so (as the kernel marks them when it cannot count)
//! or `btrfs check` finds them wrong. It must be clean; the new subvolumes
//! must have their qgroups; the kernel rescans, and then check, which now
//! compares every count, is clean again.
//!
//! Simple quotas (`squota`, counted through owner references ubtrfs does
//! not write) are refused for writing, by name, and still read.

use std::path::Path;
use std::process::Command;

use testkit::xorshift_bytes as bytes;
use testkit::{KernelImageOptions, Mount, TestDir, kernel_image};
use ubtrfs::Error;
use ubtrfs::format::Key;
use ubtrfs::format::consts::{QGROUP_INFO_KEY, QGROUP_LIMIT_KEY, QUOTA_TREE_OBJECTID};
use ubtrfs::fs::{Filesystem, InodeId, NewInode};
use ubtrfs::transaction::quota::{
    QGROUP_STATUS_FLAG_INCONSISTENT, QGROUP_STATUS_FLAG_ON, QGROUP_STATUS_FLAG_RESCAN,
};

fn run(cmd: &mut Command) -> String {
    testkit::run(cmd).unwrap_or_else(|e| panic!("{e:#}"))
}

fn check(img: &Path, when: &str) -> String {
    match testkit::btrfs_check_file(img, &[]) {
        Ok(()) => run(Command::new("btrfs").args(["check", "--readonly"]).arg(img)),
        Err(e) => panic!("{when}: {e:#}"),
    }
}

const TOP: InodeId = InodeId {
    subvol: 5,
    ino: 256,
};

fn file(fs: &Filesystem, dir: InodeId, name: &[u8], data: &[u8]) {
    let new = NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    let id = fs.create(dir, name, new).unwrap().id;
    fs.write(id, 0, data).unwrap();
}

/// Whether level-0 qgroup `subvol` has its info and limit items.
fn has_qgroup(fs: &Filesystem, subvol: u64) -> bool {
    let quota = fs.tree_by_id(QUOTA_TREE_OBJECTID).unwrap();
    [QGROUP_INFO_KEY, QGROUP_LIMIT_KEY]
        .iter()
        .all(|&k| quota.get(&Key::new(0, k, subvol)).unwrap().is_some())
}

/// `btrfs qgroup show --raw`: (qgroup, referenced, exclusive) rows.
fn qgroups(m: &Path) -> Vec<(String, u64, u64)> {
    run(Command::new("btrfs")
        .args(["qgroup", "show", "--raw"])
        .arg(m))
    .lines()
    .filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        Some((
            f.first()?.to_string(),
            f.get(1)?.parse().ok()?,
            f.get(2)?.parse().ok()?,
        ))
    })
    .collect()
}

#[test]
fn qgroups_are_marked_stale_and_a_rescan_mends_them() {
    testkit::require_privileged!();
    let t = TestDir::new("quota").unwrap();
    let image = kernel_image(&t.join("img"), &KernelImageOptions::default(), |m| {
        run(Command::new("btrfs").args(["quota", "enable"]).arg(m));
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.join("sv")));
        std::fs::write(m.join("sv/old"), bytes(1, 300_000))?;
        run(Command::new("btrfs")
            .args(["qgroup", "create", "1/100"])
            .arg(m));
        // Assigning asks for a rescan (exit status 0 or 1 by version).
        let _ = Command::new("btrfs")
            .args(["qgroup", "assign", "0/256", "1/100"])
            .arg(m)
            .output();
        run(Command::new("btrfs").args(["quota", "rescan", "-w"]).arg(m));
        Ok(())
    })
    .unwrap();
    let img = image.path().to_path_buf();
    let out = check(&img, "the kernel's image");
    assert!(
        !out.contains("are different"),
        "the kernel left stale counts:\n{out}"
    );

    let (new_id, snap_id, gone_id);
    {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let st = fs.qgroup_status().unwrap().expect("quotas are enabled");
        assert_eq!(st.flags & QGROUP_STATUS_FLAG_INCONSISTENT, 0, "{st:?}");
        let sv = fs.lookup(TOP, b"sv").unwrap().id;
        file(&fs, TOP, b"top", &bytes(2, 2_000_000));
        file(&fs, sv, b"more", &bytes(3, 500_000));
        new_id = fs.create_subvolume(TOP, b"new", 0, 0).unwrap().subvol;
        file(
            &fs,
            InodeId {
                subvol: new_id,
                ino: 256,
            },
            b"in-new",
            &bytes(4, 100_000),
        );
        snap_id = fs
            .create_snapshot(sv.subvol, TOP, b"snap", false)
            .unwrap()
            .subvol;
        file(
            &fs,
            InodeId {
                subvol: snap_id,
                ino: 256,
            },
            b"in-snap",
            &bytes(5, 200_000),
        );
        gone_id = fs.create_subvolume(TOP, b"gone", 0, 0).unwrap().subvol;
        fs.delete_subvolume(TOP, b"gone", false).unwrap();
        fs.commit().unwrap();
        let st = fs.qgroup_status().unwrap().unwrap();
        assert_eq!(
            st.flags
                & (QGROUP_STATUS_FLAG_ON
                    | QGROUP_STATUS_FLAG_INCONSISTENT
                    | QGROUP_STATUS_FLAG_RESCAN),
            QGROUP_STATUS_FLAG_ON | QGROUP_STATUS_FLAG_INCONSISTENT,
            "{st:?}"
        );
        assert!(has_qgroup(&fs, new_id), "no qgroup for the new subvolume");
        assert!(has_qgroup(&fs, snap_id), "no qgroup for the snapshot");
    }
    // Reopened: the status is as committed (generation of the last commit).
    {
        let fs = Filesystem::open(&[&img]).unwrap();
        let st = fs.qgroup_status().unwrap().unwrap();
        assert_eq!(st.generation, fs.superblock().generation, "{st:?}");
        assert_ne!(st.flags & QGROUP_STATUS_FLAG_INCONSISTENT, 0, "{st:?}");
    }
    check(&img, "after the library's writes");

    // The kernel counts again, and its counts are checked.
    let mnt = t.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    {
        let m = Mount::new(&[&img], &mnt, "").unwrap();
        run(Command::new("btrfs")
            .args(["quota", "rescan", "-w"])
            .arg(m.path()));
        let rows = qgroups(m.path());
        let row = |q: &str| {
            rows.iter()
                .find(|r| r.0 == q)
                .unwrap_or_else(|| panic!("no qgroup {q} in {rows:?}"))
                .clone()
        };
        assert!(row("0/5").1 >= 2_000_000, "{rows:?}");
        assert!(row(&format!("0/{new_id}")).1 >= 100_000, "{rows:?}");
        // The snapshot refers to sv's files and its own.
        assert!(row(&format!("0/{snap_id}")).1 >= 1_000_000, "{rows:?}");
        assert!(row("1/100").1 >= 800_000, "{rows:?}");
        assert!(
            rows.iter()
                .all(|r| r.0 != format!("0/{gone_id}") || r.1 == 0),
            "{rows:?}"
        );
        std::fs::write(m.path().join("snap/kernel"), bytes(6, 10_000)).unwrap();
        m.unmount().unwrap();
    }
    let out = check(&img, "after the kernel's rescan");
    assert!(!out.contains("are different"), "{out}");
    let fs = Filesystem::open(&[&img]).unwrap();
    let st = fs.qgroup_status().unwrap().unwrap();
    assert_eq!(st.flags & QGROUP_STATUS_FLAG_INCONSISTENT, 0, "{st:?}");
}

/// `BTRFS_IOC_QUOTA_CTL` with `BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA`
/// (btrfs-progs of this distribution cannot enable simple quotas).
fn enable_simple_quota(m: &Path) {
    let dir = std::fs::File::open(m).unwrap();
    let mut args = [0u8; 16];
    args[..8].copy_from_slice(&4u64.to_le_bytes());
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&dir),
            0xC010_9428u64 as _,
            args.as_mut_ptr(),
        )
    };
    assert_eq!(
        rc,
        0,
        "enable simple quotas: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn simple_quotas_are_read_not_written() {
    testkit::require_privileged!();
    let t = TestDir::new("squota").unwrap();
    let image = kernel_image(&t.join("img"), &KernelImageOptions::default(), |m| {
        enable_simple_quota(m);
        std::fs::write(m.join("f"), bytes(7, 50_000))?;
        Ok(())
    })
    .unwrap();
    let img = image.path();
    let e = Filesystem::open_read_write(&[img]).err().expect("written");
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("simple quotas"), "{e}");
    let fs = Filesystem::open(&[img]).unwrap();
    let f = fs.lookup(TOP, b"f").unwrap().id;
    assert_eq!(fs.read(f, 0, 100_000).unwrap(), bytes(7, 50_000));
}

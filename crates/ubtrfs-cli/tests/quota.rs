//! `ubtrfs quota rescan` against the kernel's: a filesystem with quotas
//! (compressed and reflinked data, a subvolume, a snapshot, a level-1
//! qgroup), written by the kernel and then by ubtrfs (which marks the
//! counts inconsistent), is rescanned by each on its own copy (by ubtrfs
//! through its mount, and of the images); the kernel's `btrfs qgroup
//! show` then prints the same counts for both, and the counts are
//! consistent again.

mod common;

use common::{show, ubtrfs};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::fuse_mount::UbtrfsMount;
use testkit::{Mount, TestDir, require_privileged};

fn btrfs(args: &[&str], at: &Path) -> Output {
    let out = Command::new("btrfs").args(args).arg(at).output().unwrap();
    assert!(out.status.success(), "btrfs {args:?}: {}", show(&out));
    out
}

/// `btrfs qgroup show --raw` of the kernel's mount of `img`.
fn kernel_counts(img: &Path, mnt: &Path) -> (String, String) {
    let m = Mount::new(&[img], mnt, "ro").unwrap();
    let out = btrfs(&["qgroup", "show", "--raw"], m.path());
    m.unmount().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_rescan_counts_as_the_kernels_does() {
    require_privileged!();
    let t = TestDir::new("quota-rescan").unwrap();
    let img = common::new_image(&t, "q.img", 512 << 20);
    let kmnt = t.join("kernel");
    {
        let m = Mount::new(&[&img], &kmnt, "compress=zstd").unwrap();
        let p = m.path();
        btrfs(&["quota", "enable"], p);
        std::fs::create_dir(p.join("d")).unwrap();
        for i in 0..300u64 {
            std::fs::write(
                p.join(format!("d/f{i}")),
                testkit::xorshift_bytes(i, (i * 97) as usize),
            )
            .unwrap();
        }
        std::fs::write(p.join("zeros"), vec![0u8; 3_000_000]).unwrap();
        std::fs::write(p.join("big"), testkit::xorshift_bytes(1, 5_000_000)).unwrap();
        btrfs(&["subvolume", "create"], &p.join("sv"));
        std::fs::write(p.join("sv/x"), testkit::xorshift_bytes(2, 2_000_000)).unwrap();
        testkit::run(
            Command::new("cp")
                .arg("--reflink=always")
                .arg(p.join("big"))
                .arg(p.join("sv/clone")),
        )
        .unwrap();
        testkit::run(
            Command::new("btrfs")
                .args(["subvolume", "snapshot"])
                .arg(p)
                .arg(p.join("snap")),
        )
        .unwrap();
        std::fs::remove_file(p.join("big")).unwrap();
        testkit::run(
            Command::new("btrfs")
                .args(["qgroup", "create", "1/100"])
                .arg(p),
        )
        .unwrap();
        for member in ["0/5", "0/256"] {
            // Assigning asks for a rescan (status 1 here), not an error.
            Command::new("btrfs")
                .args(["qgroup", "assign", member, "1/100"])
                .arg(p)
                .output()
                .unwrap();
        }
        btrfs(&["quota", "rescan", "-w"], p);
        m.unmount().unwrap();
    }
    // ubtrfs writes, then rescans through its mount (noatime: nothing
    // after the rescan changes the trees).
    let mnt = t.join("fuse");
    {
        let m = UbtrfsMount::start(
            Path::new(common::ubtrfs_bin()),
            &[&img],
            &mnt,
            &["-o", "noatime"],
        )
        .unwrap();
        let p = m.path();
        std::fs::write(p.join("more"), testkit::xorshift_bytes(3, 1_500_000)).unwrap();
        std::fs::write(p.join("sv/more"), testkit::xorshift_bytes(4, 700_000)).unwrap();
        std::fs::remove_file(p.join("snap/zeros")).unwrap();
        let out = ubtrfs(["quota".as_ref(), "rescan".as_ref(), p.as_os_str()]);
        assert!(out.status.success(), "{}", show(&out));
        m.unmount().unwrap();
    }
    let (counted, warned) = kernel_counts(&img, &kmnt);
    assert!(!warned.contains("inconsistent"), "{warned}");
    assert_eq!(
        counted,
        kernel_rescan(&img, &kmnt),
        "rescanned through a mount"
    );

    // ubtrfs writes again: the counts are marked inconsistent.
    {
        let m = UbtrfsMount::start(Path::new(common::ubtrfs_bin()), &[&img], &mnt, &[]).unwrap();
        let p = m.path();
        for i in 0..100 {
            std::fs::remove_file(p.join(format!("d/f{i}"))).unwrap();
        }
        let out = ubtrfs([
            "subvolume".as_ref(),
            "snapshot".as_ref(),
            p.join("sv").as_os_str(),
            p.join("sv2").as_os_str(),
        ]);
        assert!(out.status.success(), "{}", show(&out));
        m.unmount().unwrap();
    }
    let (_, warned) = kernel_counts(&img, &kmnt);
    assert!(warned.contains("inconsistent"), "{warned}");
    let expected = kernel_rescan(&img, &kmnt);

    let out = ubtrfs(["quota".as_ref(), "rescan".as_ref(), img.as_os_str()]);
    assert!(out.status.success(), "{}", show(&out));
    let (counted, warned) = kernel_counts(&img, &kmnt);
    assert_eq!(counted, expected, "the kernel's rescan and ubtrfs'");
    assert!(!warned.contains("inconsistent"), "{warned}");
    // What ubtrfs printed is what the kernel shows.
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    for line in expected.lines().skip(2) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert!(
            printed
                .lines()
                .any(|l| l.split_whitespace().take(3).eq(w.iter().take(3).copied())),
            "{line} not in:\n{printed}"
        );
    }
    // Consistent, and btrfs check (which compares consistent counts
    // with its own) finds nothing.
    let check = btrfs(&["check", "--readonly"], &img);
    assert!(!show(&check).contains("are different"), "{}", show(&check));

    // A subvolume ubtrfs deletes takes its qgroup (and its relations)
    // with it, as one the kernel deletes does.
    let ids = |shown: &str| -> Vec<String> {
        shown
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let copy: PathBuf = img.with_extension("deleted");
    std::fs::copy(&img, &copy).unwrap();
    {
        // commit=1: the cleaner drops it in a second, not thirty.
        let m = Mount::new(&[&copy], &kmnt, "commit=1").unwrap();
        btrfs(&["subvolume", "delete"], &m.path().join("sv2"));
        btrfs(&["subvolume", "sync"], m.path());
        m.unmount().unwrap();
    }
    let (kernel_deleted, _) = kernel_counts(&copy, &kmnt);
    let out = ubtrfs([
        "subvolume".as_ref(),
        "delete".as_ref(),
        img.as_os_str(),
        "/sv2".as_ref(),
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let (deleted, _) = kernel_counts(&img, &kmnt);
    assert_eq!(
        ids(&deleted),
        ids(&kernel_deleted),
        "{deleted}\n{kernel_deleted}"
    );
    assert!(ids(&deleted).len() < ids(&counted).len(), "{deleted}");
    btrfs(&["check", "--readonly"], &img);
}

/// What the kernel shows after its own rescan of a copy of `img`.
fn kernel_rescan(img: &Path, mnt: &Path) -> String {
    let copy: PathBuf = img.with_extension("kernel");
    std::fs::copy(img, &copy).unwrap();
    {
        let m = Mount::new(&[&copy], mnt, "").unwrap();
        btrfs(&["quota", "rescan", "-w"], m.path());
        m.unmount().unwrap();
    }
    let (shown, _) = kernel_counts(&copy, mnt);
    std::fs::remove_file(&copy).unwrap();
    shown
}

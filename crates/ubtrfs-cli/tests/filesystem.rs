//! `ubtrfs filesystem df` and `usage` print what `btrfs filesystem df` and
//! `usage` print on the kernel's mount of the same filesystem, GlobalReserve
//! included (the kernel sizes it when it mounts): of an image, unmounted,
//! and of a ubtrfs mount after it wrote, in bytes (`-b`) and in
//! btrfs-progs' units. `ubtrfs filesystem resize` leaves the superblock
//! and device item as the kernel's resize does.

mod common;

use common::ubtrfs;
use std::path::{Path, PathBuf};
use std::process::Command;
use testkit::fuse_mount::UbtrfsMount;
use testkit::{Mount, TestDir, require_privileged};

/// `btrfs filesystem df` of the kernel's mount, fresh.
fn kernel_df(devices: &[PathBuf], mnt: &Path, options: &str, raw: bool) -> String {
    kernel_filesystem("df", devices, mnt, options, raw).0
}

/// `btrfs filesystem COMMAND [-b]` of the kernel's fresh mount of
/// `devices`, which must succeed, and the mount's loop devices.
fn kernel_filesystem(
    command: &str,
    devices: &[PathBuf],
    mnt: &Path,
    options: &str,
    raw: bool,
) -> (String, Vec<String>) {
    let m = Mount::new(devices, mnt, options).unwrap();
    let mut cmd = Command::new("btrfs");
    cmd.args(["filesystem", command]);
    if raw {
        cmd.arg("-b");
    }
    let out = cmd.arg(m.path()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let loops = m
        .devices()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    m.unmount().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), loops)
}

fn ubtrfs_df(args: &[&Path], raw: bool) -> String {
    ubtrfs_filesystem("df", args, raw)
}

/// `ubtrfs filesystem COMMAND [-b] ARGS...`, which must succeed.
fn ubtrfs_filesystem(command: &str, args: &[&Path], raw: bool) -> String {
    let mut all: Vec<&std::ffi::OsStr> = vec!["filesystem".as_ref(), command.as_ref()];
    if raw {
        all.push("-b".as_ref());
    }
    all.extend(args.iter().map(|p| p.as_os_str()));
    let out = ubtrfs(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn filesystem_df_shows_what_the_kernel_shows() {
    require_privileged!();
    let t = TestDir::new("filesystem-df").unwrap();
    let devices: Vec<PathBuf> = (0..2)
        .map(|i| common::new_image(&t, &format!("d{i}.img"), 400 << 20))
        .collect();
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-d", "raid1", "-m", "raid1"])
        .args(&devices)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kmnt = t.join("kernel");
    {
        let m = Mount::new(&devices, &kmnt, "").unwrap();
        std::fs::write(m.path().join("big"), vec![7u8; 3 << 20]).unwrap();
        for i in 0..300 {
            std::fs::write(m.path().join(format!("f{i}")), format!("{i}")).unwrap();
        }
        m.unmount().unwrap();
    }
    let paths: Vec<&Path> = devices.iter().map(|d| d.as_path()).collect();
    for raw in [true, false] {
        let expected = kernel_df(&devices, &kmnt, "ro", raw);
        assert!(expected.contains("Data, RAID1: total="), "{expected}");
        assert_eq!(ubtrfs_df(&paths, raw), expected, "of the image");
    }

    // Written by a ubtrfs mount, asked through it once committed.
    let mnt = t.join("fuse");
    let m = mount(&devices, &mnt);
    std::fs::write(m.path().join("more"), vec![9u8; 40 << 20]).unwrap();
    for i in 0..2000 {
        std::fs::write(m.path().join(format!("g{i}")), vec![1u8; 3000]).unwrap();
    }
    let out = ubtrfs(["sync".as_ref(), m.path().as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let through_mount = [ubtrfs_df(&[m.path()], true), ubtrfs_df(&[m.path()], false)];
    m.unmount().unwrap();
    assert_eq!(through_mount[0], kernel_df(&devices, &kmnt, "ro", true));
    assert_eq!(through_mount[1], kernel_df(&devices, &kmnt, "ro", false));
    common::check_image(&devices[0]);
}

/// The GlobalReserve line where the trees it is sized from outgrow its
/// floor (4 KiB nodes, 16,000 files with data extents), after the kernel
/// wrote them and after a ubtrfs mount wrote as many again: ubtrfs keeps
/// the trees' sizes in their root items as the kernel does.
#[test]
fn global_reserve_follows_the_trees() {
    require_privileged!();
    let t = TestDir::new("filesystem-df-reserve").unwrap();
    let img = t.join("disk.img");
    testkit::mkfs_file(&img, 1 << 30, &["-n", "4096"]).unwrap();
    let kmnt = t.join("kernel");
    let write = |dir: &Path, prefix: &str| {
        for i in 0..16_000 {
            std::fs::write(dir.join(format!("{prefix}{i}")), [7u8; 5000]).unwrap();
        }
    };
    {
        let m = Mount::new(std::slice::from_ref(&img), &kmnt, "").unwrap();
        write(m.path(), "k");
        m.unmount().unwrap();
    }
    let reserve = |df: &str| -> u64 {
        let line = df
            .lines()
            .find(|l| l.starts_with("GlobalReserve, single: total="))
            .unwrap_or_else(|| panic!("no GlobalReserve line:\n{df}"));
        line["GlobalReserve, single: total=".len()..]
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let expected = kernel_df(std::slice::from_ref(&img), &kmnt, "ro", true);
    // The floor with 4 KiB nodes and the free-space tree: 352 nodes.
    assert!(reserve(&expected) > 352 * 4096, "{expected}");
    assert_eq!(ubtrfs_df(&[&img], true), expected, "of the image");

    let mnt = t.join("fuse");
    let m = mount(std::slice::from_ref(&img), &mnt);
    write(m.path(), "u");
    let out = ubtrfs(["sync".as_ref(), m.path().as_os_str()]);
    assert!(out.status.success());
    let through_mount = ubtrfs_df(&[m.path()], true);
    m.unmount().unwrap();
    let expected_after = kernel_df(std::slice::from_ref(&img), &kmnt, "ro", true);
    assert!(
        reserve(&expected_after) > reserve(&expected),
        "{expected_after}"
    );
    // The image as the mount left it is the kernel's to the byte. Through
    // the mount, before the unmount's commit (which may still take the
    // file times the kernel writes back late, a leaf or two), only the
    // data and the reserve's size within a few nodes.
    assert_eq!(ubtrfs_df(&[&img], true), expected_after, "after the mount");
    let data = |df: &str| df.lines().next().unwrap_or_default().to_string();
    assert_eq!(
        data(&through_mount),
        data(&expected_after),
        "through the mount"
    );
    assert!(
        reserve(&through_mount).abs_diff(reserve(&expected_after)) <= 8 * 4096,
        "through the mount:\n{through_mount}\nafter:\n{expected_after}"
    );
    common::check_image(&img);
}

/// `btrfs filesystem usage` of the kernel's read-write mount of `images`
/// (a read-only mount leaves the data chunks' free space out of statfs),
/// its loop devices named as the images.
fn kernel_usage(images: &[PathBuf], mnt: &Path, raw: bool) -> String {
    let (mut text, loops) = kernel_filesystem("usage", images, mnt, "", raw);
    // Longest names first: /dev/loop1 is a prefix of /dev/loop10.
    let mut pairs: Vec<(String, String)> = loops
        .into_iter()
        .zip(images.iter().map(|i| i.display().to_string()))
        .collect();
    pairs.sort_by_key(|(l, _)| std::cmp::Reverse(l.len()));
    for (l, i) in pairs {
        text = text.replace(&format!("   {l}\t"), &format!("   {i}\t"));
    }
    text
}

fn ubtrfs_usage(args: &[&Path], raw: bool) -> String {
    ubtrfs_filesystem("usage", args, raw)
}

/// `ubtrfs filesystem usage` prints what `btrfs filesystem usage` prints
/// on the kernel's mount: one device with DUP metadata; RAID1 over devices
/// of 1 and 3 GiB, one of them grown after mkfs (slack); of the images and
/// through a ubtrfs mount that wrote.
#[test]
fn filesystem_usage_shows_what_the_kernel_shows() {
    require_privileged!();
    let t = TestDir::new("filesystem-usage").unwrap();
    let one = vec![t.join("one.img")];
    testkit::mkfs_file(&one[0], 1 << 30, &["-n", "4096"]).unwrap();
    let two = vec![t.join("r0.img"), t.join("r1.img")];
    for (p, size) in two.iter().zip([1u64 << 30, 3 << 30]) {
        std::fs::File::create(p).unwrap().set_len(size).unwrap();
    }
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-d", "raid1", "-m", "raid1"])
        .args(&two)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&two[1])
        .unwrap()
        .set_len((3 << 30) + (512 << 20))
        .unwrap();
    let kmnt = t.join("kernel");
    for images in [&one, &two] {
        {
            let m = Mount::new(images, &kmnt, "").unwrap();
            std::fs::write(m.path().join("big"), vec![7u8; 30 << 20]).unwrap();
            for i in 0..2000 {
                std::fs::write(m.path().join(format!("f{i}")), [1u8; 5000]).unwrap();
            }
            m.unmount().unwrap();
        }
        let paths: Vec<&Path> = images.iter().map(|d| d.as_path()).collect();
        for raw in [true, false] {
            let ours = ubtrfs_usage(&paths, raw);
            let expected = kernel_usage(images, &kmnt, raw);
            assert!(expected.contains("Unallocated:"), "{expected}");
            assert_eq!(ours, expected, "of {paths:?}");
        }

        let mnt = t.join("fuse");
        let m = mount(images, &mnt);
        std::fs::write(m.path().join("more"), vec![9u8; 40 << 20]).unwrap();
        for i in 0..2000 {
            std::fs::write(m.path().join(format!("g{i}")), [2u8; 5000]).unwrap();
        }
        let out = ubtrfs(["sync".as_ref(), m.path().as_os_str()]);
        assert!(out.status.success());
        let through_mount = ubtrfs_usage(&[m.path()], true);
        m.unmount().unwrap();
        assert_eq!(
            through_mount,
            kernel_usage(images, &kmnt, true),
            "through the mount of {paths:?}"
        );
    }
    common::check_image(&one[0]);
}

/// `total_bytes`, `dev_item.total_bytes` and `bytes_used` of the
/// superblock of `img`, as `btrfs inspect-internal dump-super` shows them.
fn super_sizes(img: &Path) -> String {
    let out = Command::new("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(img)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.starts_with("total_bytes")
                || l.starts_with("dev_item.total_bytes")
                || l.starts_with("bytes_used")
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// An image made larger, then `resize max`, by ubtrfs and by the kernel
/// (on a copy): the same superblock sizes; then a shrink by ubtrfs back
/// above its chunks, and refusals that change nothing.
#[test]
fn resize_grows_and_shrinks_as_the_kernel_does() {
    require_privileged!();
    let t = TestDir::new("filesystem-resize").unwrap();
    let ours = t.join("ours.img");
    testkit::mkfs_file(&ours, 300 << 20, &[]).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ours)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let theirs = t.join("theirs.img");
    std::fs::copy(&ours, &theirs).unwrap();
    let out = ubtrfs([
        "filesystem".as_ref(),
        "resize".as_ref(),
        "max".as_ref(),
        ours.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from 300.00MiB to 1.00GiB"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    {
        let m = Mount::new(std::slice::from_ref(&theirs), &t.join("kernel"), "").unwrap();
        let out = Command::new("btrfs")
            .args(["filesystem", "resize", "max"])
            .arg(m.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        m.unmount().unwrap();
    }
    let grown = super_sizes(&ours);
    assert!(grown.contains("total_bytes\t\t1073741824"), "{grown}");
    assert_eq!(grown, super_sizes(&theirs));
    common::check_image(&ours);

    // Refused, and nothing changes: past the device's end, below the
    // smallest size, a device that is not there, nonsense.
    for (size, says) in [
        ("+1g", "holds"),
        ("100m", "smallest"),
        ("2:max", "no device 2"),
        ("1:+x", "not [DEVID:]"),
    ] {
        let out = ubtrfs([
            "filesystem".as_ref(),
            "resize".as_ref(),
            size.as_ref(),
            ours.as_os_str(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{size}: {err}");
    }
    assert_eq!(super_sizes(&ours), grown);

    // Back to 512 MiB: its chunks all lie below (mkfs made them first).
    let out = ubtrfs([
        "filesystem".as_ref(),
        "resize".as_ref(),
        "-512m".as_ref(),
        ours.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(super_sizes(&ours).contains("total_bytes\t\t536870912"));
    common::check_image(&ours);
}

/// A ubtrfs mount grows into an image made larger while it runs, and
/// fills the new space; a shrink that would move chunks is refused.
#[test]
fn resize_through_a_mount() {
    require_privileged!();
    let t = TestDir::new("filesystem-resize-mount").unwrap();
    let img = t.join("disk.img");
    testkit::mkfs_file(&img, 256 << 20, &[]).unwrap();
    let mnt = t.join("fuse");
    let m = mount(std::slice::from_ref(&img), &mnt);
    let size = |p: &Path| {
        let out = Command::new("stat")
            .args(["-f", "-c", "%S %b"])
            .arg(p)
            .output()
            .unwrap();
        let v: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        v[0] * v[1]
    };
    assert_eq!(size(m.path()), 256 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(768 << 20)
        .unwrap();
    let resize = |what: &str| {
        ubtrfs([
            "filesystem".as_ref(),
            "resize".as_ref(),
            what.as_ref(),
            m.path().as_os_str(),
        ])
    };
    let out = resize("max");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(size(m.path()), 768 << 20);
    // 400 MiB: more than the filesystem held before.
    let data: Vec<u8> = (0..400u32 << 20).map(|i| (i >> 12) as u8).collect();
    std::fs::write(m.path().join("big"), &data).unwrap();
    let out = ubtrfs(["sync".as_ref(), m.path().as_os_str()]);
    assert!(out.status.success());
    let out = resize("300m");
    assert!(!out.status.success(), "a shrink past the chunks");
    // The mount answers the ioctl: a device that is not there is ENODEV,
    // as from the kernel.
    let out = resize("2:max");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("No such device"),
        "{err}"
    );
    m.unmount().unwrap();
    assert!(super_sizes(&img).contains("total_bytes\t\t805306368"));
    common::check_image(&img);
    let k = Mount::single(&img, &t.join("kernel"), "ro").unwrap();
    assert!(std::fs::read(k.path().join("big")).unwrap() == data);
    k.unmount().unwrap();
}

/// `ubtrfs filesystem usage` of a filesystem the kernel sprouted from a
/// seed (given with its seed) prints what `btrfs filesystem usage` prints
/// on the kernel's mount of it: the seed's chunks count as allocated, the
/// seed itself is not listed, and statfs leaves the seed's block groups
/// out of the free space.
#[test]
fn filesystem_usage_of_a_sprout_shows_what_the_kernel_shows() {
    require_privileged!();
    let t = TestDir::new("filesystem-usage-sprout").unwrap();
    let (seed, sprout) = (t.join("seed.img"), t.join("sprout.img"));
    testkit::mkfs_file(&seed, 512 << 20, &[]).unwrap();
    std::fs::File::create(&sprout)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let kmnt = t.join("kernel");
    {
        let m = Mount::new(std::slice::from_ref(&seed), &kmnt, "").unwrap();
        std::fs::write(m.path().join("f"), vec![5u8; 300_000]).unwrap();
        m.unmount().unwrap();
    }
    testkit::sprout_from(&[&seed], &sprout, &kmnt, |_| {}).unwrap();
    let images = [sprout.clone(), seed.clone()];
    let expected = kernel_usage(&images, &kmnt, true);
    assert_eq!(ubtrfs_usage(&[&sprout, &seed], true), expected);
}

/// `ubtrfs filesystem label`: shown and set on an image and through a
/// mount; btrfs-progs and the kernel's mount see what ubtrfs set, and the
/// image stays consistent (a commit that writes only the superblocks
/// still writes the root tree's root block it names).
#[test]
fn filesystem_label_is_shown_and_set_as_the_kernel_sees_it() {
    require_privileged!();
    let t = TestDir::new("filesystem-label").unwrap();
    let img = t.join("disk.img");
    testkit::mkfs_file(&img, 512 << 20, &["-L", "first"]).unwrap();
    let label = |arg: &Path| {
        let out = ubtrfs(["filesystem".as_ref(), "label".as_ref(), arg.as_os_str()]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    };
    let progs = |img: &Path| {
        testkit::run(Command::new("btrfs").args(["filesystem", "label"]).arg(img))
            .unwrap()
            .trim_end()
            .to_string()
    };
    assert_eq!(label(&img), "first");
    let out = ubtrfs([
        "filesystem".as_ref(),
        "label".as_ref(),
        "--set".as_ref(),
        "second one".as_ref(),
        img.as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(label(&img), "second one");
    assert_eq!(progs(&img), "second one");
    common::check_image(&img);
    // Too long: refused by name, nothing changed.
    let long = "x".repeat(256);
    let out = ubtrfs([
        "filesystem".as_ref(),
        "label".as_ref(),
        "-s".as_ref(),
        long.as_ref(),
        img.as_os_str(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 255 bytes"));
    assert_eq!(progs(&img), "second one");

    let mnt = t.join("fuse");
    let m = mount(std::slice::from_ref(&img), &mnt);
    assert_eq!(label(m.path()), "second one");
    let out = ubtrfs([
        "filesystem".as_ref(),
        "label".as_ref(),
        "-s".as_ref(),
        "third".as_ref(),
        m.path().as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(label(m.path()), "third");
    // Any bytes but NUL, as the kernel takes them, shown as they are.
    {
        use std::os::unix::ffi::OsStrExt;
        let raw = std::ffi::OsStr::from_bytes(b"caf\xe9");
        let out = ubtrfs([
            "filesystem".as_ref(),
            "label".as_ref(),
            "-s".as_ref(),
            raw,
            m.path().as_os_str(),
        ]);
        assert!(out.status.success(), "{out:?}");
        let out = ubtrfs([
            "filesystem".as_ref(),
            "label".as_ref(),
            m.path().as_os_str(),
        ]);
        assert_eq!(out.stdout, b"caf\xe9\n");
        let out = ubtrfs([
            "filesystem".as_ref(),
            "label".as_ref(),
            "-s".as_ref(),
            "third".as_ref(),
            m.path().as_os_str(),
        ]);
        assert!(out.status.success(), "{out:?}");
    }
    m.unmount().unwrap();
    assert_eq!(progs(&img), "third");
    common::check_image(&img);
    let kmnt = t.join("kernel");
    let k = Mount::new(std::slice::from_ref(&img), &kmnt, "ro").unwrap();
    assert_eq!(
        testkit::run(
            Command::new("btrfs")
                .args(["filesystem", "label"])
                .arg(k.path())
        )
        .unwrap()
        .trim_end(),
        "third"
    );
    k.unmount().unwrap();
}

/// A read-write ubtrfs mount of `images` at `mnt`.
fn mount(images: &[PathBuf], mnt: &Path) -> UbtrfsMount {
    UbtrfsMount::start(Path::new(common::ubtrfs_bin()), images, mnt, &[]).unwrap()
}

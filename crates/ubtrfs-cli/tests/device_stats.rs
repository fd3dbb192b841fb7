//! `ubtrfs device stats`: the per-device error counters, against the
//! kernel's. The same damaged copies scrubbed by the kernel and by ubtrfs
//! count the same against the same devices; each reads the counters the
//! other kept in the device tree; a ubtrfs mount counts a bad copy it
//! reads past and writes the good copy over it, as the kernel's read
//! does; `-c` and `-z` behave as btrfs-progs' do.

mod common;

use common::copies::{contents, damage, make, targets};
use common::{show, ubtrfs};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::fuse_mount::UbtrfsMount;
use testkit::{Mount, TestDir, require_privileged};
use ubtrfs::fs::Filesystem;

type Counters = BTreeMap<u64, Vec<u64>>;

/// The counters of a `device stats -T` table, by devid.
fn parse_table(out: &Output) -> Counters {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("Id Path"), "{}", show(out));
    text.lines()
        .skip(2)
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 7, "{l}");
            let values = w[2..].iter().map(|v| v.parse().unwrap()).collect();
            (w[0].parse().unwrap(), values)
        })
        .collect()
}

/// `ubtrfs device stats -T` of `args` (images or a mount).
fn ubtrfs_stats<P: AsRef<Path>>(args: &[P]) -> Counters {
    let mut all = vec!["device".into(), "stats".into(), "-T".into()];
    all.extend(args.iter().map(|p| p.as_ref().as_os_str().to_owned()));
    let out = ubtrfs(&all);
    assert!(out.status.success(), "{}", show(&out));
    parse_table(&out)
}

/// `btrfs device stats -T` of a kernel mount.
fn kernel_stats(m: &Mount) -> Counters {
    let out = Command::new("btrfs")
        .args(["device", "stats", "-T"])
        .arg(m.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    parse_table(&out)
}

/// The kernel's scrub (`btrfs scrub start -B ARGS`) of `devices` mounted
/// with `options`: the counters it leaves, and what it said.
fn kernel_scrub(
    devices: &[PathBuf],
    mnt: &Path,
    options: &str,
    args: &[&str],
) -> (Counters, String) {
    let m = Mount::new(devices, mnt, options).unwrap();
    let out = Command::new("btrfs")
        .args(["scrub", "start", "-B"])
        .args(args)
        .arg(m.path())
        .output()
        .unwrap();
    let counted = kernel_stats(&m);
    m.unmount().unwrap();
    (counted, show(&out))
}

/// `ubtrfs scrub` of `devices`, which must succeed.
fn ubtrfs_scrub(devices: &[PathBuf]) {
    let out = ubtrfs(
        ["scrub".as_ref(), "--quiet".as_ref()]
            .into_iter()
            .chain(devices.iter().map(|d| d.as_os_str())),
    );
    assert!(out.status.success(), "{}", show(&out));
}

fn copy_images(devices: &[PathBuf], suffix: &str) -> Vec<PathBuf> {
    devices
        .iter()
        .map(|d| {
            let to = d.with_extension(suffix);
            std::fs::copy(d, &to).unwrap();
            to
        })
        .collect()
}

/// The devid of the device copy `mirror` of `logical` lies on.
fn devid_of(devices: &[PathBuf], logical: u64, mirror: usize) -> u64 {
    let fs = Filesystem::open(devices).unwrap();
    let piece = fs
        .tree_reader()
        .volume()
        .chunks
        .lookup(logical)
        .unwrap()
        .map(logical, 1, mirror)
        .unwrap();
    piece.devid
}

#[test]
fn scrubs_count_bad_copies_against_their_devices_as_the_kernel_does() {
    require_privileged!();
    let t = TestDir::new("device-stats-scrub").unwrap();
    let devices = make(&t, "raid1", 2);
    let zeros: Counters = [(1, vec![0; 5]), (2, vec![0; 5])].into();
    // The kernel wrote zeroed items at its first mount; ubtrfs reads them.
    assert_eq!(ubtrfs_stats(&devices), zeros);

    // Two data sectors and a leaf, one copy of each damaged, on both devices.
    let (data, leaf, _) = targets(&devices);
    {
        let fs = Filesystem::open(&devices).unwrap();
        damage(&fs, &devices, data + 3 * 4096, 0);
        damage(&fs, &devices, data + 200 * 4096, 1);
        damage(&fs, &devices, leaf, 1);
    }
    let kernel_copy = copy_images(&devices, "kernel");

    // The kernel's scrub of one copy of the images.
    let kmnt = t.join("kernel");
    let (expected, said) = kernel_scrub(&kernel_copy, &kmnt, "", &[]);
    assert!(said.contains("corrected"), "{said}");
    // The test means something only if the kernel counted on both devices.
    assert!(
        expected.values().all(|v| v[3] > 0),
        "the kernel's scrub counted {expected:?}"
    );
    // What the kernel kept, ubtrfs reads.
    assert_eq!(ubtrfs_stats(&kernel_copy), expected, "kernel-kept counters");

    // ubtrfs' scrub of the other copy counts the same.
    ubtrfs_scrub(&devices);
    assert_eq!(ubtrfs_stats(&devices), expected, "after ubtrfs scrub");

    // What ubtrfs kept, the kernel reads; the images stay consistent.
    {
        let m = Mount::new(&devices, &kmnt, "").unwrap();
        assert_eq!(kernel_stats(&m), expected, "ubtrfs-kept counters");
        m.unmount().unwrap();
    }
    let check = Command::new("btrfs")
        .args(["check", "--readonly"])
        .arg(&devices[0])
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", show(&check));

    // -c: status 64 while a counter is not zero; -z shows them and resets.
    let stats = |extra: &[&str]| {
        let mut all: Vec<&std::ffi::OsStr> = vec!["device".as_ref(), "stats".as_ref()];
        all.extend(extra.iter().map(std::ffi::OsStr::new));
        all.extend(devices.iter().map(|d| d.as_os_str()));
        ubtrfs(all)
    };
    let checked = stats(&["-c"]);
    assert_eq!(checked.status.code(), Some(64), "{}", show(&checked));
    let reset = stats(&["-z"]);
    assert!(reset.status.success(), "{}", show(&reset));
    let dev0 = devices[0].display().to_string();
    assert!(
        String::from_utf8_lossy(&reset.stdout)
            .contains(&format!("[{dev0}].corruption_errs  {}\n", expected[&1][3])),
        "{}",
        show(&reset)
    );
    let checked = stats(&["-c"]);
    assert_eq!(checked.status.code(), Some(0), "{}", show(&checked));
    let m = Mount::new(&devices, &kmnt, "").unwrap();
    assert_eq!(kernel_stats(&m), zeros, "after ubtrfs device stats -z");
    assert!(
        std::fs::read(m.path().join("f")).unwrap() == contents(),
        "the kernel reads other bytes"
    );
    m.unmount().unwrap();
}

/// A mount counts a bad data copy it reads past once (a read-only one
/// too, reading it again), a writable one writes the good copy over it;
/// a reset through the mount resets the device asked for alone.
#[test]
fn a_mount_counts_the_bad_copies_it_reads_past() {
    require_privileged!();
    let t = TestDir::new("device-stats-mount").unwrap();
    let devices = make(&t, "raid1", 2);
    let (data, leaf, _) = targets(&devices);
    // Copy 0 is read first: a read finds only the first sector bad.
    let (first, second) = (data + 5 * 4096, data + 6 * 4096);
    {
        let fs = Filesystem::open(&devices).unwrap();
        damage(&fs, &devices, first, 0);
        damage(&fs, &devices, second, 1);
        // A leaf too (not counted, as the kernel's reads do not count
        // tree blocks; mended by a writable mount's commit).
        damage(&fs, &devices, leaf, 0);
    }
    let list = |m: &Path| {
        let out = Command::new("ls").arg("-lR").arg(m).output().unwrap();
        assert!(out.status.success(), "{}", show(&out));
    };
    let (a, b) = (devid_of(&devices, first, 0), devid_of(&devices, second, 1));
    assert_ne!(a, b);
    let counts = |na: u64, nb: u64| -> Counters {
        let mut c: Counters = [(1, vec![0; 5]), (2, vec![0; 5])].into();
        c.get_mut(&a).unwrap()[3] = na;
        c.get_mut(&b).unwrap()[3] = nb;
        c
    };

    // A read-only reader reads the good copy and writes nothing.
    let before: Vec<Vec<u8>> = devices.iter().map(|d| std::fs::read(d).unwrap()).collect();
    let mut cat: Vec<&std::ffi::OsStr> = vec!["cat".as_ref()];
    cat.extend(devices.iter().map(|d| d.as_os_str()));
    cat.push("/f".as_ref());
    let out = ubtrfs(&cat);
    assert!(out.status.success(), "{}", show(&out));
    assert!(out.stdout == contents(), "ubtrfs cat read other bytes");
    let unchanged = || {
        devices
            .iter()
            .zip(&before)
            .all(|(d, b)| std::fs::read(d).unwrap() == *b)
    };
    assert!(unchanged(), "a read-only read changed the images");

    // A read-only mount counts the bad copy once, however often read.
    let mnt = t.join("fuse");
    let mount = |args: &[&str]| {
        UbtrfsMount::start(Path::new(common::ubtrfs_bin()), &devices, &mnt, args).unwrap()
    };
    {
        let m = mount(&["--ro"]);
        list(m.path());
        for _ in 0..3 {
            assert!(std::fs::read(m.path().join("f")).unwrap() == contents());
            std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        }
        assert_eq!(ubtrfs_stats(&[m.path()]), counts(1, 0), "read-only mount");
        m.unmount().unwrap();
    }
    assert!(unchanged(), "a read-only mount changed the images");

    // A writable mount's read writes the good copy over the bad one; a
    // scrub through it finds (and counts) only the other.
    {
        // noatime: nothing the reads do rewrites the leaf in another place.
        let m = mount(&["-o", "noatime"]);
        list(m.path());
        assert!(
            std::fs::read(m.path().join("f")).unwrap() == contents(),
            "the mount read other bytes"
        );
        assert_eq!(ubtrfs_stats(&[m.path()]), counts(1, 0), "through the mount");
        let out = ubtrfs(["scrub".as_ref(), "-r".as_ref(), m.path().as_os_str()]);
        let said = show(&out);
        assert!(
            !out.status.success() && said.contains("errors: tree block 1, data checksum 1,"),
            "{said}"
        );
        assert_eq!(ubtrfs_stats(&[m.path()]), counts(1, 1), "after scrub -r");
        let out = ubtrfs([
            "device".as_ref(),
            "stats".as_ref(),
            "-c".as_ref(),
            m.path().as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(64), "{}", show(&out));
        m.unmount().unwrap();
    }
    // The copies the mount's reads mended are good (the first sector's
    // at once, the leaf's by its commit); only the one scrub -r found is
    // not.
    let mut scrub: Vec<&std::ffi::OsStr> = vec!["scrub".as_ref(), "-r".as_ref()];
    scrub.extend(devices.iter().map(|d| d.as_os_str()));
    let out = ubtrfs(&scrub);
    let said = show(&out);
    assert!(
        said.contains("errors: tree block 0, data checksum 1,"),
        "{said}"
    );
    // Kept by the mount's last commit: the kernel reads it.
    let kmnt = t.join("kernel");
    {
        let m = Mount::new(&devices, &kmnt, "").unwrap();
        assert_eq!(kernel_stats(&m), counts(1, 1), "the kernel after the mount");
        m.unmount().unwrap();
    }
    // Reset through the mount (root), device by device, each showing what
    // it had; kept by the mount's commit.
    {
        let m = mount(&[]);
        let out = ubtrfs([
            "device".as_ref(),
            "stats".as_ref(),
            "-z".as_ref(),
            m.path().as_os_str(),
        ]);
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{}", show(&out));
        assert_eq!(
            said.matches("].corruption_errs  1\n").count(),
            2,
            "-z shows what each device had:\n{said}"
        );
        assert_eq!(ubtrfs_stats(&[m.path()]), counts(0, 0), "after -z");
        m.unmount().unwrap();
    }
    let m = Mount::new(&devices, &kmnt, "").unwrap();
    assert_eq!(kernel_stats(&m), counts(0, 0), "the kernel after the reset");
    m.unmount().unwrap();
}

/// A device that missed writes (the other mounted degraded meanwhile)
/// holds stale tree blocks and old data: the kernel's scrub and ubtrfs'
/// count them alike against it.
#[test]
fn stale_copies_of_a_device_that_missed_writes_count_as_the_kernel_counts() {
    require_privileged!();
    let t = TestDir::new("device-stats-stale").unwrap();
    let devices = make(&t, "raid1", 2);
    let kmnt = t.join("kernel");
    {
        let m = Mount::new(&devices[..1], &kmnt, "degraded").unwrap();
        std::fs::write(
            m.path().join("while-degraded"),
            testkit::xorshift_bytes(9, 3 << 20),
        )
        .unwrap();
        for i in 0..100 {
            std::fs::write(m.path().join(format!("d-{i}")), format!("{i}")).unwrap();
        }
        m.unmount().unwrap();
    }
    let kernel_copy = copy_images(&devices, "kernel");
    // Read-only, so that no read the mount makes mends a stale block
    // before the scrub counts it (-r: nor does the scrub).
    let (expected, said) = kernel_scrub(&kernel_copy, &kmnt, "ro", &["-r"]);
    assert!(
        expected.values().any(|v| v.iter().any(|&n| n > 0)),
        "the kernel's scrub counted nothing:\n{said}"
    );
    ubtrfs_scrub(&devices);
    assert_eq!(ubtrfs_stats(&devices), expected, "after ubtrfs scrub");
}

//! `ubtrfs scrub` on images the kernel wrote, with copies damaged on
//! purpose: `-r` finds exactly the damaged copies and changes nothing; a
//! scrub mends each from a good copy, after which `btrfs check` is clean,
//! the kernel's own scrub finds no error and the kernel reads the same
//! bytes. A sector with no good copy is named and fails the command; a
//! filesystem a kernel mount uses is refused.

mod common;

use common::copies::{contents, damage, make, targets};
use common::{show, ubtrfs};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::{Mount, TestDir, require_privileged};
use ubtrfs::fs::Filesystem;

/// `btrfs check` of the filesystem on all of `devices`.
fn btrfs_check(devices: &[PathBuf]) {
    let image = testkit::corpus::Image {
        devices: devices.to_vec(),
        source: None,
        mkfs: testkit::MkfsOptions::default(),
        mount_options: String::new(),
        builder: testkit::corpus::Builder::Kernel,
    };
    testkit::corpus::btrfs_check(&image).unwrap_or_else(|e| panic!("{e:#}"));
}

/// The scrub succeeded and found nothing wrong.
fn assert_clean(out: &Output) {
    let said = show(out);
    assert!(
        out.status.success() && said.contains("no errors found"),
        "{said}"
    );
}

fn scrub(args: &[&str], devices: &[PathBuf]) -> Output {
    let mut all: Vec<String> = vec!["scrub".into(), "--quiet".into()];
    all.extend(args.iter().map(|s| s.to_string()));
    all.extend(devices.iter().map(|d| d.display().to_string()));
    ubtrfs(&all)
}

fn digest(devices: &[PathBuf]) -> Vec<Vec<u8>> {
    devices.iter().map(|d| std::fs::read(d).unwrap()).collect()
}

fn kernel_scrub_is_clean(devices: &[PathBuf], mnt: &Path) {
    let m = Mount::new(devices, mnt, "").unwrap();
    assert!(
        std::fs::read(m.path().join("f")).unwrap() == contents(),
        "the kernel reads other bytes after the scrub"
    );
    let out = Command::new("btrfs")
        .args(["scrub", "start", "-B"])
        .arg(m.path())
        .output()
        .unwrap();
    let said = show(&out);
    assert!(
        out.status.success() && said.contains("no errors found"),
        "the kernel's scrub after ubtrfs scrub:\n{said}"
    );
    m.unmount().unwrap();
}

fn scrub_mends(profile: &str, ndev: usize, mirrored: bool) {
    require_privileged!();
    let t = TestDir::new(&format!("scrub-{profile}")).unwrap();
    let devices = make(&t, profile, ndev);
    assert_clean(&scrub(&["-r"], &devices));

    // Two leaves and two data sectors, each with one copy damaged.
    let (data, leaf_a, leaf_b) = targets(&devices);
    {
        let fs = Filesystem::open(&devices).unwrap();
        let second = if mirrored { 1 } else { 0 };
        damage(&fs, &devices, leaf_a, 0);
        damage(&fs, &devices, leaf_b, second);
        damage(&fs, &devices, data + 3 * 4096, second);
        damage(&fs, &devices, data + 200 * 4096, 0);
    }
    let before = digest(&devices);
    let found = scrub(&["-r"], &devices);
    let said = show(&found);
    assert!(!found.status.success(), "{said}");
    assert!(
        said.contains("errors: tree block 2, data checksum 2, read 0, superblock 0")
            && said.contains("corrected: 0, uncorrectable: 0")
            && said.contains("nothing was mended"),
        "{said}"
    );
    assert!(digest(&devices) == before, "scrub -r changed the devices");

    let mended = scrub(&[], &devices);
    let said = show(&mended);
    assert!(mended.status.success(), "{said}");
    assert!(said.contains("corrected: 4, uncorrectable: 0"), "{said}");
    assert_clean(&scrub(&["-r"], &devices));
    btrfs_check(&devices);
    kernel_scrub_is_clean(&devices, &t.join("kernel"));

    // No good copy left of one sector: named, and the command fails; the
    // sector is left as it is.
    if mirrored {
        let fs = Filesystem::open(&devices).unwrap();
        for mirror in 0..fs.tree_reader().volume().num_copies(data).unwrap() {
            damage(&fs, &devices, data + 9 * 4096, mirror);
        }
        drop(fs);
        let lost = scrub(&[], &devices);
        let said = show(&lost);
        assert!(!lost.status.success(), "{said}");
        assert!(
            said.contains(&format!("uncorrectable: data sector {}", data + 9 * 4096))
                && said.contains("corrected: 0, uncorrectable: 1")
                && said.contains("errors remain"),
            "{said}"
        );
    }
}

#[test]
fn scrub_mends_raid1_copies() {
    scrub_mends("raid1", 2, true);
}

#[test]
fn scrub_mends_dup_copies() {
    scrub_mends("dup", 1, true);
}

#[test]
fn scrub_mends_raid5_from_parity() {
    scrub_mends("raid5", 3, false);
}

/// RAID5 and RAID6 parity that is not its data's, in two rows holding the
/// file's data (P of one, and P or Q of the next): `-r` finds exactly
/// those two rows and changes nothing; a scrub rewrites their parity from
/// the data, byte for byte what the kernel had written there, after which
/// the kernel's scrub finds nothing.
#[test]
fn scrub_mends_raid56_parity() {
    require_privileged!();
    for (profile, ndev) in [("raid5", 3usize), ("raid6", 4)] {
        let t = TestDir::new(&format!("scrub-parity-{profile}")).unwrap();
        let devices = make(&t, profile, ndev);
        assert_clean(&scrub(&["-r"], &devices));
        let (data, _, _) = targets(&devices);
        let mut damaged = Vec::new();
        {
            let fs = Filesystem::open(&devices).unwrap();
            let volume = fs.tree_reader().volume();
            let c = volume.chunks.lookup(data).unwrap();
            let n = c.item.stripes.len() as u64;
            let ndata = n - c.profile.parity_stripes();
            let sl = c.item.stripe_len;
            let row = (data - c.logical) / (ndata * sl);
            // P of the row, then the last parity stripe (Q in RAID6) of
            // the next: the file's 1 MiB spans both.
            for (r, idx) in [(row, ndata), (row + 1, n - 1)] {
                let s = &c.item.stripes[((idx + r) % n) as usize];
                let path = volume.devices.get(s.devid).unwrap().path().to_path_buf();
                let at = s.offset + r * sl;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap();
                let mut was = vec![0u8; sl as usize];
                f.read_exact_at(&mut was, at).unwrap();
                let mut bad = was.clone();
                bad[100] ^= 0xff;
                bad[5000] ^= 0x0f;
                f.write_all_at(&bad, at).unwrap();
                damaged.push((path, at, was));
            }
        }
        let before = digest(&devices);
        let found = scrub(&["-r"], &devices);
        let said = show(&found);
        assert!(!found.status.success(), "{profile}: {said}");
        assert!(
            said.contains("errors: tree block 0, data checksum 0, read 0, superblock 0, parity 2")
                && said.contains("corrected: 0, uncorrectable: 0"),
            "{profile}: {said}"
        );
        assert!(
            digest(&devices) == before,
            "{profile}: scrub -r changed the devices"
        );

        let mended = scrub(&[], &devices);
        let said = show(&mended);
        assert!(mended.status.success(), "{profile}: {said}");
        assert!(
            said.contains("corrected: 2, uncorrectable: 0"),
            "{profile}: {said}"
        );
        for (path, at, was) in &damaged {
            let mut now = vec![0u8; was.len()];
            std::fs::File::open(path)
                .unwrap()
                .read_exact_at(&mut now, *at)
                .unwrap();
            assert!(
                now == *was,
                "{profile}: parity at {at} of {} is not the kernel's",
                path.display()
            );
        }
        assert_clean(&scrub(&["-r"], &devices));
        btrfs_check(&devices);
        kernel_scrub_is_clean(&devices, &t.join("kernel"));
    }
}

/// Parity is only ever read back where some data stripe of its row is in
/// use: elsewhere the kernel leaves it stale (devices that held other
/// bytes before, no discard at mkfs), and that is no error.
#[test]
fn stale_parity_where_no_data_is_is_not_an_error() {
    require_privileged!();
    let t = TestDir::new("scrub-stale-parity").unwrap();
    let devices: Vec<PathBuf> = (0..3u64)
        .map(|i| {
            let p = t.join(format!("old-{i}.img"));
            std::fs::write(&p, testkit::xorshift_bytes(100 + i, 160 << 20)).unwrap();
            p
        })
        .collect();
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-K", "-d", "raid5", "-m", "raid5"])
        .args(&devices)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs: {}", show(&out));
    let m = Mount::new(&devices, &t.join("kernel"), "nodiscard").unwrap();
    std::fs::write(m.path().join("one"), testkit::xorshift_bytes(3, 4096)).unwrap();
    std::fs::write(m.path().join("f"), contents()).unwrap();
    m.unmount().unwrap();
    assert_clean(&scrub(&["-r"], &devices));
    let before = digest(&devices);
    assert_clean(&scrub(&[], &devices));
    assert!(
        digest(&devices) == before,
        "a scrub of a good filesystem wrote"
    );
}

/// A RAID1 filesystem mounted degraded, one device missing, while files
/// were written: that device's copies of tree blocks, data and
/// superblocks are older than the others'. Scrub finds them (good
/// checksums, old generations), and mends them; then the kernel's scrub
/// finds nothing, and the kernel reads every file with either device.
#[test]
fn a_device_that_missed_writes_is_brought_up_to_date() {
    require_privileged!();
    let t = TestDir::new("scrub-degraded").unwrap();
    let devices = make(&t, "raid1", 2);
    let written = testkit::xorshift_bytes(9, 3 << 20);
    {
        let m = Mount::new(&devices[..1], &t.join("kernel"), "degraded").unwrap();
        std::fs::write(m.path().join("while-degraded"), &written).unwrap();
        for i in 0..100 {
            std::fs::write(m.path().join(format!("d-{i}")), format!("{i}")).unwrap();
        }
        m.unmount().unwrap();
    }
    let found = scrub(&["-r"], &devices);
    let said = show(&found);
    assert!(!found.status.success(), "{said}");
    assert!(said.contains("superblock 2"), "{said}");
    assert!(!said.contains("errors: tree block 0,"), "{said}");
    let mended = scrub(&[], &devices);
    let said = show(&mended);
    assert!(
        mended.status.success() && said.contains("uncorrectable: 0"),
        "{said}"
    );
    assert_clean(&scrub(&["-r"], &devices));
    btrfs_check(&devices);
    kernel_scrub_is_clean(&devices, &t.join("kernel"));
    // Each device alone holds everything now.
    // (testkit's unmount has the kernel forget the devices it used.)
    for one in &devices {
        let m = Mount::new(std::slice::from_ref(one), &t.join("kernel"), "ro,degraded").unwrap();
        assert!(std::fs::read(m.path().join("while-degraded")).unwrap() == written);
        assert!(std::fs::read(m.path().join("f")).unwrap() == contents());
        m.unmount().unwrap();
    }
}

/// A filesystem a kernel mount uses (through a loop device on its image)
/// is neither scrubbed for repair nor mounted read-write by ubtrfs, by
/// any path to the image (a hard link, another loop device on it); an
/// unmounted image named
/// like a mount's source ("tmpfs") is not taken for it.
#[test]
fn a_filesystem_the_kernel_mounted_is_refused() {
    require_privileged!();
    let t = TestDir::new("scrub-kernel-mounted").unwrap();
    let devices = make(&t, "single", 1);
    let m = Mount::new(&devices, &t.join("kernel"), "").unwrap();
    let out = scrub(&[], &devices);
    assert!(
        !out.status.success() && show(&out).contains("is mounted"),
        "{}",
        show(&out)
    );
    let link = t.join("link.img");
    std::fs::hard_link(&devices[0], &link).unwrap();
    let out = scrub(&[], std::slice::from_ref(&link));
    assert!(
        !out.status.success() && show(&out).contains("is mounted"),
        "{}",
        show(&out)
    );
    // Another loop device on the same image, given as the device.
    let other = testkit::Loop::attach(&devices[0]).unwrap();
    let out = scrub(&[], &[other.device().to_path_buf()]);
    assert!(
        !out.status.success() && show(&out).contains("is mounted"),
        "{}",
        show(&out)
    );
    other.detach().unwrap();
    let mnt = t.join("fuse");
    std::fs::create_dir_all(&mnt).unwrap();
    // Under a timeout: a mount that was let in would serve until killed.
    let out = Command::new("timeout")
        .arg("30")
        .arg(common::ubtrfs_bin())
        .arg("mount")
        .arg(&devices[0])
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        !out.status.success() && show(&out).contains("is mounted"),
        "{}",
        show(&out)
    );
    m.unmount().unwrap();
    std::fs::rename(&link, t.join("tmpfs")).unwrap();
    let out = Command::new(common::ubtrfs_bin())
        .args(["scrub", "--quiet", "tmpfs"])
        .current_dir(t.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
}

/// A ubtrfs mount is scrubbed a step at a time, through its mount point,
/// while files are written to it: the damaged copies are found, then
/// mended; the new files and the mended image pass `btrfs check` and the
/// kernel's scrub.
#[test]
fn a_mount_is_scrubbed_between_its_other_work() {
    require_privileged!();
    let t = TestDir::new("scrub-mounted").unwrap();
    let devices = make(&t, "raid1", 2);
    let (data, leaf_a, _) = targets(&devices);
    {
        let fs = Filesystem::open(&devices).unwrap();
        damage(&fs, &devices, leaf_a, 1);
        damage(&fs, &devices, data + 17 * 4096, 0);
    }
    // The second superblock copy of the first device (at 64 MiB).
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&devices[0])
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, (64 << 20) + 100).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], (64 << 20) + 100).unwrap();
    }
    let mnt = t.join("fuse");
    let m = testkit::fuse_mount::UbtrfsMount::start(
        Path::new(common::ubtrfs_bin()),
        &devices,
        &mnt,
        &[],
    )
    .unwrap();
    let on_mount = |args: &[&str]| {
        let mut all = vec!["scrub", "--quiet"];
        all.extend(args);
        let p = m.path().to_str().unwrap().to_string();
        let mut v: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        v.push(p);
        ubtrfs(&v)
    };
    let found = on_mount(&["-r"]);
    let said = show(&found);
    assert!(
        !found.status.success()
            && said.contains("errors: tree block 1, data checksum 1, read 0, superblock 1"),
        "{said}"
    );
    // Files written while the scrub mends.
    let writer = {
        let dir = m.path().to_path_buf();
        std::thread::spawn(move || {
            for i in 0..300 {
                std::fs::write(dir.join(format!("during-{i}")), vec![i as u8; 5000]).unwrap();
            }
        })
    };
    let mended = on_mount(&[]);
    writer.join().unwrap();
    let said = show(&mended);
    assert!(
        mended.status.success() && said.contains("corrected: 3, uncorrectable: 0"),
        "{said}"
    );
    assert_clean(&on_mount(&["-r"]));
    m.unmount().unwrap();
    btrfs_check(&devices);
    kernel_scrub_is_clean(&devices, &t.join("kernel"));
}

/// A device larger than the filesystem on it (an image grown, not yet
/// resized): the superblock copy past the filesystem's end is none of its
/// own, and no error (as for the kernel's scrub).
#[test]
fn superblock_copies_past_the_filesystem_are_not_counted() {
    require_privileged!();
    let t = TestDir::new("scrub-grown").unwrap();
    let img = t.join("grown.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(300 << 30)
        .unwrap();
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-b", "200G"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let devices = vec![img];
    for args in [&["-r"][..], &[][..]] {
        assert_clean(&scrub(args, &devices));
    }
}

//! Seed devices (`btrfstune -S 1`) and the filesystems the kernel sprouts
//! from them (`btrfs device add` on a mounted seed): the sprout's devices
//! carry its own filesystem id, the seed's keep theirs (so do the tree
//! blocks written before the sprout), and the sprout's chunk tree names
//! both. ubtrfs never writes a seed; it reads and writes a sprout given
//! with its seeds as the kernel does: the seed's block groups take no new
//! extents, new chunks and superblocks go to the sprout's own devices.

use std::process::Command;

use testkit::{Loop, Mount, TestDir};
use ubtrfs::fs::Filesystem;

#[test]
fn a_filesystem_sprouted_from_a_seed_is_read_and_written_and_the_seed_never() {
    testkit::require_privileged!();
    let t = TestDir::new("seed-sprout").unwrap();
    let (seed, sprout) = (t.join("seed.img"), t.join("sprout.img"));
    for img in [&seed, &sprout] {
        std::fs::File::create(img)
            .unwrap()
            .set_len(600 << 20)
            .unwrap();
    }
    testkit::run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&seed)).unwrap();
    let mnt = t.join("mnt");
    let mut big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    {
        let m = Mount::new(&[&seed], &mnt, "").unwrap();
        std::fs::write(m.path().join("f"), b"seeded").unwrap();
        std::fs::write(m.path().join("big"), &big).unwrap();
        // No-COW and preallocated: written in place on a plain filesystem.
        for (name, make) in [("nocow", "chattr +C nocow"), ("pre", "fallocate -l 1M pre")] {
            testkit::run(
                Command::new("sh")
                    .args(["-c", &format!("touch {name} && {make}")])
                    .current_dir(m.path()),
            )
            .unwrap();
        }
        std::fs::write(m.path().join("nocow"), vec![3u8; 1 << 20]).unwrap();
        m.unmount().unwrap();
    }
    testkit::sprout_from(&[&seed], &sprout, &mnt, |m| {
        std::fs::write(m.join("g"), b"sprouted").unwrap();
    })
    .unwrap();
    let seed_before = std::fs::read(&seed).unwrap();
    // Read, the seed given first or last.
    for order in [[&seed, &sprout], [&sprout, &seed]] {
        let fs = Filesystem::open(&order).unwrap();
        assert_eq!(read(&fs, b"/f"), b"seeded");
        assert_eq!(read(&fs, b"/big"), big);
        assert_eq!(read(&fs, b"/g"), b"sprouted");
    }
    // Written: a new file, an overwrite of the seed's file, a deletion.
    {
        let fs = Filesystem::open_read_write(&[&sprout, &seed]).unwrap();
        let root = fs.root();
        let h = fs
            .create(root, b"h", ubtrfs::fs::NewInode::file(0o644))
            .unwrap()
            .id;
        fs.write(h, 0, &vec![9u8; 3 << 20]).unwrap();
        let b = fs.resolve_path(b"/big").unwrap();
        fs.write(b, 4096, &[1u8; 8192]).unwrap();
        fs.unlink(root, b"f").unwrap();
        // Extents on the seed are copied on write, even these.
        for name in [&b"/nocow"[..], b"/pre"] {
            let id = fs.resolve_path(name).unwrap();
            fs.write(id, 8192, &[4u8; 16384]).unwrap();
        }
        fs.commit().unwrap();
    }
    big[4096..4096 + 8192].fill(1);
    let mut nocow = vec![3u8; 1 << 20];
    nocow[8192..8192 + 16384].fill(4);
    let mut pre = vec![0u8; 1 << 20];
    pre[8192..8192 + 16384].fill(4);
    assert!(
        std::fs::read(&seed).unwrap() == seed_before,
        "the seed changed"
    );
    // btrfs check of the pair, then the kernel reads what ubtrfs wrote.
    {
        let loops = [
            Loop::attach_read_only(&seed).unwrap(),
            Loop::attach_read_only(&sprout).unwrap(),
        ];
        let devs: Vec<_> = loops.iter().map(|l| l.device()).collect();
        testkit::run(Command::new("btrfs").args(["device", "scan"]).args(&devs)).unwrap();
        let out = testkit::output_of(
            Command::new("btrfs")
                .args(["check", "--readonly"])
                .arg(devs[1]),
        )
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let _ = Command::new("btrfs")
            .args(["device", "scan", "--forget"])
            .args(&devs)
            .status();
        assert!(
            out.status.success() && text.contains("no error found"),
            "btrfs check:\n{text}"
        );
    }
    {
        let m = Mount::new(&[&sprout, &seed], &mnt, "ro").unwrap();
        assert_eq!(
            std::fs::read(m.path().join("h")).unwrap(),
            vec![9u8; 3 << 20]
        );
        assert_eq!(std::fs::read(m.path().join("big")).unwrap(), big);
        assert!(std::fs::read(m.path().join("nocow")).unwrap() == nocow);
        assert!(std::fs::read(m.path().join("pre")).unwrap() == pre);
        assert_eq!(std::fs::read(m.path().join("g")).unwrap(), b"sprouted");
        assert!(!m.path().join("f").exists());
        m.unmount().unwrap();
    }
    // A seed this filesystem was not sprouted from is named as such.
    let other = t.join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    testkit::run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&other)).unwrap();
    testkit::run(Command::new("btrfstune").args(["-S", "1"]).arg(&other)).unwrap();
    let e = Filesystem::open(&[&sprout, &other])
        .err()
        .expect("opened with another seed");
    assert!(e.to_string().contains("was not sprouted from"), "{e}");
    // The sprout without its seed: the seed is named as one.
    let e = Filesystem::open(&[&sprout])
        .err()
        .expect("opened without its seed");
    assert!(e.to_string().contains("a seed device of filesystem"), "{e}");
    // The seed alone is its own filesystem, as it was.
    let fs = Filesystem::open(&[&seed]).unwrap();
    assert!(fs.resolve_path(b"/g").is_err());
    drop(fs);
    let e = Filesystem::open_read_write(&[&seed])
        .err()
        .expect("a seed opened for writing");
    assert!(e.to_string().contains("seed device"), "{e}");
    assert!(
        std::fs::read(&seed).unwrap() == seed_before,
        "the seed changed"
    );
}

/// The whole of the file at `path`.
fn read(fs: &Filesystem, path: &[u8]) -> Vec<u8> {
    fs.read_all(fs.resolve_path(path).unwrap()).unwrap()
}

/// A seed on two devices in RAID1, sprouted onto one: the sprout's own
/// device cannot hold RAID1, so new chunks are single there, as the
/// kernel reduces a profile to the writable devices (copying the seed's
/// RAID1 left ubtrfs no room at all).
#[test]
fn a_sprout_of_a_raid1_seed_grows_in_what_its_own_device_holds() {
    testkit::require_privileged!();
    let t = TestDir::new("seed-raid1").unwrap();
    let imgs: Vec<_> = ["s1.img", "s2.img", "sprout.img"]
        .iter()
        .map(|n| t.join(n))
        .collect();
    for img in &imgs {
        std::fs::File::create(img)
            .unwrap()
            .set_len(300 << 20)
            .unwrap();
    }
    let mnt = t.join("mnt");
    {
        let loops = [
            Loop::attach(&imgs[0]).unwrap(),
            Loop::attach(&imgs[1]).unwrap(),
        ];
        testkit::run(
            Command::new("mkfs.btrfs")
                .args(["-q", "-f", "-m", "raid1", "-d", "raid1"])
                .arg(loops[0].device())
                .arg(loops[1].device()),
        )
        .unwrap();
        let _ = Command::new("btrfs")
            .args(["device", "scan", "--forget"])
            .arg(loops[0].device())
            .arg(loops[1].device())
            .status();
    }
    {
        let m = Mount::new(&[&imgs[0], &imgs[1]], &mnt, "").unwrap();
        std::fs::write(m.path().join("s"), b"seeded").unwrap();
        m.unmount().unwrap();
    }
    testkit::sprout_from(&[&imgs[0], &imgs[1]], &imgs[2], &mnt, |_| {}).unwrap();
    let seeds_before = [
        std::fs::read(&imgs[0]).unwrap(),
        std::fs::read(&imgs[1]).unwrap(),
    ];
    let data: Vec<u8> = (0..(40u32 << 20)).map(|i| (i % 251) as u8).collect();
    {
        let fs = Filesystem::open_read_write(&imgs).unwrap();
        let root = fs.root();
        let f = fs
            .create(root, b"f", ubtrfs::fs::NewInode::file(0o644))
            .unwrap()
            .id;
        fs.write(f, 0, &data).unwrap();
        for i in 0..2000 {
            fs.create(
                root,
                format!("n{i}").as_bytes(),
                ubtrfs::fs::NewInode::file(0o644),
            )
            .unwrap();
        }
        fs.commit().unwrap();
    }
    assert!(
        std::fs::read(&imgs[0]).unwrap() == seeds_before[0]
            && std::fs::read(&imgs[1]).unwrap() == seeds_before[1],
        "a seed changed"
    );
    // The sprout's device first: the kernel mounts the filesystem of it.
    let m = Mount::new(&[&imgs[2], &imgs[0], &imgs[1]], &mnt, "ro").unwrap();
    assert!(std::fs::read(m.path().join("f")).unwrap() == data);
    assert_eq!(std::fs::read(m.path().join("s")).unwrap(), b"seeded");
    assert_eq!(std::fs::read_dir(m.path()).unwrap().count(), 2002);
    m.unmount().unwrap();
}

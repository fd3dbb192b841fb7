//! Seed devices (`btrfstune -S 1`) and the filesystems the kernel sprouts
//! from them (`btrfs device add` on a mounted seed): the sprout's devices
//! carry its own filesystem id, the seed's keep theirs, and the sprout's
//! chunk tree names both. ubtrfs writes neither (a seed is only read, as
//! the kernel only reads it) and does not read a sprout yet: it says so,
//! naming the seed.

use std::process::Command;

use testkit::{Loop, Mount, TestDir};
use ubtrfs::fs::Filesystem;

#[test]
fn a_filesystem_sprouted_from_a_seed_is_refused_by_name_and_the_seed_not_written() {
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
    {
        let m = Mount::new(&[&seed], &mnt, "").unwrap();
        std::fs::write(m.path().join("f"), b"seeded").unwrap();
        m.unmount().unwrap();
    }
    testkit::run(Command::new("btrfstune").args(["-S", "1"]).arg(&seed)).unwrap();
    {
        // The kernel mounts a seed read-only; a device added makes it a
        // new, writable filesystem.
        let m = Mount::new(&[&seed], &mnt, "").unwrap();
        let added = Loop::attach(&sprout).unwrap();
        testkit::run(
            Command::new("btrfs")
                .args(["device", "add", "-f"])
                .arg(added.device())
                .arg(m.path()),
        )
        .unwrap();
        testkit::run(
            Command::new("mount")
                .args(["-o", "remount,rw"])
                .arg(m.path()),
        )
        .unwrap();
        std::fs::write(m.path().join("g"), b"sprouted").unwrap();
        m.unmount().unwrap();
        let _ = Command::new("btrfs")
            .args(["device", "scan", "--forget"])
            .arg(added.device())
            .status();
    }
    let seed_before = std::fs::read(&seed).unwrap();
    // Reading a sprout is refused, naming the seed (its tree blocks carry
    // the seed's id, which the reader does not take yet).
    for order in [[&seed, &sprout], [&sprout, &seed]] {
        let e = Filesystem::open(&order).err().expect("a sprout opened");
        assert!(
            e.to_string().contains("is a seed device of filesystem"),
            "{e}"
        );
    }
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

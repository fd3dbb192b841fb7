//! Trim (what `fstrim` asks for): free space and unallocated device space
//! become holes in the image file, nothing in use does. The kernel writes
//! the filesystem; the library deletes a large file, commits, trims; the
//! image takes far less space, passes `btrfs check`, and the kernel reads
//! every kept file as written. Also on DUP data and on two RAID1 devices.

use std::os::unix::fs::MetadataExt;

use testkit::xorshift_bytes as bytes;
use testkit::{KernelImageOptions, MkfsOptions, Profile, TestDir, kernel_image};
use ubtrfs::fs::Filesystem;

/// Bytes the image files take on the host.
fn allocated(devices: &[std::path::PathBuf]) -> u64 {
    devices
        .iter()
        .map(|d| std::fs::metadata(d).unwrap().blocks() * 512)
        .sum()
}

fn trim(name: &str, mkfs: MkfsOptions) {
    let t = TestDir::new(name).unwrap();
    let opts = KernelImageOptions {
        mkfs,
        mount_options: String::new(),
    };
    let image = kernel_image(&t.join("img"), &opts, |m| {
        std::fs::write(m.join("big"), bytes(1, 60 << 20))?;
        for i in 0..20 {
            std::fs::write(m.join(format!("kept{i}")), bytes(100 + i, 50_000))?;
        }
        Ok(())
    })
    .unwrap();
    let copies: u64 = if matches!(opts.mkfs.data, Profile::Single) {
        1
    } else {
        2
    };
    let fs = Filesystem::open_read_write(&image.devices).unwrap();
    fs.unlink(fs.root(), b"big").unwrap();
    fs.commit().unwrap();
    // Space freed by the running transaction is not trimmed: the last
    // commit may still use it. So: delete, commit, then trim.
    let before = allocated(&image.devices);
    let done = fs.trim(0, u64::MAX, 0).unwrap();
    let after = allocated(&image.devices);
    assert!(
        done.bytes() >= 60 << 20,
        "{name}: trimmed {done:?}, expected the deleted file's 60 MiB at least"
    );
    assert!(
        before - after >= copies * (55 << 20),
        "{name}: the image took {before} bytes before the trim, {after} after"
    );
    // Writes after the trim land where they should.
    let new = ubtrfs::fs::NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    let id = fs.create(fs.root(), b"after", new).unwrap().id;
    fs.write(id, 0, &bytes(7, 5 << 20)).unwrap();
    fs.commit().unwrap();
    drop(fs);
    image.check().unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let m = image.mount(&t.join("mnt"), "ro").unwrap();
    for i in 0..20 {
        let got = std::fs::read(m.path().join(format!("kept{i}"))).unwrap();
        assert!(got == bytes(100 + i, 50_000), "{name}: kept{i} differs");
    }
    assert!(std::fs::read(m.path().join("after")).unwrap() == bytes(7, 5 << 20));
    assert!(!m.path().join("big").exists());
    m.unmount().unwrap();
}

#[test]
fn trim_punches_free_space_only() {
    testkit::require_privileged!();
    let one = |data| MkfsOptions {
        device_size: 1 << 30,
        data,
        ..MkfsOptions::default()
    };
    trim("trim-single", one(Profile::Single));
    trim("trim-dup", one(Profile::Dup));
    trim(
        "trim-raid1",
        MkfsOptions {
            device_size: 512 << 20,
            ..MkfsOptions::multi(Profile::Raid1)
        },
    );
}

/// A read-only filesystem is not trimmed.
#[test]
fn trim_of_a_read_only_filesystem_is_refused() {
    testkit::require_privileged!();
    let t = TestDir::new("trim-ro").unwrap();
    let opts = KernelImageOptions {
        mkfs: MkfsOptions::default(),
        mount_options: String::new(),
    };
    let image = kernel_image(&t.join("img"), &opts, |_| Ok(())).unwrap();
    let fs = Filesystem::open(&image.devices).unwrap();
    let e = fs.trim(0, u64::MAX, 0).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
}

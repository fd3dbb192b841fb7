//! SEEK_DATA / SEEK_HOLE over holes, written extents and dirty data.

use std::process::Command;
use ubtrfs::data::seek::Whence;
use ubtrfs::fs::{Filesystem, NewInode};

#[test]
fn data_and_holes() {
    for features in ["no-holes", "^no-holes"] {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("d.img");
        testkit::mkfs_file(&img, 300 << 20, &["-O", features]).unwrap();
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        let id = fs
            .create(
                fs.root(),
                b"sparse",
                NewInode {
                    mode: libc::S_IFREG | 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                },
            )
            .unwrap()
            .id;
        fs.write(id, 0, &[1; 8192]).unwrap();
        fs.write(id, 1 << 20, &[2; 4096]).unwrap();
        for committed in [false, true] {
            assert_eq!(
                fs.seek(id, 0, Whence::Data).unwrap(),
                0,
                "{features} committed={committed}"
            );
            assert_eq!(fs.seek(id, 0, Whence::Hole).unwrap(), 8192);
            assert_eq!(fs.seek(id, 9000, Whence::Data).unwrap(), 1 << 20);
            assert_eq!(fs.seek(id, 9000, Whence::Hole).unwrap(), 9000);
            assert_eq!(
                fs.seek(id, (1 << 20) + 10, Whence::Hole).unwrap(),
                (1 << 20) + 4096
            );
            assert_eq!(
                fs.seek(id, (1 << 20) + 4096, Whence::Data)
                    .unwrap_err()
                    .errno(),
                libc::ENXIO
            );
            fs.commit().unwrap();
        }
        let mut want = vec![1u8; 8192];
        want.resize(1 << 20, 0);
        want.extend_from_slice(&[2; 4096]);
        assert_eq!(fs.read_all(id).unwrap(), want);
        drop(fs);
        let out = testkit::output_of(
            Command::new("btrfs")
                .args(["check", "--readonly"])
                .arg(&img),
        )
        .unwrap();
        assert!(
            out.status.success(),
            "{features}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

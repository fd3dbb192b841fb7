//! No-COW files are overwritten in place; ordinary files move to new
//! extents. Both stay consistent for `btrfs check`.

use std::path::PathBuf;
use ubtrfs::format::consts::{EXTENT_DATA_KEY, INODE_NODATACOW, INODE_NODATASUM};
use ubtrfs::format::items::{ExtentBody, FileExtentItem};
use ubtrfs::fs::{Filesystem, InodeId, NewInode};

fn image(dir: &std::path::Path) -> PathBuf {
    let img = dir.join("d.img");
    testkit::mkfs_file(&img, 300 << 20, &[]).unwrap();
    img
}

/// (file offset, disk address) of every extent of `id`.
fn extents(fs: &Filesystem, id: InodeId) -> Vec<(u64, u64)> {
    fs.tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, EXTENT_DATA_KEY)
        .unwrap()
        .map(|it| {
            let it = it.unwrap();
            let fe = FileExtentItem::parse(it.data()).unwrap();
            match fe.body {
                ExtentBody::Regular {
                    disk_bytenr,
                    offset,
                    ..
                } => (it.key().offset, disk_bytenr + offset),
                ExtentBody::Inline(_) => (it.key().offset, 0),
            }
        })
        .collect()
}

#[test]
fn nocow_overwrites_in_place_and_cow_moves() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let new = NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    let nc = fs.create(fs.root(), b"nocow", new).unwrap().id;
    let flags = fs.set_flags(nc, INODE_NODATACOW).unwrap();
    assert_eq!(
        flags & (INODE_NODATACOW | INODE_NODATASUM),
        INODE_NODATACOW | INODE_NODATASUM
    );
    let cw = fs.create(fs.root(), b"cow", new).unwrap().id;
    let mut data = vec![0x11u8; 1 << 20];
    fs.write(nc, 0, &data).unwrap();
    fs.write(cw, 0, &data).unwrap();
    fs.commit().unwrap();
    let (nc_before, cw_before) = (extents(&fs, nc), extents(&fs, cw));
    // No-COW needs an empty file.
    assert!(fs.set_flags(cw, INODE_NODATACOW).is_err());
    fs.write(nc, 100_000, &[0x22; 50_000]).unwrap();
    fs.write(cw, 100_000, &[0x22; 50_000]).unwrap();
    fs.commit().unwrap();
    data[100_000..150_000].fill(0x22);
    assert_eq!(extents(&fs, nc), nc_before, "no-COW file kept its extent");
    assert_ne!(
        extents(&fs, cw),
        cw_before,
        "COW file moved the overwritten part"
    );
    assert_eq!(fs.read_all(nc).unwrap(), data);
    assert_eq!(fs.read_all(cw).unwrap(), data);
    drop(fs);
    testkit::btrfs_check_file(&img, &[]).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    assert_eq!(
        fs.read_all(fs.resolve_path(b"/nocow").unwrap()).unwrap(),
        data
    );
}

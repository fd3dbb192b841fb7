//! Space figures (`statfs`, what `df` shows) against the kernel's: the
//! kernel writes a filesystem (one device with DUP metadata, and two in
//! RAID1), reports its blocks, free and available blocks; the library,
//! opened read-write on the same image, must report the same three
//! figures, to the byte (free space less the global reserve the kernel
//! sizes at mount, `Filesystem::global_reserve`).

use std::process::Command;

use testkit::xorshift_bytes as bytes;
use testkit::{KernelImageOptions, MkfsOptions, Profile, TestDir, kernel_image};
use ubtrfs::fs::Filesystem;

/// The kernel's size, free and available bytes of the mount at `mnt`.
fn kernel_statfs(mnt: &std::path::Path) -> (u64, u64, u64) {
    let out = testkit::run(
        Command::new("stat")
            .args(["-f", "-c", "%S %b %f %a"])
            .arg(mnt),
    )
    .unwrap();
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0] * v[1], v[0] * v[2], v[0] * v[3])
}

fn compare(name: &str, mkfs: MkfsOptions) {
    let t = TestDir::new(name).unwrap();
    let opts = KernelImageOptions {
        mkfs,
        mount_options: String::new(),
    };
    let image = kernel_image(&t.join("img"), &opts, |m| {
        std::fs::write(m.join("big"), bytes(1, 100 << 20))?;
        for i in 0..200 {
            std::fs::write(m.join(format!("small{i}")), bytes(i, 3000))?;
        }
        Ok(())
    })
    .unwrap();
    let kernel = {
        let m = image.mount(&t.join("mnt"), "").unwrap();
        let figures = kernel_statfs(m.path());
        m.unmount().unwrap();
        figures
    };
    let fs = Filesystem::open_read_write(&image.devices).unwrap();
    let s = fs.statfs();
    let ours = (s.total_bytes, s.unused_bytes, s.free_bytes);
    assert_eq!(
        ours.0, kernel.0,
        "{name}: size (ours, kernel's: {ours:?} {kernel:?})"
    );
    assert!(
        ours.1 == kernel.1,
        "{name}: unused bytes (ours, kernel's: {ours:?} {kernel:?})"
    );
    assert!(
        ours.2 == kernel.2,
        "{name}: available bytes (ours, kernel's: {ours:?} {kernel:?})"
    );
    drop(fs);
    // Read-only, from the block group items: the same.
    let ro = Filesystem::open(&image.devices).unwrap().statfs();
    assert_eq!(ro.total_bytes, kernel.0, "{name}: read-only size");
    assert!(
        ro.unused_bytes == kernel.1,
        "{name}: read-only unused bytes {} (kernel's {})",
        ro.unused_bytes,
        kernel.1
    );
    // The data is counted as used: not every allocated chunk is.
    assert!(
        ours.0 - ours.1 < (100 << 20) + (18 << 20),
        "{name}: {ours:?}"
    );
}

#[test]
fn statfs_of_one_device_is_the_kernels() {
    testkit::require_privileged!();
    compare(
        "statfs-single",
        MkfsOptions {
            device_size: 1 << 30,
            ..MkfsOptions::default()
        },
    );
}

#[test]
fn statfs_of_raid1_is_the_kernels() {
    testkit::require_privileged!();
    compare(
        "statfs-raid1",
        MkfsOptions {
            device_size: 1 << 30,
            ..MkfsOptions::multi(Profile::Raid1)
        },
    );
}

/// New image files of `sizes` in `t`, made one RAID1 filesystem (data
/// and metadata) by mkfs.btrfs.
fn raid1_devices(t: &TestDir, sizes: &[u64]) -> Vec<std::path::PathBuf> {
    let devices: Vec<std::path::PathBuf> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let p = t.join(format!("disk{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(size).unwrap();
            p
        })
        .collect();
    testkit::run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-d", "raid1", "-m", "raid1"])
            .args(&devices),
    )
    .unwrap();
    devices
}

/// RAID1 over devices of unequal size: 1 GiB and 3 GiB (about 1 GiB of
/// data fits, as each byte needs both), and 1, 2 and 4 GiB (where the
/// kernel says less than fits); read-write and read-only.
fn uneven_raid1(name: &str, sizes: &[u64]) {
    let t = TestDir::new(name).unwrap();
    let devices = raid1_devices(&t, sizes);
    let mnt = t.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    {
        let m = testkit::Mount::new(&devices, &mnt, "").unwrap();
        std::fs::write(m.path().join("f"), bytes(2, 50 << 20)).unwrap();
        testkit::run(Command::new("sync").arg("-f").arg(m.path().join("f"))).unwrap();
        m.unmount().unwrap();
    }
    // The kernel's figures for what is on disk now, mounted again: taken
    // right after the write, they moved by up to a MiB from run to run,
    // and a mount now and then still leaves the disk a chunk's MiB away
    // from what it said: the last of three rounds must agree.
    for round in 1..=3 {
        let kernel = {
            let m = testkit::Mount::new(&devices, &mnt, "").unwrap();
            let figures = kernel_statfs(m.path());
            m.unmount().unwrap();
            figures
        };
        let rw = Filesystem::open_read_write(&devices).unwrap().statfs();
        let ro = Filesystem::open(&devices).unwrap().statfs();
        let ours = [("read-write", rw), ("read-only", ro)]
            .map(|(how, s)| (how, (s.total_bytes, s.unused_bytes, s.free_bytes)));
        if round < 3 && ours.iter().any(|(_, o)| *o != kernel) {
            continue;
        }
        for (how, ours) in ours {
            assert_eq!(
                ours.0, kernel.0,
                "{name} {how}: size (ours, kernel's: {ours:?} {kernel:?})"
            );
            assert!(
                ours.1 == kernel.1 && ours.2 == kernel.2,
                "{name} {how}: unused and available bytes (ours, kernel's: {ours:?} {kernel:?})"
            );
        }
        return;
    }
}

#[test]
fn statfs_of_uneven_raid1_is_the_kernels() {
    testkit::require_privileged!();
    const G: u64 = 1 << 30;
    uneven_raid1("statfs-uneven-2", &[G, 3 * G]);
    uneven_raid1("statfs-uneven-3", &[G, 2 * G, 4 * G]);
}

/// What statfs says is available can be allocated: a file preallocated
/// to all of it fits (fstests' generic/103 takes all but 512 KiB), the
/// last chunks taking whatever device space is left, as the kernel's do;
/// then check is clean and the kernel reads the file's size.
fn fill(name: &str, mkfs: MkfsOptions) {
    let t = TestDir::new(name).unwrap();
    let opts = KernelImageOptions {
        mkfs,
        mount_options: String::new(),
    };
    let image = kernel_image(&t.join("img"), &opts, |_| Ok(())).unwrap();
    let fs = Filesystem::open_read_write(&image.devices).unwrap();
    let free = fs.statfs().free_bytes;
    let new = ubtrfs::fs::NewInode::file(0o644);
    let id = fs.create(fs.root(), b"spc", new).unwrap().id;
    let len = free / 4096 * 4096;
    fs.fallocate(id, 0, 0, len)
        .unwrap_or_else(|e| panic!("{name}: preallocating {len} of {free} available: {e}"));
    let left = fs.statfs().free_bytes;
    assert!(left < 2 << 20, "{name}: {left} bytes still available");
    fs.commit().unwrap();
    drop(fs);
    image.check().unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let m = image.mount(&t.join("mnt"), "").unwrap();
    let size = std::fs::metadata(m.path().join("spc")).unwrap().len();
    m.unmount().unwrap();
    assert_eq!(size, len, "{name}: the kernel's size of the file");
}

#[test]
fn all_that_is_available_can_be_allocated() {
    testkit::require_privileged!();
    let one = |data| MkfsOptions {
        device_size: 1 << 30,
        data,
        ..MkfsOptions::default()
    };
    fill("fill-single", one(Profile::Single));
    fill("fill-dup", one(Profile::Dup));
    for p in [
        Profile::Raid0,
        Profile::Raid1,
        Profile::Raid1c3,
        Profile::Raid10,
    ] {
        fill(
            &format!("fill-{p:?}"),
            MkfsOptions {
                device_size: 512 << 20,
                ..MkfsOptions::multi(p)
            },
        );
    }
}

/// 16 MiB files preallocated until the space runs out, on RAID1 over
/// devices of 300, 500 and 700 MiB: ubtrfs fits as many as the kernel
/// (which puts the largest device in nearly every chunk; picking among
/// devices with room for a whole chunk by their order instead left 200
/// MiB of the largest unused).
#[test]
fn uneven_raid1_fills_as_the_kernel_does() {
    testkit::require_privileged!();
    let sizes = [300u64 << 20, 500 << 20, 700 << 20];
    let make = |t: &TestDir| raid1_devices(t, &sizes);
    const STEP: u64 = 16 << 20;
    let t = TestDir::new("fill-uneven-kernel").unwrap();
    let devices = make(&t);
    let mnt = t.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let kernel = {
        let m = testkit::Mount::new(&devices, &mnt, "").unwrap();
        let mut n = 0;
        while n < 200 {
            let f = std::fs::File::create(m.path().join(format!("f{n}"))).unwrap();
            // SAFETY: fallocate on a descriptor open for this scope.
            let r =
                unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, STEP as i64) };
            if r != 0 {
                break;
            }
            n += 1;
        }
        m.unmount().unwrap();
        n
    };
    let t = TestDir::new("fill-uneven-ubtrfs").unwrap();
    let devices = make(&t);
    let fs = Filesystem::open_read_write(&devices).unwrap();
    let mut ours = 0;
    while ours < 200 {
        let new = ubtrfs::fs::NewInode::file(0o644);
        let id = fs
            .create(fs.root(), format!("f{ours}").as_bytes(), new)
            .unwrap()
            .id;
        if fs.fallocate(id, 0, 0, STEP).is_err() {
            break;
        }
        ours += 1;
    }
    fs.commit().unwrap();
    drop(fs);
    assert!(
        ours + 1 >= kernel,
        "ubtrfs preallocated {ours} files of 16 MiB, the kernel {kernel}"
    );
}

/// `filesystem df` of a filesystem being written counts what the running
/// transaction allocated and freed (as the kernel's figures move while its
/// delayed references run), not only what the last commit recorded; after
/// a commit it is the block group items' figures, to the byte.
#[test]
fn space_info_counts_the_running_transaction() {
    use ubtrfs::format::consts::{BLOCK_GROUP_DATA, BLOCK_GROUP_METADATA};
    let t = TestDir::new("statfs-live-df").unwrap();
    let img = t.join("disk.img");
    testkit::mkfs_file(&img, 1 << 30, &[]).unwrap();
    let used = |fs: &Filesystem, kind: u64| -> u64 {
        fs.space_info()
            .unwrap()
            .iter()
            .filter(|s| s.flags & kind != 0)
            .map(|s| s.used)
            .sum()
    };
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let (meta0, data0) = (used(&fs, BLOCK_GROUP_METADATA), used(&fs, BLOCK_GROUP_DATA));
    let root = fs.root();
    for i in 0..3000 {
        let id = fs
            .create(
                root,
                format!("f{i}").as_bytes(),
                ubtrfs::fs::NewInode::file(0o644),
            )
            .unwrap()
            .id;
        fs.write(id, 0, &bytes(i, 200)).unwrap();
    }
    let big = fs.resolve_path(b"/f0").unwrap();
    fs.write(big, 0, &bytes(7, 8 << 20)).unwrap();
    fs.fsync(big, false).unwrap();
    // Thousands of inodes take many leaves: counted before the commit
    // records them.
    let meta_live = used(&fs, BLOCK_GROUP_METADATA);
    assert!(
        meta_live > meta0 + (256 << 10),
        "metadata used {meta0} before, {meta_live} while written"
    );
    // The last commit's figure: the superblock's bytes used.
    let committed_used = {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        std::fs::File::open(&img)
            .unwrap()
            .read_exact_at(&mut b, 0x10000 + 0x78)
            .unwrap();
        u64::from_le_bytes(b)
    };
    let live_total: u64 = fs
        .space_info()
        .unwrap()
        .iter()
        .filter(|s| s.flags & (BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA) != 0)
        .map(|s| s.used)
        .sum();
    assert!(
        live_total > committed_used + (8 << 20),
        "{live_total} used while written, {committed_used} committed"
    );
    let data_live = used(&fs, BLOCK_GROUP_DATA);
    assert!(
        data_live >= data0 + (8 << 20),
        "data used {data0} before, {data_live} once written back"
    );
    fs.commit().unwrap();
    let committed = fs.space_info().unwrap();
    drop(fs);
    let items = Filesystem::open(&[&img]).unwrap().space_info().unwrap();
    assert_eq!(committed, items);
}

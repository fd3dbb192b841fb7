//! `ubtrfs mkfs` against the oracles: `btrfs check` finds no error, the
//! kernel mounts the new filesystem and writes to it, `btrfs check` is
//! still clean after, `dump-super` shows what was asked for, and ubtrfs's
//! own reader and writer work on it. Bad input fails with a clear message.
//!
//! Needs root, loop devices, the btrfs module and btrfs-progs (see
//! `testkit::require_privileged!`), except the library smoke test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::{Loop, Mount, TestDir, command, require_privileged};

/// Size of each image.
const IMAGE_SIZE: &str = "320M";

fn ubtrfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
}

fn show(out: &Output) -> String {
    format!(
        "status {}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run `ubtrfs mkfs ARGS IMAGES` and return its output.
fn mkfs_out(args: &[&str], images: &[PathBuf]) -> Output {
    ubtrfs()
        .arg("mkfs")
        .args(args)
        .args(images)
        .output()
        .expect("ubtrfs runs")
}

/// `ubtrfs mkfs` that must succeed; returns stdout.
fn mkfs(args: &[&str], images: &[PathBuf]) -> String {
    let out = mkfs_out(args, images);
    assert!(out.status.success(), "ubtrfs mkfs {args:?}: {}", show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ubtrfs mkfs` that must fail; returns stderr.
fn mkfs_fails(args: &[&str], images: &[PathBuf]) -> String {
    let out = mkfs_out(args, images);
    assert!(
        !out.status.success(),
        "ubtrfs mkfs {args:?} should fail: {}",
        show(&out)
    );
    assert!(out.stdout.is_empty(), "failed mkfs printed a summary");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `n` image paths in `t` (not created: `mkfs -b` creates them).
fn images(t: &TestDir, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| t.join(format!("dev{i}.img"))).collect()
}

/// The images of one filesystem attached to loop devices for the whole of
/// a test, so that `btrfs check` and the kernel always see the same device
/// paths (attaching an image again while the kernel still knows the old
/// loop device for its fsid invites mix-ups between parallel tests).
struct Attached {
    loops: Vec<Loop>,
}

impl Attached {
    fn new(imgs: &[PathBuf]) -> Attached {
        let loops: Vec<Loop> = imgs
            .iter()
            .map(|i| Loop::attach(i).expect("losetup"))
            .collect();
        Attached { loops }
    }

    fn devs(&self) -> Vec<&Path> {
        self.loops.iter().map(|l| l.device()).collect()
    }

    /// `btrfs check --readonly`: it must exit 0 and say "no error found".
    /// Several devices are registered first so that check assembles them.
    fn check(&self) {
        let devs = self.devs();
        if devs.len() > 1 {
            let out = command("btrfs")
                .args(["device", "scan"])
                .args(&devs)
                .output()
                .expect("btrfs device scan");
            assert!(out.status.success(), "btrfs device scan: {}", show(&out));
        }
        let out = testkit::output_of(command("btrfs").args(["check", "--readonly"]).arg(devs[0]))
            .expect("btrfs check runs");
        let text = show(&out);
        assert!(out.status.success(), "btrfs check failed: {text}");
        assert!(text.contains("no error found"), "btrfs check: {text}");
    }

    /// Mount with the kernel on `target`; unmounted when the guard drops.
    fn mount(&self, target: &Path, options: &str) -> Mounted {
        std::fs::create_dir_all(target).unwrap();
        let devs = self.devs();
        let mut opts: Vec<String> = options
            .split(',')
            .filter(|o| !o.is_empty())
            .map(String::from)
            .collect();
        if devs.len() > 1 {
            opts.extend(devs.iter().map(|d| format!("device={}", d.display())));
        }
        let mut cmd = command("mount");
        cmd.args(["-t", "btrfs"]);
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts.join(","));
        }
        let out = cmd.arg(devs[0]).arg(target).output().expect("mount runs");
        assert!(
            out.status.success(),
            "the kernel does not mount it: {}\nkernel log:\n{}",
            show(&out),
            testkit::dmesg_tail(15)
        );
        Mounted {
            target: target.to_path_buf(),
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = command("btrfs")
            .args(["device", "scan", "--forget"])
            .args(self.devs())
            .output();
    }
}

/// A kernel mount, unmounted on drop.
struct Mounted {
    target: PathBuf,
}

impl Mounted {
    fn path(&self) -> &Path {
        &self.target
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = testkit::umount(&self.target) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// `btrfs check --readonly` on the filesystem made of `imgs`.
fn btrfs_check(imgs: &[PathBuf]) {
    Attached::new(imgs).check();
}

/// `btrfs inspect-internal dump-super` of `img` as (field, value) lines.
fn dump_super(img: &Path) -> Vec<(String, String)> {
    let out = command("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(img)
        .output()
        .expect("dump-super runs");
    assert!(out.status.success(), "dump-super: {}", show(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('\t')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

fn field<'a>(sb: &'a [(String, String)], name: &str) -> &'a str {
    sb.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("dump-super has no {name}: {sb:?}"))
}

/// Deterministic bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The files the kernel writes into each new filesystem.
fn kernel_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("small", b"hello\n".to_vec()),
        ("dir/one", bytes(1, 100_000)),
        ("dir/two", bytes(2, 3_000_000)),
        ("dir/sub/three", bytes(3, 5000)),
    ]
}

/// The full round: mkfs, check, dump-super, mount and write, unmount,
/// check again, and ubtrfs reads what the kernel wrote.
fn round_trip(name: &str, ndev: usize, args: &[&str], csum: &str, nodesize: u32) {
    let t = TestDir::new(name).unwrap();
    let imgs = images(&t, ndev);
    let label = format!("lbl-{name}");
    // Unique per test: tests run in parallel, and the kernel keys
    // filesystems by UUID.
    let uuid = ubtrfs::format::uuid_string(&ubtrfs::mkfs::random_uuid().unwrap());
    let uuid = uuid.as_str();
    let mut all: Vec<&str> = vec!["-b", IMAGE_SIZE, "-L", &label, "-U", uuid];
    all.extend_from_slice(args);
    let nodesize_s = nodesize.to_string();
    all.extend_from_slice(&["--csum", csum, "-n", &nodesize_s]);
    let summary = mkfs(&all, &imgs);
    assert!(summary.contains(uuid), "{summary}");
    assert!(summary.contains(&label), "{summary}");
    let attached = Attached::new(&imgs);
    attached.check();

    for img in &imgs {
        let sb = dump_super(img);
        let want_csum = match csum {
            "xxhash" => "xxhash64",
            c => c,
        };
        assert!(
            field(&sb, "csum_type").contains(&format!("({want_csum})")),
            "{sb:?}"
        );
        assert_eq!(field(&sb, "nodesize"), nodesize_s);
        assert_eq!(field(&sb, "sectorsize"), "4096");
        assert_eq!(field(&sb, "label"), label);
        assert_eq!(field(&sb, "fsid"), uuid);
        assert_eq!(field(&sb, "num_devices"), ndev.to_string());
    }

    {
        let m = attached.mount(&t.join("mnt"), "");
        for (path, data) in kernel_files() {
            let p = m.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, data).unwrap();
        }
    }
    attached.check();
    drop(attached);

    let fs = ubtrfs::fs::Filesystem::open(&imgs).expect("ubtrfs opens it");
    for (path, data) in kernel_files() {
        let id = fs
            .resolve_path(format!("/{path}").as_bytes())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(fs.read_all(id).unwrap(), data, "{path}");
    }
    let out = ubtrfs()
        .args(["ls", "-R"])
        .args(&imgs)
        .arg("/")
        .output()
        .unwrap();
    assert!(out.status.success(), "ubtrfs ls: {}", show(&out));
    let listing = String::from_utf8_lossy(&out.stdout);
    for name in ["small", "one", "two", "three"] {
        assert!(listing.contains(name), "ubtrfs ls: {listing}");
    }
}

macro_rules! csum_nodesize {
    ($($name:ident: $csum:expr, $nodesize:expr;)*) => {$(
        #[test]
        fn $name() {
            require_privileged!();
            round_trip(stringify!($name), 1, &[], $csum, $nodesize);
        }
    )*};
}

csum_nodesize! {
    crc32c_4k: "crc32c", 4096;
    crc32c_16k: "crc32c", 16384;
    crc32c_64k: "crc32c", 65536;
    xxhash_4k: "xxhash", 4096;
    xxhash_16k: "xxhash", 16384;
    xxhash_64k: "xxhash", 65536;
    sha256_4k: "sha256", 4096;
    sha256_16k: "sha256", 16384;
    sha256_64k: "sha256", 65536;
    blake2_4k: "blake2", 4096;
    blake2_16k: "blake2", 16384;
    blake2_64k: "blake2", 65536;
}

macro_rules! profiles {
    ($($name:ident: $ndev:expr, [$($arg:expr),*];)*) => {$(
        #[test]
        fn $name() {
            require_privileged!();
            round_trip(stringify!($name), $ndev, &[$($arg),*], "crc32c", 16384);
        }
    )*};
}

profiles! {
    single_one_device: 1, ["-m", "single", "-d", "single"];
    dup_one_device: 1, ["-m", "dup", "-d", "dup"];
    defaults_two_devices: 2, [];
    raid0_two_devices: 2, ["-m", "raid0", "-d", "raid0"];
    raid1_two_devices: 2, ["-m", "raid1", "-d", "raid1"];
    raid10_four_devices: 4, ["-m", "raid10", "-d", "raid10"];
    raid1c3_three_devices: 3, ["-m", "raid1c3", "-d", "raid1c3"];
    raid1c4_four_devices: 4, ["-m", "raid1c4", "-d", "raid1"];
    raid5_three_devices: 3, ["-m", "raid5", "-d", "raid5"];
    raid6_four_devices: 4, ["-m", "raid6", "-d", "raid6"];
    no_optional_features: 1, ["-O", "^skinny-metadata,^no-holes,^extref"];
}

/// What a multi-device mkfs puts where: each device's superblock names
/// itself, and the profiles are the ones asked for.
#[test]
fn multi_device_layout() {
    require_privileged!();
    let t = TestDir::new("mkfs-layout").unwrap();
    let imgs = images(&t, 4);
    let summary = mkfs(&["-b", IMAGE_SIZE, "-m", "raid10", "-d", "raid0"], &imgs);
    assert!(summary.contains("RAID10"), "{summary}");
    assert!(summary.contains("RAID0"), "{summary}");
    assert!(summary.contains("Number of devices:  4"), "{summary}");
    let mut fsids = Vec::new();
    for (i, img) in imgs.iter().enumerate() {
        let sb = dump_super(img);
        assert_eq!(field(&sb, "dev_item.devid"), (i + 1).to_string());
        assert_eq!(field(&sb, "total_bytes"), (4u64 * (320 << 20)).to_string());
        fsids.push(field(&sb, "fsid").to_string());
    }
    fsids.dedup();
    assert_eq!(fsids.len(), 1);
    let out = command("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "chunk"])
        .arg(&imgs[0])
        .output()
        .unwrap();
    let chunks = String::from_utf8_lossy(&out.stdout);
    assert!(chunks.contains("METADATA|RAID10"), "{chunks}");
    assert!(chunks.contains("DATA|RAID0"), "{chunks}");
    assert!(chunks.contains("SYSTEM|RAID10"), "{chunks}");
    btrfs_check(&imgs);
}

/// ubtrfs's own writer on a ubtrfs-made filesystem: directories, small
/// (inline) and large files, several commits; btrfs check stays clean and
/// the kernel sees exactly what was written.
#[test]
fn ubtrfs_writer_on_new_filesystem() {
    require_privileged!();
    let t = TestDir::new("mkfs-writer").unwrap();
    for (i, (ndev, args)) in [
        (1usize, vec!["--csum", "sha256"]),
        (2, vec!["-m", "raid1", "-d", "raid1", "--csum", "xxhash"]),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = t.mkdir(format!("case{i}")).unwrap();
        let imgs: Vec<PathBuf> = (0..ndev).map(|d| dir.join(format!("d{d}.img"))).collect();
        let mut a = vec!["-b", IMAGE_SIZE];
        a.extend(args);
        mkfs(&a, &imgs);
        let files = [
            ("/docs/readme", bytes(10, 300)),
            ("/docs/big", bytes(11, 1_500_000)),
            ("/top", bytes(12, 70_000)),
        ];
        {
            let fs = ubtrfs::fs::Filesystem::open_read_write(&imgs).expect("open read-write");
            let root = fs.root();
            let docs = fs.mkdir(root, b"docs", 0o755, 0, 0).expect("mkdir").id;
            fs.commit().expect("first commit");
            for (path, data) in &files {
                let (parent, name) = match path.rsplit_once('/') {
                    Some(("/docs", n)) => (docs, n),
                    Some((_, n)) => (root, n),
                    None => unreachable!(),
                };
                let new = ubtrfs::fs::NewInode {
                    mode: libc::S_IFREG | 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                };
                let id = fs.create(parent, name.as_bytes(), new).expect("create").id;
                // Two writes: the second extends the first.
                let half = data.len() / 2;
                assert_eq!(fs.write(id, 0, &data[..half]).unwrap(), half);
                assert_eq!(
                    fs.write(id, half as u64, &data[half..]).unwrap(),
                    data.len() - half
                );
            }
            fs.commit().expect("second commit");
        }
        let attached = Attached::new(&imgs);
        attached.check();
        let m = attached.mount(&dir.join("mnt"), "ro");
        for (path, data) in &files {
            let got = std::fs::read(m.path().join(&path[1..])).unwrap();
            assert!(got == *data, "{path}: kernel reads other bytes");
        }
    }
}

#[test]
fn refuses_too_small_device() {
    require_privileged!();
    let t = TestDir::new("mkfs-small").unwrap();
    let img = t.sparse_file("small.img", 50 << 20).unwrap();
    let err = mkfs_fails(&[], std::slice::from_ref(&img));
    assert!(err.contains("too small"), "{err}");
    assert!(
        err.contains("minimum size for each btrfs device is 114294784"),
        "{err}"
    );
    // Nothing was written.
    assert!(std::fs::read(&img).unwrap().iter().all(|&b| b == 0));
    // The same device is big enough for single profiles, as for mkfs.btrfs.
    mkfs(&["-q", "-m", "single", "-d", "single"], &[img]);
}

#[test]
fn refuses_bad_nodesize() {
    require_privileged!();
    let t = TestDir::new("mkfs-nodesize").unwrap();
    let img = t.sparse_file("a.img", 320 << 20).unwrap();
    let one = std::slice::from_ref(&img);
    let err = mkfs_fails(&["-n", "12288"], one);
    assert!(err.contains("nodesize 12288 (not a power of two)"), "{err}");
    let err = mkfs_fails(&["-n", "2048"], one);
    assert!(err.contains("nodesize 2048"), "{err}");
    let err = mkfs_fails(&["-n", "128k"], one);
    assert!(err.contains("larger than 65536"), "{err}");
    let err = mkfs_fails(&["-s", "3000"], one);
    assert!(err.contains("sectorsize 3000"), "{err}");
}

#[test]
fn refuses_unknown_profile_checksum_feature() {
    require_privileged!();
    let t = TestDir::new("mkfs-names").unwrap();
    let img = t.sparse_file("a.img", 320 << 20).unwrap();
    let one = std::slice::from_ref(&img);
    let err = mkfs_fails(&["-d", "raid7"], one);
    assert!(err.contains("unknown data profile 'raid7'"), "{err}");
    let err = mkfs_fails(&["-m", "mirror"], one);
    assert!(err.contains("unknown metadata profile 'mirror'"), "{err}");
    let err = mkfs_fails(&["--csum", "md5"], one);
    assert!(err.contains("unknown checksum type 'md5'"), "{err}");
    let err = mkfs_fails(&["-O", "frobnicate"], one);
    assert!(
        err.contains("unrecognized filesystem feature 'frobnicate'"),
        "{err}"
    );
    let err = mkfs_fails(&["-U", "not-a-uuid"], one);
    assert!(err.contains("could not parse UUID"), "{err}");
    let err = mkfs_fails(&["-d", "raid5"], one);
    assert!(err.contains("RAID5"), "{err}");
}

#[test]
fn refuses_raid1_on_one_device() {
    require_privileged!();
    let t = TestDir::new("mkfs-raid1-one").unwrap();
    let img = t.sparse_file("a.img", 320 << 20).unwrap();
    let one = std::slice::from_ref(&img);
    let err = mkfs_fails(&["-d", "raid1"], one);
    assert!(
        err.contains("data profile RAID1 (have 1 devices but 2 devices are required)"),
        "{err}"
    );
    let err = mkfs_fails(&["-m", "raid1"], one);
    assert!(err.contains("metadata profile RAID1"), "{err}");
    let three = images(&t, 3);
    let err = mkfs_fails(&["-b", IMAGE_SIZE, "-d", "raid10"], &three);
    assert!(err.contains("4 devices are required"), "{err}");
}

#[test]
fn refuses_existing_filesystem_without_force() {
    require_privileged!();
    let t = TestDir::new("mkfs-force").unwrap();
    let img = t.sparse_file("a.img", 320 << 20).unwrap();
    let one = std::slice::from_ref(&img);
    let out = command("mkfs.btrfs").arg("-q").arg(&img).output().unwrap();
    assert!(out.status.success(), "mkfs.btrfs: {}", show(&out));
    let before = dump_super(&img);
    let err = mkfs_fails(&[], one);
    assert!(
        err.contains("appears to contain an existing filesystem (btrfs)"),
        "{err}"
    );
    assert_eq!(
        field(&dump_super(&img), "fsid"),
        field(&before, "fsid"),
        "the old filesystem was touched"
    );
    let summary = mkfs(&["-f"], one);
    assert!(!summary.contains(field(&before, "fsid")), "{summary}");
    btrfs_check(one);
    // An ext4 signature is refused too.
    let ext = t.sparse_file("ext.img", 320 << 20).unwrap();
    let out = command("mkfs.ext4").args(["-q", "-F"]).arg(&ext).output();
    if out.is_ok_and(|o| o.status.success()) {
        let err = mkfs_fails(&[], std::slice::from_ref(&ext));
        assert!(err.contains("ext2/3/4"), "{err}");
    }
}

#[test]
fn refuses_mounted_device_even_with_force() {
    require_privileged!();
    let t = TestDir::new("mkfs-mounted").unwrap();
    let imgs = images(&t, 1);
    mkfs(&["-q", "-b", IMAGE_SIZE], &imgs);
    let m = Mount::new(&imgs, &t.join("mnt"), "").unwrap();
    let err = mkfs_fails(&["-f"], &imgs);
    assert!(err.contains("is mounted"), "{err}");
    m.unmount().unwrap();
}

#[test]
fn missing_image_needs_byte_count() {
    require_privileged!();
    let t = TestDir::new("mkfs-create").unwrap();
    let img = t.join("new.img");
    let err = mkfs_fails(&[], std::slice::from_ref(&img));
    assert!(err.contains("--byte-count"), "{err}");
    assert!(!img.exists());
    // A file created for a failing mkfs is removed again.
    let err = mkfs_fails(&["-b", "50m"], std::slice::from_ref(&img));
    assert!(err.contains("too small"), "{err}");
    assert!(!img.exists(), "a half-made image was left behind");
    mkfs(&["-b", "200m"], std::slice::from_ref(&img));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 200 << 20);
    // A -b bigger than an existing file is refused.
    let small = t.sparse_file("small.img", 150 << 20).unwrap();
    let err = mkfs_fails(&["-b", "200m"], std::slice::from_ref(&small));
    assert!(err.contains("smaller than requested size"), "{err}");
}

/// `-O list-all` lists the features and needs no device.
#[test]
fn lists_features() {
    let out = ubtrfs().args(["mkfs", "-O", "list-all"]).output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for f in ["extref", "skinny-metadata", "no-holes", "free-space-tree"] {
        assert!(text.contains(f), "{text}");
    }
}

/// Without root or btrfs-progs: the library makes a filesystem in a plain
/// file and reads it back; its writer commits into it.
#[test]
fn library_makes_readable_filesystem() {
    use ubtrfs::mkfs::{MkfsOptions, make_filesystem_at};
    let t = TestDir::new("mkfs-lib").unwrap();
    let img = t.join("lib.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let opts = MkfsOptions {
        label: "lib".into(),
        ..MkfsOptions::default()
    };
    let report = make_filesystem_at(&[&img], &opts).expect("mkfs");
    assert_eq!(report.devices.len(), 1);
    let again = make_filesystem_at(&[&img], &opts).unwrap_err().to_string();
    assert!(again.contains("existing filesystem"), "{again}");
    {
        let fs = ubtrfs::fs::Filesystem::open_read_write(&[&img]).unwrap();
        assert_eq!(fs.superblock().label, "lib");
        assert_eq!(fs.superblock().fsid, report.fsid);
        assert!(fs.read_dir(fs.root(), 0).unwrap().is_empty());
        let new = ubtrfs::fs::NewInode {
            mode: libc::S_IFREG | 0o600,
            uid: 1,
            gid: 2,
            rdev: 0,
        };
        let id = fs.create(fs.root(), b"f", new).unwrap().id;
        fs.write(id, 0, b"data").unwrap();
        fs.commit().unwrap();
    }
    let fs = ubtrfs::fs::Filesystem::open(&[&img]).unwrap();
    let id = fs.resolve_path(b"/f").unwrap();
    assert_eq!(fs.read_all(id).unwrap(), b"data");
}

/// The trees of a new RAID5/RAID6 filesystem carry right parity: the
/// kernel mounts it (read-only, degraded) and lists it without any one
/// device (RAID5) or any two (RAID6), which only parity can make up for.
#[test]
fn raid56_parity_of_a_new_filesystem_rebuilds() {
    require_privileged!();
    for (profile, ndev, lose) in [("raid5", 3usize, 1usize), ("raid6", 4, 2)] {
        let t = TestDir::new(&format!("mkfs-{profile}-degraded")).unwrap();
        let imgs = images(&t, ndev);
        mkfs(&["-b", IMAGE_SIZE, "-m", profile, "-d", profile], &imgs);
        let losses: Vec<Vec<usize>> = if lose == 1 {
            (0..ndev).map(|a| vec![a]).collect()
        } else {
            (0..ndev)
                .flat_map(|a| (a + 1..ndev).map(move |b| vec![a, b]))
                .collect()
        };
        for gone in losses {
            let present: Vec<PathBuf> = (0..ndev)
                .filter(|i| !gone.contains(i))
                .map(|i| imgs[i].clone())
                .collect();
            let m = Mount::new(&present, &t.join("mnt"), "ro,degraded")
                .unwrap_or_else(|e| panic!("{profile} without devices {gone:?}: {e:#}"));
            assert_eq!(
                std::fs::read_dir(m.path()).unwrap().count(),
                0,
                "{profile}: a new filesystem is empty"
            );
            let out = Command::new("btrfs")
                .args(["filesystem", "df"])
                .arg(m.path())
                .output()
                .unwrap();
            let df = String::from_utf8_lossy(&out.stdout);
            assert!(
                df.to_lowercase().contains(profile),
                "{profile} without devices {gone:?}: {df}"
            );
            m.unmount().unwrap();
        }
    }
}

//! Writing compressed extents: each algorithm, read back by the kernel;
//! incompressible data falls back to plain extents.

use std::path::{Path, PathBuf};
use std::process::Command;
use ubtrfs::data::compression::Compression;
use ubtrfs::format::consts::EXTENT_DATA_KEY;
use ubtrfs::format::items::FileExtentItem;
use ubtrfs::fs::{Filesystem, InodeId, NewInode};

fn noise(seed: u64, n: usize) -> Vec<u8> {
    testkit::xorshift_bytes(seed, n)
}

const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};

/// A 300 MiB image made by `mkfs.btrfs` in `dir`.
fn mkfs(dir: &Path, name: &str) -> PathBuf {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(&img)
        .output()
        .expect("mkfs.btrfs runs");
    assert!(out.status.success());
    img
}

/// `btrfs check` (with `args`) passes on `img`.
fn check(img: &Path, args: &[&str]) {
    let out = testkit::output_of(
        Command::new("btrfs")
            .args(["check", "--readonly"])
            .args(args)
            .arg(img),
    )
    .unwrap();
    assert!(
        out.status.success(),
        "btrfs check {}: {}",
        img.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Mount `img` with the kernel (`opts`) at `dir/mnt`, run `f` there,
/// unmount.
fn with_kernel_mount<T>(dir: &Path, img: &Path, opts: &str, f: impl FnOnce(&Path) -> T) -> T {
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    assert!(
        Command::new("mount")
            .args(["-o", opts])
            .arg(img)
            .arg(&mnt)
            .status()
            .unwrap()
            .success()
    );
    let out = f(&mnt);
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    out
}

fn compressions(fs: &Filesystem, id: InodeId) -> Vec<u8> {
    fs.tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, EXTENT_DATA_KEY)
        .unwrap()
        .map(|it| {
            FileExtentItem::parse(it.unwrap().data())
                .unwrap()
                .compression
        })
        .collect()
}

#[test]
fn each_algorithm_round_trips_through_the_kernel() {
    for (kind, disk) in [
        (Compression::Zlib, 1u8),
        (Compression::Lzo, 2),
        (Compression::Zstd, 3),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "d.img");
        let text: Vec<u8> = (0..1_000_000u32)
            .flat_map(|i| format!("line {} of text\n", i % 977).into_bytes())
            .take(1_000_000)
            .collect();
        let random = noise(7, 300_000);
        let mut mixed = text[..200_000].to_vec();
        mixed.extend_from_slice(&random[..200_000]);
        let files = [("text", &text), ("random", &random), ("mixed", &mixed)];
        {
            let fs = Filesystem::open_read_write(&[&img]).unwrap();
            fs.set_compression(Some((kind, None))).unwrap();
            for (name, data) in files {
                let id = fs.create(fs.root(), name.as_bytes(), FILE).unwrap().id;
                fs.write(id, 0, data).unwrap();
            }
            fs.commit().unwrap();
            let text_id = fs.resolve_path(b"/text").unwrap();
            assert!(
                compressions(&fs, text_id).iter().all(|&c| c == disk),
                "{kind:?}: text compressed"
            );
            let random_id = fs.resolve_path(b"/random").unwrap();
            assert!(
                compressions(&fs, random_id).iter().all(|&c| c == 0),
                "{kind:?}: random data stays plain"
            );
            let mixed_id = fs.resolve_path(b"/mixed").unwrap();
            let m = compressions(&fs, mixed_id);
            assert!(
                m.contains(&disk) && m.contains(&0),
                "{kind:?}: mixed has both: {m:?}"
            );
            for (name, data) in files {
                let id = fs.resolve_path(format!("/{name}").as_bytes()).unwrap();
                assert!(
                    &fs.read_all(id).unwrap() == data,
                    "{kind:?}: ubtrfs reads {name}"
                );
            }
        }
        check(&img, &[]);
        let same: Vec<bool> = with_kernel_mount(dir.path(), &img, "ro,loop", |mnt| {
            files
                .iter()
                .map(|(n, d)| &std::fs::read(mnt.join(n)).unwrap() == *d)
                .collect()
        });
        assert_eq!(
            same,
            vec![true; 3],
            "{kind:?}: the kernel reads what ubtrfs wrote"
        );
    }
}

/// `compress` writes data that looks incompressible plain without trying
/// it, as one extent (the kernel writes a 4 MiB random file as one plain
/// extent too); `compress-force` tries every piece, so data that only
/// looks random (a 48 KiB random block over and over) is compressed.
#[test]
fn compress_skips_what_looks_incompressible_and_compress_force_tries_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "d.img");
    let random = noise(21, 4 << 20);
    let echo: Vec<u8> = noise(22, 48 << 10)
        .into_iter()
        .cycle()
        .take(1 << 20)
        .collect();
    let mut files = Vec::new();
    {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        fs.set_compression(Some((Compression::Zstd, None))).unwrap();
        for force in [false, true] {
            fs.set_compress_force(force).unwrap();
            for (name, data) in [("random", &random), ("echo", &echo)] {
                let name = format!("{name}-{}", if force { "force" } else { "compress" });
                let id = fs.create(fs.root(), name.as_bytes(), FILE).unwrap().id;
                fs.write(id, 0, data).unwrap();
                files.push((name, data.clone()));
            }
            fs.commit().unwrap();
        }
        let kinds = |name: &str| compressions(&fs, fs.resolve_path(name.as_bytes()).unwrap());
        assert_eq!(kinds("/random-compress"), vec![0], "one plain extent");
        assert_eq!(
            kinds("/random-force"),
            vec![0],
            "tried, still one plain extent"
        );
        assert_eq!(kinds("/echo-compress"), vec![0], "looks random: not tried");
        let forced = kinds("/echo-force");
        assert!(
            forced.len() == 8 && forced.iter().all(|&c| c == 3),
            "compress-force compresses the echo: {forced:?}"
        );
        for (name, data) in &files {
            let id = fs.resolve_path(format!("/{name}").as_bytes()).unwrap();
            assert!(&fs.read_all(id).unwrap() == data, "ubtrfs reads {name}");
        }
    }
    check(&img, &["--check-data-csum"]);
    let same: Vec<bool> = with_kernel_mount(dir.path(), &img, "ro,loop", |mnt| {
        files
            .iter()
            .map(|(n, d)| &std::fs::read(mnt.join(n)).unwrap() == d)
            .collect()
    });
    assert_eq!(same, vec![true; 4], "the kernel reads what ubtrfs wrote");
}

/// Of each file, the share of its data bytes stored compressed (by
/// extent item: `num_bytes` of compressed ones over all).
fn compressed_share(fs: &Filesystem, name: &str) -> f64 {
    use ubtrfs::format::items::ExtentBody;
    let id = fs.resolve_path(name.as_bytes()).unwrap();
    let (mut all, mut compressed) = (0u64, 0u64);
    for it in fs
        .tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, EXTENT_DATA_KEY)
        .unwrap()
    {
        let fe = FileExtentItem::parse(it.unwrap().data()).unwrap();
        if let ExtentBody::Regular { num_bytes, .. } = fe.body {
            all += num_bytes;
            if fe.compression != 0 {
                compressed += num_bytes;
            }
        }
    }
    compressed as f64 / all.max(1) as f64
}

/// This test's own machine code: the executable segment of its file, as
/// `/proc/self/maps` places it. (The file's first bytes are headers,
/// symbols and constants; how much of them a 4 MiB prefix holds changes
/// with every build, and the kernel compresses some of it and not the
/// rest.)
fn own_machine_code() -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let (offset, len) = maps
        .lines()
        .filter(|l| l.ends_with(&*exe.to_string_lossy()))
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.get(1)? != &"r-xp" {
                return None;
            }
            let (lo, hi) = w[0].split_once('-')?;
            let len = u64::from_str_radix(hi, 16).ok()? - u64::from_str_radix(lo, 16).ok()?;
            Some((u64::from_str_radix(w[2], 16).ok()?, len))
        })
        .expect("the executable's code segment in /proc/self/maps");
    let mut code = vec![0u8; len as usize];
    let n = std::fs::File::open(&exe)
        .unwrap()
        .read_at(&mut code, offset)
        .unwrap();
    code.truncate(n);
    assert!(code.len() >= 1 << 20, "only {} bytes of code", code.len());
    code
}

/// Under `compress=zstd`, ubtrfs and the kernel agree on what to compress
/// for data that is all of one kind: text, machine code (this test's own
/// executable), random bytes and gzip output. The kernel writes the same
/// files on a loop mount; both images are read back by ubtrfs.
#[test]
fn compress_decides_like_the_kernel() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let text: Vec<u8> = (0..400_000u32)
        .flat_map(|i| {
            format!("{i} bottles of beer on the wall, {} to go\n", i * 7 % 1013).into_bytes()
        })
        .take(4 << 20)
        .collect();
    let mut code = own_machine_code();
    code.truncate(4 << 20);
    let random = noise(31, 4 << 20);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&text).unwrap();
    gz.write_all(
        &noise(32, 1 << 20)
            .iter()
            .map(|b| b'a' + b % 26)
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    for i in 0..3000u32 {
        gz.write_all(format!("record {} {:x}\n", i, i.wrapping_mul(2654435761)).as_bytes())
            .unwrap();
    }
    let gz = gz.finish().unwrap();
    let files: [(&str, &[u8]); 4] = [
        ("text", &text),
        ("code", &code),
        ("random", &random),
        ("gzip", &gz),
    ];
    let ours = mkfs(dir.path(), "ours.img");
    {
        let fs = Filesystem::open_read_write(&[&ours]).unwrap();
        fs.set_compression(Some((Compression::Zstd, None))).unwrap();
        for (name, data) in files {
            let id = fs.create(fs.root(), name.as_bytes(), FILE).unwrap().id;
            fs.write(id, 0, data).unwrap();
        }
        fs.commit().unwrap();
    }
    let kernels = mkfs(dir.path(), "kernel.img");
    with_kernel_mount(dir.path(), &kernels, "loop,compress=zstd", |mnt| {
        for (name, data) in files {
            std::fs::write(mnt.join(name), data).unwrap();
        }
    });
    let a = Filesystem::open(&[&ours]).unwrap();
    let b = Filesystem::open(&[&kernels]).unwrap();
    for (name, data) in files {
        let path = format!("/{name}");
        let (mine, theirs) = (compressed_share(&a, &path), compressed_share(&b, &path));
        assert_eq!(
            (mine > 0.5, theirs > 0.5),
            (theirs > 0.5, theirs > 0.5),
            "{name}: ubtrfs compressed {mine:.2} of it, the kernel {theirs:.2}"
        );
        assert!(
            !(0.1..=0.9).contains(&mine),
            "{name}: data of one kind is compressed all or not at all ({mine:.2})"
        );
        let id = a.resolve_path(path.as_bytes()).unwrap();
        assert!(&a.read_all(id).unwrap()[..] == data, "{name} reads back");
    }
}

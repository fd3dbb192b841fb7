//! The corpus builders really work here: every kind of image is built and
//! passes `btrfs check --readonly`, and what the kernel shows of it is what
//! went in. Needs root, loop devices, the btrfs module and btrfs-progs.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use testkit::*;

fn assert_same(expected: &Path, actual: &Path, opts: &CompareOptions) {
    if let Err(d) = compare_trees_with(expected, actual, opts) {
        panic!(
            "{} differences between {} and {}:\n{}",
            d.len(),
            expected.display(),
            actual.display(),
            d.join("\n")
        );
    }
}

/// mkfs --rootdir for one set of options: image checks clean, and the
/// kernel shows the source (within what --rootdir keeps).
fn rootdir_case(name: &str, opts: MkfsOptions) {
    let t = TestDir::new(name).unwrap();
    let spec = TreeSpec::default().for_rootdir(&opts);
    let src = t.join("src");
    gen_tree(&src, 11, &spec).unwrap();
    let img = mkfs_rootdir_image(&t.join("img"), &src, &opts).unwrap();
    assert_eq!(img.devices.len(), opts.devices);
    btrfs_check(&img).unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    let cmp = if opts.devices > 1 {
        // Copied by the kernel with cp -a: everything but the top dir.
        CompareOptions {
            top_level: false,
            ..CompareOptions::across_filesystems()
        }
    } else {
        CompareOptions::mkfs_rootdir()
    };
    assert_same(&src, m.path(), &cmp);
    m.unmount().unwrap();
}

macro_rules! rootdir_tests {
    ($($name:ident: $opts:expr;)*) => {$(
        #[test]
        fn $name() {
            require_privileged!();
            rootdir_case(stringify!($name), $opts);
        }
    )*};
}

rootdir_tests! {
    rootdir_crc32c: MkfsOptions::with_csum(Csum::Crc32c);
    rootdir_xxhash: MkfsOptions::with_csum(Csum::Xxhash);
    rootdir_sha256: MkfsOptions::with_csum(Csum::Sha256);
    rootdir_blake2: MkfsOptions::with_csum(Csum::Blake2);
    rootdir_nodesize_4k: MkfsOptions::with_nodesize(4096);
    rootdir_nodesize_64k: MkfsOptions::with_nodesize(65536);
    rootdir_single_single: MkfsOptions {
        metadata: Profile::Single,
        ..MkfsOptions::default()
    };
    rootdir_dup_dup: MkfsOptions {
        metadata: Profile::Dup,
        data: Profile::Dup,
        ..MkfsOptions::default()
    };
    rootdir_mixed: MkfsOptions {
        mixed: true,
        nodesize: 4096,
        metadata: Profile::Single,
        data: Profile::Single,
        ..MkfsOptions::default()
    };
    rootdir_hole_extents: MkfsOptions {
        features: vec!["^no-holes".into()],
        ..MkfsOptions::with_csum(Csum::Xxhash)
    };
    rootdir_raid1: MkfsOptions::multi(Profile::Raid1);
    rootdir_raid0: MkfsOptions::multi(Profile::Raid0);
    rootdir_raid10: MkfsOptions::multi(Profile::Raid10);
    rootdir_raid1c3: MkfsOptions::multi(Profile::Raid1c3);
}

/// Documents, and keeps checking, exactly what `mkfs.btrfs --rootdir`
/// loses on this btrfs-progs version (see the `corpus` module docs).
#[test]
fn rootdir_fidelity() {
    require_privileged!();
    let t = TestDir::new("rootdir-fidelity").unwrap();
    let opts = MkfsOptions::default();
    let src = t.join("src");
    gen_tree(&src, 5, &TreeSpec::default().for_rootdir(&opts)).unwrap();
    let img = mkfs_rootdir_image(&t.join("img"), &src, &opts).unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    let version = mkfs_version().unwrap();

    let diffs =
        compare_trees_with(&src, m.path(), &CompareOptions::across_filesystems()).unwrap_err();
    let mut kinds = std::collections::BTreeSet::new();
    for d in &diffs {
        let kind = d.split(": ").nth(1).unwrap().to_string();
        let top = d.starts_with(".: ");
        if !top {
            kinds.insert(kind);
        }
    }
    eprintln!("{version}: --rootdir loses {kinds:?} (and the top dir's metadata)");
    if version.ends_with("v6.2") {
        let expected: std::collections::BTreeSet<String> = ["mtime nsec", "rdev"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(kinds, expected, "{diffs:#?}");
    }

    // Holes are filled: the sparse files take their full size on disk.
    let sparse = walk_files(&src)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("sparse")
        })
        .collect::<Vec<_>>();
    assert!(!sparse.is_empty());
    let filled = sparse.iter().any(|rel| {
        let s = std::fs::metadata(src.join(rel)).unwrap();
        let i = std::fs::metadata(m.path().join(rel)).unwrap();
        i.blocks() > s.blocks() + 1024
    });
    if version.ends_with("v6.2") {
        assert!(filled, "expected mkfs 6.2 to fill holes");
    }
}

fn walk_files(top: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(top.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(r);
            } else if ft.is_file() {
                out.push(r);
            }
        }
    }
    out
}

fn kernel_case(kind: KernelCorpus) {
    let t = TestDir::new(&kind.name()).unwrap();
    let img = kind.build(&t.join("img")).unwrap();
    btrfs_check(&img).unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    assert!(std::fs::read_dir(m.path()).unwrap().count() > 0);
    // Generated trees: the kernel shows exactly what the generator makes
    // elsewhere (with the same seed), up to filesystem-specific sizes.
    let regen = match kind {
        KernelCorpus::GeneratedTree => Some((1, TreeSpec::default())),
        KernelCorpus::MultiDevice(_) => Some((2, TreeSpec::small())),
        _ => None,
    };
    // The view compares equal to itself under the strictest options (this
    // is how ubtrfs is compared to the kernel): checks that the comparison
    // copes with subvolumes, snapshots and every file kind. (A second kernel
    // mount of the same image beside the first is racy in the kernel's
    // duplicate-fsid handling, so the image is not mounted twice.)
    assert_same(m.path(), m.path(), &CompareOptions::strict());
    if let Some((seed, spec)) = regen {
        let src = t.join("src");
        gen_tree(&src, seed, &spec).unwrap();
        assert_same(&src, m.path(), &CompareOptions::across_filesystems());
    }
    m.unmount().unwrap();
}

macro_rules! kernel_tests {
    ($($name:ident: $kind:expr;)*) => {
        $(
            #[test]
            fn $name() {
                require_privileged!();
                kernel_case($kind);
            }
        )*
        /// Every member of `KernelCorpus::all()` has a test above.
        #[test]
        fn kernel_corpus_is_covered() {
            let tested = vec![$($kind),*];
            assert_eq!(tested, KernelCorpus::all());
        }
    };
}

kernel_tests! {
    kernel_sparse: KernelCorpus::Sparse;
    kernel_sparse_hole_extents: KernelCorpus::SparseHoleExtents;
    kernel_fallocate: KernelCorpus::Fallocate;
    kernel_inline: KernelCorpus::Inline;
    kernel_zlib: KernelCorpus::Compressed(Compression::Zlib);
    kernel_lzo: KernelCorpus::Compressed(Compression::Lzo);
    kernel_zstd: KernelCorpus::Compressed(Compression::Zstd);
    kernel_reflink: KernelCorpus::Reflink;
    kernel_snapshot: KernelCorpus::Snapshot;
    kernel_nested_subvolumes: KernelCorpus::NestedSubvolumes;
    kernel_big_directory: KernelCorpus::BigDirectory;
    kernel_names: KernelCorpus::Names;
    kernel_xattrs: KernelCorpus::Xattrs;
    kernel_hard_links: KernelCorpus::HardLinks;
    kernel_symlinks: KernelCorpus::Symlinks;
    kernel_special: KernelCorpus::Special;
    kernel_generated_tree: KernelCorpus::GeneratedTree;
    kernel_raid0: KernelCorpus::MultiDevice(Profile::Raid0);
    kernel_raid1: KernelCorpus::MultiDevice(Profile::Raid1);
    kernel_raid10: KernelCorpus::MultiDevice(Profile::Raid10);
    kernel_raid1c3: KernelCorpus::MultiDevice(Profile::Raid1c3);
}

/// Compressed images really hold compressed extents (the kernel reports
/// fewer bytes on disk than in the files).
#[test]
fn compressed_images_are_compressed() {
    require_privileged!();
    for c in Compression::ALL {
        let t = TestDir::new("compressed-check").unwrap();
        let img = KernelCorpus::Compressed(c).build(&t.join("img")).unwrap();
        let m = img.mount(&t.join("mnt"), "ro").unwrap();
        let f = m.path().join("compress/text-4m");
        let blocks = std::fs::metadata(&f).unwrap().blocks() * 512;
        // st_blocks of a compressed file counts uncompressed bytes on btrfs;
        // ask the filesystem for the data actually allocated instead.
        let df = run_args(
            "btrfs",
            ["filesystem", "df", "-b", m.path().to_str().unwrap()],
        )
        .unwrap();
        let used: u64 = df
            .lines()
            .find(|l| l.starts_with("Data"))
            .and_then(|l| l.split("used=").nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("cannot parse {df}"));
        assert!(blocks >= 4 << 20);
        // Uncompressed, the files of the corpus hold more than 18 MiB.
        assert!(used < 12 << 20, "{c:?}: {used} bytes of data used\n{df}");
        drop(m);
    }
}

#[test]
fn reflinks_share_extents() {
    require_privileged!();
    let t = TestDir::new("reflink-check").unwrap();
    let img = KernelCorpus::Reflink.build(&t.join("img")).unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    let out = run_args(
        "btrfs",
        [
            "filesystem",
            "du",
            "--raw",
            "-s",
            m.path().join("reflink").to_str().unwrap(),
        ],
    )
    .unwrap();
    // "Total Exclusive Set-shared Filename": shared bytes must be non-zero.
    let last = out.lines().last().unwrap();
    let cols: Vec<&str> = last.split_whitespace().collect();
    let shared: u64 = cols[2].parse().unwrap();
    assert!(shared >= 2 << 20, "{out}");
}

#[test]
fn snapshots_are_subvolumes() {
    require_privileged!();
    let t = TestDir::new("snapshot-check").unwrap();
    let img = KernelCorpus::Snapshot.build(&t.join("img")).unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    let list = run_args("btrfs", ["subvolume", "list", m.path().to_str().unwrap()]).unwrap();
    for sv in ["subvol", "snap-rw", "snap-ro", "snap-of-top"] {
        assert!(
            list.lines().any(|l| l.ends_with(&format!("path {sv}"))),
            "{list}"
        );
    }
    // The snapshot kept the old contents.
    assert!(m.path().join("snap-ro/file-03").exists());
    assert!(!m.path().join("subvol/file-03").exists());
}

#[test]
fn cache_reuses_and_detects_changes() {
    require_privileged!();
    let dir = TestDir::new("cache").unwrap();
    let a = cached_kernel_image(KernelCorpus::Inline).unwrap();
    let b = cached_kernel_image(KernelCorpus::Inline).unwrap();
    assert_eq!(a.devices, b.devices);
    btrfs_check(&a).unwrap();
    // A write to the shared image (which tests must not do) makes the
    // cache rebuild it.
    {
        let m = a.mount(&dir.join("mnt"), "").unwrap();
        std::fs::write(m.path().join("oops"), b"written").unwrap();
    }
    let c = cached_kernel_image(KernelCorpus::Inline).unwrap();
    let m = c.mount(&dir.join("mnt2"), "ro").unwrap();
    assert!(!m.path().join("oops").exists());
    assert!(m.path().join("inline/random-100").exists());
}

#[test]
fn cached_rootdir_image_has_source() {
    require_privileged!();
    let opts = MkfsOptions::default();
    let spec = TreeSpec::small().for_rootdir(&opts);
    let img = cached_rootdir_image(3, &spec, &opts).unwrap();
    let again = cached_rootdir_image(3, &spec, &opts).unwrap();
    assert_eq!(img.devices, again.devices);
    let t = TestDir::new("cached-rootdir").unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    assert_same(
        img.source.as_ref().unwrap(),
        m.path(),
        &CompareOptions::mkfs_rootdir(),
    );
    // A writable copy is independent of the cached image. (Mounted one
    // after the other: both carry the same fsid.)
    m.unmount().unwrap();
    let copy = copy_image(&img, &t.join("copy")).unwrap();
    let mc = copy.mount(&t.join("mnt-copy"), "").unwrap();
    std::fs::write(mc.path().join("new"), b"x").unwrap();
    mc.unmount().unwrap();
    btrfs_check(&copy).unwrap();
    let m = img.mount(&t.join("mnt"), "ro").unwrap();
    assert!(!m.path().join("new").exists());
}

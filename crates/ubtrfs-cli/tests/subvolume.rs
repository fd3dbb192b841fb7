//! `ubtrfs subvolume create` and `ubtrfs subvolume snapshot [-r]` on a
//! kernel-made image: `btrfs check` is clean, the kernel sees each
//! snapshot holding what its source held, flags and parents as `btrfs
//! subvolume` reports them, and both sides can go on writing.

use std::path::Path;
use std::process::{Command, Output};
use testkit::{KernelImageOptions, MkfsOptions, Mount, TestDir, kernel_image};

fn ubtrfs(args: &[&str], img: &Path, rest: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(args)
        .arg(img)
        .args(rest)
        .output()
        .expect("the ubtrfs binary starts")
}

fn show(out: &Output) -> String {
    format!(
        "status {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(args: &[&str], img: &Path, rest: &[&str]) -> String {
    let out = ubtrfs(args, img, rest);
    assert!(
        out.status.success(),
        "ubtrfs {args:?} {rest:?}: {}",
        show(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(args: &[&str], img: &Path, rest: &[&str]) -> String {
    let out = ubtrfs(args, img, rest);
    assert!(
        !out.status.success(),
        "ubtrfs {args:?} {rest:?} should fail: {}",
        show(&out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn check(img: &Path, when: &str) {
    let out =
        testkit::output_of(Command::new("btrfs").args(["check", "--readonly"]).arg(img)).unwrap();
    let text = show(&out);
    assert!(
        out.status.success() && text.contains("no error found") && !text.contains("ERROR"),
        "btrfs check {when}: {text}"
    );
}

use testkit::compare::dir_contents as tree;

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

#[test]
fn create_and_snapshot_from_the_command_line() {
    testkit::require_privileged!();
    let t = TestDir::new("cli-subvolume").unwrap();
    let opts = KernelImageOptions {
        mkfs: MkfsOptions {
            nodesize: 4096,
            ..MkfsOptions::default()
        },
        mount_options: "noatime".into(),
    };
    // A subvolume whose tree has a few levels, filled by the kernel.
    let image = kernel_image(&t.join("img"), &opts, |m| {
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.join("sv")));
        for d in 0..12 {
            std::fs::create_dir(m.join(format!("sv/d{d}")))?;
            for f in 0..100u64 {
                let len = if f % 5 == 0 {
                    9000 + f as usize * 37
                } else {
                    f as usize * 13
                };
                std::fs::write(m.join(format!("sv/d{d}/f{f}")), bytes(d * 1000 + f, len))?;
            }
        }
        std::os::unix::fs::symlink("d1/f1", m.join("sv/link"))?;
        std::fs::create_dir(m.join("into"))?;
        Ok(())
    })
    .unwrap();
    let img = image.path().to_path_buf();

    let out = ok(&["subvolume", "create"], &img, &["/sv/new"]);
    assert!(out.contains("Create subvolume '/sv/new'"), "{out}");
    ok(&["subvolume", "snapshot"], &img, &["/sv", "/snap"]);
    let out = ok(&["subvolume", "snapshot", "-r"], &img, &["/sv", "/into"]);
    assert!(
        out.contains("readonly snapshot of '/sv' in '/into/sv'"),
        "{out}"
    );
    // Refusals: an existing name, a directory that is no subvolume, a
    // read-only snapshot as the parent, a missing parent.
    fails(&["subvolume", "create"], &img, &["/sv/new"]);
    let err = fails(&["subvolume", "snapshot"], &img, &["/sv/d1", "/x"]);
    assert!(err.contains("not a subvolume"), "{err}");
    let err = fails(&["subvolume", "create"], &img, &["/into/sv/x"]);
    assert!(err.contains("read-only"), "{err}");
    fails(&["subvolume", "create"], &img, &["/nowhere/x"]);
    check(&img, "after the snapshots");

    let mnt = t.join("mnt");
    let m = Mount::single(&img, &mnt, "").unwrap();
    let p = m.path();
    let source = tree(&p.join("sv"));
    assert!(source.len() > 1200);
    assert_eq!(tree(&p.join("snap")), source, "writable snapshot");
    assert_eq!(tree(&p.join("into/sv")), source, "read-only snapshot");
    let shown = run(Command::new("btrfs")
        .args(["subvolume", "show"])
        .arg(p.join("into/sv")));
    assert!(shown.contains("readonly"), "{shown}");
    let field = |path: &str, name: &str| {
        let out = run(Command::new("btrfs")
            .args(["subvolume", "show"])
            .arg(p.join(path)));
        out.lines()
            .find(|l| l.trim_start().starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
            .to_string()
    };
    let sv_uuid = field("sv", "UUID:");
    assert_eq!(field("snap", "Parent UUID:"), sv_uuid);
    assert_eq!(field("into/sv", "Parent UUID:"), sv_uuid);
    assert_ne!(field("snap", "UUID:"), sv_uuid);
    let listed = run(Command::new("btrfs").args(["subvolume", "list"]).arg(p));
    for path in ["sv", "sv/new", "snap", "into/sv"] {
        assert!(
            listed.lines().any(|l| l.ends_with(&format!("path {path}"))),
            "{path} not listed:\n{listed}"
        );
    }
    // The kernel writes to the source and the writable snapshot; the
    // read-only one refuses.
    std::fs::write(p.join("sv/d0/f1"), b"changed in sv").unwrap();
    std::fs::remove_file(p.join("snap/d3/f7")).unwrap();
    std::fs::write(p.join("snap/d4/new"), bytes(7, 20000)).unwrap();
    std::fs::write(p.join("sv/new/file"), b"in the new subvolume").unwrap();
    assert!(std::fs::write(p.join("into/sv/d0/f1"), b"x").is_err());
    let snap_now = tree(&p.join("snap"));
    m.unmount().unwrap();
    check(&img, "after the kernel's writes");

    // A snapshot of the snapshot the kernel changed.
    ok(&["subvolume", "snapshot"], &img, &["/snap", "/snap2"]);
    check(&img, "after the second snapshot");
    let m = Mount::single(&img, &mnt, "ro").unwrap();
    assert_eq!(
        tree(&m.path().join("snap2")),
        snap_now,
        "snapshot of a snapshot"
    );
    assert_eq!(
        std::fs::read(m.path().join("sv/d0/f1")).unwrap(),
        b"changed in sv"
    );
    assert_eq!(
        tree(&m.path().join("into/sv")),
        source,
        "read-only snapshot at the end"
    );
    m.unmount().unwrap();
}

/// `ubtrfs subvolume set-default` / `get-default`, of images and through
/// a mount: the kernel's mount without subvol= then shows the default,
/// `btrfs subvolume get-default` names it, ubtrfs reads what the kernel
/// set, and the images stay consistent.
#[test]
fn the_default_subvolume_is_set_and_read_as_the_kernel_does() {
    testkit::require_privileged!();
    let t = TestDir::new("subvolume-default").unwrap();
    let img = t.join("d.img");
    testkit::mkfs_file(&img, 256 << 20, &[]).unwrap();
    ok(&["subvolume", "create"], &img, &["/vol"]);
    ok(&["subvolume", "create"], &img, &["/vol/inner"]);
    assert_eq!(
        ok(&["subvolume", "get-default"], &img, &[]),
        "ID 5 (FS_TREE)\n"
    );
    let kmnt = t.join("kernel");
    // By path, from the command line: the kernel mounts it by default.
    ok(&["subvolume", "set-default"], &img, &["/vol/inner"]);
    check(&img, "after set-default");
    // The line `subvolume list` has for it.
    let listed = ok(&["subvolume", "list"], &img, &[]);
    let line = listed.lines().find(|l| l.starts_with("ID 257 ")).unwrap();
    assert!(line.ends_with("top level 256 path vol/inner"), "{listed}");
    assert_eq!(
        ok(&["subvolume", "get-default"], &img, &[]),
        format!("{line}\n")
    );
    {
        let m = Mount::new(&[&img], &kmnt, "").unwrap();
        std::fs::write(m.path().join("here"), b"in inner\n").unwrap();
        let said = run(Command::new("btrfs")
            .args(["subvolume", "get-default"])
            .arg(m.path()));
        assert!(said.starts_with("ID 257 "), "{said}");
        // The kernel sets it back to the top level; ubtrfs reads that.
        run(Command::new("btrfs")
            .args(["subvolume", "set-default", "5"])
            .arg(m.path()));
        m.unmount().unwrap();
    }
    assert_eq!(
        ok(&["subvolume", "get-default"], &img, &[]),
        "ID 5 (FS_TREE)\n"
    );
    // Through a ubtrfs mount: the id and a path, then the subvolume's own
    // directory.
    let mnt = t.join("fuse");
    let m = testkit::fuse_mount::UbtrfsMount::start(
        Path::new(env!("CARGO_BIN_EXE_ubtrfs")),
        &[&img],
        &mnt,
        &[],
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_ubtrfs");
    run(Command::new(bin)
        .args(["subvolume", "set-default", "256"])
        .arg(m.path()));
    let said = run(Command::new(bin)
        .args(["subvolume", "get-default"])
        .arg(m.path()));
    assert!(
        said.starts_with("ID 256 ") && said.ends_with("path vol\n"),
        "{said}"
    );
    run(Command::new(bin)
        .args(["subvolume", "set-default"])
        .arg(m.path().join("vol/inner")));
    let said = run(Command::new(bin)
        .args(["subvolume", "get-default"])
        .arg(m.path()));
    assert!(said.starts_with("ID 257 "), "{said}");
    // A subvolume that is not there: refused, nothing changed.
    let out = Command::new(bin)
        .args(["subvolume", "set-default", "999"])
        .arg(m.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", show(&out));
    m.unmount().unwrap();
    check(&img, "after set-default through a mount");
    let m = Mount::new(&[&img], &kmnt, "").unwrap();
    assert_eq!(
        std::fs::read(m.path().join("here")).unwrap(),
        b"in inner\n",
        "the kernel's mount does not show the default"
    );
    m.unmount().unwrap();
    // By id, of the images: back to the top level.
    ok(&["subvolume", "set-default"], &img, &["0"]);
    assert_eq!(
        ok(&["subvolume", "get-default"], &img, &[]),
        "ID 5 (FS_TREE)\n"
    );
    check(&img, "after set-default 0");
}

//! `ubtrfs subvolume delete` on a kernel-made image: refusals exit
//! non-zero with a clear message, a deleted snapshot is gone for the
//! kernel while its origin is intact, and `btrfs check` stays clean.

use std::path::Path;
use std::process::{Command, Output};
use testkit::{KernelImageOptions, Mount, TestDir, kernel_image};

fn ubtrfs(img: &Path, path: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(["subvolume", "delete"])
        .arg(img)
        .arg(path)
        .output()
        .expect("the ubtrfs binary starts")
}

fn run(cmd: &mut Command) -> String {
    testkit::run(cmd).unwrap_or_else(|e| panic!("{e:#}"))
}

fn check(img: &Path, when: &str) {
    if let Err(e) = testkit::btrfs_check_file(img, &[]) {
        panic!("{when}: {e:#}");
    }
}

#[test]
fn delete_from_the_command_line() {
    testkit::require_privileged!();
    let help = Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(["subvolume", "delete", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && text.contains("ubtrfs subvolume delete <DEV>... <PATH>"),
        "{text}"
    );

    let t = TestDir::new("cli-subvol-delete").unwrap();
    let image = kernel_image(&t.join("img"), &KernelImageOptions::default(), |m| {
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.join("sv")));
        for i in 0..50u32 {
            std::fs::write(m.join(format!("sv/f{i}")), vec![i as u8; 5000 + i as usize])?;
        }
        std::fs::create_dir(m.join("sv/dir"))?;
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(m.join("sv"))
            .arg(m.join("snap")));
        Ok(())
    })
    .unwrap();
    let img = image.path().to_path_buf();

    for (path, why) in [
        ("/", "top level"),
        ("/missing", "missing"),
        ("/nowhere/x", "nowhere"),
        ("/sv/dir", "not a subvolume"),
        ("/sv/f1", "not a directory"),
    ] {
        let out = ubtrfs(&img, path);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path} should fail");
        assert!(err.to_lowercase().contains(why), "{path}: {err}");
    }
    let mnt = t.join("mnt");
    let m = Mount::single(&img, &mnt, "ro").unwrap();
    let before: Vec<Vec<u8>> = (0..50)
        .map(|i| std::fs::read(m.path().join(format!("sv/f{i}"))).unwrap())
        .collect();
    m.unmount().unwrap();

    let out = ubtrfs(&img, "/snap");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Delete subvolume '/snap'"));
    check(&img, "after the deletion");
    let out = ubtrfs(&img, "/snap");
    assert!(!out.status.success(), "deleted twice");

    let m = Mount::single(&img, &mnt, "").unwrap();
    assert!(!m.path().join("snap").exists());
    for (i, want) in before.iter().enumerate() {
        let got = std::fs::read(m.path().join(format!("sv/f{i}"))).unwrap();
        assert!(got == *want, "sv/f{i} changed");
    }
    std::fs::write(m.path().join("sv/f3"), b"kernel write").unwrap();
    m.unmount().unwrap();
    check(&img, "after the kernel's write");
}

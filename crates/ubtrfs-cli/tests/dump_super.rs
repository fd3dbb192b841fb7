//! `ubtrfs inspect dump-super` agrees with `btrfs inspect-internal
//! dump-super` on every field both print, for each checksum type and for
//! the superblock mirror.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// `key value` lines as a map of key to the value's first word.
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next().unwrap_or("");
            (!k.starts_with('-') && !k.starts_with('(') && !k.ends_with(':'))
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn compare(img: &Path, mirror: &str) {
    let ours = fields(&run(Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(["inspect", "dump-super", "-s", mirror])
        .arg(img)));
    let theirs = fields(&run(Command::new("btrfs")
        .args(["inspect-internal", "dump-super", "-s", mirror])
        .arg(img)));
    // btrfs-progs prints `leafsize (deprecated)`: an annotation, not a value.
    let shared: Vec<&String> = ours
        .keys()
        .filter(|k| theirs.get(*k).is_some_and(|v| !v.starts_with('(')))
        .collect();
    assert!(
        shared.len() >= 40,
        "only {} shared fields: {:?}",
        shared.len(),
        shared
    );
    for k in shared {
        assert_eq!(ours[k], theirs[k], "{}: field {k}", img.display());
    }
}

#[test]
fn agrees_with_btrfs_progs() {
    let dir = tempfile::tempdir().unwrap();
    for csum in ["crc32c", "xxhash", "sha256", "blake2"] {
        let img = dir.path().join(format!("{csum}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(300 << 20)
            .unwrap();
        run(Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-L", "lbl", "--csum", csum])
            .arg(&img));
        compare(&img, "0");
        compare(&img, "1");
    }
    // A bad copy is an error that names it, not a dump of garbage.
    let img = dir.path().join("crc32c.img");
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xff; 8], 0x10000 + 0x40).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(["inspect", "dump-super"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("magic"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

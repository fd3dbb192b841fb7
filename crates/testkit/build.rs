//! Exposes a hash of the test kit's sources as `TESTKIT_SRC_HASH`, so the
//! corpus cache can tell images made by another version of the generators.

use std::hash::{Hash, Hasher};

fn main() {
    println!("cargo::rerun-if-changed=src");
    let mut files: Vec<_> = std::fs::read_dir("src")
        .expect("src dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.file_name().hash(&mut h);
        std::fs::read(&f).expect("read source").hash(&mut h);
    }
    println!("cargo::rustc-env=TESTKIT_SRC_HASH={:016x}", h.finish());
}

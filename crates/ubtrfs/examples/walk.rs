//! Print every path of a btrfs image with its kind, size and a content hash.
//!
//! `cargo run --example walk -- disk.img [more devices...]`

use ubtrfs::fs::{FileKind, Filesystem, InodeId};

fn walk(fs: &Filesystem, dir: InodeId, path: &str) -> ubtrfs::Result<()> {
    for e in fs.read_dir(dir, 0)? {
        let name = String::from_utf8_lossy(&e.name);
        let p = format!("{path}/{name}");
        let st = fs.stat(e.id)?;
        let extra = match st.kind {
            FileKind::File => format!("{:08x}", crc32c_of(&fs.read_all(e.id)?)),
            FileKind::Symlink => String::from_utf8_lossy(&fs.read_link(e.id)?).into_owned(),
            _ => String::new(),
        };
        println!("{p} {:?} {:o} {} {extra}", st.kind, st.mode, st.size);
        if st.kind == FileKind::Dir {
            walk(fs, e.id, &p)?;
        }
    }
    Ok(())
}

fn crc32c_of(b: &[u8]) -> u32 {
    // A cheap content fingerprint for eyeballing.
    b.iter().fold(0u32, |h, &x| h.rotate_left(5) ^ x as u32)
}

fn main() -> ubtrfs::Result<()> {
    let devices: Vec<String> = std::env::args().skip(1).collect();
    let fs = Filesystem::open(&devices)?;
    for w in fs.warnings() {
        eprintln!("warning: {w}");
    }
    walk(&fs, fs.root(), "")
}

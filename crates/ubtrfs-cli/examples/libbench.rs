//! The workloads of `bench/metadata.sh` run through the ubtrfs library
//! directly, without FUSE: what the filesystem itself costs, so the
//! benchmark can tell it apart from what the FUSE round trips add.
//!
//! ```text
//! libbench PHASE IMAGE FILES DIRS THREADS [SIZE]
//!   PHASE: create | stat | readdir | unlink | rmdir   (the names of bench/smallfiles.c)
//!        | write | read                             (FILES MiB of one file /seqfile, 1 MiB calls)
//! ```
//!
//! Each run opens the image, times the phase, commits (timed apart: the
//! durable point, like an unmount or syncfs), and prints one JSON line.
//! THREADS threads share one `Filesystem`, each owning every THREADS-th
//! directory, like the processes of `smallfiles.c`.

use anyhow::{Context, Result, bail};
use std::time::Instant;
use ubtrfs::fs::{Filesystem, InodeId, NewInode};

struct Args {
    phase: String,
    image: String,
    files: u64,
    dirs: u64,
    threads: u64,
    size: usize,
}

fn args() -> Result<Args> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if !(5..=6).contains(&a.len()) {
        bail!(
            "usage: libbench create|stat|readdir|unlink|rmdir|write|read IMAGE FILES DIRS THREADS [SIZE]"
        );
    }
    let num = |s: &str, what: &str| -> Result<u64> {
        s.parse()
            .with_context(|| format!("{what} {s:?} is not a number"))
    };
    let r = Args {
        phase: a[0].clone(),
        image: a[1].clone(),
        files: num(&a[2], "FILES")?,
        dirs: num(&a[3], "DIRS")?.max(1),
        threads: num(&a[4], "THREADS")?.max(1),
        size: a.get(5).map(|s| num(s, "SIZE")).transpose()?.unwrap_or(0) as usize,
    };
    Ok(r)
}

fn dir_name(d: u64) -> Vec<u8> {
    format!("d{d:04}").into_bytes()
}

fn file_name(i: u64) -> Vec<u8> {
    format!("f{i:07}").into_bytes()
}

fn file() -> NewInode {
    NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    }
}

/// One thread's share of a small-file phase; returns the operations done.
fn small(fs: &Filesystem, a: &Args, me: u64) -> Result<u64> {
    let root = fs.root();
    let data = vec![b'x'; a.size];
    let mut ops = 0;
    let mut d = me;
    while d < a.dirs {
        if a.phase == "rmdir" {
            fs.rmdir(root, &dir_name(d))?;
            ops += 1;
            d += a.threads;
            continue;
        }
        // The kernel keeps the directory's dentry cached after the first
        // lookup; so does this loop.
        let dir: InodeId = fs.lookup(root, &dir_name(d))?.id;
        if a.phase == "readdir" {
            let mut after = 0;
            loop {
                let page = fs.read_dir(dir, after)?;
                let Some(last) = page.last() else { break };
                after = last.index;
                ops += page.len() as u64;
            }
            d += a.threads;
            continue;
        }
        let mut i = d;
        while i < a.files {
            let name = file_name(i);
            match a.phase.as_str() {
                "create" => {
                    let st = fs.create(dir, &name, file())?;
                    if !data.is_empty() {
                        fs.write(st.id, 0, &data)?;
                    }
                }
                "stat" => {
                    let e = fs.lookup(dir, &name)?;
                    std::hint::black_box(fs.stat(e.id)?);
                }
                "unlink" => fs.unlink(dir, &name)?,
                p => bail!("unknown phase {p}"),
            }
            ops += 1;
            i += a.dirs;
        }
        d += a.threads;
    }
    Ok(ops)
}

fn main() -> Result<()> {
    let a = args()?;
    let t_open = Instant::now();
    let read_only = matches!(a.phase.as_str(), "stat" | "readdir" | "read");
    let fs = if read_only {
        Filesystem::open(&[&a.image])
    } else {
        Filesystem::open_read_write(&[&a.image])
    }
    .with_context(|| format!("opening {}", a.image))?;
    let open_s = t_open.elapsed().as_secs_f64();
    let root = fs.root();
    if a.phase == "create" {
        for d in 0..a.dirs {
            fs.mkdir(root, &dir_name(d), 0o755, 0, 0)?;
        }
    }
    let t = Instant::now();
    let ops = match a.phase.as_str() {
        "write" => {
            let st = fs.create(root, b"seqfile", file())?;
            let buf: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
            for i in 0..a.files {
                fs.write(st.id, i << 20, &buf)?;
            }
            a.files
        }
        "read" => {
            let id = fs.lookup(root, b"seqfile")?.id;
            let size = fs.stat(id)?.size;
            let mut off = 0;
            while off < size {
                let got = fs.read(id, off, 1 << 20)?;
                if got.is_empty() {
                    break;
                }
                off += got.len() as u64;
            }
            off >> 20
        }
        _ => {
            let fs = &fs;
            let a = &a;
            let per: Vec<Result<u64>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..a.threads)
                    .map(|me| s.spawn(move || small(fs, a, me)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| bail!("a thread panicked")))
                    .collect()
            });
            let mut ops = 0;
            for r in per {
                ops += r?;
            }
            ops
        }
    };
    let secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    if !read_only {
        fs.commit()?;
    }
    let commit_s = t.elapsed().as_secs_f64();
    println!(
        "{{\"phase\": \"{}\", \"procs\": {}, \"ops\": {ops}, \"secs\": {secs:.6}, \"commit_secs\": {commit_s:.6}, \"open_secs\": {open_s:.6}, \"errors\": 0}}",
        a.phase, a.threads
    );
    Ok(())
}

//! fsync durability, judged by the kernel: random writes, appends,
//! overwrites, truncates, hole punches, xattr and mode changes on existing
//! files (written by ubtrfs, or by the kernel), some of them fsync'd, more
//! changes left unsynced, on a recording device. Power cuts after every
//! flush and every FUA write of the device's log, and at its end: ubtrfs's
//! read-only open (which replays any log tree in memory) and the kernel's
//! mount (which replays it on disk) must show every file fsync'd before the
//! cut in its state at that fsync or a later one, never an earlier one;
//! `btrfs check` is clean after the kernel's unmount.
//!
//! [`Filesystem::fsync`] logs these files (their names never change) and
//! commits for anything it cannot log; the oracle holds for both paths,
//! and each logged fsync costs one flush and at most one FUA write.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use ubtrfs::data::compression::Compression;
use ubtrfs::device::recording::{Op, cut_points, replay};
use ubtrfs::device::{Device, MemDevice, RecordingDevice};
use ubtrfs::fs::{Filesystem, InodeId, NewInode, SetAttr};
use ubtrfs::tree_log::Synced;
use ubtrfs::volume::DeviceSet;

const FILES: usize = 6;
/// A regular file owned by root.
const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};
const PUNCH: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32 | libc::FALLOC_FL_KEEP_SIZE as u32;

/// What a file shows: content, permission bits, user xattrs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileState {
    data: Vec<u8>,
    mode: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Ops in the device log when an fsync returned, the index in each file's
/// history of its last fsync'd state, and which hard links were durable.
type Mark = (usize, Vec<Option<usize>>, Vec<bool>);

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn state_of(fs: &Filesystem, id: InodeId) -> FileState {
    let mut xattrs = BTreeMap::new();
    for name in fs.list_xattrs(id).unwrap() {
        if name.starts_with(b"user.") {
            let v = fs.get_xattr(id, &name).unwrap().unwrap();
            xattrs.insert(name, v);
        }
    }
    FileState {
        data: fs.read_all(id).unwrap(),
        mode: fs.stat(id).unwrap().mode & 0o7777,
        xattrs,
    }
}

/// The kernel's view of the file at `p`.
fn kernel_state(p: &Path) -> FileState {
    let data = std::fs::read(p).unwrap();
    let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: `c` is a valid C string and `buf` is writable for its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr {}", p.display());
    let mut xattrs = BTreeMap::new();
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: valid C strings and a writable buffer of the given length.
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(m >= 0, "getxattr {}", p.display());
        v.truncate(m as usize);
        xattrs.insert(name.to_vec(), v);
    }
    FileState { data, mode, xattrs }
}

/// One random change to file `id`.
fn mutate(fs: &Filesystem, id: InodeId, seed: &mut u64) {
    let size = fs.stat(id).unwrap().size;
    let byte = (rng(seed) % 250) as u8 + 1;
    match rng(seed) % 8 {
        0 | 1 => {
            // Overwrite inside (or a little past) the file.
            let off = rng(seed) % (size + 1);
            let len = (rng(seed) % 40_000 + 1) as usize;
            fs.write(id, off, &vec![byte; len]).unwrap();
        }
        2 => {
            let len = (rng(seed) % 200_000 + 1) as usize;
            fs.write(id, size, &vec![byte; len]).unwrap();
        }
        3 => {
            // Write past the end, leaving a hole.
            let off = size + rng(seed) % 100_000;
            fs.write(id, off, &[byte; 5000]).unwrap();
        }
        4 => fs.truncate(id, rng(seed) % (size + 1)).unwrap(),
        5 if size > 0 => {
            let off = rng(seed) % size;
            let len = rng(seed) % 70_000 + 1;
            fs.fallocate(id, PUNCH, off, len).unwrap();
        }
        6 => {
            let name = format!("user.k{}", rng(seed) % 3);
            if rng(seed).is_multiple_of(3) {
                let _ = fs.remove_xattr(id, name.as_bytes());
            } else {
                let len = (rng(seed) % 300) as usize;
                fs.set_xattr(id, name.as_bytes(), &vec![byte; len], 0)
                    .unwrap();
            }
        }
        _ => {
            let mode = 0o600 | (rng(seed) as u32 & 0o077);
            fs.setattr(
                id,
                SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                },
            )
            .unwrap();
        }
    }
}

/// The workload and its oracle on a fresh `mkfs.btrfs ARGS` image whose
/// files ubtrfs writes, or the kernel when `kernel_files`.
fn fsyncs_survive(
    name: &str,
    mkfs_args: &[&str],
    kernel_files: bool,
    compress: Option<Compression>,
    mut seed: u64,
) {
    let dir = testkit::TestDir::new(name).unwrap();
    let contents: Vec<(String, Vec<u8>)> = (0..FILES)
        .map(|i| {
            let len = (rng(&mut seed) % 300_000) as usize;
            (format!("/f{i}"), testkit::xorshift_bytes(seed, len))
        })
        .collect();
    let img = if kernel_files {
        let imgs = testkit::mkfs_devices_with_files(dir.path(), 1, 256 << 20, mkfs_args, &contents)
            .unwrap();
        imgs[0].clone()
    } else {
        let img = dir.path().join("base.img");
        testkit::mkfs_file(&img, 256 << 20, mkfs_args).unwrap();
        img
    };
    // The files exist, with data and xattrs, in a committed state.
    let (mut ids, sub): (Vec<InodeId>, Option<InodeId>) = {
        let fs = Filesystem::open_read_write(&[&img]).unwrap();
        // Files ubtrfs writes: the odd ones in a subvolume, so the log
        // holds a tree per subvolume.
        let sub = (!kernel_files).then(|| fs.create_subvolume(fs.root(), b"sv", 0, 0).unwrap());
        let ids = contents
            .iter()
            .enumerate()
            .map(|(i, (path, data))| {
                let id = if kernel_files {
                    fs.resolve_path(path.as_bytes()).unwrap()
                } else {
                    let dir = match sub {
                        Some(sv) if i % 2 == 1 => sv,
                        _ => fs.root(),
                    };
                    let f = fs.create(dir, &path.as_bytes()[1..], FILE).unwrap();
                    fs.write(f.id, 0, data).unwrap();
                    f.id
                };
                fs.set_xattr(id, b"user.k0", b"initial", 0).unwrap();
                id
            })
            .collect();
        fs.commit().unwrap();
        (ids, sub)
    };
    let base = std::fs::read(&img).unwrap();

    let rec = Arc::new(RecordingDevice::new(Arc::new(MemDevice::new(
        &img,
        base.clone(),
    ))));
    let set = DeviceSet::from_devices(vec![rec.clone() as Arc<dyn Device>]).unwrap();
    let fs = Filesystem::open_devices_read_write(set).unwrap();
    // Each incremental log must equal the one made from scratch.
    fs.set_log_self_check(true).unwrap();
    fs.set_compression(compress.map(|c| (c, None))).unwrap();
    // Each file's path under the mount: the odd ones of ubtrfs' files are
    // in the subvolume.
    let mut rels: Vec<String> = (0..FILES)
        .map(|f| match sub {
            Some(_) if f % 2 == 1 => format!("sv/f{f}"),
            _ => format!("f{f}"),
        })
        .collect();
    // history[f]: every state file f went through; synced[f]: the index in
    // history[f] of its last fsync'd state (None: never fsync'd, a file
    // created since).
    let mut history: Vec<Vec<FileState>> = ids.iter().map(|&id| vec![state_of(&fs, id)]).collect();
    let mut synced: Vec<Option<usize>> = vec![Some(0); FILES];
    // Hard links made since: (file, path under the mount), and whether an
    // fsync of the file (or a commit) has made each durable.
    let mut links: Vec<(usize, String)> = Vec::new();
    let mut linked: Vec<bool> = Vec::new();
    // marks: (ops in the device log when an fsync returned, synced indexes,
    // durable links).
    let mut marks: Vec<Mark> = vec![(0, synced.clone(), linked.clone())];
    let (mut logged, mut committed) = (0, 0);
    // fsyncs right after a hard link, and how many of them were logged.
    let (mut link_fsyncs, mut links_logged) = (0, 0);
    for step in 0..40 {
        let mut g = None;
        let mut after_link = false;
        if step % 5 == 2 {
            // A new file, written and (mostly) fsync'd at once: logged
            // with its name.
            let k = ids.len();
            let (dir, rel) = match sub {
                Some(sv) if k % 2 == 1 => (sv, format!("sv/n{k}")),
                _ => (fs.root(), format!("n{k}")),
            };
            let id = fs
                .create(
                    dir,
                    &rel.as_bytes()[rel.len() - format!("n{k}").len()..],
                    FILE,
                )
                .unwrap()
                .id;
            let len = (rng(&mut seed) % 150_000) as usize;
            fs.write(id, 0, &testkit::xorshift_bytes(seed, len))
                .unwrap();
            ids.push(id);
            rels.push(rel);
            history.push(vec![state_of(&fs, id)]);
            synced.push(None);
            if !rng(&mut seed).is_multiple_of(4) {
                g = Some(k);
            }
        } else if step % 7 == 4 {
            // A hard link next to the file, then (logged) an fsync of it.
            let f = (rng(&mut seed) % ids.len() as u64) as usize;
            let (dir_rel, name) = match rels[f].rsplit_once('/') {
                Some((d, _)) => (format!("/{d}"), format!("l{step}")),
                None => ("/".to_string(), format!("l{step}")),
            };
            let dir = fs.resolve_path(dir_rel.as_bytes()).unwrap();
            fs.link(ids[f], dir, name.as_bytes()).unwrap();
            let rel = match rels[f].rsplit_once('/') {
                Some((d, _)) => format!("{d}/{name}"),
                None => name,
            };
            links.push((f, rel));
            linked.push(false);
            history[f].push(state_of(&fs, ids[f]));
            g = Some(f);
            after_link = true;
        } else {
            let f = (rng(&mut seed) % ids.len() as u64) as usize;
            mutate(&fs, ids[f], &mut seed);
            history[f].push(state_of(&fs, ids[f]));
            if step % 4 == 3 {
                g = Some((rng(&mut seed) % ids.len() as u64) as usize);
            }
        }
        if let Some(g) = g {
            let before = rec.log();
            let how = fs.fsync(ids[g], rng(&mut seed).is_multiple_of(2)).unwrap();
            if after_link {
                link_fsyncs += 1;
                links_logged += usize::from(how == Synced::Logged);
            }
            let log = rec.log();
            let new = &log[before.len()..];
            let flushes = new.iter().filter(|o| **o == Op::Flush).count();
            let fuas = new.iter().filter(|o| matches!(o, Op::Fua { .. })).count();
            match how {
                // The log reached the disk: one flush, then at most the
                // superblock by FUA (none when the log did not change).
                Synced::Logged => {
                    logged += 1;
                    assert_eq!(flushes, 1, "fsync {step}: {new:?}");
                    assert!(fuas <= 1, "fsync {step}: {new:?}");
                    if fuas == 1 {
                        let flush = new.iter().position(|o| *o == Op::Flush);
                        let fua = new.iter().position(|o| matches!(o, Op::Fua { .. }));
                        assert!(flush < fua, "fsync {step}: FUA before the flush");
                    }
                }
                Synced::Committed => {
                    committed += 1;
                    let flush = new.iter().rposition(|o| *o == Op::Flush);
                    let fua = new.iter().rposition(|o| matches!(o, Op::Fua { .. }));
                    assert!(
                        matches!((flush, fua), (Some(a), Some(b)) if a < b),
                        "fsync {step} wrote no flush followed by a FUA write"
                    );
                    // A commit makes every file durable as it is.
                    for (f, h) in history.iter().enumerate() {
                        synced[f] = Some(h.len() - 1);
                    }
                    linked.iter_mut().for_each(|l| *l = true);
                }
                Synced::Nothing => assert!(new.is_empty(), "fsync {step}: {new:?}"),
            }
            synced[g] = Some(history[g].len() - 1);
            for (l, (f, _)) in links.iter().enumerate() {
                linked[l] |= *f == g;
            }
            marks.push((log.len(), synced.clone(), linked.clone()));
        }
    }
    // Files whose names do not change, and new files, are logged, not
    // committed.
    assert!(
        logged > committed,
        "{name}: {logged} fsyncs logged, {committed} committed"
    );
    // A file with a new hard link is logged with all its names.
    assert!(
        link_fsyncs > 0 && links_logged == link_fsyncs,
        "{name}: {links_logged} of {link_fsyncs} fsyncs after a hard link logged"
    );
    // More changes nobody syncs.
    for _ in 0..10 {
        let f = (rng(&mut seed) % ids.len() as u64) as usize;
        mutate(&fs, ids[f], &mut seed);
        history[f].push(state_of(&fs, ids[f]));
    }
    let log = rec.log();
    drop(fs);
    // Power cuts: after every flush and every FUA write (the device then
    // holds exactly the ops before it), and at the very end. The fsyncs
    // that had returned by then must show.
    let cuts: Vec<(usize, &Mark)> = cut_points(&log)
        .into_iter()
        .map(|c| {
            let m = marks.iter().rev().find(|(at, _, _)| *at <= c).unwrap();
            (c, m)
        })
        .collect();
    assert!(cuts.len() > marks.len(), "every fsync flushed");

    let work = dir.path().join("cut.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    for (n, &(cut, (_, synced, durable))) in cuts.iter().enumerate() {
        let due_links: Vec<&(usize, String)> = links
            .iter()
            .zip(durable.iter().chain(std::iter::repeat(&false)))
            .filter(|(_, d)| **d)
            .map(|(l, _)| l)
            .collect();
        let mut image = base.clone();
        replay(&mut image, &log[..cut]);
        std::fs::write(&work, &image).unwrap();
        // btrfs-progs reads the cut as it is, its log tree included.
        testkit::btrfs_check_file(&work, &[]).unwrap();
        // So does ubtrfs check: the last commit, the log left alone.
        let report = ubtrfs::fs::Filesystem::open_without_log_replay(&[&work])
            .unwrap()
            .check(&mut |_| {})
            .unwrap();
        assert!(report.clean(), "{name}: cut {n}: {report}");
        // The files fsync'd by the cut, with the index of that state.
        let due: Vec<(usize, usize)> = synced
            .iter()
            .enumerate()
            .filter_map(|(f, s)| s.map(|s| (f, s)))
            .collect();
        let allowed = |f: usize, s: usize, got: &FileState| history[f][s..].contains(got);
        // ubtrfs's own read-only open (replaying any log in memory, writing
        // nothing) shows the fsyncs, before the kernel touches the image.
        {
            let fs = Filesystem::open(&[&work]).unwrap();
            for &(f, s) in &due {
                let path = format!("/{}", rels[f]);
                let id = fs
                    .resolve_path(path.as_bytes())
                    .unwrap_or_else(|e| panic!("{name}: cut {n}: ubtrfs lost {path}: {e}"));
                let got = state_of(&fs, id);
                assert!(
                    allowed(f, s, &got),
                    "{name}: cut {n}: ubtrfs shows {path} in no state since its last fsync"
                );
            }
            for (f, link) in &due_links {
                let at = fs.resolve_path(format!("/{link}").as_bytes());
                let file = fs.resolve_path(format!("/{}", rels[*f]).as_bytes());
                assert!(
                    matches!((&at, &file), (Ok(a), Ok(b)) if a == b),
                    "{name}: cut {n}: ubtrfs lost the fsync'd link {link}: {at:?}"
                );
            }
        }
        // The kernel replays whatever log the image has, then shows the files.
        {
            let m = testkit::Mount::single(&work, &mnt, "").unwrap();
            for &(f, s) in &due {
                let got = kernel_state(&m.path().join(&rels[f]));
                assert!(
                    allowed(f, s, &got),
                    "{name}: cut {n}: the kernel shows f{f} (size {}) in no state since its last fsync",
                    got.data.len()
                );
            }
            for (f, link) in &due_links {
                use std::os::unix::fs::MetadataExt;
                let at = std::fs::metadata(m.path().join(link)).map(|s| s.ino());
                let file = std::fs::metadata(m.path().join(&rels[*f])).map(|s| s.ino());
                assert!(
                    matches!((&at, &file), (Ok(a), Ok(b)) if a == b),
                    "{name}: cut {n}: the kernel lost the fsync'd link {link}: {at:?}"
                );
            }
            m.unmount().unwrap();
        }
        testkit::btrfs_check_file(&work, &[]).unwrap();
    }
}

#[test]
fn fsync_4k_crc32c() {
    testkit::require_privileged!();
    fsyncs_survive("log-write-4k", &["-n", "4096"], false, None, 0x10_9a11);
}

#[test]
fn fsync_16k_xxhash() {
    testkit::require_privileged!();
    fsyncs_survive(
        "log-write-16k-xxhash",
        &["--csum", "xxhash"],
        false,
        None,
        0xfee1,
    );
}

#[test]
fn fsync_without_no_holes() {
    testkit::require_privileged!();
    fsyncs_survive(
        "log-write-holes",
        &["-O", "^no-holes"],
        false,
        None,
        0xb0_1e5,
    );
}

/// Compressed extents: the log carries the checksums of each whole
/// compressed extent, which both replays look up.
#[test]
fn fsync_zstd_compressed() {
    testkit::require_privileged!();
    fsyncs_survive(
        "log-write-zstd",
        &[],
        false,
        Some(Compression::Zstd),
        0xc0_3e55,
    );
}

#[test]
fn fsync_kernel_written_files() {
    testkit::require_privileged!();
    fsyncs_survive(
        "log-write-kernel",
        &["--csum", "sha256"],
        true,
        None,
        0x4e_12e1,
    );
}

/// Big files (many leaves of extent items, 4 KiB nodes) fsync'd again and
/// again in one transaction: each log is made incrementally from what
/// changed since the last one, and must equal the log made from scratch
/// (the self-check fails the fsync otherwise). A crash image taken at the
/// end shows every file as fsync'd or later. No kernel or root needed.
#[test]
fn incremental_logs_match_full_logs() {
    use ubtrfs::mkfs::{MkfsOptions, make_filesystem_at};
    let dir = testkit::TestDir::new("log-incremental").unwrap();
    let img = dir.path().join("inc.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    make_filesystem_at(
        &[&img],
        &MkfsOptions {
            nodesize: 4096,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let mut seed = 0x5eed_1095u64;
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let ids: Vec<InodeId> = (0..3)
        .map(|i| {
            let id = fs
                .create(fs.root(), format!("big{i}").as_bytes(), FILE)
                .unwrap()
                .id;
            fs.write(id, 0, &testkit::xorshift_bytes(i, 4 << 20))
                .unwrap();
            id
        })
        .collect();
    fs.commit().unwrap();
    fs.set_log_self_check(true).unwrap();
    let mut history: Vec<Vec<FileState>> = ids.iter().map(|&id| vec![state_of(&fs, id)]).collect();
    let mut synced = vec![0usize; ids.len()];
    let mut logged = 0;
    for step in 0..300u64 {
        let f = (rng(&mut seed) % ids.len() as u64) as usize;
        let id = ids[f];
        let size = fs.stat(id).unwrap().size;
        let byte = (step % 250) as u8 + 1;
        match rng(&mut seed) % 10 {
            0..=5 => {
                // Small scattered overwrites: one new extent each.
                let off = rng(&mut seed) % (size + 1) / 4096 * 4096;
                fs.write(id, off, &[byte; 4096]).unwrap();
            }
            6 => {
                let off = rng(&mut seed) % (size + 1);
                fs.write(
                    id,
                    off,
                    &vec![byte; (rng(&mut seed) % 300_000) as usize + 1],
                )
                .unwrap();
            }
            7 => fs
                .truncate(id, size - rng(&mut seed) % (size / 8 + 1))
                .unwrap(),
            8 if size > 0 => {
                let off = rng(&mut seed) % size;
                fs.fallocate(id, PUNCH, off, rng(&mut seed) % 200_000 + 1)
                    .unwrap();
            }
            _ => fs
                .set_xattr(id, b"user.k0", &step.to_le_bytes(), 0)
                .unwrap(),
        }
        history[f].push(state_of(&fs, id));
        if !rng(&mut seed).is_multiple_of(3) {
            if fs.fsync(id, false).unwrap() == Synced::Logged {
                logged += 1;
            }
            synced[f] = history[f].len() - 1;
        }
    }
    assert!(logged > 150, "only {logged} fsyncs were logged");
    // A crash now: the image as written so far, the log included.
    let crash = dir.path().join("crash.img");
    std::fs::copy(&img, &crash).unwrap();
    drop(fs);
    let fs = Filesystem::open(&[&crash]).unwrap();
    for (f, &id) in ids.iter().enumerate() {
        let got = state_of(&fs, id);
        assert!(
            history[f][synced[f]..].contains(&got),
            "big{f}: the crash image shows no state since its last fsync"
        );
    }
}

//! Power cuts at every point: the recording device logs every write, flush
//! and FUA of a workload; each prefix of the log that ends at a flush or a
//! FUA write, alone and with random subsets of the writes that followed it
//! unflushed, is replayed onto the original image. Every replayed image
//! must pass `btrfs check`, and hold exactly the state of the last commit
//! whose superblock reached the disk.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use ubtrfs::device::recording::{Op, replay};
use ubtrfs::device::{Device, MemDevice, RecordingDevice};
use ubtrfs::fs::{FileKind, Filesystem, InodeId, NewInode};
use ubtrfs::volume::DeviceSet;

type State = BTreeMap<String, Vec<u8>>;

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn walk(fs: &Filesystem, dir: InodeId, prefix: &str, out: &mut State) {
    for e in fs.read_dir(dir, 0).unwrap() {
        let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
        if e.kind == FileKind::Dir {
            out.insert(format!("{path}/"), Vec::new());
            walk(fs, e.id, &path, out);
        } else {
            out.insert(path, fs.read_all(e.id).unwrap());
        }
    }
}

#[test]
fn every_cut_shows_the_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("base.img");
    testkit::mkfs_file(&img, 160 << 20, &[]).unwrap();
    let base = std::fs::read(&img).unwrap();

    let rec = Arc::new(RecordingDevice::new(Arc::new(MemDevice::new(
        &img,
        base.clone(),
    ))));
    let set = DeviceSet::from_devices(vec![rec.clone() as Arc<dyn Device>]).unwrap();
    let fs = Filesystem::open_devices_read_write(set).unwrap();
    let base_gen = fs.superblock().generation;
    let file = NewInode {
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
    };
    let mut seed = 0x5eed_u64;
    // states[k]: what commit k (generation base_gen + k) holds.
    let mut states: Vec<State> = vec![State::new()];
    let mut live: Vec<String> = Vec::new();
    for round in 0..8 {
        let d = fs
            .mkdir(fs.root(), format!("r{round}").as_bytes(), 0o755, 0, 0)
            .unwrap();
        for i in 0..6 {
            let name = format!("f{i}");
            let f = fs.create(d.id, name.as_bytes(), file).unwrap();
            let len = [10, 3000, 5000, 70_000, 300_000][(rng(&mut seed) % 5) as usize];
            let byte = (rng(&mut seed) % 250) as u8 + 1;
            fs.write(f.id, 0, &vec![byte; len]).unwrap();
            live.push(format!("/r{round}/{name}"));
        }
        // Overwrite and delete some older files.
        for _ in 0..3 {
            if live.is_empty() {
                break;
            }
            let victim = live.remove((rng(&mut seed) % live.len() as u64) as usize);
            let (parent, name) = victim.rsplit_once('/').unwrap();
            let pid = fs.resolve_path(parent.as_bytes()).unwrap();
            if rng(&mut seed).is_multiple_of(2) {
                fs.unlink(pid, name.as_bytes()).unwrap();
            } else {
                let id = fs.resolve_path(victim.as_bytes()).unwrap();
                fs.write(id, 1000, &[0xEE; 9000]).unwrap();
                live.push(victim);
            }
        }
        fs.commit().unwrap();
        let mut s = State::new();
        walk(&fs, fs.root(), "", &mut s);
        states.push(s);
    }
    drop(fs);
    let log = rec.log();
    assert!(
        log.iter().filter(|o| **o == Op::Flush).count() >= 8,
        "each commit flushed"
    );

    let work = dir.path().join("replay.img");
    // A cut after op c: everything before the last flush is on disk, FUA
    // writes are on disk, and any subset of the other writes since that
    // flush may be. Try none, all, and a random subset at each flush or FUA.
    let mut cuts: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, op) in log.iter().enumerate() {
        if !matches!(op, Op::Flush | Op::Fua { .. }) {
            continue;
        }
        let c = i + 1;
        let last_flush = log[..c]
            .iter()
            .rposition(|o| *o == Op::Flush)
            .map_or(0, |f| f + 1);
        let after: Vec<usize> = (last_flush..c).collect();
        let fua: Vec<usize> = after
            .iter()
            .copied()
            .filter(|&j| matches!(log[j], Op::Fua { .. }))
            .collect();
        let plain: Vec<usize> = after
            .iter()
            .copied()
            .filter(|&j| matches!(log[j], Op::Write { .. }))
            .collect();
        let some: Vec<usize> = plain
            .iter()
            .copied()
            .filter(|_| rng(&mut seed).is_multiple_of(2))
            .collect();
        for chosen in [Vec::new(), plain.clone(), some] {
            let mut ops: Vec<usize> = fua.iter().copied().chain(chosen).collect();
            ops.sort_unstable();
            cuts.push((last_flush, ops));
        }
    }
    let mut kernel_checked = 0;
    for (n, (cut, extra)) in cuts.iter().enumerate() {
        let mut image = base.clone();
        // Ops before the last flush, then the chosen later ones in order.
        replay(&mut image, &log[..*cut]);
        let extra_ops: Vec<Op> = extra.iter().map(|&j| log[j].clone()).collect();
        replay(&mut image, &extra_ops);
        std::fs::write(&work, &image).unwrap();
        testkit::btrfs_check_file(&work, &[]).unwrap();
        let report = Filesystem::open_without_log_replay(&[&work])
            .unwrap()
            .check(&mut |_| {})
            .unwrap();
        assert!(report.clean(), "cut {n}: {report}");
        let fs = Filesystem::open(&[&work]).unwrap();
        let k = (fs.superblock().generation - base_gen) as usize;
        assert!(k < states.len(), "generation beyond the workload");
        let mut seen = State::new();
        walk(&fs, fs.root(), "", &mut seen);
        assert!(
            seen == states[k],
            "cut {n} at op {cut}: state differs from commit {k}"
        );
        drop(fs);
        // The kernel agrees on a few of them.
        if n % 9 == 4 && kernel_checked < 3 {
            kernel_checked += 1;
            let mnt = dir.path().join("mnt");
            std::fs::create_dir_all(&mnt).unwrap();
            let st = Command::new("mount")
                .args(["-o", "ro,loop"])
                .arg(&work)
                .arg(&mnt)
                .status()
                .unwrap();
            assert!(st.success(), "kernel mount of cut {n}");
            for (path, content) in &states[k] {
                if !path.ends_with('/') {
                    let got = std::fs::read(mnt.join(path.trim_start_matches('/'))).unwrap();
                    assert!(&got == content, "kernel read of {path} at cut {n}");
                }
            }
            assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
        }
    }
    assert!(kernel_checked > 0);
}

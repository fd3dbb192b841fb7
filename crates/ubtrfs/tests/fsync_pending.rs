//! An fsync waits for the device without the change lock
//! ([`Filesystem::fsync_start`], then `wait`): other changes, a commit
//! among them, go on meanwhile, and the fsync's superblock, older than
//! that commit's, must then not replace it on disk. And an fsync in two
//! steps ([`Filesystem::fsync_prepare`] with readers shut out, then
//! [`Filesystem::fsync_log`] beside them) logs only what was written back.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;
use ubtrfs::fs::{Filesystem, InodeId, NewInode};
use ubtrfs::tree_log::{LogOnly, Synced};

const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};

/// The primary superblock's generation and log root.
fn superblock(img: &Path) -> (u64, u64) {
    let raw = std::fs::read(img).unwrap();
    let sb = &raw[0x10000..0x11000];
    let le = |o: usize| u64::from_le_bytes(sb[o..o + 8].try_into().unwrap());
    (le(0x48), le(0x60))
}

/// A new image (in a test directory named after `name`) holding an empty
/// file `a`, committed, open read-write.
fn with_file_a(name: &str) -> (testkit::TestDir, PathBuf, Filesystem, InodeId) {
    let dir = testkit::TestDir::new(name).unwrap();
    let img = dir.join("disk.img");
    testkit::mkfs_file(&img, 256 << 20, &[]).unwrap();
    let fs = Filesystem::open_read_write(&[&img]).unwrap();
    let a = fs.create(fs.root(), b"a", FILE).unwrap().id;
    fs.commit().unwrap();
    (dir, img, fs, a)
}

#[test]
fn a_commit_while_an_fsync_waits_stays_on_disk() {
    let (dir, img, fs, a) = with_file_a("fsync-pending");
    let root = fs.root();
    let (committed, _) = superblock(&img);
    fs.write(a, 0, b"logged by fsync").unwrap();

    let pending = fs.fsync_start(a, false).unwrap();
    // The log is written, not yet durable: another thread changes and
    // commits meanwhile, which it could not while the change lock was held.
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let done = (|| {
                let b = fs.create(root, b"b", FILE)?.id;
                fs.write(b, 0, b"committed")?;
                fs.commit()
            })();
            let _ = tx.send(done.map_err(|e| e.to_string()));
        });
        let done = rx.recv_timeout(Duration::from_secs(60));
        assert!(
            matches!(done, Ok(Ok(()))),
            "a change while the fsync waits: {done:?}"
        );
    });
    let (newer, log_root) = superblock(&img);
    assert!(newer > committed, "the commit wrote no superblock");
    assert_eq!(log_root, 0);

    assert_eq!(pending.wait().unwrap(), Synced::Logged);
    // The fsync's superblock (generation `committed`, with a log root)
    // must not have replaced the commit's.
    assert_eq!(
        superblock(&img),
        (newer, 0),
        "an older superblock came back"
    );

    // Another fsync, with nothing in between, logs as usual.
    fs.write(a, 0, b"logged twice by fsync").unwrap();
    assert_eq!(fs.fsync(a, false).unwrap(), Synced::Logged);
    let (generation, log_root) = superblock(&img);
    assert_eq!(generation, newer);
    assert_ne!(log_root, 0, "the second fsync did not point at its log");
    // A crash now: the log is replayed on open.
    let crashed = dir.join("crashed.img");
    std::fs::copy(&img, &crashed).unwrap();
    drop(fs);
    let fs = Filesystem::open(&[&crashed]).unwrap();
    let a = fs.lookup(root, b"a").unwrap().id;
    let b = fs.lookup(root, b"b").unwrap().id;
    assert_eq!(fs.read_all(a).unwrap(), b"logged twice by fsync");
    assert_eq!(fs.read_all(b).unwrap(), b"committed");
    drop(fs);
    testkit::btrfs_check_file(&crashed, &[]).unwrap();
}

#[test]
fn an_fsync_in_two_steps_logs_only_data_written_back() {
    let (dir, img, fs, a) = with_file_a("fsync-two-steps");
    let root = fs.root();
    let logged = |fs: &Filesystem, id| match fs.fsync_log(id, false).unwrap() {
        LogOnly::Started(p) => p.wait().unwrap(),
        LogOnly::NeedsWriteback => panic!("written back, yet more to write back"),
        LogOnly::NeedsCommit => panic!("a regular file could not be logged"),
    };

    fs.write(a, 0, b"first").unwrap();
    fs.fsync_prepare(a).unwrap();
    // A write between the steps: its data is not on disk, so the log step
    // must not name it.
    fs.write(a, 0, b"second, longer").unwrap();
    assert!(matches!(
        fs.fsync_log(a, false).unwrap(),
        LogOnly::NeedsWriteback
    ));
    fs.fsync_prepare(a).unwrap();
    assert_eq!(logged(&fs, a), Synced::Logged);
    assert_ne!(superblock(&img).1, 0, "no log root after the fsync");

    // A symlink is not logged: the caller is told to commit, and until a
    // commit every fsync commits (the log may be half changed).
    let l = fs.symlink(root, b"l", b"a", 0, 0).unwrap().id;
    fs.fsync_prepare(l).unwrap();
    assert!(matches!(
        fs.fsync_log(l, false).unwrap(),
        LogOnly::NeedsCommit
    ));
    fs.write(a, 0, b"third").unwrap();
    assert_eq!(fs.fsync(a, false).unwrap(), Synced::Committed);
    assert_eq!(superblock(&img).1, 0, "the commit left a log root");
    fs.write(a, 0, b"fourth").unwrap();
    fs.fsync_prepare(a).unwrap();
    assert_eq!(logged(&fs, a), Synced::Logged);

    // A crash now: the log is replayed on open.
    let crashed = dir.join("crashed.img");
    std::fs::copy(&img, &crashed).unwrap();
    drop(fs);
    let fs = Filesystem::open(&[&crashed]).unwrap();
    let a = fs.lookup(root, b"a").unwrap().id;
    assert_eq!(fs.read_all(a).unwrap(), b"fourth, longer");
    assert!(fs.lookup(root, b"l").is_ok());
    drop(fs);
    testkit::btrfs_check_file(&crashed, &[]).unwrap();
}

/// (writes, FUA writes) of every device so far.
fn writes(fs: &Filesystem) -> Vec<(u64, u64)> {
    use ubtrfs::device::Counters;
    fs.tree_reader()
        .volume()
        .devices
        .iter()
        .map(|(_, d)| {
            let c = d.counters();
            (Counters::get(&c.writes), Counters::get(&c.fua_writes))
        })
        .collect()
}

/// The log's blocks are written while the fsync waits for the device, off
/// the change lock. A commit in between drops the log and frees its
/// blocks for the transactions after it, which may write their own blocks
/// there: the late fsync must then write nothing at all.
#[test]
fn blocks_of_a_log_a_commit_dropped_are_not_written_late() {
    let (_dir, img, fs, a) = with_file_a("fsync-pending-late");
    let root = fs.root();
    // Many extents, so the log spans several blocks.
    for i in 0..600u64 {
        fs.write(a, i * 8192, &[i as u8 | 1; 4096]).unwrap();
    }
    let pending = fs.fsync_start(a, false).unwrap();
    fs.commit().unwrap();
    let mut files = Vec::new();
    for i in 0..50 {
        let name = format!("f{i}");
        let f = fs.create(root, name.as_bytes(), FILE).unwrap().id;
        fs.write(f, 0, name.as_bytes()).unwrap();
        files.push(name);
    }
    fs.commit().unwrap();
    let before = writes(&fs);
    assert_eq!(pending.wait().unwrap(), Synced::Logged);
    assert_eq!(writes(&fs), before, "the fsync wrote after the commits");
    drop(fs);
    testkit::btrfs_check_file(&img, &[]).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    for name in &files {
        let f = fs.lookup(root, name.as_bytes()).unwrap().id;
        assert_eq!(fs.read_all(f).unwrap(), name.as_bytes());
    }
    let a = fs.lookup(root, b"a").unwrap().id;
    let data = fs.read_all(a).unwrap();
    assert_eq!(data.len(), 599 * 8192 + 4096);
    assert!(
        data.chunks(8192)
            .enumerate()
            .all(|(i, c)| c[..4096] == [i as u8 | 1; 4096])
    );
}

/// A device whose tree block writes fail while `fail` is set.
struct FailingNodes {
    inner: ubtrfs::device::MemDevice,
    fail: std::sync::atomic::AtomicBool,
}

impl ubtrfs::device::Device for FailingNodes {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ubtrfs::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> ubtrfs::Result<()> {
        if buf.len() == 16384 && self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ubtrfs::Error::Io {
                path: self.path().to_path_buf(),
                source: std::io::Error::other("injected write failure"),
            });
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> ubtrfs::Result<()> {
        self.inner.flush()
    }
    fn write_fua(&self, offset: u64, buf: &[u8]) -> ubtrfs::Result<()> {
        self.inner.write_fua(offset, buf)
    }
    fn counters(&self) -> &ubtrfs::device::Counters {
        self.inner.counters()
    }
}

/// The log's blocks failed to reach the device while the fsync waited:
/// the log takes them as written, so the next fsync must not build on it
/// (its superblock would name blocks never written): it commits.
#[test]
fn after_the_log_failed_to_write_the_next_fsync_commits() {
    use std::sync::atomic::Ordering;
    let dir = testkit::TestDir::new("fsync-pending-failed").unwrap();
    let img = dir.join("disk.img");
    testkit::mkfs_file(&img, 256 << 20, &[]).unwrap();
    let dev = Arc::new(FailingNodes {
        inner: ubtrfs::device::MemDevice::new(&img, std::fs::read(&img).unwrap()),
        fail: false.into(),
    });
    let set = ubtrfs::volume::DeviceSet::from_devices(vec![
        dev.clone() as Arc<dyn ubtrfs::device::Device>
    ])
    .unwrap();
    let fs = Filesystem::open_devices_read_write(set).unwrap();
    let root = fs.root();
    let a = fs.create(root, b"a", FILE).unwrap().id;
    let b = fs.create(root, b"b", FILE).unwrap().id;
    fs.commit().unwrap();
    // Many extents, so the log spans several blocks, most of which the
    // next fsync (of another file) leaves as they are.
    for i in 0..600u64 {
        fs.write(a, i * 8192, &[i as u8 | 1; 4096]).unwrap();
    }
    let pending = fs.fsync_start(a, false).unwrap();
    dev.fail.store(true, Ordering::SeqCst);
    assert_eq!(pending.wait_for_device().unwrap(), None);
    dev.fail.store(false, Ordering::SeqCst);
    fs.write(b, 0, b"after the failure").unwrap();
    assert_eq!(fs.fsync(b, false).unwrap(), Synced::Committed);
    // A power cut now: everything is there.
    drop(fs);
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    testkit::btrfs_check_file(&img, &[]).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let b = fs.lookup(root, b"b").unwrap().id;
    assert_eq!(fs.read_all(b).unwrap(), b"after the failure");
    let a = fs.lookup(root, b"a").unwrap().id;
    assert_eq!(fs.read_all(a).unwrap().len(), 599 * 8192 + 4096);
}

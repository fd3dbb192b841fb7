//! Writeback in the background: once enough dirty data piles up, a write
//! hands it to the writeback thread and returns without waiting for the
//! device. Meanwhile reads see the new bytes, an fsync of another file is
//! logged without waiting for them, and the commit waits for every one
//! (the kernel then reads them back, checksums and all). A failed
//! background write fails the commit and leaves the last one intact.
//!
//! A gate in front of the device holds back large writes (data; tree
//! blocks are smaller), so "does not wait" is shown by the write
//! returning while its data is still held at the gate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use ubtrfs::device::{Counters, Device, MemDevice};
use ubtrfs::fs::{Filesystem, InodeId, NewInode};
use ubtrfs::tree_log::Synced;
use ubtrfs::volume::DeviceSet;

const FILE: NewInode = NewInode {
    mode: libc::S_IFREG | 0o644,
    uid: 0,
    gid: 0,
    rdev: 0,
};
const PUNCH: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32 | libc::FALLOC_FL_KEEP_SIZE as u32;
/// Writes at least this long are held at a closed gate.
const DATA_WRITE: usize = 256 << 10;
/// Longest a test waits for something that should happen at once.
const PATIENCE: Duration = Duration::from_secs(60);

/// A memory device whose large writes wait while the gate is closed, or
/// fail while it is set to fail.
struct Gated {
    inner: MemDevice,
    open: Mutex<bool>,
    opened: Condvar,
    fail: AtomicBool,
    /// Hold only the writeback thread's writes.
    writeback_only: AtomicBool,
    /// Large writes waiting at the gate right now.
    waiting: AtomicUsize,
}

impl Gated {
    fn new(img: &Path) -> Arc<Self> {
        Arc::new(Gated {
            inner: MemDevice::new(img, std::fs::read(img).unwrap()),
            open: Mutex::new(true),
            opened: Condvar::new(),
            fail: AtomicBool::new(false),
            writeback_only: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
        })
    }

    fn set_open(&self, open: bool) {
        *self.open.lock().unwrap() = open;
        self.opened.notify_all();
    }
}

impl Device for Gated {
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
        if buf.len() >= DATA_WRITE {
            if self.fail.load(Ordering::SeqCst) {
                return Err(ubtrfs::Error::Io {
                    path: self.path().to_path_buf(),
                    source: std::io::Error::other("injected write failure"),
                });
            }
            if self.writeback_only.load(Ordering::SeqCst)
                && std::thread::current().name() != Some("writeback")
            {
                return self.inner.write_at(offset, buf);
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let g = self.open.lock().unwrap();
            let (g, _) = self
                .opened
                .wait_timeout_while(g, PATIENCE, |open| !*open)
                .unwrap();
            drop(g);
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> ubtrfs::Result<()> {
        self.inner.flush()
    }
    fn write_fua(&self, offset: u64, buf: &[u8]) -> ubtrfs::Result<()> {
        self.inner.write_fua(offset, buf)
    }
    fn counters(&self) -> &Counters {
        self.inner.counters()
    }
}

/// Opens the gate when dropped: a failing test must not leave the
/// writeback thread waiting at it.
struct OpenOnDrop(Arc<Gated>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set_open(true);
    }
}

fn mkfs(dir: &Path) -> PathBuf {
    let img = dir.join("d.img");
    testkit::mkfs_file(&img, 512 << 20, &["-m", "single", "-d", "single"]).unwrap();
    img
}

fn open(dev: &Arc<Gated>) -> Filesystem {
    let set = DeviceSet::from_devices(vec![dev.clone() as Arc<dyn Device>]).unwrap();
    Filesystem::open_devices_read_write(set).unwrap()
}

fn check(img: &Path) {
    // Checksums went in for every extent the thread wrote.
    if let Err(e) = testkit::btrfs_check_file(img, &["--check-data-csum"]) {
        panic!("{e:#}");
    }
}

/// The kernel's view of files `names` of the image.
fn kernel_reads(dir: &Path, img: &Path, names: &[&str]) -> Vec<Vec<u8>> {
    testkit::require_privileged!();
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let k = testkit::Mount::single(img, &mnt, "ro").expect("kernel mount");
    let got = names
        .iter()
        .map(|n| std::fs::read(mnt.join(n)).unwrap())
        .collect();
    k.unmount().unwrap();
    got
}

/// Run `f` on another thread; fail the test if it takes longer than
/// [`PATIENCE`] (it is then waiting for the gate).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("{what} waited for the device"))
}

/// Write `data` to `id` in 1 MiB calls, as a streaming writer does.
fn stream(fs: &Filesystem, id: InodeId, data: &[u8]) -> ubtrfs::Result<()> {
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        fs.write(id, (i << 20) as u64, piece)?;
    }
    Ok(())
}

#[test]
fn writes_reads_and_fsyncs_do_not_wait_for_background_data() {
    let dir = testkit::TestDir::new("bg-writeback").unwrap();
    let img = mkfs(dir.path());
    let dev = Gated::new(&img);
    let fs = Arc::new(open(&dev));
    let _gate = OpenOnDrop(Arc::clone(&dev));
    let small = fs.create(fs.root(), b"small", FILE).unwrap().id;
    fs.write(small, 0, b"before").unwrap();
    let big = fs.create(fs.root(), b"big", FILE).unwrap().id;
    fs.commit().unwrap();

    // 96 MiB: more than writes hold back, so some goes to the thread.
    let data = testkit::xorshift_bytes(7, 96 << 20);
    dev.set_open(false);
    let (fs2, d2) = (Arc::clone(&fs), data.clone());
    within("a streaming write", move || stream(&fs2, big, &d2)).unwrap();
    assert!(
        dev.waiting.load(Ordering::SeqCst) > 0,
        "no data write reached the device in the background"
    );
    // Reads see the new bytes while they wait at the gate.
    let fs2 = Arc::clone(&fs);
    let got = within("a read", move || fs2.read_all(big).unwrap());
    assert!(
        got == data,
        "reads do not see data on its way to the device"
    );
    // Another file's fsync is logged without waiting for them.
    let fs2 = Arc::clone(&fs);
    let how = within("an fsync of another file", move || {
        fs2.write(small, 0, b"after!").unwrap();
        fs2.fsync(small, false).unwrap()
    });
    assert_eq!(how, Synced::Logged);

    dev.set_open(true);
    fs.commit().unwrap();
    assert_eq!(fs.read_all(big).unwrap(), data);
    drop(fs);
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    check(&img);
    let kernel = kernel_reads(dir.path(), &img, &["big", "small"]);
    assert!(kernel[0] == data, "the kernel reads other bytes");
    assert_eq!(kernel[1], b"after!");
}

/// An fsync of a file whose extents wait behind another file's in the
/// writeback thread writes them itself: it does not wait for the other
/// file's data (held at the gate here).
#[test]
fn an_fsync_does_not_wait_behind_another_files_stream() {
    let dir = testkit::TestDir::new("bg-writeback-fsync").unwrap();
    let img = mkfs(dir.path());
    let dev = Gated::new(&img);
    let fs = Arc::new(open(&dev));
    let _gate = OpenOnDrop(Arc::clone(&dev));
    let streamed = fs.create(fs.root(), b"stream", FILE).unwrap().id;
    let synced = fs.create(fs.root(), b"synced", FILE).unwrap().id;
    // Data chunks with room for both files, committed: a log naming data
    // in a chunk added since the commit could not be replayed, so that
    // fsync would commit (and wait for the stream), as the kernel's does.
    let ballast = fs.create(fs.root(), b"ballast", FILE).unwrap().id;
    stream(&fs, ballast, &testkit::xorshift_bytes(9, 96 << 20)).unwrap();
    fs.commit().unwrap();
    fs.unlink(fs.root(), b"ballast").unwrap();
    fs.commit().unwrap();

    dev.writeback_only.store(true, Ordering::SeqCst);
    dev.set_open(false);
    let stream_data = testkit::xorshift_bytes(3, 40 << 20);
    stream(&fs, streamed, &stream_data).unwrap();
    // The thread is stuck on the stream's first extent; this file's
    // extents queue behind the stream's.
    let synced_data = testkit::xorshift_bytes(4, 20 << 20);
    stream(&fs, synced, &synced_data).unwrap();
    assert!(
        dev.waiting.load(Ordering::SeqCst) > 0,
        "nothing in the background"
    );
    let fs2 = Arc::clone(&fs);
    let how = within("an fsync behind another file's stream", move || {
        fs2.fsync(synced, false).unwrap()
    });
    assert_eq!(how, Synced::Logged);
    assert!(
        dev.waiting.load(Ordering::SeqCst) > 0,
        "the stream's data got through the gate"
    );

    dev.set_open(true);
    fs.commit().unwrap();
    drop(fs);
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    check(&img);
    let kernel = kernel_reads(dir.path(), &img, &["stream", "synced"]);
    assert!(
        kernel[0] == stream_data,
        "the kernel reads other stream bytes"
    );
    assert!(
        kernel[1] == synced_data,
        "the kernel reads other synced bytes"
    );
}

/// A server throttles each write before taking the change lock. The
/// stream that made the backlog waits for the device; a small write to a
/// file with nothing dirty (the one an fsync sends first) does not.
#[test]
fn a_small_write_beside_a_stream_is_not_throttled_for_it() {
    let dir = testkit::TestDir::new("bg-writeback-throttle").unwrap();
    let img = mkfs(dir.path());
    let dev = Gated::new(&img);
    let fs = Arc::new(open(&dev));
    let _gate = OpenOnDrop(Arc::clone(&dev));
    let small = fs.create(fs.root(), b"small", FILE).unwrap().id;
    let dirty = fs.create(fs.root(), b"dirty", FILE).unwrap().id;
    let big = fs.create(fs.root(), b"big", FILE).unwrap().id;
    fs.commit().unwrap();

    dev.set_open(false);
    let data = testkit::xorshift_bytes(5, 96 << 20);
    let (fs2, d2) = (Arc::clone(&fs), data.clone());
    within("a streaming write", move || stream(&fs2, big, &d2)).unwrap();
    assert!(
        fs.writes_must_wait(),
        "the stream left no backlog to throttle for"
    );
    let fs2 = Arc::clone(&fs);
    within("a small write's throttle", move || {
        fs2.throttle_writes(small, 4096)
    });

    // Small writes beside the stream have a budget: 4 MiB of them go past
    // the full backlog, then they wait like any other.
    let fs2 = Arc::clone(&fs);
    within("small writes within their budget", move || {
        for _ in 1..(4 << 20) / 4096 {
            fs2.throttle_writes(small, 4096);
        }
    });

    // The stream's next write, large or small, waits for the gate; so does
    // a small write to a file with dirty data of its own, and one past
    // the budget.
    fs.write(dirty, 0, &[1; 4096]).unwrap();
    let mut waiting = Vec::new();
    for (what, id, len) in [
        ("a 1 MiB write to the streaming file", big, 1 << 20),
        ("a 4 KiB write to the streaming file", big, 4096),
        ("a 4 KiB write to a dirty file", dirty, 4096),
        ("a 4 KiB write past the budget", small, 4096),
    ] {
        let (tx, rx) = mpsc::channel();
        let fs2 = Arc::clone(&fs);
        std::thread::spawn(move || {
            fs2.throttle_writes(id, len);
            let _ = tx.send(());
        });
        waiting.push((what, rx));
    }
    std::thread::sleep(Duration::from_millis(300));
    for (what, rx) in &waiting {
        assert!(rx.try_recv().is_err(), "{what} was not throttled");
    }
    dev.set_open(true);
    for (what, rx) in waiting {
        rx.recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("{what} stayed throttled with the gate open"));
    }
    fs.write(small, 0, b"beside").unwrap();
    fs.commit().unwrap();
    drop(fs);
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    check(&img);
}

#[test]
fn a_failed_background_write_fails_the_commit_and_keeps_the_last_one() {
    let dir = testkit::TestDir::new("bg-writeback-fail").unwrap();
    let img = mkfs(dir.path());
    let dev = Gated::new(&img);
    let fs = open(&dev);
    let f = fs.create(fs.root(), b"kept", FILE).unwrap().id;
    let first = testkit::xorshift_bytes(1, 3 << 20);
    fs.write(f, 0, &first).unwrap();
    fs.commit().unwrap();
    let committed = dev.inner.snapshot();

    dev.fail.store(true, Ordering::SeqCst);
    let lost = fs.create(fs.root(), b"lost", FILE).unwrap().id;
    // A write that finds the failure reports it (as a later fsync would).
    if let Err(e) = stream(&fs, lost, &testkit::xorshift_bytes(2, 96 << 20)) {
        assert!(e.to_string().contains("injected write failure"), "{e}");
    }
    let err = fs.commit().expect_err("a commit over a failed data write");
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    assert!(
        text.contains("injected write failure"),
        "the error does not say a write failed: {text}"
    );
    // Later commits fail too: the transaction names data never written.
    dev.fail.store(false, Ordering::SeqCst);
    assert!(fs.commit().is_err(), "a later commit succeeded");
    drop(fs);
    // What the device holds is the first commit, whole.
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    check(&img);
    let again = Filesystem::open(&[&img]).unwrap();
    let kept = again.resolve_path(b"/kept").unwrap();
    assert!(again.read_all(kept).unwrap() == first);
    assert!(again.resolve_path(b"/lost").is_err());
    // Nothing after the first commit's superblock reached the device's
    // superblock area.
    assert_eq!(
        &dev.inner.snapshot()[0x10000..0x11000],
        &committed[0x10000..0x11000]
    );
}

/// Bytes of which every other 128 KiB piece compresses (text) and the
/// rest does not.
fn half_compressible(seed: u64, len: usize) -> Vec<u8> {
    let noise = testkit::xorshift_bytes(seed, len);
    let mut out = Vec::with_capacity(len);
    let mut line = 0u64;
    while out.len() < len {
        let piece = out.len() / (128 << 10);
        if piece % 2 == 0 {
            out.extend_from_slice(format!("{seed} line {line} of text\n").as_bytes());
            line += 1;
        } else {
            let n = ((piece + 1) * (128 << 10)).min(len) - out.len();
            let at = out.len();
            out.extend_from_slice(&noise[at..at + n]);
        }
    }
    out.truncate(len);
    out
}

/// The compression of each file extent of `id`.
fn compressions(fs: &Filesystem, id: InodeId) -> Vec<u8> {
    fs.tree_by_id(id.subvol)
        .unwrap()
        .items_of(id.ino, ubtrfs::format::consts::EXTENT_DATA_KEY)
        .unwrap()
        .map(|it| {
            ubtrfs::format::items::FileExtentItem::parse(it.unwrap().data())
                .unwrap()
                .compression
        })
        .collect()
}

/// With compression, a stream is compressed off the change lock and its
/// compressed extents are written by the writeback thread: the writes
/// return while that data waits at the gate, reads and another file's
/// fsync do not wait, and the kernel reads back what was written.
#[test]
fn a_compressed_stream_is_compressed_and_written_in_the_background() {
    use ubtrfs::data::compression::Compression;
    let dir = testkit::TestDir::new("bg-writeback-zstd").unwrap();
    let img = mkfs(dir.path());
    let dev = Gated::new(&img);
    let fs = Arc::new(open(&dev));
    fs.set_compression(Some((Compression::Zstd, None))).unwrap();
    let _gate = OpenOnDrop(Arc::clone(&dev));
    let small = fs.create(fs.root(), b"small", FILE).unwrap().id;
    let big = fs.create(fs.root(), b"big", FILE).unwrap().id;
    fs.commit().unwrap();

    let data = half_compressible(9, 80 << 20);
    dev.writeback_only.store(true, Ordering::SeqCst);
    dev.set_open(false);
    let (fs2, d2) = (Arc::clone(&fs), data.clone());
    within("a compressed streaming write", move || {
        stream(&fs2, big, &d2)
    })
    .unwrap();
    // Jobs still compressing when the stream ended are taken by a later
    // write (of any file), which must not wait for the gate either.
    let (fs2, dev2) = (Arc::clone(&fs), Arc::clone(&dev));
    within("writes taking finished compression jobs", move || {
        let deadline = std::time::Instant::now() + PATIENCE / 2;
        while dev2.waiting.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            fs2.write(small, 0, b"poke").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(
        dev.waiting.load(Ordering::SeqCst) > 0,
        "no compressed data reached the writeback thread"
    );
    let fs2 = Arc::clone(&fs);
    let got = within("a read", move || fs2.read_all(big).unwrap());
    assert!(
        got == data,
        "reads do not see the compressed stream's bytes"
    );
    let fs2 = Arc::clone(&fs);
    let how = within("an fsync of another file", move || {
        fs2.write(small, 0, b"small file").unwrap();
        fs2.fsync(small, false).unwrap()
    });
    assert_eq!(how, Synced::Logged);

    dev.set_open(true);
    fs.fsync(big, false).unwrap();
    fs.commit().unwrap();
    assert!(fs.read_all(big).unwrap() == data);
    let kinds = compressions(&fs, big);
    assert!(
        kinds.contains(&3) && kinds.contains(&0),
        "zstd and plain extents expected: {} extents, {} zstd",
        kinds.len(),
        kinds.iter().filter(|&&k| k == 3).count()
    );
    drop(fs);
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    check(&img);
    let kernel = kernel_reads(dir.path(), &img, &["big", "small"]);
    assert!(kernel[0] == data, "the kernel reads other bytes");
    assert_eq!(kernel[1], b"small file");
}

/// Random large writes, truncates, hole punches, clones, fsyncs, reads
/// and commits on three files, with enough data that much of it is in
/// flight when the next operation comes: every read agrees with a model,
/// `btrfs check` verifies every data checksum, the kernel reads the model.
#[test]
fn random_operations_over_data_in_flight_match_a_model() {
    random_operations("bg-writeback-model", None, true);
}

/// The same with zstd: much of the data is in compression jobs when the
/// next operation writes over it, truncates or clones it.
#[test]
fn random_operations_over_data_being_compressed_match_a_model() {
    random_operations(
        "bg-writeback-model-zstd",
        Some(ubtrfs::data::compression::Compression::Zstd),
        true,
    );
}

/// The same with jobs that copy the dirty data instead of sharing whole
/// runs (what they do with parts of runs).
#[test]
fn random_operations_over_copies_being_compressed_match_a_model() {
    random_operations(
        "bg-writeback-model-zstd-copied",
        Some(ubtrfs::data::compression::Compression::Zstd),
        false,
    );
}

fn random_operations(
    name: &str,
    compression: Option<ubtrfs::data::compression::Compression>,
    lend_runs: bool,
) {
    const MAX_SIZE: u64 = 48 << 20;
    let dir = testkit::TestDir::new(name).unwrap();
    let img = mkfs(dir.path());
    let dev = Gated::new(&img);
    let fs = open(&dev);
    fs.set_compression(compression.map(|c| (c, None))).unwrap();
    fs.set_lend_runs(lend_runs).unwrap();
    let ss = u64::from(fs.geometry().sectorsize);
    let ids: Vec<InodeId> = (0..3)
        .map(|i| {
            fs.create(fs.root(), format!("f{i}").as_bytes(), FILE)
                .unwrap()
                .id
        })
        .collect();
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); ids.len()];
    let mut rng = testkit::Rng::new(2026);
    let mut seed = 100;
    for step in 0..400 {
        let f = rng.range(0, ids.len() as u64 - 1) as usize;
        let (id, size) = (ids[f], model[f].len() as u64);
        match rng.range(0, 19) {
            0..=8 => {
                let off = rng.range(0, MAX_SIZE - (1 << 20));
                let len = rng.range(1, (8 << 20).min(MAX_SIZE - off));
                seed += 1;
                let bytes = if compression.is_some() {
                    half_compressible(seed, len as usize)
                } else {
                    testkit::xorshift_bytes(seed, len as usize)
                };
                fs.write(id, off, &bytes).unwrap();
                let m = &mut model[f];
                if m.len() < (off + len) as usize {
                    m.resize((off + len) as usize, 0);
                }
                m[off as usize..(off + len) as usize].copy_from_slice(&bytes);
            }
            9 | 10 => {
                let to = rng.range(0, size + (1 << 20));
                fs.truncate(id, to).unwrap();
                model[f].resize(to as usize, 0);
            }
            11 | 12 if size > 0 => {
                let off = rng.range(0, size - 1);
                let len = rng.range(1, size - off);
                fs.fallocate(id, PUNCH, off, len).unwrap();
                model[f][off as usize..(off + len) as usize].fill(0);
            }
            13 | 14 => {
                // Whole sectors from another file, within both sizes.
                let g = (f + 1) % ids.len();
                let (src_size, dst_size) = (model[g].len() as u64, size);
                let room = src_size.min(dst_size) / ss;
                if room >= 2 {
                    let len = rng.range(1, room / 2) * ss;
                    let s = rng.range(0, src_size / ss - len / ss) * ss;
                    let d = rng.range(0, dst_size / ss - len / ss) * ss;
                    fs.clone_range(ids[g], s, id, d, len).unwrap();
                    let piece = model[g][s as usize..(s + len) as usize].to_vec();
                    model[f][d as usize..(d + len) as usize].copy_from_slice(&piece);
                }
            }
            15 | 16 => {
                fs.fsync(id, false).unwrap();
            }
            17 => fs.commit().unwrap(),
            _ if size > 0 => {
                let off = rng.range(0, size - 1);
                let len = rng.range(1, (size - off).min(4 << 20));
                let got = fs.read(id, off, len as usize).unwrap();
                assert!(
                    got[..] == model[f][off as usize..(off + len) as usize],
                    "step {step}: file {f} differs in [{off}, {})",
                    off + len
                );
            }
            _ => {}
        }
    }
    for (f, &id) in ids.iter().enumerate() {
        assert!(
            fs.read_all(id).unwrap() == model[f],
            "file {f} before commit"
        );
    }
    fs.commit().unwrap();
    drop(fs);
    std::fs::write(&img, dev.inner.snapshot()).unwrap();
    check(&img);
    let kernel = kernel_reads(dir.path(), &img, &["f0", "f1", "f2"]);
    for (f, m) in model.iter().enumerate() {
        assert!(kernel[f] == *m, "the kernel reads other bytes in file {f}");
    }
}

//! fsx, the file system exerciser (crate `fsx`, fsx-rs), against
//! read-write ubtrfs FUSE mounts: over a million random operations on
//! single files (reads and writes at any offset, through `pread`/`pwrite`
//! and through `mmap`, truncation, `posix_fallocate`, hole punching,
//! `sendfile`, `posix_fadvise`, `fsync`/`fdatasync`, close and reopen),
//! fsx checking every read against its model of the file. Then the kernel
//! is the oracle: after `btrfs check`, it mounts each image and must read
//! exactly the final file fsx expects.
//!
//! Two streams run at once, each on its own image and mount (one with
//! zstd compression), each a list of runs with different settings and
//! seeds, one file per run. Writes and reads reach ubtrfs, not just the
//! kernel's page cache (the mount uses the writeback cache and keeps pages
//! across opens): every quarter of a second a thread writes dirty pages
//! back (`sync`) and drops the cached ones (`/proc/sys/vm/drop_caches`),
//! and so does each stream between its runs; fsx's `fsync`, `msync`,
//! `posix_fadvise(DONTNEED)` and `msync(MS_INVALIDATE)` do some of that
//! too. (fsx has no `O_DIRECT` mode, and the mount no direct-I/O option.)
//!
//! The expected final file is fsx's own model, written out by fsx itself:
//! the same seed and settings replayed with `-b N` (simulate the first
//! N - 1 operations, write the model to the file, do the last one for
//! real) on the host's filesystem. fsx 0.3.2 performs `copy_file_range`
//! even in simulated steps, so the run that copies ranges is replayed for
//! real on a tmpfs instead.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3 and the
//! `fsx` program (scripts/test.sh installs it from crates.io).

mod common;
mod suites;

use common::{Tmpfs, check_image, new_image, start_mount};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use suites::{CacheDropper, drop_caches, tool};
use testkit::*;

/// The fsx release scripts/test.sh installs.
const FSX_VERSION: &str = "0.3.2";
/// Size of each image (sparse); the files stay below a few MiB.
const IMAGE_SIZE: u64 = 1 << 30;
/// How often the page cache is written back and dropped while fsx runs.
const DROP_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

/// Relative frequencies of fsx's operations in every setting; each
/// [`Setting`] changes some.
const BASE_WEIGHTS: &[(&str, u32)] = &[
    ("read", 10),
    ("write", 10),
    ("truncate", 5),
    ("close_open", 2),
    ("fsync", 1),
    ("fdatasync", 1),
    ("posix_fallocate", 2),
    ("punch_hole", 2),
    ("sendfile", 2),
    ("posix_fadvise", 2),
    ("mapread", 0),
    ("mapwrite", 0),
    ("invalidate", 0),
    ("copy_file_range", 0),
];

/// One kind of run: an fsx configuration.
#[derive(Clone, Copy, Debug)]
enum Setting {
    /// A 256 KiB file, unaligned operations, reads and writes through
    /// `mmap` too. (Each mapped write ends with `msync`, which is an
    /// `fsync` through FUSE: a commit.)
    Mmap,
    /// A 1 MiB file, unaligned `pread`/`pwrite`.
    Plain,
    /// A 4 MiB file, every offset and size a multiple of 4 KiB (whole
    /// sectors: real holes, whole-extent replacement), mapped reads too.
    /// No `posix_fallocate`: fsx 0.3.2 rounds its length down to the
    /// alignment, to zero near the end of the file, and a zero-length
    /// `posix_fallocate` fails with EINVAL, as it should.
    Aligned,
    /// A 16 KiB file and operations of at most 4 KiB: the file keeps
    /// moving between one inline extent (up to 2 KiB) and regular ones.
    Small,
    /// Like `Plain`, with `copy_file_range` from one range of the file to
    /// another.
    Copy,
}

impl Setting {
    /// The fsx configuration file. Operation sizes start at one byte: fsx
    /// 0.3.2 would pass a zero length to `posix_fallocate`, which fails
    /// with EINVAL, as it should.
    fn config(self) -> String {
        let (flen, align, max, changes): (u32, u32, u32, &[(&str, u32)]) = match self {
            Setting::Mmap => (
                256 << 10,
                1,
                64 << 10,
                &[("mapread", 10), ("mapwrite", 3), ("invalidate", 1)],
            ),
            Setting::Plain => (1 << 20, 1, 64 << 10, &[]),
            Setting::Aligned => (
                4 << 20,
                4096,
                128 << 10,
                &[("mapread", 3), ("mapwrite", 1), ("posix_fallocate", 0)],
            ),
            Setting::Small => (
                16 << 10,
                1,
                4 << 10,
                &[("mapread", 5), ("mapwrite", 2), ("invalidate", 1)],
            ),
            Setting::Copy => (1 << 20, 1, 64 << 10, &[("copy_file_range", 3)]),
        };
        let mut c =
            format!("flen = {flen}\n[opsize]\nmin = 1\nmax = {max}\nalign = {align}\n[weights]\n");
        for (op, weight) in BASE_WEIGHTS {
            let w = changes
                .iter()
                .find(|(o, _)| o == op)
                .map_or(*weight, |(_, w)| *w);
            c.push_str(&format!("{op} = {w}\n"));
        }
        c
    }

    /// Whether fsx can replay the run without doing its operations (see
    /// the module documentation).
    fn simulable(self) -> bool {
        !matches!(self, Setting::Copy)
    }
}

/// One fsx run: a setting, a seed and a number of operations.
#[derive(Clone, Copy, Debug)]
struct Run {
    setting: Setting,
    seed: u64,
    ops: u64,
}

/// The runs of one stream; seeds differ between streams.
fn runs(stream: u64) -> Vec<Run> {
    let plan: &[(Setting, u64, u64)] = &[
        // (setting, runs, operations per run)
        (Setting::Mmap, 2, 40_000),
        (Setting::Small, 2, 40_000),
        (Setting::Plain, 3, 80_000),
        (Setting::Aligned, 2, 50_000),
        (Setting::Copy, 1, 30_000),
    ];
    let mut out = Vec::new();
    for (i, &(setting, n, ops)) in plan.iter().enumerate() {
        for k in 0..n {
            out.push(Run {
                setting,
                seed: 1000 * (stream + 1) + 10 * i as u64 + k,
                ops,
            });
        }
    }
    out
}

/// Everything a stream needs that does not change between runs.
struct Stream<'a> {
    fsx: &'a Path,
    /// Scratch directory on the host: configurations, output, fsx's
    /// artifacts, the expected files.
    work: PathBuf,
    /// A tmpfs for the runs fsx cannot simulate.
    tmpfs: &'a Path,
}

impl Stream<'_> {
    /// `fsx` with `args` on `file`, which must end "All operations
    /// completed A-OK!"; its output is kept in the work directory.
    fn fsx(&self, label: &str, run: &Run, file: &Path, args: &[String]) {
        let config = self.work.join(format!("{label}.toml"));
        fs::write(&config, run.setting.config()).unwrap();
        let out_path = self.work.join(format!("{label}.out"));
        let out = fs::File::create(&out_path).unwrap();
        let status = Command::new(self.fsx)
            .arg("-f")
            .arg(&config)
            .arg("-S")
            .arg(run.seed.to_string())
            .arg("-P")
            .arg(&self.work)
            .args(args)
            .arg(file)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .status()
            .expect("start fsx");
        let output = fs::read_to_string(&out_path).unwrap_or_default();
        if !status.success() || !output.contains("All operations completed A-OK!") {
            // What went wrong comes first, then fsx's log of the last
            // operations (numbered lines): show both, briefly.
            let lines: Vec<&str> = output.lines().collect();
            let numbered = |l: &&str| {
                l.trim_start_matches("[ERROR fsx]")
                    .trim_start()
                    .starts_with(|c: char| c.is_ascii_digit())
            };
            let head: Vec<&str> = lines
                .iter()
                .filter(|l| !numbered(l))
                .take(40)
                .copied()
                .collect();
            let log: Vec<&str> = lines.iter().filter(|l| numbered(l)).copied().collect();
            panic!(
                "fsx {label} ({run:?}) on {} failed ({status}); artifacts (.fsxlog, .fsxgood) in {}:\n\
                 {}\n... the last operations:\n{}",
                file.display(),
                self.work.display(),
                head.join("\n"),
                log[log.len().saturating_sub(30)..].join("\n")
            );
        }
    }

    /// The file `run` must leave behind, from fsx's model.
    fn expected(&self, label: &str, run: &Run) -> PathBuf {
        let n = run.ops.to_string();
        if run.setting.simulable() {
            let path = self.work.join(format!("{label}.expected"));
            let args = ["-N".to_string(), n.clone(), "-b".to_string(), n];
            self.fsx(&format!("{label}-model"), run, &path, &args);
            path
        } else {
            let path = self.tmpfs.join(format!("{label}.expected"));
            self.fsx(
                &format!("{label}-tmpfs"),
                run,
                &path,
                &["-N".to_string(), n],
            );
            path
        }
    }
}

/// What one stream leaves to check: (file name on the mount, expected
/// file).
type Finals = Vec<(String, PathBuf)>;

/// Assert that `dir/name` holds exactly the bytes of `expected`.
fn assert_same_file(what: &str, dir: &Path, name: &str, expected: &Path) {
    let want = fs::read(expected).unwrap();
    let got = fs::read(dir.join(name)).unwrap();
    if got != want {
        let first = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {name} differs from fsx's expected file {}: {} bytes, expected {}; \
             first difference at byte {first}",
            expected.display(),
            got.len(),
            want.len()
        );
    }
}

/// Run stream `index` on a fresh image mounted with `mount_args`; then
/// unmount, check, and read every final file back with the kernel.
fn stream(t: &TestDir, fsx: &Path, tmpfs: &Path, index: u64, mount_args: &[&str]) -> u64 {
    let name = format!("stream{index}");
    let work = t.join(&name);
    fs::create_dir_all(&work).unwrap();
    let s = Stream { fsx, work, tmpfs };
    let img = new_image(t, &format!("{name}.img"), IMAGE_SIZE);
    let m = start_mount(&img, &t.join(format!("{name}-mnt")), mount_args);
    let mut finals = Finals::new();
    let mut total = 0;
    for (i, run) in runs(index).iter().enumerate() {
        let label = format!("{name}-run{i}");
        let file = format!("{label}.dat");
        let started = Instant::now();
        s.fsx(
            &label,
            run,
            &m.path().join(&file),
            &["-N".to_string(), run.ops.to_string()],
        );
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "fsx {label}: {:?} seed {} {} ops in {secs:.1} s ({:.0} ops/s)",
            run.setting,
            run.seed,
            run.ops,
            run.ops as f64 / secs
        );
        total += run.ops;
        // The next run's reads, and the check below, come from ubtrfs.
        drop_caches();
        let expected = s.expected(&label, run);
        assert_same_file("through the mount", m.path(), &file, &expected);
        finals.push((file, expected));
    }
    m.unmount().expect("unmount ubtrfs cleanly");
    check_image(&img);
    let k = Mount::single(&img, &t.join(format!("{name}-kernel")), "ro").expect("kernel mount");
    for (file, expected) in &finals {
        assert_same_file("through the kernel", k.path(), file, expected);
    }
    k.unmount().expect("unmount the kernel's mount");
    total
}

#[test]
fn fsx_million_operations() {
    require_privileged!();
    let fsx = tool("fsx", FSX_VERSION);
    let t = TestDir::new("fsx").unwrap();
    let tmpfs = Tmpfs::new(&t.join("tmpfs"));
    let started = Instant::now();
    let dropper = CacheDropper::start(DROP_PERIOD);
    let totals: Vec<u64> = std::thread::scope(|scope| {
        let streams = [
            scope.spawn(|| stream(&t, &fsx, tmpfs.path(), 0, &[])),
            scope.spawn(|| stream(&t, &fsx, tmpfs.path(), 1, &["-o", "compress=zstd"])),
        ];
        streams
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let drops = dropper.stop();
    let total: u64 = totals.iter().sum();
    eprintln!(
        "fsx: {total} operations in {:.1} s, page cache dropped {drops} times",
        started.elapsed().as_secs_f64()
    );
    assert!(total >= 1_000_000, "only {total} operations");
}

#[test]
fn plan_adds_up() {
    for s in [
        Setting::Mmap,
        Setting::Plain,
        Setting::Aligned,
        Setting::Copy,
    ] {
        let c = s.config();
        assert!(c.contains("[weights]\nread = 10\n"), "{s:?}:\n{c}");
        assert!(c.ends_with("\n"), "{s:?}:\n{c}");
    }
    assert!(Setting::Aligned.config().contains("posix_fallocate = 0\n"));
    let per_stream: u64 = runs(0).iter().map(|r| r.ops).sum();
    assert!(2 * per_stream >= 1_000_000, "{per_stream}");
    let seeds: std::collections::BTreeSet<u64> =
        runs(0).iter().chain(&runs(1)).map(|r| r.seed).collect();
    assert_eq!(seeds.len(), runs(0).len() + runs(1).len(), "seeds repeat");
}

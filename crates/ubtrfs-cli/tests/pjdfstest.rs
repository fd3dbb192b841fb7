//! pjdfstest, the POSIX file system suite (its Rust rewrite, crate
//! `pjdfstest`), against the kernel's btrfs on a loop device and against
//! a read-write ubtrfs FUSE mount, in the same run: every test the kernel
//! passes, ubtrfs must pass, but for the short list of known differences
//! below, each with its reason. Afterwards the ubtrfs image must pass
//! `btrfs check`. ubtrfs runs it twice: with requests over io_uring (when
//! the kernel offers it, as `scripts/test.sh` has it do) and through
//! `/dev/fuse` (`-o nouring`).
//!
//! The suite runs twice per filesystem: once for everything but the
//! `erofs` tests, then those alone, which remount the filesystem
//! read-only and back. (In one run, a file an earlier test leaves open
//! for writing makes the kernel refuse the read-only remount with EBUSY.)
//! pjdfstest remounts with `mount -o remount,ro MOUNTPOINT`; for a FUSE
//! mount, mount(8) would hand that to the `mount.fuse` helper, which
//! cannot remount, so both runs see a `mount` that adds `-i` (no helpers:
//! the remount goes straight to mount(2), as it does for btrfs).
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3 and the
//! `pjdfstest` program (scripts/test.sh installs it from crates.io).

mod common;
mod suites;

use common::{Tmpfs, check_image, new_image, start_mount};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use suites::tool;
use testkit::*;

/// The pjdfstest release scripts/test.sh installs.
const PJDFSTEST_VERSION: &str = "0.2.2";
/// Size of the test images (sparse).
const IMAGE_SIZE: u64 = 1 << 30;
/// Longest a run of the suite may take (it takes seconds).
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Tests the kernel passes and ubtrfs does not, and why. Each must really
/// differ (the test fails on a stale entry).
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[];

/// What one test did.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    /// Failed, with the first lines of what it said.
    Fail(String),
    Skip,
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Pass => "ok",
            Outcome::Fail(_) => "FAILED",
            Outcome::Skip => "skipped",
        }
    }
}

type Results = BTreeMap<String, Outcome>;

/// The suite's configuration: the opt-in features Linux and btrfs have,
/// naps longer than the kernel's timestamp granularity (a jiffy), and two
/// unprivileged users of the base system for the permission tests.
fn write_config(path: &Path, allow_remount: bool) {
    let nogroup = run_args("id", ["-gn", "nobody"]).expect("the user nobody exists");
    let nogroup = nogroup.trim();
    let daemon_group = run_args("id", ["-gn", "daemon"]).expect("the user daemon exists");
    let daemon_group = daemon_group.trim();
    fs::write(
        path,
        format!(
            "[features]\n\
             posix_fallocate = {{}}\n\
             rename_ctime = {{}}\n\
             utime_now = {{}}\n\
             utimensat = {{}}\n\
             [settings]\n\
             naptime = 0.02\n\
             allow_remount = {allow_remount}\n\
             expected_failures = []\n\
             [dummy_auth]\n\
             entries = [[\"nobody\", \"{nogroup}\"], [\"daemon\", \"{daemon_group}\"]]\n"
        ),
    )
    .unwrap();
}

/// Remove ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The per-test results in pjdfstest's output (`NAME   ok|FAILED|skipped`,
/// a failure's message on the tab-indented lines after it), checked
/// against its closing summary line.
fn parse(output: &str) -> Results {
    let output = strip_ansi(output);
    let mut results = Results::new();
    let mut last_failed: Option<String> = None;
    let mut summary_total = None;
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("Summary: ") {
            // "F failed, S skipped, P passed, E expected failures, N total"
            summary_total = rest
                .rsplit(", ")
                .next()
                .and_then(|t| t.strip_suffix(" total"))
                .and_then(|n| n.parse::<usize>().ok());
            continue;
        }
        if line.starts_with('\t') {
            if let Some(Outcome::Fail(msg)) = last_failed.as_ref().and_then(|n| results.get_mut(n))
                && msg.lines().count() < 4
            {
                msg.push_str(line.trim());
                msg.push('\n');
            }
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(word), None) = (words.next(), words.next(), words.next()) else {
            last_failed = None;
            continue;
        };
        let outcome = match word {
            "ok" => Outcome::Pass,
            "FAILED" => Outcome::Fail(String::new()),
            "skipped" => Outcome::Skip,
            _ => {
                last_failed = None;
                continue;
            }
        };
        last_failed = matches!(outcome, Outcome::Fail(_)).then(|| name.to_string());
        let old = results.insert(name.to_string(), outcome);
        assert!(old.is_none(), "pjdfstest reported {name} twice");
    }
    let total =
        summary_total.unwrap_or_else(|| panic!("no summary line in pjdfstest's output:\n{output}"));
    assert_eq!(
        results.len(),
        total,
        "parsed results and pjdfstest's summary disagree:\n{output}"
    );
    results
}

/// Where one filesystem's suite runs and what it needs around it.
struct Setup<'a> {
    pjdfstest: &'a Path,
    /// Scratch directory for configuration, output and the `mount` shim.
    work: PathBuf,
    /// A second filesystem, for the EXDEV tests.
    second: &'a Path,
}

impl Setup<'_> {
    /// Run pjdfstest on `dir` with `config`, limited to `patterns`; its
    /// results. The exit status says only whether some test failed.
    fn run(&self, label: &str, dir: &Path, config: &Path, patterns: &[&str]) -> Results {
        let out_path = self.work.join(format!("{label}.out"));
        let path = format!(
            "{}:{}",
            self.work.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new(self.pjdfstest)
            .arg("-c")
            .arg(config)
            .arg("-p")
            .arg(dir)
            .arg("-s")
            .arg(self.second)
            .args(patterns)
            .current_dir(&self.work)
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out_path).unwrap())
            .stderr(fs::File::create(out_path.with_extension("stderr")).unwrap())
            .spawn()
            .expect("start pjdfstest");
        let deadline = Instant::now() + RUN_TIMEOUT;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "pjdfstest on {label} still running after {RUN_TIMEOUT:?}; output so far in {}",
                    out_path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let output = fs::read_to_string(&out_path).unwrap();
        let results = parse(&output);
        eprintln!("pjdfstest on {label}: {}", counts(&results));
        results
    }

    /// The whole suite on `dir`: everything but the remounting tests, then
    /// those (see the module documentation).
    fn suite(&self, label: &str, dir: &Path) -> Results {
        let (plain, remount) = (self.work.join("plain.toml"), self.work.join("remount.toml"));
        let mut all = self.run(label, dir, &plain, &[]);
        let erofs = self.run(&format!("{label}-erofs"), dir, &remount, &["erofs"]);
        assert!(!erofs.is_empty(), "no erofs tests ran on {label}");
        for (name, outcome) in erofs {
            assert_eq!(
                all.get(&name),
                Some(&Outcome::Skip),
                "{label}: {name} ran without allow_remount"
            );
            all.insert(name, outcome);
        }
        all
    }
}

fn counts(r: &Results) -> String {
    let n = |o: fn(&Outcome) -> bool| r.values().filter(|x| o(x)).count();
    format!(
        "{} passed, {} failed, {} skipped of {}",
        n(|o| *o == Outcome::Pass),
        n(|o| matches!(o, Outcome::Fail(_))),
        n(|o| *o == Outcome::Skip),
        r.len()
    )
}

/// A `mount` that never runs `mount.TYPE` helpers (see the module
/// documentation), first on the suite's `$PATH`.
fn write_mount_shim(bin: &Path) {
    let real = which("mount").expect("mount (util-linux) is installed");
    fs::create_dir_all(bin).unwrap();
    let shim = bin.join("mount");
    fs::write(
        &shim,
        format!("#!/bin/sh\nexec '{}' -i \"$@\"\n", real.display()),
    )
    .unwrap();
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn pjdfstest_kernel_and_ubtrfs() {
    require_privileged!();
    let pjdfstest = tool("pjdfstest", PJDFSTEST_VERSION);
    let t = TestDir::new("pjdfstest").unwrap();
    let work = t.join("work");
    fs::create_dir_all(&work).unwrap();
    write_config(&work.join("plain.toml"), false);
    write_config(&work.join("remount.toml"), true);
    write_mount_shim(&work.join("bin"));
    let second = Tmpfs::new(&t.join("second"));
    let setup = Setup {
        pjdfstest: &pjdfstest,
        work,
        second: second.path(),
    };

    // The kernel's btrfs: the oracle.
    let kimg = new_image(&t, "kernel.img", IMAGE_SIZE);
    let kernel_results = {
        let m = Mount::single(&kimg, &t.join("kernel"), "").expect("kernel mount");
        let r = setup.suite("kernel", m.path());
        m.unmount().expect("unmount the kernel's btrfs");
        r
    };
    check_image(&kimg);

    // ubtrfs through FUSE, with what a kernel mount has by default:
    // device nodes and set-user-ID bits honoured; other users let in.
    // Twice: over io_uring when the kernel offers it (the default), and
    // through /dev/fuse.
    let mut runs = Vec::new();
    // Short labels: they name the mount points, and socket paths are short.
    for (label, transport) in [("ring", ""), ("dev", ",nouring")] {
        let img = new_image(&t, &format!("{label}.img"), IMAGE_SIZE);
        let opts = format!("allow_other,dev,suid{transport}");
        let m = start_mount(&img, &t.join(label), &["-o", &opts]);
        let results = setup.suite(label, m.path());
        m.unmount().expect("unmount ubtrfs cleanly");
        check_image(&img);
        runs.push((label, results));
    }

    // The oracle must have said something.
    let kernel_passed = kernel_results
        .values()
        .filter(|o| **o == Outcome::Pass)
        .count();
    assert!(
        kernel_passed >= 300,
        "the kernel passed only {kernel_passed} tests: {}",
        counts(&kernel_results)
    );
    let known: BTreeMap<&str, &str> = KNOWN_DIFFERENCES.iter().copied().collect();
    let mut problems = Vec::new();
    for (label, ubtrfs_results) in &runs {
        assert_eq!(
            kernel_results.keys().collect::<Vec<_>>(),
            ubtrfs_results.keys().collect::<Vec<_>>(),
            "{label}: the two runs ran different tests"
        );
        for (name, k) in &kernel_results {
            let u = &ubtrfs_results[name];
            let differs = *k == Outcome::Pass && *u != Outcome::Pass;
            match (differs, known.get(name.as_str())) {
                (true, None) => problems.push(format!(
                    "{label}: {name}: kernel ok, ubtrfs {}\n\t{}",
                    u.word(),
                    match u {
                        Outcome::Fail(msg) => msg.trim().replace('\n', "\n\t"),
                        _ => String::new(),
                    }
                )),
                (false, Some(why)) => problems.push(format!(
                    "{label}: {name}: listed as a known difference ({why}), but kernel {} and \
                     ubtrfs {}: remove it from KNOWN_DIFFERENCES",
                    k.word(),
                    u.word()
                )),
                _ => {}
            }
            if *k != Outcome::Pass && *u == Outcome::Pass {
                eprintln!(
                    "note: {label}: {name}: ubtrfs passes, the kernel {}",
                    k.word()
                );
            }
        }
    }
    for name in known.keys() {
        if !kernel_results.contains_key(*name) {
            problems.push(format!(
                "{name}: a known difference pjdfstest no longer has"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "pjdfstest: ubtrfs differs from the kernel ({} vs {}):\n{}",
        runs.iter()
            .map(|(l, r)| format!("{l}: {}", counts(r)))
            .collect::<Vec<_>>()
            .join(", "),
        counts(&kernel_results),
        problems.join("\n")
    );
}

#[test]
fn parses_pjdfstest_output() {
    let out = "\u{1b}[34mchmod::ok_case\u{1b}[0m    \u{1b}[32mok\u{1b}[0m\n\
               rename::bad   FAILED\n\
               \tassertion `left == right` failed\n\
               \t  left: 1\n\
               Backtrace:\n\
               link::skipme   skipped\n\
               \tCannot get value for LINK_MAX\n\
               \n\
               Summary: 1 failed, 1 skipped, 1 passed, 0 expected failures, 3 total\n\
               Error: Some tests have failed\n";
    let r = parse(out);
    assert_eq!(r.len(), 3);
    assert_eq!(r["chmod::ok_case"], Outcome::Pass);
    assert_eq!(r["link::skipme"], Outcome::Skip);
    match &r["rename::bad"] {
        Outcome::Fail(msg) => assert!(msg.contains("left: 1"), "{msg}"),
        o => panic!("{o:?}"),
    }
}

#[test]
#[should_panic(expected = "disagree")]
fn parse_checks_the_summary() {
    parse("a::b   ok\nSummary: 0 failed, 0 skipped, 2 passed, 0 expected failures, 2 total\n");
}

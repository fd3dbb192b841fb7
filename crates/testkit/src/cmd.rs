//! Running external programs (`mkfs.btrfs`, `losetup`, `mount`, ...).

use anyhow::{Context, Result, bail};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Directories searched after `$PATH`: administration tools live in
/// `sbin`, which is not on every user's `PATH`.
const EXTRA_PATH: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// The full path of `program` if it can be found on `$PATH` or in the
/// `sbin` directories.
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_PATH.iter().map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A [`Command`] for `program`, resolved through [`which`] so that `sbin`
/// tools are found even when `$PATH` lacks `sbin`.
pub fn command(program: &str) -> Command {
    Command::new(which(program).unwrap_or_else(|| PathBuf::from(program)))
}

/// Run `cmd` with stdin from `/dev/null`, wait for it, and return its
/// stdout (lossily decoded). A non-zero exit, or failure to start, is an
/// error whose message holds the command line, the exit status, stderr and
/// stdout.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = run_bytes(cmd)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Like [`run`], returning stdout as raw bytes.
pub fn run_bytes(cmd: &mut Command) -> Result<Vec<u8>> {
    let shown = format!("{cmd:?}");
    let out = output_of(cmd).with_context(|| format!("cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}):\n--- stderr ---\n{}--- stdout ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(out.stdout)
}

/// Runs `cmd` (stdin from /dev/null) and collects its output.
///
/// `btrfs check` looks whether its image is mounted through every loop
/// device; one that another test detaches meanwhile fails it with "could
/// not check mount status" before it checked anything. Such a run is
/// repeated, a few times at most.
pub fn output_of(cmd: &mut Command) -> std::io::Result<std::process::Output> {
    cmd.stdin(Stdio::null());
    let mut out = cmd.output()?;
    for _ in 0..3 {
        let raced = String::from_utf8_lossy(&out.stderr).contains("could not check mount status");
        if out.status.success() || !raced {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        out = cmd.output()?;
    }
    Ok(out)
}

/// Run `program` with `args` (see [`run`]).
///
/// ```no_run
/// let version = testkit::run_args("mkfs.btrfs", ["--version"]).unwrap();
/// ```
pub fn run_args<I, S>(program: &str, args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(command(program).args(args))
}

/// Why tests that need root, loop devices, the btrfs kernel module and
/// btrfs-progs cannot run here, or `None` if they can.
pub fn privileged_unavailable() -> Option<String> {
    if !crate::sys::is_root() {
        return Some("not running as root".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("btrfs"))
    {
        return Some("the btrfs kernel module is not loaded (see /proc/filesystems)".into());
    }
    for tool in ["mkfs.btrfs", "btrfs", "losetup", "mount", "umount"] {
        if which(tool).is_none() {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing".into());
    }
    None
}

/// True when `UBTRFS_REQUIRE_PRIVILEGED` is set to a non-empty value other
/// than `0` (`scripts/test.sh` sets it): then privileged tests fail instead
/// of skipping.
pub fn privileged_required() -> bool {
    std::env::var("UBTRFS_REQUIRE_PRIVILEGED").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// At the top of a test that needs root, loop devices and the kernel's
/// btrfs: fails the test, naming what is missing, when those are
/// unavailable. There is no skipping: `scripts/test.sh` installs them.
///
/// ```no_run
/// #[test]
/// fn reads_kernel_image() {
///     testkit::require_privileged!();
///     // ...
/// }
/// ```
#[macro_export]
macro_rules! require_privileged {
    () => {
        // Never a silent skip: a test that cannot run is a failing test.
        if let Some(why) = $crate::privileged_unavailable() {
            panic!("this test needs root, loop devices, the btrfs module and btrfs-progs (scripts/test.sh installs them): {why}");
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_returns_stdout() {
        let out = run(Command::new("sh").args(["-c", "echo hello; echo noise >&2"])).unwrap();
        assert_eq!(out, "hello\n");
    }

    #[test]
    fn run_reports_stderr_on_failure() {
        let err = run(Command::new("sh").args(["-c", "echo out; echo 'it broke' >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("it broke"), "{err}");
        assert!(err.contains("exit status: 3"), "{err}");
        assert!(err.contains("out"), "{err}");
    }

    #[test]
    fn run_reports_missing_program() {
        let err = run_args("definitely-not-a-program-xyz", ["a"]).unwrap_err();
        assert!(format!("{err:#}").contains("cannot start"), "{err:#}");
    }

    #[test]
    fn which_finds_sh() {
        assert!(which("sh").is_some());
        assert!(which("definitely-not-a-program-xyz").is_none());
    }
}

//! `ubtrfs mount`: serve a filesystem through FUSE.
//!
//! Foreground by default; `--daemon` forks before anything else happens
//! (while the process has one thread) and the parent exits 0 only once the
//! child reports that the mount is up, or prints the child's error. SIGINT,
//! SIGTERM and SIGHUP unmount the filesystem and end the process; so does
//! `fusermount3 -u MOUNTPOINT` (or `umount`) from outside.

use super::{list, open_fs};
use crate::fuse::FuseFs;
use anyhow::{Context, Result, anyhow, bail};
use fuser::{Config, MountOption, SessionACL};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Arguments of `mount`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Mount options (-o, comma separated): ro, allow_other, allow_root, \
auto_unmount, default_permissions, dev, nodev, suid, nosuid, exec, noexec, \
atime, noatime, sync, async, dirsync, fsname=NAME, subtype=NAME. \
The mount is always read-only, with default_permissions, and nodev,nosuid \
unless dev or suid is given. Unmount with `fusermount3 -u MOUNTPOINT`, \
Ctrl-C, or SIGTERM to the process.")]
pub struct Args {
    /// The filesystem's devices (all of them, any order).
    #[arg(required = true, value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// The mount point (an existing directory).
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
    /// Mount read-only (required, or `-o ro`: read-write mounts are not
    /// implemented yet).
    #[arg(long)]
    ro: bool,
    /// Detach into the background once the mount is up.
    #[arg(long, short = 'd')]
    daemon: bool,
    /// Mount options, comma separated (see below).
    #[arg(short = 'o', value_name = "OPTS", action = clap::ArgAction::Append)]
    options: Vec<String>,
    /// Threads serving requests (default: the number of CPUs, at most 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
}

/// Run `mount`.
pub fn run(args: Args) -> Result<()> {
    let (devices, mountpoint) = (&args.devices, &args.mountpoint);
    let config = mount_config(&args, devices)?;
    let ro_option = args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "ro");
    if !args.ro && !ro_option {
        bail!("read-write mounts are not implemented yet; use --ro");
    }
    let meta = std::fs::metadata(mountpoint)
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("mount point {}: not a directory", mountpoint.display());
    }
    let mountpoint = mountpoint
        .canonicalize()
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    if args.daemon {
        let notify = daemonize()?;
        if serve(devices, &mountpoint, &config, Some(notify)).is_err() {
            // The parent has printed the error (sent through the pipe) or,
            // once mounted, stderr is /dev/null: just report failure.
            std::process::exit(1);
        }
        Ok(())
    } else {
        serve(devices, &mountpoint, &config, None)
    }
}

/// The fuser configuration from the command line.
fn mount_config(args: &Args, devices: &[PathBuf]) -> Result<Config> {
    let mut opts = vec![
        MountOption::RO,
        MountOption::DefaultPermissions,
        MountOption::Subtype("ubtrfs".into()),
    ];
    let mut acl = SessionACL::Owner;
    let mut fsname = devices
        .first()
        .map(|d| d.canonicalize().unwrap_or_else(|_| d.clone()))
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let (mut dev, mut suid) = (false, false);
    for opt in args.options.iter().flat_map(|o| o.split(',')) {
        let o = match opt {
            "" | "ro" | "default_permissions" => continue,
            "rw" => bail!("read-write mounts are not implemented yet; use --ro"),
            "allow_other" => {
                acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                acl = SessionACL::RootAndOwner;
                continue;
            }
            "auto_unmount" => MountOption::AutoUnmount,
            "dev" => {
                dev = true;
                continue;
            }
            "nodev" => {
                dev = false;
                continue;
            }
            "suid" => {
                suid = true;
                continue;
            }
            "nosuid" => {
                suid = false;
                continue;
            }
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            o => {
                if let Some(name) = o.strip_prefix("fsname=") {
                    fsname = name.to_string();
                    continue;
                }
                if let Some(name) = o.strip_prefix("subtype=") {
                    opts.retain(|x| !matches!(x, MountOption::Subtype(_)));
                    MountOption::Subtype(name.to_string())
                } else {
                    bail!("unknown mount option {o:?} (see --help)");
                }
            }
        };
        opts.retain(|x| x != &o);
        opts.push(o);
    }
    opts.push(if dev {
        MountOption::Dev
    } else {
        MountOption::NoDev
    });
    opts.push(if suid {
        MountOption::Suid
    } else {
        MountOption::NoSuid
    });
    // fusermount splits options on commas; keep the name in one piece.
    opts.push(MountOption::FSName(fsname.replace(',', "_")));
    if opts.contains(&MountOption::AutoUnmount) && acl == SessionACL::Owner {
        bail!("auto_unmount needs allow_other or allow_root");
    }
    let threads = match args.threads {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism()
            .map(|n| n.get().clamp(2, 8))
            .unwrap_or(2),
    };
    let mut config = Config::default();
    config.mount_options = opts;
    config.acl = acl;
    config.n_threads = Some(threads);
    // One /dev/fuse descriptor per thread, so they do not contend on one queue.
    config.clone_fd = true;
    Ok(config)
}

/// Open, mount and serve until unmounted. With `notify`, report "mounted"
/// (or the error) to the waiting parent and detach from the terminal.
fn serve(
    devices: &[PathBuf],
    mountpoint: &Path,
    config: &Config,
    mut notify: Option<std::fs::File>,
) -> Result<()> {
    // Block the signals in this thread before any other thread exists, so
    // every thread inherits the mask and only the waiter below sees them.
    let signals = block_signals()?;
    let mounted = (|| -> Result<_> {
        let fs = open_fs(devices)?;
        let mut session =
            fuser::Session::new(FuseFs::new(fs), mountpoint, config).with_context(|| {
                format!("cannot mount {} on {}", list(devices), mountpoint.display())
            })?;
        let unmounter = session.unmount_callable();
        Ok((session, unmounter))
    })();
    let (session, unmounter) = match mounted {
        Ok(m) => m,
        Err(e) => {
            if let Some(mut pipe) = notify.take() {
                let _ = write!(pipe, "{}", crate::util::error_chain(&e));
            }
            return Err(e);
        }
    };
    tracing::info!(
        "mounted {} on {} (read-only)",
        list(devices),
        mountpoint.display()
    );
    let mp = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || wait_for_signals(signals, unmounter, &mp))
        .context("cannot start the signal thread")?;
    if let Some(mut pipe) = notify.take() {
        let _ = pipe.write_all(b"ok");
        drop(pipe);
        detach_stdio();
    }
    session
        .run()
        .with_context(|| format!("serving {}", mountpoint.display()))?;
    tracing::info!("{} unmounted", mountpoint.display());
    Ok(())
}

/// Signals that end the mount.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn block_signals() -> Result<libc::sigset_t> {
    // SAFETY: the set is initialised by sigemptyset before use; the calls
    // only read and write it and the thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc)).context("pthread_sigmask");
        }
        Ok(set)
    }
}

/// Wait for a stop signal and unmount; a second signal ends the process at once.
fn wait_for_signals(set: libc::sigset_t, mut unmounter: fuser::SessionUnmounter, mp: &Path) {
    let mut first = true;
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is an initialised signal set and `sig` a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        if !first {
            tracing::warn!("second signal {sig}: exiting without waiting for the unmount");
            std::process::exit(128 + sig);
        }
        first = false;
        tracing::info!("signal {sig}: unmounting {}", mp.display());
        if let Err(e) = unmounter.unmount() {
            tracing::warn!(
                "cannot unmount {} ({e}); detaching it lazily: it goes away when no longer busy",
                mp.display()
            );
            lazy_unmount(mp);
        }
    }
}

fn lazy_unmount(mp: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        // Not root: let the setuid helper do it.
        let _ = std::process::Command::new("fusermount3")
            .args(["-u", "-z", "--"])
            .arg(mp)
            .status();
    }
}

/// Fork. The parent waits for the child's report and exits with it; the
/// child returns a pipe to report on. Must run while single-threaded.
fn daemonize() -> Result<std::fs::File> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: the descriptors were just created and are owned here only.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process has a single thread here (nothing has spawned one
    // yet), so the child may go on running ordinary Rust code.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()).context("fork"),
        0 => {
            drop(read_end);
            // SAFETY: no preconditions; a new session detaches from the terminal.
            unsafe { libc::setsid() };
            Ok(std::fs::File::from(write_end))
        }
        child => {
            drop(write_end);
            let mut report = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut report);
            if report == "ok" {
                std::process::exit(0);
            }
            if report.is_empty() {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(child, &mut status, 0) };
                return Err(anyhow!(
                    "the mount daemon exited before the mount was up (status {status:#x})"
                ));
            }
            // Already a full message: print it as it is.
            Err(anyhow!(report))
        }
    }
}

/// Point stdin, stdout and stderr at /dev/null and leave the mount point's
/// directory tree, as a daemon should.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: duplicating a valid descriptor onto the standard ones.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let _ = std::env::set_current_dir("/");
}

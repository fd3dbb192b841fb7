//! `ubtrfs mount`: serve a filesystem through FUSE, read-write or
//! read-only.
//!
//! Foreground by default; `--daemon` forks before anything else happens
//! (while the process has one thread) and the parent exits 0 only once the
//! child reports that the mount is up, or prints the child's error. SIGINT,
//! SIGTERM and SIGHUP unmount the filesystem and end the process; so does
//! `ubtrfs umount MOUNTPOINT` or `fusermount3 -u MOUNTPOINT` (or `umount`)
//! from outside. Either way the kernel first writes back the dirty pages
//! it holds (the mount uses its writeback cache), then the last
//! transaction is committed before the process exits, and the exit status
//! says whether that commit succeeded. (A second signal, for a mount that
//! cannot be unmounted because it is busy, commits at once: what the
//! kernel still holds dirty is lost then, as in a crash.)

use super::list;
use crate::fuse::{FuseFs, Served};
use anyhow::{Context, Result, anyhow, bail};
use fuser::{Config, MountOption, SessionACL};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use ubtrfs::data::compression::Compression;
use ubtrfs::data::ordered::CsumMode;
use ubtrfs::format::consts::{FIRST_INODE, FS_TREE_OBJECTID, INODE_NODATACOW, INODE_NODATASUM};
use ubtrfs::fs::{AtimeUpdate, Filesystem, InodeId};

/// Seconds between periodic commits unless `-o commit=` says otherwise
/// (the kernel's default).
const DEFAULT_COMMIT_SECS: u64 = 30;
/// Commit intervals above this draw a warning, as in the kernel.
const MAX_QUIET_COMMIT_SECS: u64 = 300;

/// Arguments of `mount`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Mount options (-o, comma separated): ro, rw, commit=SECONDS, \
csum=inline|offload|auto, compress[=ALG[:LEVEL]], compress-force[=ALG[:LEVEL]] \
(ALG: zlib, lzo, zstd), nodatacow, datacow, nodatasum, datasum, \
subvol=PATH, subvolid=ID, uring, nouring, allow_other, \
allow_root, auto_unmount, default_permissions, dev, nodev, suid, nosuid, \
exec, noexec, relatime, strictatime, noatime, atime, diratime, nodiratime, \
norecovery or rescue=nologreplay (with ro; also nologreplay), sync, async, dirsync, fsname=NAME, subtype=NAME. \
The mount is read-write unless --ro or ro is given; it always has \
default_permissions, and nodev,nosuid unless dev or suid is given. \
nodatacow gives new regular files the no-COW and no-checksum flags, \
nodatasum the no-checksum flag, as the kernel's options do. \
Access times move as the kernel's relatime (the default), strictatime \
and noatime say, when a file is opened for reading or a directory for \
listing. \
nologreplay shows the filesystem as its last commit left it, without \
replaying what was fsync'd since (the log tree, left on disk). \
subvol=PATH (relative to the top-level subvolume) or subvolid=ID mounts \
that subvolume as the root instead of the default one. \
Requests come over io_uring (one queue per CPU) when the kernel offers it \
(Linux 6.14 or later with /sys/module/fuse/parameters/enable_uring set to \
Y), through /dev/fuse otherwise or with nouring. \
Changes are committed every commit=SECONDS (default 30), on fsync, and at \
unmount. Unmount with `ubtrfs umount MOUNTPOINT`, `fusermount3 -u \
MOUNTPOINT`, Ctrl-C, or SIGTERM to the process; the process exits non-zero \
if the last commit fails.")]
pub struct Args {
    /// The filesystem's devices (all of them, any order).
    #[arg(required = true, value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// The mount point (an existing directory).
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
    /// Mount read-only (the same as `-o ro`).
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

/// What the command line asks for besides fuser's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    read_only: bool,
    /// Time between periodic commits.
    commit_interval: Duration,
    /// How data checksums are computed (`csum=`).
    csum_mode: Option<CsumMode>,
    /// Compression of new extents (`compress=`, `compress-force=`).
    compress: Option<(Compression, Option<i32>)>,
    /// `compress-force`: try every extent, even data that looks
    /// incompressible.
    compress_force: bool,
    /// Flags of new regular files (`nodatacow`, `nodatasum`).
    new_file_flags: u64,
    /// The subvolume to mount (`subvol=`, `subvolid=`).
    subvol: Option<SubvolChoice>,
    /// Take requests over io_uring when the kernel offers it (`nouring`
    /// says no).
    uring: bool,
    /// When reads move access times (`relatime`, `strictatime`, `noatime`).
    atime: AtimeUpdate,
    /// Whether listings move directories' access times (`nodiratime` says
    /// no).
    diratime: bool,
    /// Leave a log tree unreplayed (`nologreplay`, `norecovery`; read-only).
    nologreplay: bool,
}

/// Which subvolume `subvol=` and `subvolid=` ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct SubvolChoice {
    path: Option<String>,
    id: Option<u64>,
}

/// The value of `csum=`: inline, offload or auto (seed 003).
fn parse_csum_mode(v: &str) -> Result<CsumMode> {
    Ok(match v {
        "inline" => CsumMode::Inline,
        "offload" => CsumMode::Offload,
        "auto" => CsumMode::Auto,
        _ => bail!("mount option csum={v:?}: expected inline, offload or auto"),
    })
}

/// The value of `compress=` / `compress-force=`: ALGORITHM[:LEVEL], or no.
fn parse_compress(v: &str) -> Result<Option<(Compression, Option<i32>)>> {
    let (name, level) = match v.split_once(':') {
        Some((n, l)) => (
            n,
            Some(
                l.parse::<i32>()
                    .map_err(|_| anyhow!("compression level {l:?} is not a number"))?,
            ),
        ),
        None => (v, None),
    };
    Ok(match name {
        "" | "zlib" => Some((Compression::Zlib, level)),
        "lzo" => Some((Compression::Lzo, None)),
        "zstd" => Some((Compression::Zstd, level)),
        "no" | "none" => None,
        _ => bail!("mount option compress={v:?}: expected zlib, lzo, zstd (with :LEVEL) or no"),
    })
}

/// Run `mount`.
pub fn run(args: Args) -> Result<()> {
    let (devices, mountpoint) = (&args.devices, &args.mountpoint);
    let (config, settings) = mount_config(&args, devices)?;
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
        if serve(devices, &mountpoint, &config, settings, Some(notify)).is_err() {
            // The parent has printed the error (sent through the pipe) or,
            // once mounted, stderr is /dev/null: just report failure.
            std::process::exit(1);
        }
        Ok(())
    } else {
        serve(devices, &mountpoint, &config, settings, None)
    }
}

/// The fuser configuration and our own settings from the command line.
fn mount_config(args: &Args, devices: &[PathBuf]) -> Result<(Config, Settings)> {
    let mut opts = vec![
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
    // The last of ro and rw wins, as for mount(8); --ro overrides both.
    let mut read_only = false;
    let mut commit_secs = DEFAULT_COMMIT_SECS;
    let mut csum_mode = None;
    let mut compress = None;
    let mut compress_force = false;
    let (mut nodatacow, mut nodatasum) = (false, false);
    let mut subvol: Option<SubvolChoice> = None;
    let mut uring = true;
    let mut nologreplay = false;
    let (mut atime, mut diratime) = (AtimeUpdate::Relative, true);
    for opt in args.options.iter().flat_map(|o| o.split(',')) {
        let o = match opt {
            "" | "default_permissions" => continue,
            // As in the kernel: nodatacow implies nodatasum, datasum
            // implies datacow.
            "nodatacow" => {
                (nodatacow, nodatasum) = (true, true);
                continue;
            }
            "datacow" => {
                nodatacow = false;
                continue;
            }
            "nodatasum" => {
                nodatasum = true;
                continue;
            }
            "datasum" => {
                (nodatacow, nodatasum) = (false, false);
                continue;
            }
            "ro" => {
                read_only = true;
                continue;
            }
            // The kernel's norecovery is its old name for nologreplay.
            "nologreplay" | "norecovery" | "rescue=nologreplay" => {
                nologreplay = true;
                continue;
            }
            "uring" | "nouring" => {
                uring = opt == "uring";
                continue;
            }
            "rw" => {
                read_only = false;
                continue;
            }
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
            "atime" => {
                if atime == AtimeUpdate::Never {
                    atime = AtimeUpdate::Relative;
                }
                MountOption::Atime
            }
            "noatime" => {
                atime = AtimeUpdate::Never;
                MountOption::NoAtime
            }
            "relatime" | "strictatime" => {
                atime = if opt == "relatime" {
                    AtimeUpdate::Relative
                } else {
                    AtimeUpdate::Always
                };
                continue;
            }
            "diratime" | "nodiratime" => {
                diratime = opt == "diratime";
                continue;
            }
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            o => {
                if let Some(secs) = o.strip_prefix("commit=") {
                    commit_secs = parse_commit(secs)?;
                    continue;
                }
                if let Some(v) = o.strip_prefix("csum=") {
                    csum_mode = Some(parse_csum_mode(v)?);
                    continue;
                }
                // compress-force tries every extent; compress skips data
                // that looks incompressible. Both write plain what does
                // not shrink.
                if let Some(v) = o.strip_prefix("compress-force=") {
                    compress = parse_compress(v)?;
                    // As in the kernel, compress-force=no is no compression.
                    compress_force = compress.is_some();
                    continue;
                }
                if let Some(v) = o.strip_prefix("compress=") {
                    compress = parse_compress(v)?;
                    compress_force = false;
                    continue;
                }
                if o == "compress" || o == "compress-force" {
                    compress = Some((Compression::Zlib, None));
                    compress_force = o == "compress-force";
                    continue;
                }
                if let Some(p) = o.strip_prefix("subvol=") {
                    if p.is_empty() {
                        bail!("mount option subvol= needs a path");
                    }
                    subvol.get_or_insert_with(Default::default).path = Some(p.to_string());
                    continue;
                }
                if let Some(v) = o.strip_prefix("subvolid=") {
                    let id = v.parse::<u64>().map_err(|_| {
                        anyhow!("mount option subvolid={v:?}: expected a subvolume id")
                    })?;
                    subvol.get_or_insert_with(Default::default).id = Some(id);
                    continue;
                }
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
    read_only |= args.ro;
    if !read_only && let Some(seed) = seed_device(devices) {
        // As the kernel does: a seed is only ever read.
        eprintln!(
            "ubtrfs: warning: {} is a seed device: mounted read-only",
            seed.display()
        );
        read_only = true;
    }
    if nologreplay && !read_only {
        bail!(
            "mount option nologreplay needs a read-only mount (-o ro): a log not replayed would be lost"
        );
    }
    opts.push(if read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
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
    if !read_only && commit_secs > MAX_QUIET_COMMIT_SECS {
        tracing::warn!(
            "commit interval of {commit_secs} s is long: up to that much work is lost on a crash"
        );
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
    // Read by `serve` for the /dev/fuse threads (each with a descriptor
    // of its own, `fuse_ring::dev`); fuser's own loop never runs.
    config.n_threads = Some(threads);
    let mut new_file_flags = 0;
    if nodatasum {
        new_file_flags |= INODE_NODATASUM;
    }
    if nodatacow {
        new_file_flags |= INODE_NODATACOW | INODE_NODATASUM;
    }
    let settings = Settings {
        read_only,
        commit_interval: Duration::from_secs(commit_secs),
        csum_mode,
        compress,
        compress_force,
        new_file_flags,
        subvol,
        uring,
        atime,
        diratime,
        nologreplay,
    };
    Ok((config, settings))
}

/// The root directory of the subvolume `choice` names, or the default
/// subvolume's. A path is taken from the top-level subvolume, as the
/// kernel does; `subvolid=0` means the default subvolume.
fn mount_root(fs: &Filesystem, choice: Option<&SubvolChoice>) -> Result<InodeId> {
    let Some(choice) = choice else {
        return Ok(fs.root());
    };
    let top = InodeId {
        subvol: FS_TREE_OBJECTID,
        ino: FIRST_INODE,
    };
    let by_path = match &choice.path {
        None => None,
        Some(p) => {
            let mut cur = top;
            for name in p.split('/').filter(|c| !c.is_empty() && *c != ".") {
                cur = fs
                    .lookup(cur, name.as_bytes())
                    .with_context(|| format!("subvolume {p:?} does not exist"))?
                    .id;
            }
            if cur.ino != FIRST_INODE {
                bail!("subvol={p}: {p:?} is not a subvolume");
            }
            Some(cur)
        }
    };
    let by_id = match choice.id {
        None => None,
        Some(0) => Some(fs.root()),
        Some(id) => {
            let known = id == FS_TREE_OBJECTID
                || fs
                    .subvolumes()
                    .context("cannot list the subvolumes")?
                    .iter()
                    .any(|s| s.id == id);
            if !known {
                bail!("subvolume with id {id} does not exist");
            }
            Some(InodeId {
                subvol: id,
                ino: FIRST_INODE,
            })
        }
    };
    match (by_path, by_id) {
        (Some(a), Some(b)) if a != b => bail!(
            "subvol={} is subvolume {}, not subvolid={}",
            choice.path.as_deref().unwrap_or_default(),
            a.subvol,
            b.subvol
        ),
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Ok(fs.root()),
    }
}

/// A seed device given alone (every one of `devices` is a seed): it is
/// only read.
fn seed_device(devices: &[PathBuf]) -> Option<&PathBuf> {
    let seed = |path: &PathBuf| {
        ubtrfs::device::FileDevice::open_read_only(path)
            .and_then(|dev| ubtrfs::volume::scan_device(&dev))
            .is_ok_and(|(sb, _)| sb.is_seed())
    };
    // A filesystem sprouted from seeds is written (on its own devices).
    if devices.iter().all(seed) {
        devices.first()
    } else {
        None
    }
}

/// The value of `commit=`: whole seconds; 0 means the default, as in the
/// kernel.
fn parse_commit(secs: &str) -> Result<u64> {
    let n: u64 = secs
        .parse()
        .map_err(|_| anyhow!("mount option commit={secs:?}: expected a whole number of seconds"))?;
    if n > u64::from(u32::MAX) {
        bail!("mount option commit={secs}: too long");
    }
    Ok(if n == 0 { DEFAULT_COMMIT_SECS } else { n })
}

/// Open the filesystem, read-write unless `read_only`, and print the
/// library's warnings on stderr.
fn open_fs(devices: &[PathBuf], read_only: bool, nologreplay: bool) -> Result<Filesystem> {
    if nologreplay {
        let fs = Filesystem::open_without_log_replay(devices)
            .with_context(|| format!("cannot open a btrfs filesystem on {}", list(devices)))?;
        for warning in fs.warnings() {
            eprintln!("ubtrfs: warning: {warning}");
        }
        return Ok(fs);
    }
    if read_only {
        return super::open_fs(devices);
    }
    super::refuse_mounted(devices)?;
    let fs = Filesystem::open_read_write(devices).with_context(|| {
        format!(
            "cannot open a btrfs filesystem on {} for writing (--ro mounts it read-only)",
            list(devices)
        )
    })?;
    for warning in fs.warnings() {
        eprintln!("ubtrfs: warning: {warning}");
    }
    // Ring threads serve short requests under SCHED_IDLE: long work
    // (a commit, freeing extents) runs under the normal policy.
    fs.set_before_long_work(|| {
        fuse_ring::leave_idle();
    });
    Ok(fs)
}

/// Open, mount and serve until unmounted, then make the last commit. With
/// `notify`, report "mounted" (or the error) to the waiting parent and
/// detach from the terminal.
fn serve(
    devices: &[PathBuf],
    mountpoint: &Path,
    config: &Config,
    settings: Settings,
    mut notify: Option<std::fs::File>,
) -> Result<()> {
    // Block the signals in this thread before any other thread exists, so
    // every thread inherits the mask and only the waiter below sees them.
    let signals = block_signals()?;
    let mounted = (|| -> Result<_> {
        let fs = open_fs(devices, settings.read_only, settings.nologreplay)?;
        if !settings.read_only {
            if let Some(mode) = settings.csum_mode {
                fs.set_csum_mode(mode)
                    .context("cannot set the checksum mode")?;
            }
            fs.set_compression(settings.compress)
                .context("cannot set compression")?;
            fs.set_compress_force(settings.compress_force)
                .context("cannot set compression")?;
            fs.set_new_file_flags(settings.new_file_flags)
                .context("cannot set nodatacow/nodatasum")?;
        }
        let opts = crate::fuse::Options {
            root: mount_root(&fs, settings.subvol.as_ref())?,
            uring: settings.uring,
            atime: settings.atime,
            diratime: settings.diratime,
            nologreplay: settings.nologreplay,
            mountpoint: mountpoint.to_path_buf(),
        };
        let served = Arc::new(Served::new(fs, !settings.read_only));
        let fuse = FuseFs::new(Arc::clone(&served), opts);
        let serving = fuse.clone();
        let mut session = match fuser::Session::new(fuse, mountpoint, config) {
            Ok(session) => session,
            // Unmounted the moment it was mounted, before the kernel's
            // first request: nothing was served, nothing changed since
            // the open, and the mount ends as after any unmount.
            // (fuser's own error, without an OS code: a real ENOTCONN, a
            // dead mount above the mountpoint, is a failure.)
            Err(e)
                if e.kind() == std::io::ErrorKind::NotConnected && e.raw_os_error().is_none() =>
            {
                tracing::info!("unmounted before the first request: {e}");
                served
                    .commit("last")
                    .map_err(|_| anyhow!("the last commit failed (the log says why)"))?;
                return Ok(None);
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot mount {} on {}", list(devices), mountpoint.display())
                });
            }
        };
        serving.note_mounted();
        // Before any request is served: a change may need to tell the
        // kernel what it caches (a killed set-user-ID bit).
        served.set_notifier(session.notifier());
        // INIT is answered: if the kernel took FUSE over io_uring, it now
        // waits for the queues, and holds requests until they are up.
        let access = crate::fuse::Access {
            acl: config.acl,
            // As fuser tells the owner. SAFETY: geteuid cannot fail.
            owner: unsafe { libc::geteuid() },
        };
        let rings = match serving.start_rings(session.as_fd().as_raw_fd(), access) {
            Ok(rings) => rings,
            // Unmounted before the queues were up (the kernel refuses
            // entries of a connection that ended): the session ends at
            // once, and the last commit runs, as after any unmount.
            Err(fuse_ring::Error::Register(e))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV)
                ) =>
            {
                tracing::info!("unmounted while the io_uring queues started: {e}");
                false
            }
            Err(e) => {
                return Err(e).context(
                    "cannot start the io_uring queues (-o nouring serves through /dev/fuse)",
                );
            }
        };
        if rings {
            tracing::info!("serving over io_uring");
        }
        // Our own threads read /dev/fuse, not fuser's loop: they answer
        // what fuser cannot (statx, the ACL set-group-ID kill). Beside the
        // rings only FORGET, INTERRUPT and DESTROY come that way.
        let threads = if rings {
            1
        } else {
            config.n_threads.unwrap_or(1)
        };
        let dev = serving
            .serve_dev(session.as_fd(), threads, access)
            .context("cannot start the threads reading /dev/fuse")?;
        raise_readahead(mountpoint);
        let unmounter = session.unmount_callable();
        Ok(Some((session, dev, unmounter, served)))
    })();
    let (session, dev, unmounter, served) = match mounted {
        Ok(Some(m)) => m,
        Ok(None) => {
            if let Some(mut pipe) = notify.take() {
                let _ = pipe.write_all(b"ok");
            }
            tracing::info!("{} unmounted", mountpoint.display());
            return Ok(());
        }
        Err(e) => {
            if let Some(mut pipe) = notify.take() {
                let _ = write!(pipe, "{}", crate::util::error_chain(&e));
            }
            return Err(e);
        }
    };
    tracing::info!(
        "mounted {} on {} ({})",
        list(devices),
        mountpoint.display(),
        if settings.read_only {
            "read-only".to_string()
        } else {
            format!(
                "read-write, commit every {} s",
                settings.commit_interval.as_secs()
            )
        }
    );
    served
        .start_commit_timer(settings.commit_interval)
        .context("cannot start the commit thread")?;
    let mp = mountpoint.to_path_buf();
    let for_signals = Arc::clone(&served);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || wait_for_signals(signals, unmounter, &mp, &for_signals))
        .context("cannot start the signal thread")?;
    if let Some(mut pipe) = notify.take() {
        let _ = pipe.write_all(b"ok");
        drop(pipe);
        detach_stdio();
    }
    let ran = dev.join();
    // The connection is over: dropping the session makes the last commit
    // (`FuseFs::end_session`) and unmounts if the kernel has not yet.
    drop(session);
    // This returns the last commit's outcome.
    let committed = served.finish();
    if let (Err(e), Err(_)) = (&ran, &committed) {
        // Reported here: the error returned is the lost commit.
        tracing::error!("serving {}: {e}", mountpoint.display());
    }
    committed.map_err(|e| anyhow!("{} on {}: {e}", list(devices), mountpoint.display()))?;
    ran.with_context(|| format!("serving {}", mountpoint.display()))?;
    tracing::info!("{} unmounted", mountpoint.display());
    Ok(())
}

/// Readahead the mount's reads should get: as large as the largest
/// request (the kernel offers FUSE only its default, 128 KiB).
const READAHEAD_KB: u64 = crate::fuse::MAX_READAHEAD as u64 / 1024;

/// Raise the readahead of the mount's backing device info (root only; a
/// no-op elsewhere). It lives as long as the mount. (Its device number
/// comes from the mount table: nothing may look at the mount itself
/// before the session serves it.)
fn raise_readahead(mountpoint: &Path) {
    let Ok(Some(m)) = crate::mountinfo::mount_at(mountpoint) else {
        return;
    };
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", m.dev.0, m.dev.1);
    let current = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if current.is_some_and(|kb| kb < READAHEAD_KB)
        && let Err(e) = std::fs::write(&path, READAHEAD_KB.to_string())
    {
        tracing::debug!("cannot raise readahead through {path}: {e}");
    }
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

/// Wait for a stop signal and unmount (the session then ends and the last
/// commit follows). A second signal does not wait for the unmount: the
/// last commit is made at once (in a thread of its own) and the process
/// exits, detaching the mount lazily. A third one exits at once, without
/// that commit, for when it cannot finish (a request stuck in the library
/// holds the filesystem).
fn wait_for_signals(
    set: libc::sigset_t,
    mut unmounter: fuser::SessionUnmounter,
    mp: &Path,
    served: &Arc<Served>,
) {
    let mut count = 0;
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is an initialised signal set and `sig` a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        count += 1;
        match count {
            1 => {
                tracing::info!("signal {sig}: unmounting {}", mp.display());
                if let Err(e) = unmounter.unmount() {
                    tracing::warn!(
                        "cannot unmount {} ({e}); detaching it lazily: it goes away when no longer busy",
                        mp.display()
                    );
                    lazy_unmount(mp);
                }
            }
            2 => {
                tracing::warn!(
                    "second signal {sig}: committing and exiting without waiting for the unmount (a third signal exits at once, without committing)"
                );
                let (served, mp) = (Arc::clone(served), mp.to_path_buf());
                let started = std::thread::Builder::new()
                    .name("last-commit".into())
                    .spawn(move || {
                        let committed = served.finish();
                        lazy_unmount(&mp);
                        match committed {
                            Ok(()) => std::process::exit(128 + sig),
                            Err(e) => {
                                eprintln!("ubtrfs: error: {}: {e}", mp.display());
                                std::process::exit(1);
                            }
                        }
                    });
                if let Err(e) = started {
                    eprintln!("ubtrfs: error: cannot start the last commit: {e}");
                    std::process::exit(1);
                }
            }
            _ => {
                eprintln!(
                    "ubtrfs: error: signal {sig}: exiting without the last commit; changes made after the last successful commit are lost"
                );
                lazy_unmount(mp);
                std::process::exit(1);
            }
        }
    }
}

fn lazy_unmount(mp: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    {
        // Not root: let the setuid helper do it. (Any other error: it is
        // not mounted there any more, detached already.)
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// The compression settings `-o OPTS` gives: the last option wins.
    fn compression(opts: &str) -> (Option<(Compression, Option<i32>)>, bool) {
        let cli = Cli::try_parse_from(["mount", "disk.img", "/mnt", "-o", opts]).unwrap();
        let (_, s) = mount_config(&cli.args, &[PathBuf::from("disk.img")]).unwrap();
        (s.compress, s.compress_force)
    }

    #[test]
    fn compress_options_as_the_kernel_reads_them() {
        let zstd = Some((Compression::Zstd, None));
        assert_eq!(compression("compress=zstd"), (zstd, false));
        assert_eq!(compression("compress-force=zstd"), (zstd, true));
        assert_eq!(
            compression("compress-force=zstd:9"),
            (Some((Compression::Zstd, Some(9))), true)
        );
        assert_eq!(
            compression("compress-force"),
            (Some((Compression::Zlib, None)), true)
        );
        assert_eq!(compression("compress-force=no"), (None, false));
        assert_eq!(
            compression("compress-force=zstd,compress=no"),
            (None, false)
        );
        assert!(!compression("compress-force=zstd,compress=lzo").1);
    }
}

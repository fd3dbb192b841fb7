//! `ubtrfs restore`: copy everything out of a filesystem into a host
//! directory, with owners, modes, extended attributes, times, hard links and
//! holes.
//!
//! Per inode the order is: contents, owner (`lchown`, which clears setuid
//! bits and `security.capability`), mode, extended attributes, and times
//! last (nanoseconds, without following symlinks). A directory is created
//! writable first and gets its own attributes after everything inside it
//! (post-order), so restoring its entries does not disturb its times.
//! Subvolumes and snapshots become ordinary directories. An error on one
//! entry is reported and counted, and the restore goes on; the command
//! fails at the end if any entry failed.

use super::{fs_path, open_fs, os_name, resolve};
use crate::util::{rdev_to_host, show};
use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, IsTerminal};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use ubtrfs::format::items::Timespec;
use ubtrfs::fs::{FileKind, Filesystem, InodeId, Stat};

/// Bytes read from the filesystem per call.
const CHUNK: usize = 1 << 20;
/// Granularity of hole detection: all-zero blocks of this size are skipped.
const HOLE_BLOCK: usize = 4096;
/// Deepest directory nesting followed (guards against corrupt, cyclic trees).
const MAX_DEPTH: usize = 4096;

/// Arguments of `restore`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
DESTDIR is created if missing; then, and only then, it also gets the \
attributes of the restored directory. Existing directories are merged into; \
an existing file is an error unless --overwrite is given. Ownership and \
trusted.*/security.* attributes need root: without it they are skipped with \
a warning. Properties (btrfs.* attributes such as btrfs.compression) are kept \
only when DESTDIR is on btrfs; elsewhere they are skipped with a warning. \
Use -v to list each path as it is restored.")]
pub struct Args {
    /// The filesystem's devices (all of them, any order).
    #[arg(required = true, value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// The destination directory on the host.
    #[arg(value_name = "DESTDIR")]
    dest: PathBuf,
    /// Restore only this path inside the filesystem (a directory's contents
    /// go into DESTDIR; anything else into DESTDIR/its name).
    #[arg(long, value_name = "SUBPATH", default_value = "/")]
    path: PathBuf,
    /// Replace existing non-directory entries in DESTDIR.
    #[arg(long)]
    overwrite: bool,
}

/// Run `restore`. `verbose` > 0 lists each restored path on stdout.
pub fn run(args: Args, verbose: u8) -> Result<()> {
    let (devices, dest) = (&args.devices, &args.dest);
    let sub = fs_path(&args.path)?;
    let fs = open_fs(devices)?;
    let start = resolve(&fs, sub, false)?;
    let start_stat = fs.stat(start).with_context(|| show(sub))?;

    let created_dest = match fs::metadata(dest) {
        Ok(m) if m.is_dir() => false,
        Ok(_) => bail!("{}: exists and is not a directory", dest.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dest)
                .with_context(|| format!("cannot create {}", dest.display()))?;
            true
        }
        Err(e) => return Err(e).with_context(|| format!("{}", dest.display())),
    };

    let mut r = Restorer::new(&fs, args.overwrite, verbose > 0);
    if start_stat.kind == FileKind::Dir {
        let mut ancestors = vec![start];
        r.dir_contents(start, dest, sub, &mut ancestors);
        if created_dest {
            r.apply_attrs(dest, &start_stat, sub);
        }
    } else {
        let name = sub
            .rsplit(|&c| c == b'/')
            .find(|c| !c.is_empty())
            .ok_or_else(|| anyhow!("{}: has no name", show(sub)))?;
        r.entry(start, &dest.join(os_name(name)), sub, &mut Vec::new());
    }
    r.progress.finish_and_clear();
    r.summary();
    if r.counts.errors > 0 {
        bail!(
            "{} of the entries could not be restored completely (see the messages above)",
            r.counts.errors
        );
    }
    Ok(())
}

#[derive(Default)]
struct Counts {
    files: u64,
    dirs: u64,
    symlinks: u64,
    special: u64,
    hardlinks: u64,
    bytes: u64,
    errors: u64,
}

struct Restorer<'a> {
    fs: &'a Filesystem,
    overwrite: bool,
    list: bool,
    /// First restored path of each inode with more than one link.
    links: HashMap<InodeId, PathBuf>,
    counts: Counts,
    progress: ProgressBar,
    /// Whether lchown and privileged xattr namespaces can be expected to work.
    privileged: bool,
    /// Warnings about skipped privileged operations, reported once each.
    skipped: Vec<String>,
    buf_zero: Vec<u8>,
}

impl<'a> Restorer<'a> {
    fn new(fs: &'a Filesystem, overwrite: bool, list: bool) -> Self {
        let progress = if io::stderr().is_terminal() {
            let p = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            p.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {binary_bytes} ({binary_bytes_per_sec}) {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            p.enable_steady_tick(Duration::from_millis(200));
            p
        } else {
            ProgressBar::hidden()
        };
        Restorer {
            fs,
            overwrite,
            list,
            links: HashMap::new(),
            counts: Counts::default(),
            progress,
            // SAFETY: geteuid has no preconditions and cannot fail.
            privileged: unsafe { libc::geteuid() } == 0,
            skipped: Vec::new(),
            buf_zero: vec![0u8; HOLE_BLOCK],
        }
    }

    fn error(&mut self, fs_path: &[u8], msg: impl std::fmt::Display) {
        self.counts.errors += 1;
        self.progress
            .suspend(|| eprintln!("ubtrfs: restore: {}: {msg}", show(fs_path)));
    }

    fn tick(&mut self) {
        let c = &self.counts;
        self.progress.set_message(format!(
            "{} files, {} dirs, {} errors",
            c.files + c.symlinks + c.special + c.hardlinks,
            c.dirs,
            c.errors
        ));
    }

    /// Restore every entry of directory `dir` into the existing host directory `dest`.
    fn dir_contents(
        &mut self,
        dir: InodeId,
        dest: &Path,
        dir_path: &[u8],
        ancestors: &mut Vec<InodeId>,
    ) {
        let entries = match self.fs.read_dir(dir, 0) {
            Ok(e) => e,
            Err(e) => return self.error(dir_path, format!("cannot read the directory: {e}")),
        };
        for e in entries {
            let child_path = join(dir_path, &e.name);
            if e.name.is_empty()
                || e.name == b"."
                || e.name == b".."
                || e.name.contains(&b'/')
                || e.name.contains(&0)
            {
                self.error(&child_path, "invalid file name in the filesystem; skipped");
                continue;
            }
            self.entry(e.id, &dest.join(os_name(&e.name)), &child_path, ancestors);
        }
    }

    /// Restore one inode at host path `to`.
    fn entry(&mut self, id: InodeId, to: &Path, path: &[u8], ancestors: &mut Vec<InodeId>) {
        let stat = match self.fs.stat(id) {
            Ok(s) => s,
            Err(e) => return self.error(path, e),
        };
        if self.list {
            self.progress.suspend(|| println!("{}", show(path)));
        }
        if stat.kind == FileKind::Dir {
            return self.dir(id, &stat, to, path, ancestors);
        }
        if let Some(first) = self.links.get(&id).filter(|_| stat.nlink > 1) {
            match self
                .replace_existing(to)
                .and_then(|()| fs::hard_link(first, to))
            {
                Ok(()) => self.counts.hardlinks += 1,
                Err(e) => self.error(path, format!("cannot link to {}: {e}", first.display())),
            }
            self.tick();
            return;
        }
        let made = match stat.kind {
            FileKind::File => self.file(id, &stat, to, path),
            FileKind::Symlink => self.symlink(id, to),
            _ => self.special(&stat, to),
        };
        match made {
            Ok(()) => {
                if stat.nlink > 1 {
                    self.links.insert(id, to.to_path_buf());
                }
                self.apply_attrs(to, &stat, path);
            }
            Err(e) => self.error(path, format!("{e:#}")),
        }
        self.tick();
    }

    fn dir(
        &mut self,
        id: InodeId,
        stat: &Stat,
        to: &Path,
        path: &[u8],
        ancestors: &mut Vec<InodeId>,
    ) {
        if ancestors.contains(&id) {
            return self.error(path, "directory cycle in the filesystem; not descending");
        }
        if ancestors.len() >= MAX_DEPTH {
            return self.error(path, "directories nested too deep; not descending");
        }
        match fs::symlink_metadata(to) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return self.error(
                    path,
                    format!("{}: exists and is not a directory", to.display()),
                );
            }
            Err(_) => {
                // Writable for us until its own mode is applied after its contents.
                let made = std::fs::DirBuilder::new().mode(0o700).create(to);
                if let Err(e) = made {
                    return self.error(path, format!("cannot create {}: {e}", to.display()));
                }
            }
        }
        self.counts.dirs += 1;
        self.tick();
        ancestors.push(id);
        self.dir_contents(id, to, path, ancestors);
        ancestors.pop();
        self.apply_attrs(to, stat, path);
    }

    /// Make room for a new non-directory at `to` if --overwrite allows it.
    fn replace_existing(&self, to: &Path) -> io::Result<()> {
        match fs::symlink_metadata(to) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a directory is in the way",
            )),
            Ok(_) if self.overwrite => fs::remove_file(to),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists (use --overwrite to replace it)",
            )),
        }
    }

    fn file(&mut self, id: InodeId, stat: &Stat, to: &Path, path: &[u8]) -> Result<()> {
        self.replace_existing(to)
            .with_context(|| format!("{}", to.display()))?;
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(to)
            .with_context(|| format!("cannot create {}", to.display()))?;
        self.counts.files += 1;
        // Only the file's data ranges are read: holes stay holes without
        // reading their zeros (a sparse terabyte file restores at once).
        let ranges = self
            .fs
            .data_ranges(id, 0)
            .with_context(|| format!("cannot map the extents of {}", show(path)))?;
        for (start, end) in ranges {
            let mut offset = start;
            while offset < end {
                let want = CHUNK.min((end - offset) as usize);
                let data = self
                    .fs
                    .read(id, offset, want)
                    .with_context(|| format!("read at offset {offset}"))?;
                if data.is_empty() {
                    break;
                }
                // Within data, all-zero blocks are left as holes too.
                let mut run_start: Option<usize> = None;
                for (i, block) in data.chunks(HOLE_BLOCK).enumerate() {
                    let zero = block == &self.buf_zero[..block.len()];
                    let at = i * HOLE_BLOCK;
                    match (zero, run_start) {
                        (false, None) => run_start = Some(at),
                        (true, Some(s)) => {
                            out.write_all_at(&data[s..at], offset + s as u64)
                                .with_context(|| format!("cannot write {}", to.display()))?;
                            run_start = None;
                        }
                        _ => {}
                    }
                }
                if let Some(s) = run_start {
                    out.write_all_at(&data[s..], offset + s as u64)
                        .with_context(|| format!("cannot write {}", to.display()))?;
                }
                offset += data.len() as u64;
                self.counts.bytes += data.len() as u64;
                self.progress.inc(data.len() as u64);
            }
        }
        out.set_len(stat.size)
            .with_context(|| format!("cannot set the size of {}", to.display()))?;
        Ok(())
    }

    fn symlink(&mut self, id: InodeId, to: &Path) -> Result<()> {
        let target = self.fs.read_link(id).context("cannot read the link")?;
        self.replace_existing(to)
            .with_context(|| format!("{}", to.display()))?;
        std::os::unix::fs::symlink(os_name(&target), to)
            .with_context(|| format!("cannot create the symlink {}", to.display()))?;
        self.counts.symlinks += 1;
        Ok(())
    }

    fn special(&mut self, stat: &Stat, to: &Path) -> Result<()> {
        self.replace_existing(to)
            .with_context(|| format!("{}", to.display()))?;
        let c = cpath(to)?;
        let dev = match stat.kind {
            FileKind::CharDev | FileKind::BlockDev => rdev_to_host(stat.rdev),
            _ => 0,
        };
        // Only the type with owner-only permissions now; the mode comes later.
        let mode = (stat.mode & libc::S_IFMT) | 0o600;
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::mknod(c.as_ptr(), mode, dev) } != 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("cannot create {}", to.display()));
        }
        self.counts.special += 1;
        Ok(())
    }

    /// Owner, mode, extended attributes, then times. Failures are counted
    /// (or, for operations that need privileges we lack, noted once).
    fn apply_attrs(&mut self, to: &Path, stat: &Stat, path: &[u8]) {
        let c = match cpath(to) {
            Ok(c) => c,
            Err(e) => return self.error(path, e),
        };
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::lchown(c.as_ptr(), stat.uid, stat.gid) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EPERM) && !self.privileged {
                self.skip_once("file owners were not restored (not running as root)");
            } else {
                self.error(path, format!("cannot set the owner: {e}"));
            }
        }
        if stat.kind != FileKind::Symlink {
            let perm = fs::Permissions::from_mode(stat.mode & 0o7777);
            if let Err(e) = fs::set_permissions(to, perm) {
                self.error(path, format!("cannot set the mode: {e}"));
            }
        }
        self.xattrs(&c, stat.id, path);
        let times = [timespec(&stat.atime), timespec(&stat.mtime)];
        // SAFETY: `c` is valid and `times` holds two timespecs.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.error(path, format!("cannot set the times: {e}"));
        }
    }

    fn xattrs(&mut self, c: &CString, id: InodeId, path: &[u8]) {
        let names = match self.fs.list_xattrs(id) {
            Ok(n) => n,
            Err(e) => return self.error(path, format!("cannot list extended attributes: {e}")),
        };
        for name in names {
            let value = match self.fs.get_xattr(id, &name) {
                Ok(Some(v)) => v,
                // Listed but gone: nothing to restore.
                Ok(None) => continue,
                Err(e) => {
                    self.error(
                        path,
                        format!("cannot read extended attribute {}: {e}", show(&name)),
                    );
                    continue;
                }
            };
            let Ok(cname) = CString::new(name.clone()) else {
                self.error(
                    path,
                    format!("invalid extended attribute name {}", show(&name)),
                );
                continue;
            };
            // SAFETY: both strings are NUL-terminated; value is a valid slice.
            let rc = unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    cname.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            };
            if rc != 0 {
                let e = io::Error::last_os_error();
                let privileged_ns = name.starts_with(b"trusted.") || name.starts_with(b"security.");
                if e.raw_os_error() == Some(libc::EPERM) && privileged_ns && !self.privileged {
                    self.skip_once("trusted.* and security.* attributes were not restored (not running as root)");
                } else if e.raw_os_error() == Some(libc::EOPNOTSUPP) && name.starts_with(b"btrfs.")
                {
                    // Properties such as btrfs.compression exist only on btrfs.
                    self.skip_once(
                        "btrfs.* properties were not restored (the destination is not btrfs)",
                    );
                } else {
                    self.error(
                        path,
                        format!("cannot set extended attribute {}: {e}", show(&name)),
                    );
                }
            }
        }
    }

    fn skip_once(&mut self, what: &str) {
        if !self.skipped.iter().any(|s| s == what) {
            self.skipped.push(what.to_string());
        }
    }

    fn summary(&self) {
        let c = &self.counts;
        eprintln!(
            "restored {} files ({} bytes), {} directories, {} symlinks, {} special files, {} hard links; {} errors",
            c.files, c.bytes, c.dirs, c.symlinks, c.special, c.hardlinks, c.errors
        );
        for s in &self.skipped {
            eprintln!("ubtrfs: warning: {s}");
        }
    }
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| anyhow!("{}: path contains a NUL byte", p.display()))
}

fn timespec(t: &Timespec) -> libc::timespec {
    libc::timespec {
        tv_sec: t.sec as libc::time_t,
        tv_nsec: i64::from(t.nsec.min(999_999_999)) as _,
    }
}

/// `dir/name` for messages, without doubling the slash after the root.
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

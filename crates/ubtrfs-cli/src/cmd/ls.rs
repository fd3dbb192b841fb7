//! `ubtrfs ls`: list a directory inside a filesystem.

use super::{fs_path, has_btrfs_magic, open_fs, resolve};
use crate::util::{format_time, mode_string, rdev_split};
use anyhow::{Context, Result, bail};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use ubtrfs::fs::{FileKind, Filesystem, InodeId};

/// Arguments of `ls`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs ls [OPTIONS] <DEV>... [PATH]",
    after_help = "\
The last argument is taken as a path inside the filesystem if it starts with \
'/' and is not an existing file or block device holding a btrfs superblock; \
otherwise it is a device and PATH is '/'. Every entry is listed, including \
names that start with '.'; names are sorted bytewise. Times are UTC."
)]
pub struct Args {
    /// The filesystem's devices, then optionally a path inside it.
    #[arg(required = true, value_name = "DEV... [PATH]")]
    args: Vec<PathBuf>,
    /// Long listing: mode, links, owner, group, size, mtime, name.
    #[arg(short = 'l')]
    long: bool,
    /// List subdirectories recursively.
    #[arg(short = 'R')]
    recursive: bool,
}

/// Run `ls`.
pub fn run(args: Args) -> Result<()> {
    let (devices, path): (&[PathBuf], &[u8]) = match args.args.split_last() {
        Some((last, devices))
            if !devices.is_empty()
                && last.as_os_str().as_encoded_bytes().starts_with(b"/")
                && !has_btrfs_magic(last) =>
        {
            (devices, fs_path(last)?)
        }
        Some(_) => (&args.args, b"/"),
        None => bail!("expected one or more devices"),
    };
    let fs = open_fs(devices)?;
    let id = resolve(&fs, path, !args.long)?;
    let stdout = std::io::stdout();
    let mut lister = Lister {
        fs: &fs,
        long: args.long,
        recursive: args.recursive,
        out: BufWriter::new(stdout.lock()),
        errors: 0,
    };
    let result = lister.list_top(id, path);
    let flushed = lister.out.flush();
    match result.and(flushed.map_err(Into::into)) {
        Err(e) if is_broken_pipe(&e) => return Ok(()),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    if lister.errors > 0 {
        bail!("{} entries could not be listed", lister.errors);
    }
    Ok(())
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// A subdirectory found in a listing: its name and inode.
type Subdir = (Vec<u8>, InodeId);

struct Lister<'a, W: Write> {
    fs: &'a Filesystem,
    long: bool,
    recursive: bool,
    out: W,
    /// Errors on single entries, already reported on stderr.
    errors: u64,
}

impl<W: Write> Lister<'_, W> {
    fn list_top(&mut self, id: InodeId, path: &[u8]) -> Result<()> {
        let stat = self.fs.stat(id).with_context(|| crate::util::show(path))?;
        if stat.kind != FileKind::Dir {
            return self.entry(id, path);
        }
        if !self.recursive {
            return self.dir(id, path).map(|_| ());
        }
        // Depth-first, like `ls -R`: a header per directory, blank line between.
        let mut stack: Vec<(InodeId, Vec<u8>, Vec<InodeId>)> = vec![(id, path.to_vec(), vec![])];
        let mut first = true;
        while let Some((dir, dir_path, ancestors)) = stack.pop() {
            if !first {
                self.out.write_all(b"\n")?;
            }
            first = false;
            self.out.write_all(&dir_path)?;
            self.out.write_all(b":\n")?;
            let Some(subdirs) = self.dir(dir, &dir_path)? else {
                continue;
            };
            let mut chain = ancestors.clone();
            chain.push(dir);
            for (name, child) in subdirs.into_iter().rev() {
                if chain.contains(&child) {
                    self.error(&join(&dir_path, &name), "directory cycle; not descending");
                    continue;
                }
                stack.push((child, join(&dir_path, &name), chain.clone()));
            }
        }
        Ok(())
    }

    /// List one directory; returns its subdirectories (name, id) in order, or
    /// `None` if it could not be read (the error is reported and counted).
    fn dir(&mut self, dir: InodeId, dir_path: &[u8]) -> Result<Option<Vec<Subdir>>> {
        let mut entries = match self.fs.read_dir(dir, 0) {
            Ok(e) => e,
            Err(e) => {
                self.error(dir_path, &e.to_string());
                return Ok(None);
            }
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let mut subdirs = Vec::new();
        for e in entries {
            if self.long {
                self.long_line(e.id, &join(dir_path, &e.name), &e.name)?;
            } else {
                self.out.write_all(&e.name)?;
                self.out.write_all(b"\n")?;
            }
            if e.kind == FileKind::Dir {
                subdirs.push((e.name, e.id));
            }
        }
        Ok(Some(subdirs))
    }

    /// A non-directory given as the path: print it like `ls` does.
    fn entry(&mut self, id: InodeId, path: &[u8]) -> Result<()> {
        if self.long {
            self.long_line(id, path, path)
        } else {
            self.out.write_all(path)?;
            self.out.write_all(b"\n")?;
            Ok(())
        }
    }

    fn long_line(&mut self, id: InodeId, path: &[u8], name: &[u8]) -> Result<()> {
        let stat = match self.fs.stat(id) {
            Ok(s) => s,
            Err(e) => {
                self.error(path, &e.to_string());
                return Ok(());
            }
        };
        let size = match stat.kind {
            FileKind::CharDev | FileKind::BlockDev => {
                let (major, minor) = rdev_split(stat.rdev);
                format!("{major}, {minor}")
            }
            _ => stat.size.to_string(),
        };
        let line = format!(
            "{} {:>3} {:>5} {:>5} {:>10} {} ",
            mode_string(stat.mode),
            stat.nlink,
            stat.uid,
            stat.gid,
            size,
            format_time(&stat.mtime)
        );
        self.out.write_all(line.as_bytes())?;
        self.out.write_all(name)?;
        if stat.kind == FileKind::Symlink {
            match self.fs.read_link(id) {
                Ok(target) => {
                    self.out.write_all(b" -> ")?;
                    self.out.write_all(&target)?;
                }
                Err(e) => self.error(path, &format!("cannot read the link: {e}")),
            }
        }
        self.out.write_all(b"\n")?;
        Ok(())
    }

    fn error(&mut self, path: &[u8], msg: &str) {
        // Keep stdout and stderr in order for a reader of both.
        let _ = self.out.flush();
        eprintln!("ubtrfs: {}: {msg}", crate::util::show(path));
        self.errors += 1;
    }
}

/// `dir/name`, without doubling the slash after the root.
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

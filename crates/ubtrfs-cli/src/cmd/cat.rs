//! `ubtrfs cat`: write a file's bytes to stdout.

use super::{fs_path, open_fs, resolve};
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::PathBuf;
use ubtrfs::fs::FileKind;

/// Bytes read from the filesystem per call.
const CHUNK: usize = 1 << 20;

/// Arguments of `cat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The filesystem's devices (all of them, any order).
    #[arg(required = true, value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// The path of a file inside the filesystem (starting with '/').
    #[arg(value_name = "PATH")]
    path: PathBuf,
}

/// Run `cat`.
pub fn run(args: Args) -> Result<()> {
    let devices = &args.devices;
    let path = fs_path(&args.path)?;
    let shown = crate::util::show(path);
    let fs = open_fs(devices)?;
    let id = resolve(&fs, path, true)?;
    let stat = fs.stat(id).with_context(|| shown.clone())?;
    match stat.kind {
        FileKind::File => {}
        FileKind::Dir => bail!("{shown}: is a directory"),
        _ => bail!("{shown}: not a regular file"),
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut offset = 0u64;
    loop {
        let data = fs
            .read(id, offset, CHUNK)
            .with_context(|| format!("{shown}: read at offset {offset}"))?;
        if data.is_empty() {
            break;
        }
        if let Err(e) = out.write_all(&data) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e).context("writing to stdout");
        }
        offset += data.len() as u64;
        if data.len() < CHUNK {
            break;
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

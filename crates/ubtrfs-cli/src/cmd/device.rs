//! `ubtrfs device stats`: each device's counts of failed I/O and of bad
//! copies read from it, as `btrfs device stats` shows them, of an
//! unmounted filesystem or of a ubtrfs mount.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use ubtrfs::fs::DeviceStatsEntry;
use ubtrfs::volume::dev_stats::{DEV_STAT_COUNT, DEV_STAT_NAMES};

/// The `device` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show (and reset) the devices' error counters.
    Stats(StatsArgs),
}

/// Arguments of `device stats`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints, for every device of the filesystem, how many writes, reads and \
cache flushes failed, how many copies read from it did not match their \
checksum (corruption_errs) and how many tree blocks read from it were \
older than they should be (generation_errs), as `btrfs device stats` \
does. Reads and scrubs count them, as in the kernel; they are kept in the \
device tree by the next commit (in memory only on a read-only mount; never \
on a seed device). On a mount, resetting is for root.")]
pub struct StatsArgs {
    /// Exit with status 64 if any counter is not zero.
    #[arg(short, long)]
    check: bool,
    /// Show the counters, then set them to zero (committed at once for
    /// images; by the next commit of a mount).
    #[arg(short = 'z', long)]
    reset: bool,
    /// A table: a line per device.
    #[arg(short = 'T')]
    table: bool,
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Run a `device` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Stats(a) => {
            let mut failed = 0;
            let entries = match &a.args[..] {
                [dir] if dir.is_dir() => {
                    let (entries, f) = from_mount(dir, a.reset)?;
                    failed = f;
                    entries
                }
                devices if a.reset => {
                    let fs = super::open_fs_rw(devices)?;
                    let before = fs
                        .reset_device_stats(None)
                        .context("resetting the device statistics")?;
                    fs.commit().context("committing the reset")?;
                    before
                }
                devices => super::open_fs(devices)?
                    .device_stats()
                    .context("reading the devices")?,
            };
            if a.table {
                print!("{}", table(&entries));
            } else {
                print!("{}", lines(&entries));
            }
            if failed > 0 {
                bail!("{failed} device(s) could not be asked");
            }
            if a.check && entries.iter().any(|e| e.values.iter().any(|&v| v != 0)) {
                return Err(crate::util::ExitWith(64).into());
            }
            Ok(())
        }
    }
}

/// The name `btrfs device stats` shows for a device.
fn name(e: &DeviceStatsEntry) -> String {
    match &e.path {
        Some(p) => p.display().to_string(),
        None => format!("devid:{}", e.devid),
    }
}

/// `[DEVICE].write_io_errs    0`, a line per counter and device.
fn lines(entries: &[DeviceStatsEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        for (n, v) in DEV_STAT_NAMES.iter().zip(e.values) {
            out.push_str(&format!("[{}].{n:<16} {v}\n", name(e)));
        }
    }
    out
}

/// `-T`: a header, a rule, a line per device.
fn table(entries: &[DeviceStatsEntry]) -> String {
    const HEADS: [&str; DEV_STAT_COUNT] = [
        "Write errors",
        "Read errors",
        "Flush errors",
        "Corruption errors",
        "Generation errors",
    ];
    let names: Vec<String> = entries.iter().map(name).collect();
    let id_w = entries
        .iter()
        .map(|e| e.devid.to_string().len())
        .max()
        .unwrap_or(0)
        .max(2);
    let path_w = names.iter().map(|n| n.len()).max().unwrap_or(0).max(4);
    let widths: Vec<usize> = HEADS
        .iter()
        .enumerate()
        .map(|(i, h)| {
            entries
                .iter()
                .map(|e| e.values[i].to_string().len())
                .max()
                .unwrap_or(0)
                .max(h.len())
        })
        .collect();
    let mut out = format!("{:<id_w$} {:<path_w$}", "Id", "Path");
    for (h, w) in HEADS.iter().zip(&widths) {
        out.push_str(&format!(" {h:<w$}"));
    }
    out.push('\n');
    out.push_str(&format!("{} {}", "-".repeat(id_w), "-".repeat(path_w)));
    for w in &widths {
        out.push_str(&format!(" {}", "-".repeat(*w)));
    }
    out.push('\n');
    for (e, n) in entries.iter().zip(&names) {
        out.push_str(&format!("{:>id_w$} {n:<path_w$}", e.devid));
        for (v, w) in e.values.iter().zip(&widths) {
            out.push_str(&format!(" {v:>w$}"));
        }
        out.push('\n');
    }
    out
}

/// The counters of every device of the mount at `dir`
/// (`BTRFS_IOC_GET_DEV_STATS` per device, the devices from the mount's
/// usage), reset after reading with `reset`.
/// Also how many devices could not be asked (each said on stderr).
fn from_mount(dir: &Path, reset: bool) -> Result<(Vec<DeviceStatsEntry>, usize)> {
    use crate::fuse::{BTRFS_IOC_GET_DEV_STATS, DEV_STATS_ARGS_SIZE, DEV_STATS_RESET};
    let usage = super::filesystem::usage_from_mount(dir)?;
    let mut out = Vec::new();
    let mut failed = 0;
    for d in &usage.devices {
        let mut buf = vec![0u8; DEV_STATS_ARGS_SIZE];
        buf[..8].copy_from_slice(&d.devid.to_le_bytes());
        buf[8..16].copy_from_slice(&(DEV_STAT_COUNT as u64).to_le_bytes());
        let flags = if reset { DEV_STATS_RESET } else { 0 };
        buf[16..24].copy_from_slice(&flags.to_le_bytes());
        if let Err(e) =
            super::filesystem::mount_ioctl(dir, BTRFS_IOC_GET_DEV_STATS.into(), &mut buf)?
        {
            // As btrfs-progs: said, and on to the next device.
            eprintln!(
                "ubtrfs: error: {} the statistics of device {} of {}: {e}",
                if reset { "resetting" } else { "reading" },
                d.devid,
                dir.display()
            );
            failed += 1;
            continue;
        }
        let mut values = [0u64; DEV_STAT_COUNT];
        for (i, v) in values.iter_mut().enumerate() {
            let at = 24 + i * 8;
            *v = u64::from_le_bytes(buf[at..at + 8].try_into().unwrap_or_default());
        }
        out.push(DeviceStatsEntry {
            devid: d.devid,
            path: d.path.clone(),
            values,
        });
    }
    Ok((out, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<DeviceStatsEntry> {
        vec![
            DeviceStatsEntry {
                devid: 1,
                path: Some("/dev/loop0".into()),
                values: [0, 0, 0, 1, 0],
            },
            DeviceStatsEntry {
                devid: 2,
                path: Some("/dev/loop1".into()),
                values: [0, 0, 0, 0, 0],
            },
        ]
    }

    /// As btrfs-progs 6.2 prints them for the same counters.
    #[test]
    fn lines_and_table_are_as_btrfs_prints_them() {
        let l = lines(&entries());
        assert!(l.starts_with(
            "[/dev/loop0].write_io_errs    0\n[/dev/loop0].read_io_errs     0\n\
             [/dev/loop0].flush_io_errs    0\n[/dev/loop0].corruption_errs  1\n\
             [/dev/loop0].generation_errs  0\n[/dev/loop1].write_io_errs    0\n"
        ));
        assert_eq!(
            table(&entries()),
            "Id Path       Write errors Read errors Flush errors Corruption errors Generation errors\n\
             -- ---------- ------------ ----------- ------------ ----------------- -----------------\n \
             1 /dev/loop0            0           0            0                 1                 0\n \
             2 /dev/loop1            0           0            0                 0                 0\n"
        );
    }
}

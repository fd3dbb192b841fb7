//! `ubtrfs check`: read an unmounted filesystem's trees and report where
//! they disagree, as `btrfs check --readonly` does. Writes nothing.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;
use ubtrfs::fs::Filesystem;

/// Arguments of `check`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Walks every tree once and checks: every tree block verifies (checksum, \
place, level, generation, key order); every tree block and data extent \
the trees reach has an extent item whose back references match the \
references found, and nothing else is allocated; block group usage, \
the superblock's total, chunks, device extents, device items and the \
free-space tree agree with the extent items; every inode's names match \
its directories' entries, its link count its names, its byte count its \
file extents, a directory's size its entries; file extents do not \
overlap; checksums lie in data extents and cover the data of files that \
have them; root refs, root backrefs and subvolume entries agree. Data is \
not read (`ubtrfs scrub` does that). The log tree is not replayed: what \
is checked is the last commit. Exits 1 when a problem is found.")]
pub struct Args {
    /// Only check (the only mode: accepted as `btrfs check` takes it).
    #[arg(long)]
    readonly: bool,
    /// Check even if the kernel has the filesystem mounted (what is read
    /// may be changing under the check).
    #[arg(long)]
    force: bool,
    /// Print no progress on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// The filesystem's devices or image files (all of them).
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<PathBuf>,
}

/// Run `check`.
pub fn run(args: Args) -> Result<()> {
    let _ = args.readonly;
    if let Some(d) = args.devices.iter().find(|d| d.is_dir()) {
        bail!("{}: a directory, not a device or image file", d.display());
    }
    if !args.force {
        for dev in &args.devices {
            if let Some(how) = super::mounted(dev) {
                bail!(
                    "{} is mounted ({how}): unmount it first, or give --force",
                    dev.display()
                );
            }
        }
    }
    let fs = Filesystem::open_without_log_replay(&args.devices).with_context(|| {
        format!(
            "cannot open a btrfs filesystem on {}",
            super::list(&args.devices)
        )
    })?;
    for warning in fs.warnings() {
        eprintln!("ubtrfs: warning: {warning}");
    }
    let bar = if !args.quiet && std::io::stderr().is_terminal() {
        let p = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        p.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        p.enable_steady_tick(Duration::from_millis(200));
        p
    } else {
        ProgressBar::hidden()
    };
    let report = fs.check(&mut |stage| bar.set_message(stage.describe()));
    bar.finish_and_clear();
    let report =
        report.with_context(|| format!("check of {} stopped", super::list(&args.devices)))?;
    let sb = fs.superblock();
    println!(
        "checked {} (generation {}): {} trees, {} tree blocks, {} extents, {} inodes, {} bytes used",
        super::list(&args.devices),
        sb.generation,
        report.trees,
        report.tree_blocks,
        report.extents,
        report.inodes,
        report.bytes_used
    );
    for note in &report.notes {
        println!("note: {note}");
    }
    for p in &report.problems {
        println!("{p}");
    }
    if report.clean() {
        println!("no errors found");
        return Ok(());
    }
    let shown = report.problems.len() as u64;
    if report.problem_count > shown {
        println!("... and {} more", report.problem_count - shown);
    }
    bail!(
        "{} problem{} found",
        report.problem_count,
        if report.problem_count == 1 { "" } else { "s" }
    )
}

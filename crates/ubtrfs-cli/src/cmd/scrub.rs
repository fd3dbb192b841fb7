//! `ubtrfs scrub`: check every copy of a filesystem's metadata and
//! checksummed data, and mend bad copies from good ones, as
//! `btrfs scrub start -B` does for a mounted kernel btrfs.

use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use ubtrfs::mkfs::human;
use ubtrfs::scrub::ScrubReport;

/// Arguments of `scrub`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Reads every copy of every tree block (found through the extent tree), of \
every data sector that has a checksum (found through the checksum tree) \
and of every superblock, and verifies each. A bad copy is written over \
with a good one (unless -r); in RAID5/6, data that reads bad is rebuilt \
from parity and written back with its parity (parity itself is not \
checked). Superblock copies are only checked: the next commit rewrites \
them all. Works on unmounted devices or images; a filesystem in use by a \
mount is refused. Exits non-zero when errors remain: any found with -r, \
and any copy that had no good one beside it.")]
pub struct Args {
    /// Only check and report: write nothing.
    #[arg(short = 'r', long)]
    readonly: bool,
    /// Print no progress on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// The filesystem's devices or image files (all of them).
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<PathBuf>,
}

/// Run `scrub`.
pub fn run(args: Args) -> Result<()> {
    for d in &args.devices {
        if d.is_dir() {
            bail!(
                "{}: a directory; scrub takes the devices or image files of an unmounted filesystem",
                d.display()
            );
        }
    }
    let fs = if args.readonly {
        super::open_fs(&args.devices)?
    } else {
        super::open_fs_rw(&args.devices)?
    };
    let bar = if !args.quiet && std::io::stderr().is_terminal() {
        let p = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        p.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        p
    } else {
        ProgressBar::hidden()
    };
    let report = fs.scrub(!args.readonly, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report
        .map_err(|e| anyhow::anyhow!("scrub of {} stopped: {e}", super::list(&args.devices)))?;
    print!("{}", summary(&report, &super::list(&args.devices)));
    let remaining = if args.readonly {
        !report.clean()
    } else {
        report.uncorrectable > 0
    };
    if remaining {
        bail!(
            "errors remain on {}{}",
            super::list(&args.devices),
            if args.readonly {
                " (checked with -r: nothing was mended)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// What `scrub` prints: what was checked, and what was found and done.
fn summary(r: &ScrubReport, devices: &str) -> String {
    let mut out = format!(
        "scrub of {devices}: {} checked (tree blocks {} in {}, data {})\n",
        human(r.tree_bytes + r.data_bytes),
        human(r.tree_bytes),
        r.tree_blocks,
        human(r.data_bytes),
    );
    if r.missing_copies > 0 {
        out += &format!("copies on missing devices: {}\n", r.missing_copies);
    }
    if r.clean() {
        out += "no errors found\n";
        return out;
    }
    out += &format!(
        "errors: tree block {}, data checksum {}, read {}, superblock {}\n",
        r.tree_errors, r.csum_errors, r.read_errors, r.super_errors
    );
    out += &format!(
        "corrected: {}, uncorrectable: {}\n",
        r.corrected, r.uncorrectable
    );
    if r.super_errors > 0 {
        out += "superblock copies are rewritten by the next commit\n";
    }
    for at in &r.uncorrectable_at {
        out += &format!("uncorrectable: {at}\n");
    }
    if r.uncorrectable > r.uncorrectable_at.len() as u64 {
        out += &format!(
            "uncorrectable: and {} more\n",
            r.uncorrectable - r.uncorrectable_at.len() as u64
        );
    }
    out
}

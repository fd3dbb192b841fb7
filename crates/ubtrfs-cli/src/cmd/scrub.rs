//! `ubtrfs scrub`: check every copy of a filesystem's metadata and
//! checksummed data, and mend bad copies from good ones, as
//! `btrfs scrub start -B` does for a mounted kernel btrfs.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::path::PathBuf;
use ubtrfs::mkfs::human;
use ubtrfs::scrub::{ScrubCursor, ScrubReport};

/// Arguments of `scrub`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Reads every copy of every tree block (found through the extent tree), of \
every data sector that has a checksum (found through the checksum tree) \
and of every superblock, and verifies each: checksum, place, and for tree \
blocks and superblocks the generation (a device that missed writes holds \
older copies). A bad copy is written over with a good one (unless -r); \
in RAID5/6, data that reads bad is rebuilt from parity and written back \
with its parity, and then every row holding an extent has its parity \
compared with its data's and rewritten from it where it differs (once \
the data's checksums and tree blocks verify); bad superblock copies \
are mended by a commit, which writes every copy again. Give the devices \
or images of an unmounted filesystem, or the mount point of a ubtrfs \
mount (root only): the mount is scrubbed a step at a time between its \
other work. A filesystem a kernel mount uses is refused. Exits non-zero \
when errors remain: any found with -r, and any copy that had no good \
one beside it or could not be written.")]
pub struct Args {
    /// Only check and report: write nothing.
    #[arg(short = 'r', long)]
    readonly: bool,
    /// Print no progress on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// The filesystem's devices or image files (all of them), or the
    /// mount point of a ubtrfs mount.
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<PathBuf>,
}

/// Run `scrub`.
pub fn run(args: Args) -> Result<()> {
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
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = match &args.devices[..] {
        [dir] if dir.is_dir() => scrub_mount(dir, !args.readonly, &mut progress),
        devices => {
            if let Some(d) = devices.iter().find(|d| d.is_dir()) {
                bail!("{}: a directory among devices", d.display());
            }
            let fs = if args.readonly {
                super::open_fs(devices)?
            } else {
                super::open_fs_rw(devices)?
            };
            fs.scrub(!args.readonly, &mut progress)
                .map_err(anyhow::Error::new)
        }
    };
    bar.finish_and_clear();
    let report = report.map_err(|e| {
        anyhow::anyhow!(
            "scrub of {} stopped: {}",
            super::list(&args.devices),
            crate::util::error_chain(&e)
        )
    })?;
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

/// Scrub the filesystem mounted at `dir` (a ubtrfs mount), a step per
/// request (`UBTRFS_IOC_SCRUB`), so the mount's other work goes on between.
fn scrub_mount(
    dir: &Path,
    repair: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ScrubReport> {
    use crate::fuse::control;
    match super::umount::server_info(dir) {
        Ok(info) if repair && !info.rw => {
            bail!(
                "{}: the mount is read-only; -r checks without mending",
                dir.display()
            )
        }
        Ok(_) => {}
        Err(e) => bail!("{}: not in a ubtrfs mount ({e})", dir.display()),
    }
    let f = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
    let mut cursor = ScrubCursor::start();
    let mut report = ScrubReport::default();
    while !cursor.done() {
        let mut buf = control::encode_scrub_request(repair, &cursor);
        // SAFETY: the ioctl reads and writes at most the size its number
        // encodes, which is the buffer's.
        let rc = unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                control::UBTRFS_IOC_SCRUB as _,
                buf.as_mut_ptr(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EPERM) => bail!("{}: only root scrubs a mount", dir.display()),
                Some(libc::ENOTTY) => {
                    bail!("{}: the mount is too old to scrub", dir.display())
                }
                _ => return Err(e).with_context(|| format!("scrubbing {}", dir.display())),
            }
        }
        let (next, in_use, step) = control::decode_scrub_reply(&buf)
            .with_context(|| format!("{}: the mount's reply is cut short", dir.display()))?;
        if next == cursor && step == ScrubReport::default() {
            bail!("{}: the mount's scrub does not go on", dir.display());
        }
        cursor = next;
        report.add(&step);
        progress(
            (report.tree_bytes + report.data_bytes).min(in_use),
            in_use.max(1),
        );
    }
    Ok(report)
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
    if r.parity_bytes > 0 {
        out += &format!(
            "RAID5/6 parity checked for {} of data\n",
            human(r.parity_bytes)
        );
    }
    if r.missing_copies > 0 {
        out += &format!("copies on missing devices: {}\n", r.missing_copies);
    }
    if r.clean() {
        out += "no errors found\n";
        return out;
    }
    out += &format!(
        "errors: tree block {}, data checksum {}, read {}, superblock {}, parity {}\n",
        r.tree_errors, r.csum_errors, r.read_errors, r.super_errors, r.parity_errors
    );
    out += &format!(
        "corrected: {}, uncorrectable: {}\n",
        r.corrected, r.uncorrectable
    );
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

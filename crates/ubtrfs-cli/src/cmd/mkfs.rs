//! `ubtrfs mkfs`: make a new filesystem, with the options of `mkfs.btrfs`.

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use ubtrfs::format::consts::*;
use ubtrfs::mkfs::{self, FEATURES, MkfsOptions, MkfsReport, human};

/// Arguments of `mkfs`.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "ubtrfs mkfs [OPTIONS] <DEV>...",
    after_help = "\
Sizes take a suffix: k, m, g, t (powers of 1024). A device that does not \
exist is created as an image file when --byte-count is given. Devices that \
already hold a filesystem or a partition table are refused unless --force; \
mounted devices are always refused. The free-space tree is always created."
)]
pub struct Args {
    /// Data profile: single, dup, raid0, raid1, raid1c3, raid1c4, raid10.
    #[arg(short = 'd', long = "data", value_name = "PROFILE")]
    data: Option<String>,
    /// Metadata (and system) profile; default dup on one device, raid1 on more.
    #[arg(short = 'm', long = "metadata", value_name = "PROFILE")]
    metadata: Option<String>,
    /// Mixed data and metadata block groups (not supported).
    #[arg(short = 'M', long = "mixed")]
    mixed: bool,
    /// Checksum algorithm: crc32c (default), xxhash, sha256, blake2.
    #[arg(long = "csum", visible_alias = "checksum", value_name = "TYPE")]
    csum: Option<String>,
    /// Size of tree blocks (default 16k).
    #[arg(short = 'n', long = "nodesize", value_name = "SIZE")]
    nodesize: Option<String>,
    /// Size of data blocks (default 4k, the page size).
    #[arg(short = 's', long = "sectorsize", value_name = "SIZE")]
    sectorsize: Option<String>,
    /// Comma-separated features, ^name to turn one off; 'list-all' lists them.
    #[arg(short = 'O', long = "features", value_name = "LIST")]
    features: Vec<String>,
    /// Runtime features (free-space-tree, always on); 'list-all' lists them.
    #[arg(short = 'R', long = "runtime-features", value_name = "LIST")]
    runtime_features: Vec<String>,
    /// Filesystem label.
    #[arg(short = 'L', long = "label", value_name = "LABEL")]
    label: Option<String>,
    /// Filesystem UUID (random by default).
    #[arg(short = 'U', long = "uuid", value_name = "UUID")]
    uuid: Option<String>,
    /// Use SIZE bytes of each device; creates missing image files of that size.
    #[arg(short = 'b', long = "byte-count", value_name = "SIZE")]
    byte_count: Option<String>,
    /// Copy files from DIR into the new filesystem (not supported yet).
    #[arg(short = 'r', long = "rootdir", value_name = "DIR")]
    rootdir: Option<PathBuf>,
    /// Do not discard (ubtrfs never discards; accepted for compatibility).
    #[arg(short = 'K', long = "nodiscard")]
    nodiscard: bool,
    /// Overwrite devices that hold a filesystem or partition table.
    #[arg(short = 'f', long = "force")]
    force: bool,
    /// No messages except errors.
    #[arg(short = 'q', long = "quiet")]
    quiet: bool,
    /// The devices or image files.
    #[arg(value_name = "DEV")]
    devices: Vec<PathBuf>,
}

/// Parse a size with an optional binary suffix: `16k`, `256M`, `1GiB`.
pub fn parse_size(s: &str) -> Result<u64> {
    ubtrfs::mkfs::parse_size(s).with_context(|| {
        format!("'{s}' is not a size (a number, with k, m, g, t, p or e after it)")
    })
}

/// Run `mkfs`.
pub fn run(args: Args) -> Result<()> {
    let lists = |v: &[String]| {
        v.iter()
            .any(|l| l.split(',').any(|w| w.trim() == "list-all"))
    };
    if lists(&args.features) || lists(&args.runtime_features) {
        print_features();
        return Ok(());
    }
    if args.devices.is_empty() {
        bail!("no device given: ubtrfs mkfs [OPTIONS] <DEV>...");
    }
    if args.mixed {
        bail!("mixed block groups (-M) are not supported by ubtrfs mkfs");
    }
    if args.rootdir.is_some() {
        bail!("--rootdir is not supported by ubtrfs mkfs yet");
    }
    let _ = args.nodiscard;
    let mut opts = MkfsOptions {
        force: args.force,
        ..MkfsOptions::default()
    };
    if let Some(c) = &args.csum {
        opts.csum_type = mkfs::parse_csum(c)?;
    }
    if let Some(n) = &args.nodesize {
        opts.nodesize = small_size(n, "nodesize")?;
    }
    if let Some(s) = &args.sectorsize {
        opts.sectorsize = small_size(s, "sectorsize")?;
    }
    if let Some(p) = &args.data {
        opts.data_profile = Some(profile(p, "data")?);
    }
    if let Some(p) = &args.metadata {
        opts.metadata_profile = Some(profile(p, "metadata")?);
    }
    for list in args.features.iter().chain(&args.runtime_features) {
        opts.features.apply(list)?;
    }
    if let Some(l) = &args.label {
        opts.label = l.clone();
    }
    if let Some(u) = &args.uuid {
        opts.fsid = Some(mkfs::parse_uuid(u)?);
    }
    if let Some(b) = &args.byte_count {
        opts.byte_count = Some(parse_size(b)?);
    }
    let page = page_size();
    if !args.quiet {
        if opts.sectorsize as u64 != page {
            eprintln!(
                "WARNING: the filesystem may not be mountable, sectorsize {} doesn't match page size {page}",
                opts.sectorsize
            );
        }
        if args.devices.len() > 1
            && [opts.data_profile, opts.metadata_profile]
                .contains(&Some(ubtrfs::volume::Profile::Dup))
        {
            eprintln!("WARNING: DUP is not recommended on filesystem with multiple devices");
        }
        if !opts.features.skinny_metadata {
            eprintln!(
                "WARNING: without skinny-metadata the filesystem can be written by the kernel but not by ubtrfs"
            );
        }
    }
    let mut created = Vec::new();
    let result = make(&args.devices, &opts, &mut created);
    if result.is_err() {
        // Leave no half-made image files behind.
        for f in created {
            let _ = std::fs::remove_file(f);
        }
    }
    let report = result?;
    if !args.quiet {
        match print_report(&report) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.context("cannot print the summary")?,
        }
    }
    Ok(())
}

/// Check the devices, create missing image files (recorded in `created`)
/// and make the filesystem.
fn make(devices: &[PathBuf], opts: &MkfsOptions, created: &mut Vec<PathBuf>) -> Result<MkfsReport> {
    for dev in devices {
        if prepare_device(dev, opts.byte_count)? {
            created.push(dev.clone());
        }
        if let Some(how) = super::mounted(dev) {
            bail!("{} is mounted ({how})", dev.display());
        }
    }
    mkfs::make_filesystem_at(devices, opts)
        .with_context(|| format!("cannot make a filesystem on {}", super::list(devices)))
}

/// A profile name given for `what` (data or metadata).
fn profile(name: &str, what: &str) -> Result<ubtrfs::volume::Profile> {
    mkfs::parse_profile(name).map_err(|_| {
        anyhow::anyhow!(
            "unknown {what} profile '{name}' (single, dup, raid0, raid1, raid1c3, raid1c4, raid10)"
        )
    })
}

/// A node or sector size: parsed with a suffix, and small enough for u32.
fn small_size(s: &str, what: &str) -> Result<u32> {
    let v = parse_size(s)?;
    u32::try_from(v).with_context(|| format!("illegal {what} {v}"))
}

/// Create a missing image file of `size` bytes (returns true if it did);
/// refuse a missing device without a size.
fn prepare_device(dev: &Path, size: Option<u64>) -> Result<bool> {
    match std::fs::metadata(dev) {
        Ok(m) if m.is_file() || m.file_type().is_block_device() => Ok(false),
        Ok(_) => bail!("{}: not a regular file or block device", dev.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(size) = size else {
                bail!(
                    "{} does not exist; give --byte-count SIZE to create an image file",
                    dev.display()
                );
            };
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dev)
                .with_context(|| format!("cannot create {}", dev.display()))?;
            if let Err(e) = f.set_len(size) {
                let _ = std::fs::remove_file(dev);
                return Err(e)
                    .with_context(|| format!("cannot size {} to {size} bytes", dev.display()));
            }
            Ok(true)
        }
        Err(e) => Err(e).with_context(|| format!("cannot open {}", dev.display())),
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as u64 } else { 4096 }
}

fn print_features() {
    println!("Filesystem features available:");
    for f in FEATURES {
        let d = if f.default { " (default)" } else { "" };
        println!("{:<20}- {}{d}", f.name, f.description);
    }
}

fn profile_line(report: &MkfsReport, kind: u64) -> Option<String> {
    let c = report.chunks.iter().find(|c| c.kind == kind)?;
    let name = match c.profile {
        ubtrfs::volume::Profile::Single => "single".to_string(),
        p => p.name().to_string(),
    };
    Some(format!("{name:<10}{:>15}", human(c.length)))
}

fn print_report(r: &MkfsReport) -> std::io::Result<()> {
    let mut o = std::io::stdout().lock();
    let label = if r.label.is_empty() {
        "(none)"
    } else {
        &r.label
    };
    writeln!(o, "ubtrfs v{}", env!("CARGO_PKG_VERSION"))?;
    writeln!(o)?;
    writeln!(o, "Label:              {label}")?;
    writeln!(
        o,
        "UUID:               {}",
        ubtrfs::format::uuid_string(&r.fsid)
    )?;
    writeln!(o, "Node size:          {}", r.nodesize)?;
    writeln!(o, "Sector size:        {}", r.sectorsize)?;
    writeln!(o, "Filesystem size:    {}", human(r.total_bytes))?;
    writeln!(o, "Block group profiles:")?;
    for (name, kind) in [
        ("Data", BLOCK_GROUP_DATA),
        ("Metadata", BLOCK_GROUP_METADATA),
        ("System", BLOCK_GROUP_SYSTEM),
    ] {
        if let Some(line) = profile_line(r, kind) {
            writeln!(o, "  {:<18}{line}", format!("{name}:"))?;
        }
    }
    writeln!(o, "Incompat features:  {}", r.feature_names().join(", "))?;
    writeln!(o, "Runtime features:   free-space-tree")?;
    writeln!(o, "Checksum:           {}", r.csum_type.name())?;
    writeln!(o, "Number of devices:  {}", r.devices.len())?;
    writeln!(o, "Devices:")?;
    writeln!(o, "   ID        SIZE  PATH")?;
    for d in &r.devices {
        writeln!(
            o,
            "  {:>3}  {:>10}  {}",
            d.devid,
            human(d.size),
            d.path.display()
        )?;
    }
    writeln!(o)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16k").unwrap(), 16384);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12q").is_err());
        assert!(parse_size("").is_err());
    }
}

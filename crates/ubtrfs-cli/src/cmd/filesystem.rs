//! `ubtrfs filesystem df`, `usage` and `resize`: the space of each block
//! group type and profile and of each device, as `btrfs filesystem df` and
//! `usage` show them, and a device's size in the filesystem, of an
//! unmounted filesystem or of a ubtrfs mount.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use ubtrfs::format::consts::*;
use ubtrfs::fs::{SpaceInfo, Usage};
use ubtrfs::mkfs::human;
use ubtrfs::volume::Profile;

/// The `filesystem` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show the space of each block group type and profile.
    Df(DfArgs),
    /// Show the space of the devices and of each type and profile.
    Usage(UsageArgs),
    /// Grow or shrink the part of a device the filesystem uses.
    Resize(ResizeArgs),
    /// Show or set the filesystem's label.
    Label(LabelArgs),
}

/// Arguments of `filesystem label`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints the label (what `btrfs filesystem label` prints), or with --set \
writes a new one (at most 255 bytes) to every device's superblock and \
commits, as the kernel does; on a mount, root only.")]
pub struct LabelArgs {
    /// The new label ("" clears it; any bytes but NUL).
    #[arg(short, long, value_name = "LABEL")]
    set: Option<std::ffi::OsString>,
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Arguments of `filesystem resize`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
SIZE is `[DEVID:]max` (all of the device, say an image file made larger \
first) or `[DEVID:][+|-]BYTES[kmgtpe]` (binary units); DEVID is 1 unless \
given. A device shrinks only down to the end of its last chunk: ubtrfs \
does not move chunks. The change is committed at once.")]
pub struct ResizeArgs {
    /// The new size.
    #[arg(value_name = "SIZE", allow_hyphen_values = true)]
    size: String,
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Arguments of `filesystem usage`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints what `btrfs filesystem usage` prints: the devices' size, what \
chunks take of it and what is left, what is used, the free space for data \
(estimated from the profiles, and as df says it), the profiles' ratios \
and the global reserve; then for each type and profile its size, what is \
used, and what each device holds of it; then each device's unallocated \
space.")]
pub struct UsageArgs {
    /// Sizes in bytes.
    #[arg(short = 'b', long)]
    raw: bool,
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Arguments of `filesystem df`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints a line per type and profile: its block groups' size (total) and \
what is used in them, as `btrfs filesystem df` does; then GlobalReserve, \
the metadata space the kernel would hold back for this filesystem (ubtrfs \
holds back as much in `df`'s free space).")]
pub struct DfArgs {
    /// Sizes in bytes.
    #[arg(short = 'b', long)]
    raw: bool,
    /// The filesystem's devices (all of them), or a path in a ubtrfs mount.
    #[arg(value_name = "DEVICE|PATH", required = true)]
    args: Vec<PathBuf>,
}

/// Run a `filesystem` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Df(a) => {
            let spaces = match &a.args[..] {
                [dir] if dir.is_dir() => from_mount(dir)?,
                devices => super::open_fs(devices)?
                    .space_info()
                    .context("reading the block groups")?,
            };
            print!("{}", df_lines(&spaces, a.raw));
            Ok(())
        }
        Command::Resize(a) => {
            let request = ubtrfs::fs::resize::ResizeRequest::parse(&a.size)?;
            match &a.args[..] {
                [dir] if dir.is_dir() => {
                    resize_mount(dir, &a.size)?;
                    println!("Resize '{}' of '{}'", dir.display(), a.size);
                }
                devices => {
                    let fs = super::open_fs_rw(devices)?;
                    let r = fs.resize_device(&request).context("resizing")?;
                    println!(
                        "Resize device id {} ({}) from {} to {}",
                        r.devid,
                        r.path.display(),
                        human(r.old),
                        human(r.new)
                    );
                }
            }
            Ok(())
        }
        Command::Label(a) => {
            use std::os::unix::ffi::OsStrExt;
            let set = a.set.as_deref().map(|l| l.as_bytes());
            match (&a.args[..], set) {
                ([dir], set) if dir.is_dir() => label_mount(dir, set)?,
                (devices, Some(label)) => super::open_fs_rw(devices)?
                    .set_label(label)
                    .context("setting the label")?,
                (devices, None) => print_label(&super::open_fs(devices)?.label_bytes())?,
            }
            Ok(())
        }
        Command::Usage(a) => {
            let usage = match &a.args[..] {
                [dir] if dir.is_dir() => usage_from_mount(dir)?,
                devices => super::open_fs(devices)?
                    .usage()
                    .context("reading the chunks and block groups")?,
            };
            print!("{}", usage_lines(&usage, a.raw));
            Ok(())
        }
    }
}

/// Print the label of the mount at `dir`, or set it
/// (`FS_IOC_GETFSLABEL`, `FS_IOC_SETFSLABEL`, as btrfs-progs sends them).
fn label_mount(dir: &Path, set: Option<&[u8]>) -> Result<()> {
    let mut buf = [0u8; 256];
    let cmd: u64 = match set {
        Some(label) => {
            if label.len() > 255 || label.contains(&0) {
                bail!("a label is at most 255 bytes with no NUL");
            }
            buf[..label.len()].copy_from_slice(label);
            0x4100_9432
        }
        None => 0x8100_9431,
    };
    if let Err(e) = mount_ioctl(dir, cmd, &mut buf)? {
        let what = if set.is_some() {
            "setting the label"
        } else {
            "the label"
        };
        bail!("{what} of {}: {e}", dir.display());
    }
    if set.is_none() {
        let len = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
        print_label(&buf[..len])?;
    }
    Ok(())
}

/// Print a label's bytes as they are (as btrfs-progs does), and a newline.
fn print_label(label: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(label)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// Have the mount at `dir` resize (`BTRFS_IOC_RESIZE`, as btrfs-progs
/// sends it).
fn resize_mount(dir: &Path, size: &str) -> Result<()> {
    // struct btrfs_ioctl_vol_args: a descriptor (unused), then the text.
    let mut args = vec![0u8; 4096];
    if size.len() >= args.len() - 8 {
        bail!("resize: {size:?} is too long");
    }
    args[8..8 + size.len()].copy_from_slice(size.as_bytes());
    mount_ioctl(dir, crate::fuse::BTRFS_IOC_RESIZE.into(), &mut args)?.with_context(|| {
        format!(
            "resizing {} to {size} (the mount process logs why)",
            dir.display()
        )
    })
}

/// Ask the mount at `dir` (`UBTRFS_IOC_USAGE`).
pub(crate) fn usage_from_mount(dir: &Path) -> Result<Usage> {
    use crate::fuse::control;
    let buf = ask_mount(dir, control::UBTRFS_IOC_USAGE, control::USAGE_SIZE, "usage")?;
    control::decode_usage(&buf)
        .with_context(|| format!("{}: the mount's reply is cut short", dir.display()))
}

/// Send the mount at `dir` the read ioctl `cmd`, whose reply is `size`
/// bytes (`what` it tells, for messages).
fn ask_mount(dir: &Path, cmd: u32, size: usize, what: &str) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; size];
    if let Err(e) = mount_ioctl(dir, cmd.into(), &mut buf)? {
        if e.raw_os_error() == Some(libc::ENOTTY) {
            bail!("{}: the mount is too old to tell its {what}", dir.display());
        }
        return Err(e).with_context(|| format!("asking {} for its {what}", dir.display()));
    }
    Ok(buf)
}

/// Send the ubtrfs mount at `dir` the ioctl `cmd` on `buf`, which must be
/// as long as `cmd` encodes. The outer error: `dir` is no ubtrfs mount;
/// the inner one: the ioctl's.
pub(crate) fn mount_ioctl(dir: &Path, cmd: u64, buf: &mut [u8]) -> Result<std::io::Result<()>> {
    super::umount::server_info(dir)
        .map_err(|e| anyhow::anyhow!("{}: not in a ubtrfs mount ({e})", dir.display()))?;
    let f = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
    // SAFETY: the ioctl reads and writes at most the size its number
    // encodes, which is the buffer's (the callers' duty).
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
    Ok(if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    })
}

/// The name of a block group type, as btrfs-progs prints it.
fn kind_name(flags: u64) -> &'static str {
    match flags & (BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA) {
        BLOCK_GROUP_DATA => "Data",
        BLOCK_GROUP_SYSTEM => "System",
        BLOCK_GROUP_METADATA => "Metadata",
        f if f == BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA => "Data+Metadata",
        _ => "unknown",
    }
}

/// `btrfs filesystem usage`'s lines.
fn usage_lines(u: &Usage, raw: bool) -> String {
    let size = |b: u64| if raw { b.to_string() } else { human(b) };
    let width = if raw { 18 } else { 10 };
    let groups: Vec<&SpaceInfo> = u
        .spaces
        .iter()
        .filter(|s| s.flags & ubtrfs::fs::SPACE_INFO_GLOBAL_RSV == 0)
        .collect();
    let reserve = u
        .spaces
        .iter()
        .find(|s| s.flags & ubtrfs::fs::SPACE_INFO_GLOBAL_RSV != 0);
    // Raw bytes the chunks of `flags` take on all devices.
    let raw_of = |flags: u64| -> u64 {
        u.devices
            .iter()
            .flat_map(|d| &d.allocated)
            .filter(|(f, _)| *f == flags)
            .map(|(_, b)| b)
            .sum()
    };
    // Raw over logical size of the groups of a type.
    let ratio = |kind: u64| -> f64 {
        let of_kind = groups.iter().filter(|s| s.flags & kind != 0);
        let (logical, raw): (u64, u64) =
            of_kind.fold((0, 0), |(l, r), s| (l + s.total, r + raw_of(s.flags)));
        if logical == 0 {
            0.0
        } else {
            raw as f64 / logical as f64
        }
    };
    // As the kernel's tool: a sprout's seeds are left out of the sizes,
    // their chunks are not (all chunks count as allocated).
    let device_size: u64 = u
        .devices
        .iter()
        .filter(|d| !d.seed)
        .map(|d| d.total_bytes)
        .sum();
    let allocated: u64 = u
        .devices
        .iter()
        .flat_map(|d| &d.allocated)
        .map(|(_, b)| b)
        .sum();
    let unallocated = device_size.saturating_sub(allocated);
    let missing: u64 = u
        .devices
        .iter()
        .filter(|d| d.path.is_none())
        .map(|d| d.total_bytes)
        .sum();
    let slack: u64 = u
        .devices
        .iter()
        .filter(|d| d.path.is_some())
        .map(|d| d.device_size.saturating_sub(d.total_bytes))
        .sum();
    let used: u64 = groups
        .iter()
        .map(|s| {
            let r = raw_of(s.flags);
            if s.total == 0 {
                0
            } else {
                (u128::from(s.used) * u128::from(r) / u128::from(s.total)) as u64
            }
        })
        .sum();
    let (data_ratio, meta_ratio) = (ratio(BLOCK_GROUP_DATA), ratio(BLOCK_GROUP_METADATA));
    let data_free: u64 = groups
        .iter()
        .filter(|s| s.flags & BLOCK_GROUP_DATA != 0)
        .map(|s| s.total.saturating_sub(s.used))
        .sum();
    let share = |r: f64| {
        if r > 0.0 {
            (unallocated as f64 / r) as u64
        } else {
            0
        }
    };
    // With mixed groups, the global reserve is taken from the data's space.
    let mixed = groups
        .iter()
        .any(|s| s.flags & BLOCK_GROUP_DATA != 0 && s.flags & BLOCK_GROUP_METADATA != 0);
    let data_free = if mixed {
        data_free.saturating_sub(reserve.map_or(0, |r| r.total))
    } else {
        data_free
    };
    let free = data_free + share(data_ratio);
    let free_min = data_free + share(data_ratio.max(meta_ratio));
    let kinds = [
        (BLOCK_GROUP_DATA, "data"),
        (BLOCK_GROUP_METADATA, "metadata"),
        (BLOCK_GROUP_SYSTEM, "system"),
    ];
    let type_bits = BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA;
    let multiple: Vec<&str> = kinds
        .iter()
        .filter(|&&(k, _)| groups.iter().filter(|s| s.flags & type_bits == k).count() > 1)
        .map(|&(_, name)| name)
        .collect();
    let mut out = String::from("Overall:\n");
    let mut line = |label: &str, tabs: &str, value: String, extra: String| {
        out += &format!("    {label}:{tabs}{value:>width$}{extra}\n");
    };
    line("Device size", "\t\t", size(device_size), String::new());
    line("Device allocated", "\t\t", size(allocated), String::new());
    line(
        "Device unallocated",
        "\t\t",
        size(unallocated),
        String::new(),
    );
    line("Device missing", "\t\t", size(missing), String::new());
    line("Device slack", "\t\t", size(slack), String::new());
    line("Used", "\t\t\t", size(used), String::new());
    line(
        "Free (estimated)",
        "\t\t",
        size(free),
        format!("\t(min: {})", size(free_min)),
    );
    line(
        "Free (statfs, df)",
        "\t\t",
        size(u.statfs_free),
        String::new(),
    );
    line(
        "Data ratio",
        "\t\t\t",
        format!("{data_ratio:.2}"),
        String::new(),
    );
    line(
        "Metadata ratio",
        "\t\t",
        format!("{meta_ratio:.2}"),
        String::new(),
    );
    line(
        "Global reserve",
        "\t\t",
        size(reserve.map_or(0, |r| r.total)),
        format!("\t(used: {})", size(reserve.map_or(0, |r| r.used))),
    );
    if multiple.is_empty() {
        line("Multiple profiles", "\t\t", "no".to_string(), String::new());
    } else {
        let which = format!("\t({})", multiple.join(", "));
        line("Multiple profiles", "\t\t", "yes".to_string(), which);
    }
    let device_name = |d: &ubtrfs::fs::DeviceUsage| match &d.path {
        Some(p) => p.display().to_string(),
        None => "missing".to_string(),
    };
    // Types in the order btrfs-progs shows them.
    let order = |f: u64| match f & (BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA) {
        BLOCK_GROUP_DATA => 0,
        BLOCK_GROUP_METADATA => 2,
        BLOCK_GROUP_SYSTEM => 3,
        _ => 1,
    };
    let mut sections = groups.clone();
    sections.sort_by_key(|s| (order(s.flags), s.flags));
    for s in sections {
        let profile = Profile::from_flags(s.flags).map_or("unknown", |p| p.name());
        let pct = if s.total == 0 {
            0.0
        } else {
            s.used as f64 * 100.0 / s.total as f64
        };
        out += &format!(
            "\n{},{profile}: Size:{}, Used:{} ({pct:.2}%)\n",
            kind_name(s.flags),
            size(s.total),
            size(s.used)
        );
        for d in u.devices.iter().filter(|d| !d.seed) {
            if let Some((_, b)) = d.allocated.iter().find(|(f, _)| *f == s.flags) {
                out += &format!("   {}\t{:>10}\n", device_name(d), size(*b));
            }
        }
    }
    out += "\nUnallocated:\n";
    for d in u.devices.iter().filter(|d| !d.seed) {
        let taken: u64 = d.allocated.iter().map(|(_, b)| b).sum();
        out += &format!(
            "   {}\t{:>10}\n",
            device_name(d),
            size(d.total_bytes.saturating_sub(taken))
        );
    }
    out
}

/// Ask the mount at `dir` (`UBTRFS_IOC_SPACE_INFO`).
fn from_mount(dir: &Path) -> Result<Vec<SpaceInfo>> {
    use crate::fuse::control;
    let buf = ask_mount(
        dir,
        control::UBTRFS_IOC_SPACE_INFO,
        control::SPACE_SIZE,
        "space",
    )?;
    control::decode_space(&buf)
        .with_context(|| format!("{}: the mount's reply is cut short", dir.display()))
}

/// `btrfs filesystem df`'s lines.
fn df_lines(spaces: &[SpaceInfo], raw: bool) -> String {
    let size = |b: u64| if raw { b.to_string() } else { human(b) };
    let mut out = String::new();
    for s in spaces {
        if s.flags & ubtrfs::fs::SPACE_INFO_GLOBAL_RSV != 0 {
            out += &format!(
                "GlobalReserve, single: total={}, used={}\n",
                size(s.total),
                size(s.used)
            );
            continue;
        }
        let kind = match s.flags & (BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA) {
            BLOCK_GROUP_DATA => "Data",
            BLOCK_GROUP_SYSTEM => "System",
            BLOCK_GROUP_METADATA => "Metadata",
            f if f == BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA => "Data+Metadata",
            _ => "unknown",
        };
        let profile = Profile::from_flags(s.flags).map_or("unknown", |p| p.name());
        out += &format!(
            "{kind}, {profile}: total={}, used={}\n",
            size(s.total),
            size(s.used)
        );
    }
    out
}

//! `ubtrfs inspect`: look at on-disk structures.
//!
//! `dump-super` prints a superblock as `key value` lines, one field per line,
//! with the key names btrfs users know from `btrfs inspect-internal
//! dump-super`. The first word of every value is the raw value; decoded
//! names follow it in parentheses.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::fmt::Write as _;
use std::path::PathBuf;
use ubtrfs::device::{Device, FileDevice};
use ubtrfs::format::consts::*;
use ubtrfs::format::items::ChunkItem;
use ubtrfs::format::superblock::Superblock;
use ubtrfs::format::uuid_string;

/// The `inspect` subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the superblock of a device.
    DumpSuper(DumpSuperArgs),
    /// Print tree blocks and their items, decoded.
    DumpTree(super::dump_tree::DumpTreeArgs),
}

/// Arguments of `inspect dump-super`.
#[derive(clap::Args, Debug)]
pub struct DumpSuperArgs {
    /// The device or image file.
    #[arg(value_name = "DEV")]
    device: PathBuf,
    /// Also print the system chunk array and the backup roots.
    #[arg(short, long)]
    all: bool,
    /// Which superblock copy: 0 (at 64 KiB), 1 (at 64 MiB) or 2 (at 256 GiB).
    #[arg(short = 's', long = "super", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=2))]
    mirror: u8,
}

/// Run an `inspect` subcommand.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::DumpSuper(args) => dump_super(args),
        Command::DumpTree(args) => super::dump_tree::run(args),
    }
}

fn dump_super(args: DumpSuperArgs) -> Result<()> {
    let path = &args.device;
    let offset = SUPER_OFFSETS[usize::from(args.mirror)];
    let dev = FileDevice::open_read_only(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if dev.size() < offset + SUPER_SIZE as u64 {
        bail!(
            "{}: the device ({} bytes) is too small to hold superblock copy {} at offset {offset}",
            path.display(),
            dev.size(),
            args.mirror
        );
    }
    let mut buf = vec![0u8; SUPER_SIZE];
    dev.read_at(offset, &mut buf)
        .with_context(|| format!("{}: cannot read the superblock", path.display()))?;
    let sb = Superblock::parse(&buf, offset).with_context(|| {
        format!(
            "{}: superblock copy {} at offset {offset}",
            path.display(),
            args.mirror
        )
    })?;
    let mut out = String::new();
    format_super(&mut out, &sb, args.all);
    print!("{out}");
    Ok(())
}

/// One `key value` line. Keys are padded so the values line up.
fn kv(out: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{key:<31} {value}");
}

/// A flag word as `0xHEX ( NAME | NAME )`, with unknown bits shown in hex.
fn flags(value: u64, names: &[(u64, &str)]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = value;
    for &(bit, name) in names {
        if value & bit != 0 {
            parts.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("unknown: {rest:#x}"));
    }
    if parts.is_empty() {
        format!("{value:#x}")
    } else {
        format!("{value:#x} ( {} )", parts.join(" | "))
    }
}

/// Names of the superblock `flags` bits.
const SUPER_FLAG_NAMES: &[(u64, &str)] = &[
    (HEADER_FLAG_WRITTEN, "WRITTEN"),
    (HEADER_FLAG_RELOC, "RELOC"),
    (1 << 2, "ERROR"),
    (1 << 32, "SEEDING"),
    (1 << 33, "METADUMP"),
    (1 << 34, "METADUMP_V2"),
    (1 << 35, "CHANGING_FSID"),
    (1 << 36, "CHANGING_FSID_V2"),
    (1 << 38, "CHANGING_BG_TREE"),
    (1 << 39, "CHANGING_DATA_CSUM"),
    (1 << 40, "CHANGING_META_CSUM"),
];

/// Names of the compat_ro feature bits.
const COMPAT_RO_NAMES: &[(u64, &str)] = &[
    (COMPAT_RO_FREE_SPACE_TREE, "FREE_SPACE_TREE"),
    (COMPAT_RO_FREE_SPACE_TREE_VALID, "FREE_SPACE_TREE_VALID"),
    (COMPAT_RO_VERITY, "VERITY"),
    (COMPAT_RO_BLOCK_GROUP_TREE, "BLOCK_GROUP_TREE"),
];

/// Names of the incompat feature bits.
const INCOMPAT_NAMES: &[(u64, &str)] = &[
    (INCOMPAT_MIXED_BACKREF, "MIXED_BACKREF"),
    (INCOMPAT_DEFAULT_SUBVOL, "DEFAULT_SUBVOL"),
    (INCOMPAT_MIXED_GROUPS, "MIXED_GROUPS"),
    (INCOMPAT_COMPRESS_LZO, "COMPRESS_LZO"),
    (INCOMPAT_COMPRESS_ZSTD, "COMPRESS_ZSTD"),
    (INCOMPAT_BIG_METADATA, "BIG_METADATA"),
    (INCOMPAT_EXTENDED_IREF, "EXTENDED_IREF"),
    (INCOMPAT_RAID56, "RAID56"),
    (INCOMPAT_SKINNY_METADATA, "SKINNY_METADATA"),
    (INCOMPAT_NO_HOLES, "NO_HOLES"),
    (INCOMPAT_METADATA_UUID, "METADATA_UUID"),
    (INCOMPAT_RAID1C34, "RAID1C34"),
    (INCOMPAT_ZONED, "ZONED"),
    (INCOMPAT_EXTENT_TREE_V2, "EXTENT_TREE_V2"),
    (INCOMPAT_RAID_STRIPE_TREE, "RAID_STRIPE_TREE"),
    (INCOMPAT_SIMPLE_QUOTA, "SIMPLE_QUOTA"),
];

/// Names of block group / chunk type bits.
const CHUNK_TYPE_NAMES: &[(u64, &str)] = &[
    (BLOCK_GROUP_DATA, "DATA"),
    (BLOCK_GROUP_SYSTEM, "SYSTEM"),
    (BLOCK_GROUP_METADATA, "METADATA"),
    (BLOCK_GROUP_RAID0, "RAID0"),
    (BLOCK_GROUP_RAID1, "RAID1"),
    (BLOCK_GROUP_DUP, "DUP"),
    (BLOCK_GROUP_RAID10, "RAID10"),
    (BLOCK_GROUP_RAID5, "RAID5"),
    (BLOCK_GROUP_RAID6, "RAID6"),
    (BLOCK_GROUP_RAID1C3, "RAID1C3"),
    (BLOCK_GROUP_RAID1C4, "RAID1C4"),
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Append every field of `sb` to `out`.
fn format_super(out: &mut String, sb: &Superblock, all: bool) {
    let csum_size = sb.csum_type.size();
    kv(
        out,
        "csum_type",
        format!("{} ({})", sb.csum_type.to_disk(), sb.csum_type.name()),
    );
    kv(out, "csum_size", csum_size);
    kv(
        out,
        "csum",
        format!("0x{} [match]", hex(&sb.csum[..csum_size])),
    );
    kv(out, "bytenr", sb.bytenr);
    kv(out, "flags", flags(sb.flags, SUPER_FLAG_NAMES));
    let magic = String::from_utf8_lossy(&sb.magic.to_le_bytes()).into_owned();
    let verdict = if sb.magic == BTRFS_MAGIC {
        "[match]"
    } else {
        "[DON'T MATCH]"
    };
    kv(out, "magic", format!("{magic} {verdict}"));
    kv(out, "fsid", uuid_string(&sb.fsid));
    kv(out, "metadata_uuid", uuid_string(&sb.tree_fsid()));
    kv(out, "label", &sb.label);
    kv(out, "generation", sb.generation);
    kv(out, "root", sb.root);
    kv(out, "sys_array_size", sb.sys_chunk_array_size);
    kv(out, "chunk_root_generation", sb.chunk_root_generation);
    kv(out, "root_level", sb.root_level);
    kv(out, "chunk_root", sb.chunk_root);
    kv(out, "chunk_root_level", sb.chunk_root_level);
    kv(out, "log_root", sb.log_root);
    kv(out, "log_root_transid", sb.log_root_transid);
    kv(out, "log_root_level", sb.log_root_level);
    kv(out, "total_bytes", sb.total_bytes);
    kv(out, "bytes_used", sb.bytes_used);
    kv(out, "sectorsize", sb.sectorsize);
    kv(out, "nodesize", sb.nodesize);
    kv(out, "leafsize", sb.nodesize);
    kv(out, "stripesize", sb.stripesize);
    kv(out, "root_dir", sb.root_dir_objectid);
    kv(out, "num_devices", sb.num_devices);
    kv(out, "compat_flags", flags(sb.compat_flags, &[]));
    kv(
        out,
        "compat_ro_flags",
        flags(sb.compat_ro_flags, COMPAT_RO_NAMES),
    );
    kv(
        out,
        "incompat_flags",
        flags(sb.incompat_flags, INCOMPAT_NAMES),
    );
    kv(out, "cache_generation", sb.cache_generation);
    kv(out, "uuid_tree_generation", sb.uuid_tree_generation);
    if sb.compat_ro_flags & COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        kv(out, "block_group_root", sb.block_group_root);
        kv(
            out,
            "block_group_root_generation",
            sb.block_group_root_generation,
        );
        kv(out, "block_group_root_level", sb.block_group_root_level);
    }
    let d = &sb.dev_item;
    kv(out, "dev_item.uuid", uuid_string(&d.uuid));
    let verdict = if d.fsid == sb.tree_fsid() {
        "[match]"
    } else {
        "[DON'T MATCH]"
    };
    kv(
        out,
        "dev_item.fsid",
        format!("{} {verdict}", uuid_string(&d.fsid)),
    );
    kv(out, "dev_item.type", d.dev_type);
    kv(out, "dev_item.total_bytes", d.total_bytes);
    kv(out, "dev_item.bytes_used", d.bytes_used);
    kv(out, "dev_item.io_align", d.io_align);
    kv(out, "dev_item.io_width", d.io_width);
    kv(out, "dev_item.sector_size", d.sector_size);
    kv(out, "dev_item.devid", d.devid);
    kv(out, "dev_item.dev_group", d.dev_group);
    kv(out, "dev_item.seek_speed", d.seek_speed);
    kv(out, "dev_item.bandwidth", d.bandwidth);
    kv(out, "dev_item.generation", d.generation);
    if all {
        format_sys_chunks(out, sb);
        format_backup_roots(out, sb);
    }
}

fn chunk_type(t: u64) -> String {
    let mut s = flags(t, CHUNK_TYPE_NAMES);
    if t & BLOCK_GROUP_PROFILE_MASK == 0 {
        // No profile bit means the single profile.
        s = match s.strip_suffix(" )") {
            Some(head) => format!("{head} | single )"),
            None => format!("{s} ( single )"),
        };
    }
    s
}

fn format_sys_chunks(out: &mut String, sb: &Superblock) {
    kv(out, "sys_chunk_array.count", sb.sys_chunks.len());
    for (i, (key, chunk)) in sb.sys_chunks.iter().enumerate() {
        let p = format!("sys_chunk[{i}]");
        format_chunk(out, &p, key, chunk);
    }
}

fn format_chunk(out: &mut String, p: &str, key: &ubtrfs::format::Key, c: &ChunkItem) {
    kv(
        out,
        &format!("{p}.key"),
        format!("({} CHUNK_ITEM {})", key.objectid, key.offset),
    );
    kv(out, &format!("{p}.length"), c.length);
    kv(out, &format!("{p}.owner"), c.owner);
    kv(out, &format!("{p}.stripe_len"), c.stripe_len);
    kv(out, &format!("{p}.type"), chunk_type(c.chunk_type));
    kv(out, &format!("{p}.io_align"), c.io_align);
    kv(out, &format!("{p}.io_width"), c.io_width);
    kv(out, &format!("{p}.sector_size"), c.sector_size);
    kv(out, &format!("{p}.num_stripes"), c.stripes.len());
    kv(out, &format!("{p}.sub_stripes"), c.sub_stripes);
    for (j, s) in c.stripes.iter().enumerate() {
        kv(out, &format!("{p}.stripe[{j}].devid"), s.devid);
        kv(out, &format!("{p}.stripe[{j}].offset"), s.offset);
        kv(
            out,
            &format!("{p}.stripe[{j}].dev_uuid"),
            uuid_string(&s.dev_uuid),
        );
    }
}

fn format_backup_roots(out: &mut String, sb: &Superblock) {
    for (i, b) in sb.backup_roots.iter().enumerate() {
        let p = format!("backup_roots[{i}]");
        let trees = [
            ("tree_root", b.tree_root, b.tree_root_gen, b.tree_root_level),
            (
                "chunk_root",
                b.chunk_root,
                b.chunk_root_gen,
                b.chunk_root_level,
            ),
            (
                "extent_root",
                b.extent_root,
                b.extent_root_gen,
                b.extent_root_level,
            ),
            ("fs_root", b.fs_root, b.fs_root_gen, b.fs_root_level),
            ("dev_root", b.dev_root, b.dev_root_gen, b.dev_root_level),
            ("csum_root", b.csum_root, b.csum_root_gen, b.csum_root_level),
        ];
        for (name, bytenr, generation, level) in trees {
            kv(out, &format!("{p}.{name}"), bytenr);
            kv(out, &format!("{p}.{name}_gen"), generation);
            kv(out, &format!("{p}.{name}_level"), level);
        }
        kv(out, &format!("{p}.total_bytes"), b.total_bytes);
        kv(out, &format!("{p}.bytes_used"), b.bytes_used);
        kv(out, &format!("{p}.num_devices"), b.num_devices);
    }
}

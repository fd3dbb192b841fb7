//! Making a new filesystem: the trees, chunks and superblocks of an empty
//! btrfs, as `mkfs.btrfs` lays them out.
//!
//! The layout, learnt from images that `mkfs.btrfs` makes:
//!
//! - each device keeps its first MiB to itself (the primary superblock is at
//!   64 KiB); the superblock copies at 64 MiB and 256 GiB get 1 MiB windows
//!   that no chunk covers, so nothing ever allocates over them;
//! - three chunks: SYSTEM (holding the chunk tree and listed in the
//!   superblock's system chunk array), METADATA (every other tree) and
//!   DATA (empty), in the profiles asked for, packed one after another in
//!   the logical address space from 1 MiB and on each device from 1 MiB;
//! - nine trees, each written once at one generation: root, chunk,
//!   extent, dev, fs, csum, uuid, free-space and data-reloc. A tree whose
//!   items do not fit one leaf gets internal nodes.
//!
//! [`make_filesystem`] checks everything before it writes a byte: the
//! options, each device's size, and that no device already holds a
//! filesystem (unless [`MkfsOptions::force`]).

use crate::alloc::RangeSet;
use crate::device::{Device, FileDevice};
use crate::format::consts::*;
use crate::format::csum::CsumType;
use crate::format::items::{
    ChunkItem, DevExtent, DevItem, DirItem, InodeItem, InodeRef, Stripe, Timespec,
};
use crate::format::key::Key;
use crate::format::node::{Body, HEADER_SIZE, Header, ITEM_SIZE, KEY_PTR_SIZE, KeyPtr, Node};
use crate::format::superblock::{SYS_CHUNK_ARRAY_MAX, Superblock};
use crate::fs::dir::name_hash;
use crate::volume::{ChunkMap, DeviceSet, Profile, Volume};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Device space below this is never part of a chunk.
const DEV_RESERVED: u64 = MIB;
/// The window kept free around each superblock copy.
const SUPER_WINDOW: u64 = MIB;
/// Logical address of the first chunk.
const FIRST_LOGICAL: u64 = MIB;
/// Smallest stripe this mkfs makes when a device is short of room.
const MIN_STRIPE: u64 = MIB;
/// The generation every block and item of the new filesystem carries.
const GENERATION: u64 = 1;
/// Offset of the system chunk array in the superblock.
const SYS_CHUNK_ARRAY_OFF: usize = 0x32b;
/// Offset of the backup roots in the superblock.
const BACKUP_ROOTS_OFF: usize = SYS_CHUNK_ARRAY_OFF + SYS_CHUNK_ARRAY_MAX;
/// Name of the root tree directory's entry for the top-level subvolume.
const DEFAULT_SUBVOL_NAME: &[u8] = b"default";

/// Optional on-disk features, as `mkfs.btrfs -O` names them. The
/// free-space tree is always created: the library's writer needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// `no-holes`: no explicit hole extents.
    pub no_holes: bool,
    /// `skinny-metadata`: METADATA_ITEM keys for tree blocks.
    pub skinny_metadata: bool,
    /// `extref`: INODE_EXTREF items for many hard links.
    pub extended_iref: bool,
}

impl Default for Features {
    /// The defaults of `mkfs.btrfs` 6.2: extref, skinny-metadata, no-holes.
    fn default() -> Self {
        Features {
            no_holes: true,
            skinny_metadata: true,
            extended_iref: true,
        }
    }
}

/// A feature name, what it means, and whether ubtrfs can change it.
pub struct FeatureInfo {
    /// Name as `-O` takes it.
    pub name: &'static str,
    /// One line about it.
    pub description: &'static str,
    /// On unless turned off.
    pub default: bool,
}

/// Every feature `-O` accepts, for `-O list-all`.
pub const FEATURES: &[FeatureInfo] = &[
    FeatureInfo {
        name: "extref",
        description: "increased hardlink limit per file to 65536",
        default: true,
    },
    FeatureInfo {
        name: "skinny-metadata",
        description: "reduced-size metadata extent refs",
        default: true,
    },
    FeatureInfo {
        name: "no-holes",
        description: "no explicit hole extents for files",
        default: true,
    },
    FeatureInfo {
        name: "free-space-tree",
        description: "free space tree (space_cache=v2); always on",
        default: true,
    },
    FeatureInfo {
        name: "raid1c34",
        description: "RAID1 with 3 or 4 copies; set when a raid1c3/raid1c4 profile is used",
        default: false,
    },
];

impl Features {
    /// Apply a comma-separated `-O` list: `name` turns a feature on,
    /// `^name` turns it off.
    pub fn apply(&mut self, list: &str) -> Result<()> {
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let (on, name) = match word.strip_prefix('^') {
                Some(n) => (false, n),
                None => (true, word),
            };
            match name.to_ascii_lowercase().as_str() {
                "no-holes" => self.no_holes = on,
                "skinny-metadata" => self.skinny_metadata = on,
                "extref" => self.extended_iref = on,
                "free-space-tree" | "fst" => {
                    if !on {
                        return Err(Error::Unsupported(
                            "a filesystem without the free-space tree: ubtrfs always creates it"
                                .into(),
                        ));
                    }
                }
                "raid1c34" => {
                    if !on {
                        return Err(Error::Invalid(
                            "raid1c34 is set by the raid1c3/raid1c4 profiles and cannot be turned off"
                                .into(),
                        ));
                    }
                }
                "mixed-bg" | "raid56" | "zoned" | "block-group-tree" | "extent-tree-v2"
                | "raid-stripe-tree" | "squota" => {
                    if on {
                        return Err(Error::Unsupported(format!(
                            "filesystem feature '{name}' is not supported by ubtrfs mkfs"
                        )));
                    }
                }
                _ => {
                    return Err(Error::Invalid(format!(
                        "unrecognized filesystem feature '{name}'"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// What to make. [`MkfsOptions::default`] gives the defaults of
/// `mkfs.btrfs` 6.2.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Checksum algorithm of metadata and data.
    pub csum_type: CsumType,
    /// Size of a tree block: a power of two from the sector size to 64 KiB.
    pub nodesize: u32,
    /// Size of a data block: a power of two from 4 KiB to 64 KiB. The
    /// kernel mounts only a sector size it supports (the page size, 4 KiB
    /// on most machines).
    pub sectorsize: u32,
    /// Filesystem label (at most 255 bytes).
    pub label: String,
    /// Filesystem UUID; random if `None`.
    pub fsid: Option<[u8; 16]>,
    /// Metadata (and system) profile; DUP on one device, RAID1 on more if `None`.
    pub metadata_profile: Option<Profile>,
    /// Data profile; single if `None`.
    pub data_profile: Option<Profile>,
    /// Optional features.
    pub features: Features,
    /// Overwrite devices that already hold a filesystem or partition table.
    pub force: bool,
    /// Use only this many bytes of each device.
    pub byte_count: Option<u64>,
    /// Creation time of the root directories; now if `None`.
    pub time: Option<Timespec>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            csum_type: CsumType::Crc32c,
            nodesize: 16384,
            sectorsize: 4096,
            label: String::new(),
            fsid: None,
            metadata_profile: None,
            data_profile: None,
            features: Features::default(),
            force: false,
            byte_count: None,
            time: None,
        }
    }
}

/// One device of the new filesystem.
#[derive(Clone, Debug)]
pub struct MkfsDevice {
    /// Device id (1 for the first device given).
    pub devid: u64,
    /// The path the device was opened from.
    pub path: PathBuf,
    /// Bytes of the device the filesystem uses.
    pub size: u64,
    /// The device's UUID.
    pub uuid: [u8; 16],
}

/// One chunk of the new filesystem.
#[derive(Clone, Debug)]
pub struct MkfsChunk {
    /// `BLOCK_GROUP_DATA`, `_METADATA` or `_SYSTEM`.
    pub kind: u64,
    /// Its profile.
    pub profile: Profile,
    /// First logical address.
    pub logical: u64,
    /// Logical length.
    pub length: u64,
    /// (devid, physical offset) of each stripe.
    pub stripes: Vec<(u64, u64)>,
    /// Bytes of each stripe on its device.
    pub stripe_size: u64,
}

/// What [`make_filesystem`] made.
#[derive(Clone, Debug)]
pub struct MkfsReport {
    pub fsid: [u8; 16],
    pub label: String,
    pub nodesize: u32,
    pub sectorsize: u32,
    pub csum_type: CsumType,
    /// Sum of the devices' sizes.
    pub total_bytes: u64,
    pub incompat_flags: u64,
    pub compat_ro_flags: u64,
    /// UUID of the top-level subvolume (tree 5).
    pub subvol_uuid: [u8; 16],
    pub devices: Vec<MkfsDevice>,
    /// System, metadata, data.
    pub chunks: Vec<MkfsChunk>,
}

impl MkfsReport {
    /// Names of the incompat features set, as `mkfs.btrfs` prints them.
    pub fn feature_names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let f = self.incompat_flags;
        if f & INCOMPAT_EXTENDED_IREF != 0 {
            v.push("extref");
        }
        if f & INCOMPAT_RAID1C34 != 0 {
            v.push("raid1c34");
        }
        if f & INCOMPAT_SKINNY_METADATA != 0 {
            v.push("skinny-metadata");
        }
        if f & INCOMPAT_NO_HOLES != 0 {
            v.push("no-holes");
        }
        v
    }
}

/// Parse a size with an optional binary suffix, as btrfs-progs takes
/// them: `4096`, `16k`, `256M`, `1GiB`. `None` if it is not one or does
/// not fit in 64 bits.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let n: u64 = num.parse().ok()?;
    let suffix = suffix.to_ascii_lowercase();
    let suffix = suffix
        .strip_suffix("ib")
        .or_else(|| suffix.strip_suffix('b'))
        .unwrap_or(&suffix);
    let shift = match suffix {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        "e" => 60,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Parse a profile name as `mkfs.btrfs -d/-m` takes it.
pub fn parse_profile(s: &str) -> Result<Profile> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "single" => Profile::Single,
        "dup" => Profile::Dup,
        "raid0" => Profile::Raid0,
        "raid1" => Profile::Raid1,
        "raid1c3" => Profile::Raid1c3,
        "raid1c4" => Profile::Raid1c4,
        "raid10" => Profile::Raid10,
        "raid5" => Profile::Raid5,
        "raid6" => Profile::Raid6,
        _ => return Err(Error::Invalid(format!("unknown profile '{s}'"))),
    })
}

/// Parse a checksum name as `mkfs.btrfs --csum` takes it.
pub fn parse_csum(s: &str) -> Result<CsumType> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "crc32c" => CsumType::Crc32c,
        "xxhash" | "xxhash64" => CsumType::Xxhash64,
        "sha256" => CsumType::Sha256,
        "blake2" | "blake2b" => CsumType::Blake2b,
        _ => return Err(Error::Invalid(format!("unknown checksum type '{s}'"))),
    })
}

/// Parse a UUID written as 32 hex digits, dashes anywhere.
pub fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    let bad = || Error::Invalid(format!("could not parse UUID '{s}'"));
    if hex.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let txt = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(txt, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A random (version 4) UUID.
pub fn random_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    getrandom::fill(&mut u)
        .map_err(|e| Error::Unsupported(format!("no random numbers for a UUID: {e}")))?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// The smallest device `mkfs.btrfs` 6.2 accepts for these profiles; this
/// mkfs refuses the same devices it does.
pub fn min_device_size(metadata: Profile, data: Profile) -> u64 {
    let meta_extra = match metadata {
        Profile::Single => 0,
        Profile::Dup => 64 * MIB,
        _ => 24 * MIB,
    };
    let data_extra = match data {
        Profile::Single => 0,
        Profile::Dup => 120 * MIB,
        _ => 56 * MIB,
    };
    45 * MIB + meta_extra + data_extra
}

/// Devices a profile needs at least, in this mkfs.
pub fn min_devices(profile: Profile) -> usize {
    match profile {
        Profile::Single | Profile::Dup | Profile::Raid0 => 1,
        Profile::Raid1 | Profile::Raid5 => 2,
        Profile::Raid1c3 | Profile::Raid6 => 3,
        Profile::Raid1c4 | Profile::Raid10 => 4,
    }
}

/// What is on a device already, if it looks like anything: a filesystem,
/// a partition table, swap or an encrypted volume.
pub fn existing_signature(dev: &dyn Device) -> Result<Option<String>> {
    let size = dev.size();
    let read = |off: u64, len: usize| -> Result<Option<Vec<u8>>> {
        if off + len as u64 > size {
            return Ok(None);
        }
        let mut b = vec![0u8; len];
        dev.read_at(off, &mut b)?;
        Ok(Some(b))
    };
    for &off in &SUPER_OFFSETS {
        if let Some(b) = read(off + 0x40, 8)?
            && b == BTRFS_MAGIC.to_le_bytes()
        {
            return Ok(Some("an existing filesystem (btrfs)".into()));
        }
    }
    let Some(head) = read(0, 4096)? else {
        return Ok(None);
    };
    if &head[0..4] == b"XFSB" {
        return Ok(Some("an existing filesystem (xfs)".into()));
    }
    if head[0..6] == *b"LUKS\xba\xbe" {
        return Ok(Some("an encrypted volume (LUKS)".into()));
    }
    if head[1080..1082] == [0x53, 0xef] {
        return Ok(Some("an existing filesystem (ext2/3/4)".into()));
    }
    if &head[4086..4096] == b"SWAPSPACE2" || &head[4086..4096] == b"SWAP-SPACE" {
        return Ok(Some("swap space".into()));
    }
    if let Some(b) = read(512, 8)?
        && &b == b"EFI PART"
    {
        return Ok(Some("a partition table (gpt)".into()));
    }
    if head[510..512] == [0x55, 0xaa] {
        return Ok(Some("a partition table or boot sector (dos)".into()));
    }
    Ok(None)
}

/// Make a filesystem on the devices at `paths` (opened read-write).
pub fn make_filesystem_at<P: AsRef<Path>>(paths: &[P], opts: &MkfsOptions) -> Result<MkfsReport> {
    let mut devs: Vec<Arc<dyn Device>> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let canon = std::fs::canonicalize(p).map_err(|source| Error::Io {
            path: p.to_path_buf(),
            source,
        })?;
        if seen.contains(&canon) {
            return Err(Error::Devices(format!(
                "{} is given more than once",
                p.display()
            )));
        }
        seen.push(canon);
        devs.push(Arc::new(FileDevice::open_read_write(p)?));
    }
    make_filesystem(&devs, opts)
}

/// Make a filesystem on `devices`; the first becomes device 1. Nothing is
/// written unless every check passes.
pub fn make_filesystem(devices: &[Arc<dyn Device>], opts: &MkfsOptions) -> Result<MkfsReport> {
    let plan = Plan::new(devices, opts)?;
    let image = plan.build()?;
    plan.write(devices, &image)?;
    Ok(plan.report())
}

/// Everything decided before the trees are built.
struct Plan {
    opts: MkfsOptions,
    fsid: [u8; 16],
    chunk_tree_uuid: [u8; 16],
    subvol_uuid: [u8; 16],
    time: Timespec,
    devices: Vec<MkfsDevice>,
    system: MkfsChunk,
    metadata: MkfsChunk,
    data: MkfsChunk,
    incompat: u64,
    compat_ro: u64,
}

impl Plan {
    fn new(devices: &[Arc<dyn Device>], opts: &MkfsOptions) -> Result<Self> {
        check_options(opts)?;
        if devices.is_empty() {
            return Err(Error::Devices("no device given".into()));
        }
        let n = devices.len();
        let meta_profile =
            opts.metadata_profile
                .unwrap_or(if n > 1 { Profile::Raid1 } else { Profile::Dup });
        let data_profile = opts.data_profile.unwrap_or(Profile::Single);
        for (what, p) in [("metadata", meta_profile), ("data", data_profile)] {
            let need = min_devices(p);
            if n < need {
                return Err(Error::Invalid(format!(
                    "unable to create FS with {what} profile {} (have {n} devices but {need} devices are required)",
                    p.name()
                )));
            }
        }
        let min = min_device_size(meta_profile, data_profile);
        let sector = opts.sectorsize as u64;
        let mut devs = Vec::with_capacity(n);
        for (i, dev) in devices.iter().enumerate() {
            let path = dev.path().to_path_buf();
            let size = match opts.byte_count {
                Some(b) if b > dev.size() => {
                    return Err(Error::Invalid(format!(
                        "{} is smaller than requested size, expected {b}, found {}",
                        path.display(),
                        dev.size()
                    )));
                }
                Some(b) => b,
                None => dev.size(),
            } / sector
                * sector;
            if size < min {
                return Err(Error::Invalid(format!(
                    "'{}' is too small to make a usable filesystem: {} bytes; minimum size for each btrfs device is {min} ({})",
                    path.display(),
                    size,
                    human(min)
                )));
            }
            if !opts.force
                && let Some(what) = existing_signature(dev.as_ref())?
            {
                return Err(Error::Exists(format!(
                    "{} appears to contain {what}; use force (-f) to overwrite it",
                    path.display()
                )));
            }
            devs.push(MkfsDevice {
                devid: i as u64 + 1,
                path,
                size,
                uuid: random_uuid()?,
            });
        }
        let total: u64 = devs.iter().map(|d| d.size).sum();
        let mut space: Vec<DevSpace> = devs
            .iter()
            .map(|d| DevSpace {
                devid: d.devid,
                free: device_free_space(d.size),
            })
            .collect();
        let single = |p: Profile| p == Profile::Single;
        let sys_stripe = if single(meta_profile) {
            4 * MIB
        } else {
            8 * MIB
        };
        let meta_stripe = if single(meta_profile) {
            8 * MIB
        } else {
            let cap = if total >= 50 * GIB { GIB } else { 256 * MIB };
            let stripes = stripe_count(meta_profile, n) as u64;
            (total / 10 / stripes / STRIPE_LEN * STRIPE_LEN).clamp(32 * MIB, cap)
        };
        let data_stripe = if single(data_profile) {
            8 * MIB
        } else {
            64 * MIB
        };
        let mut logical = FIRST_LOGICAL;
        let mut place = |kind: u64, profile: Profile, want: u64| -> Result<MkfsChunk> {
            let c = place_chunk(&mut space, kind, profile, want, logical)?;
            logical = (c.logical + c.length).div_ceil(MIB) * MIB;
            Ok(c)
        };
        let system = place(BLOCK_GROUP_SYSTEM, meta_profile, sys_stripe)?;
        let metadata = place(BLOCK_GROUP_METADATA, meta_profile, meta_stripe)?;
        let data = place(BLOCK_GROUP_DATA, data_profile, data_stripe)?;
        let mut incompat = INCOMPAT_MIXED_BACKREF;
        let f = opts.features;
        if f.extended_iref {
            incompat |= INCOMPAT_EXTENDED_IREF;
        }
        if f.skinny_metadata {
            incompat |= INCOMPAT_SKINNY_METADATA;
        }
        if f.no_holes {
            incompat |= INCOMPAT_NO_HOLES;
        }
        if [meta_profile, data_profile]
            .iter()
            .any(|p| matches!(p, Profile::Raid1c3 | Profile::Raid1c4))
        {
            incompat |= INCOMPAT_RAID1C34;
        }
        if [meta_profile, data_profile]
            .iter()
            .any(|p| matches!(p, Profile::Raid5 | Profile::Raid6))
        {
            incompat |= INCOMPAT_RAID56;
        }
        Ok(Plan {
            opts: opts.clone(),
            fsid: match opts.fsid {
                Some(u) => u,
                None => random_uuid()?,
            },
            chunk_tree_uuid: random_uuid()?,
            subvol_uuid: random_uuid()?,
            time: opts.time.unwrap_or_else(Timespec::now),
            devices: devs,
            system,
            metadata,
            data,
            incompat,
            compat_ro: COMPAT_RO_FREE_SPACE_TREE | COMPAT_RO_FREE_SPACE_TREE_VALID,
        })
    }

    fn chunks(&self) -> [&MkfsChunk; 3] {
        [&self.system, &self.metadata, &self.data]
    }

    fn nodesize(&self) -> usize {
        self.opts.nodesize as usize
    }

    fn report(&self) -> MkfsReport {
        MkfsReport {
            fsid: self.fsid,
            label: self.opts.label.clone(),
            nodesize: self.opts.nodesize,
            sectorsize: self.opts.sectorsize,
            csum_type: self.opts.csum_type,
            total_bytes: self.devices.iter().map(|d| d.size).sum(),
            incompat_flags: self.incompat,
            compat_ro_flags: self.compat_ro,
            subvol_uuid: self.subvol_uuid,
            devices: self.devices.clone(),
            chunks: self.chunks().into_iter().cloned().collect(),
        }
    }
}

fn check_options(opts: &MkfsOptions) -> Result<()> {
    let s = opts.sectorsize;
    if !s.is_power_of_two() || !(4096..=65536).contains(&s) {
        return Err(Error::Invalid(format!(
            "illegal sectorsize {s}: a power of two from 4096 to 65536"
        )));
    }
    let n = opts.nodesize;
    if n < s {
        return Err(Error::Invalid(format!(
            "illegal nodesize {n} (smaller than the sectorsize {s})"
        )));
    }
    if n > 65536 {
        return Err(Error::Invalid(format!(
            "illegal nodesize {n} (larger than 65536)"
        )));
    }
    if !n.is_power_of_two() {
        return Err(Error::Invalid(format!(
            "illegal nodesize {n} (not a power of two)"
        )));
    }
    if opts.label.len() > 255 {
        return Err(Error::Invalid(format!(
            "label of {} bytes is too long (max 255)",
            opts.label.len()
        )));
    }
    if opts.label.contains('\0') {
        return Err(Error::Invalid("label contains a NUL byte".into()));
    }
    Ok(())
}

/// Free space of one device while chunks are placed.
struct DevSpace {
    devid: u64,
    free: RangeSet,
}

/// Where chunks may go on a device of `size` bytes: after the first MiB,
/// and away from the superblock copies.
fn device_free_space(size: u64) -> RangeSet {
    let mut free = RangeSet::new();
    if size > DEV_RESERVED {
        free.insert(DEV_RESERVED, size - DEV_RESERVED);
    }
    for &off in &SUPER_OFFSETS[1..] {
        let lo = off / SUPER_WINDOW * SUPER_WINDOW;
        let hi = (lo + SUPER_WINDOW).min(size);
        let parts: Vec<(u64, u64)> = free.iter().collect();
        for (s, l) in parts {
            let (a, b) = (s.max(lo), (s + l).min(hi));
            if a < b {
                free.remove(a, b - a);
            }
        }
    }
    free
}

/// Stripes a chunk of `profile` gets on `n` devices.
fn stripe_count(profile: Profile, n: usize) -> usize {
    match profile {
        Profile::Single => 1,
        Profile::Dup | Profile::Raid1 => 2,
        Profile::Raid1c3 => 3,
        Profile::Raid1c4 => 4,
        Profile::Raid0 | Profile::Raid5 | Profile::Raid6 => n,
        Profile::Raid10 => n / 2 * 2,
    }
}

/// Stripes of a chunk that hold distinct data (the rest are copies).
fn data_stripes(profile: Profile, stripes: usize) -> u64 {
    match profile {
        Profile::Raid0 => stripes as u64,
        Profile::Raid10 => stripes as u64 / 2,
        Profile::Raid5 | Profile::Raid6 => stripes as u64 - profile.parity_stripes(),
        _ => 1,
    }
}

/// Place a chunk: pick its devices (most free space first, then lowest
/// devid), shrink the stripe if a device is short of room, and carve the
/// stripes out of the devices' free space.
fn place_chunk(
    space: &mut [DevSpace],
    kind: u64,
    profile: Profile,
    want: u64,
    logical: u64,
) -> Result<MkfsChunk> {
    let (ndev, per_dev) = match profile {
        Profile::Dup => (1, 2),
        p => (stripe_count(p, space.len()), 1),
    };
    let mut order: Vec<usize> = (0..space.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(space[i].free.total()), space[i].devid));
    order.truncate(ndev);
    if order.len() < ndev {
        return Err(Error::Invalid(format!(
            "{} needs {ndev} devices",
            profile.name()
        )));
    }
    order.sort_by_key(|&i| space[i].devid);
    let room = order
        .iter()
        .map(|&i| {
            // DUP needs two stripes on one device, possibly in two pieces.
            let mut best: Vec<u64> = space[i].free.iter().map(|(_, l)| l).collect();
            best.sort_unstable_by(|a, b| b.cmp(a));
            if per_dev == 2 {
                let two = best.first().map_or(0, |&l| l / 2);
                let split = best.get(1).copied().unwrap_or(0);
                two.max(split)
            } else {
                best.first().copied().unwrap_or(0)
            }
        })
        .min()
        .unwrap_or(0);
    let stripe = want.min(room / STRIPE_LEN * STRIPE_LEN);
    if stripe < MIN_STRIPE {
        return Err(Error::NoSpace(format!(
            "no room for a {} {} chunk on the devices",
            kind_name(kind),
            profile.name()
        )));
    }
    let mut stripes = Vec::new();
    for &i in &order {
        for _ in 0..per_dev {
            let d = &mut space[i];
            let at = d.free.find(stripe, STRIPE_LEN, 0).ok_or_else(|| {
                Error::NoSpace(format!(
                    "no room for a {} chunk on device {}",
                    kind_name(kind),
                    d.devid
                ))
            })?;
            d.free.remove(at, stripe);
            stripes.push((d.devid, at));
        }
    }
    let length = stripe * data_stripes(profile, stripes.len());
    Ok(MkfsChunk {
        kind,
        profile,
        logical,
        length,
        stripes,
        stripe_size: stripe,
    })
}

fn kind_name(kind: u64) -> &'static str {
    if kind & BLOCK_GROUP_SYSTEM != 0 {
        "System"
    } else if kind & BLOCK_GROUP_METADATA != 0 {
        "Metadata"
    } else {
        "Data"
    }
}

fn profile_flag(p: Profile) -> u64 {
    match p {
        Profile::Single => 0,
        Profile::Dup => BLOCK_GROUP_DUP,
        Profile::Raid0 => BLOCK_GROUP_RAID0,
        Profile::Raid1 => BLOCK_GROUP_RAID1,
        Profile::Raid1c3 => BLOCK_GROUP_RAID1C3,
        Profile::Raid1c4 => BLOCK_GROUP_RAID1C4,
        Profile::Raid10 => BLOCK_GROUP_RAID10,
        Profile::Raid5 => BLOCK_GROUP_RAID5,
        Profile::Raid6 => BLOCK_GROUP_RAID6,
    }
}

impl MkfsChunk {
    /// Type and profile flags.
    pub fn flags(&self) -> u64 {
        self.kind | profile_flag(self.profile)
    }

    fn item(&self, plan_devs: &[MkfsDevice], sectorsize: u32) -> ChunkItem {
        ChunkItem {
            length: self.length,
            owner: EXTENT_TREE_OBJECTID,
            stripe_len: STRIPE_LEN,
            chunk_type: self.flags(),
            io_align: STRIPE_LEN as u32,
            io_width: STRIPE_LEN as u32,
            sector_size: sectorsize,
            sub_stripes: if self.profile == Profile::Raid10 {
                2
            } else {
                1
            },
            stripes: self
                .stripes
                .iter()
                .map(|&(devid, offset)| Stripe {
                    devid,
                    offset,
                    dev_uuid: plan_devs
                        .iter()
                        .find(|d| d.devid == devid)
                        .map_or([0; 16], |d| d.uuid),
                })
                .collect(),
        }
    }
}

/// The trees in the order their blocks are laid out in the metadata chunk.
const META_TREES: [u64; 8] = [
    ROOT_TREE_OBJECTID,
    EXTENT_TREE_OBJECTID,
    DEV_TREE_OBJECTID,
    FS_TREE_OBJECTID,
    CSUM_TREE_OBJECTID,
    UUID_TREE_OBJECTID,
    FREE_SPACE_TREE_OBJECTID,
    DATA_RELOC_TREE_OBJECTID,
];

type Items = Vec<(Key, Vec<u8>)>;

/// Block placement of one tree: nodes per level, leaves first.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shape(Vec<usize>);

impl Shape {
    fn blocks(&self) -> usize {
        self.0.iter().sum()
    }
}

/// One tree's blocks: (logical address, level), leaves first, root last.
#[derive(Clone, Debug)]
struct Placed {
    blocks: Vec<(u64, u8)>,
}

impl Placed {
    fn root(&self) -> (u64, u8) {
        self.blocks.last().copied().unwrap_or((0, 0))
    }
}

/// The built filesystem: every tree block, ready to write.
struct Image {
    nodes: Vec<Node>,
    roots: BTreeMap<u64, (u64, u8)>,
    bytes_used: u64,
}

/// How items split into leaves: greedy, each leaf as full as it can be.
fn split_leaves(sizes: &[usize], nodesize: usize) -> Result<Vec<Range<usize>>> {
    let cap = nodesize - HEADER_SIZE;
    let mut out = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for (i, &s) in sizes.iter().enumerate() {
        let need = ITEM_SIZE + s;
        if need > cap {
            return Err(Error::Invalid(format!(
                "an item of {s} bytes does not fit a {nodesize}-byte leaf"
            )));
        }
        if used + need > cap {
            out.push(start..i);
            start = i;
            used = 0;
        }
        used += need;
    }
    out.push(start..sizes.len());
    Ok(out)
}

/// Nodes per level for a tree of these items.
fn shape_of(items: &Items, nodesize: usize) -> Result<Shape> {
    let sizes: Vec<usize> = items.iter().map(|(_, d)| d.len()).collect();
    let mut levels = vec![split_leaves(&sizes, nodesize)?.len()];
    let fan = (nodesize - HEADER_SIZE) / KEY_PTR_SIZE;
    while let Some(&n) = levels.last()
        && n > 1
    {
        if levels.len() > MAX_TREE_LEVELS {
            return Err(Error::Invalid("tree too deep".into()));
        }
        levels.push(n.div_ceil(fan));
    }
    Ok(Shape(levels))
}

const MAX_TREE_LEVELS: usize = 8;

/// Build the blocks of a tree whose block addresses are `placed` (which
/// must agree with [`shape_of`] of `items`). Returns the nodes and the
/// first key of each block.
fn build_tree(
    owner: u64,
    items: Items,
    placed: &Placed,
    header: &Header,
    nodesize: usize,
) -> Result<(Vec<Node>, Vec<Key>)> {
    let sizes: Vec<usize> = items.iter().map(|(_, d)| d.len()).collect();
    let leaves = split_leaves(&sizes, nodesize)?;
    let mut addrs = placed.blocks.iter();
    let mut next_addr = |level: u8| -> Result<u64> {
        match addrs.next() {
            Some(&(a, l)) if l == level => Ok(a),
            _ => Err(Error::Invalid(format!(
                "tree {owner}: block placement does not match its shape"
            ))),
        }
    };
    let mut nodes = Vec::new();
    let mut firsts = Vec::new();
    // (first key, address) of each block of the level just built.
    let mut level_ptrs: Vec<(Key, u64)> = Vec::new();
    let mut items = items.into_iter();
    for r in leaves {
        let chunk: Items = items.by_ref().take(r.len()).collect();
        let first = chunk.first().map(|(k, _)| *k).unwrap_or_default();
        let at = next_addr(0)?;
        let h = Header {
            bytenr: at,
            owner,
            level: 0,
            ..header.clone()
        };
        nodes.push(Node::build(&h, &Body::Leaf(chunk), nodesize)?);
        firsts.push(first);
        level_ptrs.push((first, at));
    }
    let fan = (nodesize - HEADER_SIZE) / KEY_PTR_SIZE;
    let mut level = 0u8;
    while level_ptrs.len() > 1 {
        level += 1;
        let mut up = Vec::new();
        for group in level_ptrs.chunks(fan) {
            let at = next_addr(level)?;
            let ptrs: Vec<KeyPtr> = group
                .iter()
                .map(|&(key, blockptr)| KeyPtr {
                    key,
                    blockptr,
                    generation: GENERATION,
                })
                .collect();
            let h = Header {
                bytenr: at,
                owner,
                level,
                ..header.clone()
            };
            nodes.push(Node::build(&h, &Body::Internal(ptrs), nodesize)?);
            firsts.push(group[0].0);
            up.push((group[0].0, at));
        }
        level_ptrs = up;
    }
    if addrs.next().is_some() {
        return Err(Error::Invalid(format!(
            "tree {owner}: more blocks placed than built"
        )));
    }
    Ok((nodes, firsts))
}

impl Plan {
    /// Give each tree's blocks addresses: the chunk tree's at the start of
    /// the system chunk, the others one after another in the metadata chunk.
    fn place(&self, shapes: &BTreeMap<u64, Shape>) -> Result<BTreeMap<u64, Placed>> {
        let ns = self.nodesize() as u64;
        let mut out = BTreeMap::new();
        let mut lay = |id: u64, cursor: &mut u64, chunk: &MkfsChunk| -> Result<()> {
            let shape = &shapes[&id];
            let mut blocks = Vec::new();
            for (level, &count) in shape.0.iter().enumerate() {
                for _ in 0..count {
                    if *cursor + ns > chunk.logical + chunk.length {
                        return Err(Error::NoSpace(format!(
                            "the {} chunk of {} bytes cannot hold the new trees",
                            kind_name(chunk.kind),
                            chunk.length
                        )));
                    }
                    blocks.push((*cursor, level as u8));
                    *cursor += ns;
                }
            }
            out.insert(id, Placed { blocks });
            Ok(())
        };
        let mut sys = self.system.logical;
        lay(CHUNK_TREE_OBJECTID, &mut sys, &self.system)?;
        let mut meta = self.metadata.logical;
        for id in META_TREES {
            lay(id, &mut meta, &self.metadata)?;
        }
        Ok(out)
    }

    fn header(&self) -> Header {
        Header {
            csum: [0; 32],
            fsid: self.fsid,
            bytenr: 0,
            flags: HEADER_FLAG_WRITTEN | (MIXED_BACKREF_REV << 56),
            chunk_tree_uuid: self.chunk_tree_uuid,
            generation: GENERATION,
            owner: 0,
            nritems: 0,
            level: 0,
        }
    }

    /// Build every tree. Block counts depend on the extent tree, whose
    /// items depend on the block counts: start from one block per tree and
    /// repeat until the shapes agree.
    fn build(&self) -> Result<Image> {
        let ns = self.nodesize();
        let mut ids = vec![CHUNK_TREE_OBJECTID];
        ids.extend(META_TREES);
        let mut shapes: BTreeMap<u64, Shape> = ids.iter().map(|&id| (id, Shape(vec![1]))).collect();
        for _ in 0..16 {
            let placed = self.place(&shapes)?;
            let contents = self.contents(&placed)?;
            let mut new_shapes = BTreeMap::new();
            for (&id, items) in &contents {
                new_shapes.insert(id, shape_of(items, ns)?);
            }
            if new_shapes != shapes {
                shapes = new_shapes;
                continue;
            }
            let header = self.header();
            let mut nodes = Vec::new();
            for (id, items) in contents {
                let (built, _) = build_tree(id, items, &placed[&id], &header, ns)?;
                nodes.extend(built);
            }
            let roots = placed.iter().map(|(&id, p)| (id, p.root())).collect();
            let bytes_used = nodes.len() as u64 * ns as u64;
            return Ok(Image {
                nodes,
                roots,
                bytes_used,
            });
        }
        Err(Error::Invalid(
            "the tree layout did not settle (too many devices?)".into(),
        ))
    }

    /// The items of every tree, for blocks placed as `placed`.
    fn contents(&self, placed: &BTreeMap<u64, Placed>) -> Result<BTreeMap<u64, Items>> {
        let ns = self.nodesize();
        let mut t: BTreeMap<u64, Items> = BTreeMap::new();
        t.insert(CHUNK_TREE_OBJECTID, self.chunk_tree_items());
        t.insert(DEV_TREE_OBJECTID, self.dev_tree_items());
        t.insert(FS_TREE_OBJECTID, self.subvol_root_items(true));
        t.insert(DATA_RELOC_TREE_OBJECTID, self.subvol_root_items(false));
        t.insert(CSUM_TREE_OBJECTID, Vec::new());
        t.insert(UUID_TREE_OBJECTID, self.uuid_tree_items());
        t.insert(FREE_SPACE_TREE_OBJECTID, self.free_space_items(placed));
        t.insert(ROOT_TREE_OBJECTID, self.root_tree_items(placed));
        // The extent tree: keys and sizes first (they do not depend on
        // first keys), then, for non-skinny items, each block's first key.
        let mut firsts: BTreeMap<u64, Key> = BTreeMap::new();
        let header = self.header();
        for (&id, items) in &t {
            let p = &placed[&id];
            if shape_of(items, ns)?.blocks() != p.blocks.len() {
                // Shapes not settled yet: first keys do not matter this round.
                continue;
            }
            let (_, keys) = build_tree(id, items.clone(), p, &header, ns)?;
            for (&(at, _), k) in p.blocks.iter().zip(keys) {
                firsts.insert(at, k);
            }
        }
        let draft = self.extent_tree_items(placed, &firsts);
        let p = &placed[&EXTENT_TREE_OBJECTID];
        if shape_of(&draft, ns)?.blocks() == p.blocks.len() {
            let (_, keys) = build_tree(EXTENT_TREE_OBJECTID, draft, p, &header, ns)?;
            for (&(at, _), k) in p.blocks.iter().zip(keys) {
                firsts.insert(at, k);
            }
        }
        t.insert(
            EXTENT_TREE_OBJECTID,
            self.extent_tree_items(placed, &firsts),
        );
        Ok(t)
    }

    fn dev_item(&self, d: &MkfsDevice) -> DevItem {
        let used: u64 = self
            .chunks()
            .iter()
            .map(|c| c.stripes.iter().filter(|s| s.0 == d.devid).count() as u64 * c.stripe_size)
            .sum();
        DevItem {
            devid: d.devid,
            total_bytes: d.size,
            bytes_used: used,
            io_align: self.opts.sectorsize,
            io_width: self.opts.sectorsize,
            sector_size: self.opts.sectorsize,
            dev_type: 0,
            generation: 0,
            start_offset: 0,
            dev_group: 0,
            seek_speed: 0,
            bandwidth: 0,
            uuid: d.uuid,
            fsid: self.fsid,
        }
    }

    fn chunk_tree_items(&self) -> Items {
        let mut v: Items = self
            .devices
            .iter()
            .map(|d| {
                (
                    Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, d.devid),
                    self.dev_item(d).to_bytes(),
                )
            })
            .collect();
        for c in self.chunks() {
            v.push((
                Key::new(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, c.logical),
                c.item(&self.devices, self.opts.sectorsize).to_bytes(),
            ));
        }
        v.sort_by_key(|(k, _)| *k);
        v
    }

    fn dev_tree_items(&self) -> Items {
        let mut v: Items = Vec::new();
        for c in self.chunks() {
            for &(devid, offset) in &c.stripes {
                let de = DevExtent {
                    chunk_tree: CHUNK_TREE_OBJECTID,
                    chunk_objectid: FIRST_CHUNK_TREE_OBJECTID,
                    chunk_offset: c.logical,
                    length: c.stripe_size,
                    chunk_tree_uuid: self.chunk_tree_uuid,
                };
                v.push((Key::new(devid, DEV_EXTENT_KEY, offset), de.to_bytes()));
            }
        }
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// A subvolume root directory (inode 256): the top-level subvolume's
    /// or the data relocation tree's.
    fn subvol_root_items(&self, top_level: bool) -> Items {
        let inode = InodeItem {
            generation: GENERATION,
            transid: 0,
            size: 0,
            // mkfs.btrfs counts the root directory of the top-level
            // subvolume as one node; the data relocation tree's as nothing.
            nbytes: if top_level {
                self.opts.nodesize as u64
            } else {
                0
            },
            block_group: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            mode: libc::S_IFDIR | 0o755,
            rdev: 0,
            flags: 0,
            sequence: 0,
            atime: self.time,
            ctime: self.time,
            mtime: self.time,
            otime: self.time,
        };
        let mut r = Vec::new();
        InodeRef {
            parent: FIRST_INODE,
            index: 0,
            name: b"..".to_vec(),
        }
        .encode_ref(&mut r);
        vec![
            (Key::new(FIRST_INODE, INODE_ITEM_KEY, 0), inode.to_bytes()),
            (Key::new(FIRST_INODE, INODE_REF_KEY, FIRST_INODE), r),
        ]
    }

    fn uuid_tree_items(&self) -> Items {
        let u = &self.subvol_uuid;
        let lo = u64::from_le_bytes(u[0..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(u[8..16].try_into().unwrap_or_default());
        vec![(
            Key::new(lo, UUID_KEY_SUBVOL, hi),
            FS_TREE_OBJECTID.to_le_bytes().to_vec(),
        )]
    }

    /// Bytes of tree blocks in each chunk, by chunk start.
    fn used_by_chunk(&self, placed: &BTreeMap<u64, Placed>) -> BTreeMap<u64, u64> {
        let ns = self.opts.nodesize as u64;
        let mut used: BTreeMap<u64, u64> = self.chunks().iter().map(|c| (c.logical, 0)).collect();
        for p in placed.values() {
            for &(at, _) in &p.blocks {
                if let Some(c) = self
                    .chunks()
                    .into_iter()
                    .find(|c| (c.logical..c.logical + c.length).contains(&at))
                {
                    *used.entry(c.logical).or_default() += ns;
                }
            }
        }
        used
    }

    fn free_space_items(&self, placed: &BTreeMap<u64, Placed>) -> Items {
        let ns = self.opts.nodesize as u64;
        let mut taken = RangeSet::new();
        for p in placed.values() {
            for &(at, _) in &p.blocks {
                taken.insert(at, ns);
            }
        }
        let mut v = Vec::new();
        for c in self.chunks() {
            let end = c.logical + c.length;
            let mut free = Vec::new();
            let mut cursor = c.logical;
            for (s, l) in taken.iter() {
                if s + l <= c.logical || s >= end {
                    continue;
                }
                if s > cursor {
                    free.push((cursor, s - cursor));
                }
                cursor = cursor.max(s + l);
            }
            if cursor < end {
                free.push((cursor, end - cursor));
            }
            let mut info = Vec::with_capacity(8);
            info.extend_from_slice(&(free.len() as u32).to_le_bytes());
            info.extend_from_slice(&0u32.to_le_bytes());
            v.push((Key::new(c.logical, FREE_SPACE_INFO_KEY, c.length), info));
            for (s, l) in free {
                v.push((Key::new(s, FREE_SPACE_EXTENT_KEY, l), Vec::new()));
            }
        }
        v.sort_by_key(|(k, _)| *k);
        v
    }

    fn root_item(&self, tree: u64, placed: &BTreeMap<u64, Placed>) -> Vec<u8> {
        let p = &placed[&tree];
        let (bytenr, level) = p.root();
        let inode = InodeItem {
            generation: 1,
            size: 3,
            nbytes: self.opts.nodesize as u64,
            nlink: 1,
            mode: libc::S_IFDIR | 0o755,
            ..Default::default()
        };
        let mut v = inode.to_bytes();
        let subvol = tree == FS_TREE_OBJECTID || tree == DATA_RELOC_TREE_OBJECTID;
        for x in [
            GENERATION,
            if subvol { FIRST_INODE } else { 0 },
            bytenr,
            0,
            (p.blocks.len() * self.nodesize()) as u64,
            0,
            0,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&Key::MIN.to_bytes());
        v.push(0);
        v.push(level);
        v.extend_from_slice(&GENERATION.to_le_bytes());
        let uuid = if tree == FS_TREE_OBJECTID {
            self.subvol_uuid
        } else {
            [0; 16]
        };
        v.extend_from_slice(&uuid);
        v.extend_from_slice(&[0u8; 32]);
        for _ in 0..4 {
            v.extend_from_slice(&0u64.to_le_bytes());
        }
        let t = if tree == FS_TREE_OBJECTID {
            self.time
        } else {
            Timespec::default()
        };
        t.encode(&mut v);
        t.encode(&mut v);
        Timespec::default().encode(&mut v);
        Timespec::default().encode(&mut v);
        v.resize(439, 0);
        v
    }

    fn root_tree_items(&self, placed: &BTreeMap<u64, Placed>) -> Items {
        let mut v: Items = Vec::new();
        for id in META_TREES {
            if id != ROOT_TREE_OBJECTID {
                v.push((Key::new(id, ROOT_ITEM_KEY, 0), self.root_item(id, placed)));
            }
        }
        let mut name_ref = Vec::new();
        InodeRef {
            parent: ROOT_TREE_DIR_OBJECTID,
            index: 0,
            name: DEFAULT_SUBVOL_NAME.to_vec(),
        }
        .encode_ref(&mut name_ref);
        v.push((
            Key::new(FS_TREE_OBJECTID, INODE_REF_KEY, ROOT_TREE_DIR_OBJECTID),
            name_ref,
        ));
        let dir_inode = InodeItem {
            generation: GENERATION,
            nbytes: self.opts.nodesize as u64,
            nlink: 1,
            mode: libc::S_IFDIR | 0o755,
            atime: self.time,
            ctime: self.time,
            mtime: self.time,
            otime: self.time,
            ..Default::default()
        };
        v.push((
            Key::new(ROOT_TREE_DIR_OBJECTID, INODE_ITEM_KEY, 0),
            dir_inode.to_bytes(),
        ));
        let mut dotdot = Vec::new();
        InodeRef {
            parent: ROOT_TREE_DIR_OBJECTID,
            index: 0,
            name: b"..".to_vec(),
        }
        .encode_ref(&mut dotdot);
        v.push((
            Key::new(
                ROOT_TREE_DIR_OBJECTID,
                INODE_REF_KEY,
                ROOT_TREE_DIR_OBJECTID,
            ),
            dotdot,
        ));
        let mut entry = Vec::new();
        DirItem {
            location: Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX),
            transid: 0,
            file_type: FT_DIR,
            name: DEFAULT_SUBVOL_NAME.to_vec(),
            data: Vec::new(),
        }
        .encode(&mut entry);
        v.push((
            Key::new(
                ROOT_TREE_DIR_OBJECTID,
                DIR_ITEM_KEY,
                name_hash(DEFAULT_SUBVOL_NAME),
            ),
            entry,
        ));
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// Block group items and one tree block item per block. `firsts` holds
    /// each block's first key (for non-skinny items; missing ones are zero).
    fn extent_tree_items(
        &self,
        placed: &BTreeMap<u64, Placed>,
        firsts: &BTreeMap<u64, Key>,
    ) -> Items {
        let used = self.used_by_chunk(placed);
        let mut v: Items = Vec::new();
        for c in self.chunks() {
            let mut b = Vec::with_capacity(24);
            b.extend_from_slice(&used.get(&c.logical).copied().unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&FIRST_CHUNK_TREE_OBJECTID.to_le_bytes());
            b.extend_from_slice(&c.flags().to_le_bytes());
            v.push((Key::new(c.logical, BLOCK_GROUP_ITEM_KEY, c.length), b));
        }
        let skinny = self.opts.features.skinny_metadata;
        for (&owner, p) in placed {
            for &(at, level) in &p.blocks {
                let mut b = Vec::with_capacity(51);
                b.extend_from_slice(&1u64.to_le_bytes());
                b.extend_from_slice(&GENERATION.to_le_bytes());
                b.extend_from_slice(&EXTENT_FLAG_TREE_BLOCK.to_le_bytes());
                let key = if skinny {
                    Key::new(at, METADATA_ITEM_KEY, level as u64)
                } else {
                    let first = firsts.get(&at).copied().unwrap_or_default();
                    b.extend_from_slice(&first.to_bytes());
                    b.push(level);
                    Key::new(at, EXTENT_ITEM_KEY, self.opts.nodesize as u64)
                };
                b.push(TREE_BLOCK_REF_KEY);
                b.extend_from_slice(&owner.to_le_bytes());
                v.push((key, b));
            }
        }
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// The superblock of device `d` (its bytenr is set when written).
    fn superblock(&self, d: &MkfsDevice, image: &Image) -> Result<Box<[u8; SUPER_SIZE]>> {
        let mut sb = Box::new([0u8; SUPER_SIZE]);
        let b = &mut sb[..];
        let put =
            |b: &mut [u8], off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        let put32 =
            |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        let (root, root_level) = image.roots[&ROOT_TREE_OBJECTID];
        let (chunk_root, chunk_level) = image.roots[&CHUNK_TREE_OBJECTID];
        let total: u64 = self.devices.iter().map(|d| d.size).sum();
        b[0x20..0x30].copy_from_slice(&self.fsid);
        put(b, 0x30, SUPER_OFFSETS[0]);
        put(b, 0x38, HEADER_FLAG_WRITTEN);
        put(b, 0x40, BTRFS_MAGIC);
        put(b, 0x48, GENERATION);
        put(b, 0x50, root);
        put(b, 0x58, chunk_root);
        put(b, 0x70, total);
        put(b, 0x78, image.bytes_used);
        put(b, 0x80, ROOT_TREE_DIR_OBJECTID);
        put(b, 0x88, self.devices.len() as u64);
        put32(b, 0x90, self.opts.sectorsize);
        put32(b, 0x94, self.opts.nodesize);
        put32(b, 0x98, self.opts.nodesize);
        put32(b, 0x9c, self.opts.sectorsize);
        put(b, 0xa4, GENERATION);
        put(b, 0xb4, self.compat_ro);
        put(b, 0xbc, self.incompat);
        b[0xc4..0xc6].copy_from_slice(&self.opts.csum_type.to_disk().to_le_bytes());
        b[0xc6] = root_level;
        b[0xc7] = chunk_level;
        b[0xc9..0xc9 + DevItem::SIZE].copy_from_slice(&self.dev_item(d).to_bytes());
        let label = self.opts.label.as_bytes();
        b[0x12b..0x12b + label.len()].copy_from_slice(label);
        put(b, 0x233, GENERATION);
        // The system chunk array: the key and item of the system chunk.
        let mut sys = Key::new(
            FIRST_CHUNK_TREE_OBJECTID,
            CHUNK_ITEM_KEY,
            self.system.logical,
        )
        .to_bytes()
        .to_vec();
        sys.extend_from_slice(
            &self
                .system
                .item(&self.devices, self.opts.sectorsize)
                .to_bytes(),
        );
        if sys.len() > SYS_CHUNK_ARRAY_MAX {
            return Err(Error::Invalid(format!(
                "the system chunk with {} stripes does not fit the superblock",
                self.system.stripes.len()
            )));
        }
        put32(b, 0xa0, sys.len() as u32);
        b[SYS_CHUNK_ARRAY_OFF..SYS_CHUNK_ARRAY_OFF + sys.len()].copy_from_slice(&sys);
        // Backup root 0: the roots as written.
        let r = |id: u64| image.roots[&id];
        let o = BACKUP_ROOTS_OFF;
        let trees = [
            ROOT_TREE_OBJECTID,
            CHUNK_TREE_OBJECTID,
            EXTENT_TREE_OBJECTID,
            FS_TREE_OBJECTID,
            DEV_TREE_OBJECTID,
            CSUM_TREE_OBJECTID,
        ];
        for (i, id) in trees.iter().enumerate() {
            put(b, o + i * 16, r(*id).0);
            put(b, o + i * 16 + 8, GENERATION);
            b[o + 152 + i] = r(*id).1;
        }
        put(b, o + 96, total);
        put(b, o + 104, image.bytes_used);
        put(b, o + 112, self.devices.len() as u64);
        Ok(sb)
    }

    /// Write the image: wipe the start of each device and stale superblock
    /// copies, write every tree block to every copy, flush, write the
    /// superblock copies, and the primary superblocks last with FUA.
    fn write(&self, devices: &[Arc<dyn Device>], image: &Image) -> Result<()> {
        let csum = self.opts.csum_type;
        let mut supers = Vec::new();
        for d in &self.devices {
            supers.push(self.superblock(d, image)?);
        }
        let mut sealed0 = supers[0].clone();
        seal_super(&mut sealed0, SUPER_OFFSETS[0], csum);
        let sb0 = Superblock::parse(&sealed0[..], SUPER_OFFSETS[0])?;
        let set = DeviceSet::with_superblock(
            self.devices
                .iter()
                .zip(devices)
                .map(|(d, dev)| (d.devid, dev.clone()))
                .collect(),
            sb0,
        );
        let chunks = ChunkMap::default();
        for c in self.chunks() {
            chunks.insert(c.logical, c.item(&self.devices, self.opts.sectorsize))?;
        }
        let volume = Volume::new(set, chunks);
        // Wipe: the first MiB (old signatures, old primary superblock) and
        // superblock copies past the end of the filesystem.
        let zeros = vec![0u8; DEV_RESERVED as usize];
        for (d, dev) in self.devices.iter().zip(devices) {
            dev.write_at(0, &zeros[..DEV_RESERVED.min(dev.size()) as usize])?;
            for &off in &SUPER_OFFSETS[1..] {
                if off + SUPER_SIZE as u64 > d.size && off + SUPER_SIZE as u64 <= dev.size() {
                    dev.write_at(off, &zeros[..SUPER_SIZE])?;
                }
            }
        }
        for node in &image.nodes {
            volume.write(node.header.bytenr, &node.sealed_bytes(csum))?;
        }
        for dev in devices {
            dev.flush()?;
        }
        for ((d, dev), sb) in self.devices.iter().zip(devices).zip(&supers) {
            for &off in &SUPER_OFFSETS[1..] {
                if off + SUPER_SIZE as u64 <= d.size {
                    let mut copy = sb.clone();
                    seal_super(&mut copy, off, csum);
                    dev.write_at(off, &copy[..])?;
                }
            }
        }
        for (dev, sb) in devices.iter().zip(&supers) {
            let mut copy = sb.clone();
            seal_super(&mut copy, SUPER_OFFSETS[0], csum);
            dev.write_fua(SUPER_OFFSETS[0], &copy[..])?;
        }
        Ok(())
    }
}

fn seal_super(sb: &mut [u8; SUPER_SIZE], at: u64, csum: CsumType) {
    sb[0x30..0x38].copy_from_slice(&at.to_le_bytes());
    let c = csum.compute(&sb[CSUM_SIZE_MAX..]);
    sb[..CSUM_SIZE_MAX].copy_from_slice(&c);
}

/// A size as btrfs-progs prints it: `256.00MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    // As btrfs-progs: whole divisions while the value is at least 1024,
    // and only the last one as a fraction (so 1.7949 GiB is 1.79GiB).
    let (mut size, mut last, mut unit) = (bytes, bytes, 0);
    while size >= 1024 && unit < UNITS.len() - 1 {
        last = size;
        size /= 1024;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}.00B")
    } else {
        format!("{:.2}{}", last as f64 / 1024.0, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::uuid_string;

    #[test]
    fn names_parse() {
        assert_eq!(parse_profile("RAID1").unwrap(), Profile::Raid1);
        assert!(parse_profile("raid7").is_err());
        assert_eq!(parse_csum("xxhash").unwrap(), CsumType::Xxhash64);
        assert!(parse_csum("md5").is_err());
        let u = parse_uuid("15c4dc74-445f-46b4-9da2-f892ac5de2b1").unwrap();
        assert_eq!(uuid_string(&u), "15c4dc74-445f-46b4-9da2-f892ac5de2b1");
        assert!(parse_uuid("xyz").is_err());
        let r = random_uuid().unwrap();
        assert_eq!(r[6] >> 4, 4);
        let mut f = Features::default();
        f.apply("^no-holes,extref").unwrap();
        assert!(!f.no_holes && f.extended_iref);
        assert!(f.apply("bogus").is_err());
        assert!(f.apply("^free-space-tree").is_err());
        assert_eq!(human(256 << 20), "256.00MiB");
        // Whole divisions but the last, as btrfs-progs: 1.7949 GiB.
        assert_eq!(human(1_927_553_024), "1.79GiB");
        assert_eq!(human(1023), "1023.00B");
        assert_eq!(min_device_size(Profile::Dup, Profile::Single), 114_294_784);
    }

    #[test]
    fn splits_and_shapes() {
        let items: Items = (0..1000u64)
            .map(|i| (Key::new(i, 1, 0), vec![0u8; 100]))
            .collect();
        let s = shape_of(&items, 4096).unwrap();
        assert!(s.0.len() >= 2 && s.0[0] > 30);
        assert_eq!(*s.0.last().unwrap(), 1);
        let empty = shape_of(&Vec::new(), 4096).unwrap();
        assert_eq!(empty, Shape(vec![1]));
        assert!(split_leaves(&[5000], 4096).is_err());
    }

    #[test]
    fn free_space_skips_super_copies() {
        let f = device_free_space(300 << 20);
        assert!(!f.contains(64 << 20, 4096));
        assert!(!f.contains(0, 4096));
        assert!(f.contains(1 << 20, 63 << 20));
    }
}

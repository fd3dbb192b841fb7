//! The superblock: the fixed-position root of a btrfs device.

use super::consts::*;
use super::csum::CsumType;
use super::items::{ChunkItem, DevItem};
use super::key::{KEY_SIZE, Key};
use super::le;
use crate::{Error, Result};

/// Offset of the system chunk array in the superblock (after the block
/// group root fields at 0x253..0x264 and reserved space).
const SYS_CHUNK_ARRAY_OFF: usize = 0x32b;
/// Size of the system chunk array area.
pub const SYS_CHUNK_ARRAY_MAX: usize = 2048;
/// Offset of the four backup roots.
const BACKUP_ROOTS_OFF: usize = SYS_CHUNK_ARRAY_OFF + SYS_CHUNK_ARRAY_MAX;
/// Size of one backup root record.
const BACKUP_ROOT_SIZE: usize = 168;

/// One of the four backup root records of the superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackupRoot {
    pub tree_root: u64,
    pub tree_root_gen: u64,
    pub chunk_root: u64,
    pub chunk_root_gen: u64,
    pub extent_root: u64,
    pub extent_root_gen: u64,
    pub fs_root: u64,
    pub fs_root_gen: u64,
    pub dev_root: u64,
    pub dev_root_gen: u64,
    pub csum_root: u64,
    pub csum_root_gen: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub num_devices: u64,
    pub tree_root_level: u8,
    pub chunk_root_level: u8,
    pub extent_root_level: u8,
    pub fs_root_level: u8,
    pub dev_root_level: u8,
    pub csum_root_level: u8,
}

/// A decoded superblock. The raw bytes are kept for rewriting.
#[derive(Clone, Debug)]
pub struct Superblock {
    pub csum: [u8; 32],
    pub fsid: [u8; 16],
    pub bytenr: u64,
    pub flags: u64,
    pub magic: u64,
    pub generation: u64,
    pub root: u64,
    pub chunk_root: u64,
    pub log_root: u64,
    /// Transid of the log root (unused by current kernels, kept for dumps).
    pub log_root_transid: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub root_dir_objectid: u64,
    pub num_devices: u64,
    pub sectorsize: u32,
    pub nodesize: u32,
    pub stripesize: u32,
    pub sys_chunk_array_size: u32,
    pub chunk_root_generation: u64,
    pub compat_flags: u64,
    pub compat_ro_flags: u64,
    pub incompat_flags: u64,
    pub csum_type: CsumType,
    pub root_level: u8,
    pub chunk_root_level: u8,
    pub log_root_level: u8,
    pub dev_item: DevItem,
    pub label: String,
    pub cache_generation: u64,
    pub uuid_tree_generation: u64,
    pub metadata_uuid: [u8; 16],
    pub nr_global_roots: u64,
    /// Root of the block group tree (compat_ro BLOCK_GROUP_TREE), its generation and level.
    pub block_group_root: u64,
    pub block_group_root_generation: u64,
    pub block_group_root_level: u8,
    /// The system chunks: (key, chunk) pairs needed to read the chunk tree.
    pub sys_chunks: Vec<(Key, ChunkItem)>,
    pub backup_roots: Vec<BackupRoot>,
    /// The 4096 bytes this was decoded from.
    pub raw: Box<[u8; SUPER_SIZE]>,
}

impl Superblock {
    /// Decode and verify a superblock read from byte offset `at` of a device.
    /// Checks the magic, the checksum, that `bytenr` is `at`, and the sizes.
    pub fn parse(b: &[u8], at: u64) -> Result<Self> {
        if b.len() < SUPER_SIZE {
            return Err(Error::corrupt("superblock shorter than 4096 bytes"));
        }
        let magic = le::u64(b, 0x40)?;
        if magic != BTRFS_MAGIC {
            return Err(Error::corrupt("no btrfs magic"));
        }
        let csum_type = CsumType::from_disk(le::u16(b, 0xc4)?)?;
        if !csum_type.verify(&b[CSUM_SIZE_MAX..SUPER_SIZE], &b[..CSUM_SIZE_MAX]) {
            return Err(Error::corrupt(format!(
                "superblock {} checksum mismatch",
                csum_type.name()
            )));
        }
        let bytenr = le::u64(b, 0x30)?;
        if bytenr != at {
            return Err(Error::corrupt(format!(
                "superblock at {at} says it is at {bytenr}"
            )));
        }
        let generation = le::u64(b, 0x48)?;
        if generation >= u64::MAX - 1 {
            // Nothing could come after it (blocks may be one newer).
            return Err(Error::corrupt(format!("generation {generation}")));
        }
        let sectorsize = le::u32(b, 0x90)?;
        let nodesize = le::u32(b, 0x94)?;
        if !(4096..=65536).contains(&sectorsize) || !sectorsize.is_power_of_two() {
            return Err(Error::corrupt(format!("bad sector size {sectorsize}")));
        }
        if !(sectorsize..=65536).contains(&nodesize) || !nodesize.is_power_of_two() {
            return Err(Error::corrupt(format!("bad node size {nodesize}")));
        }
        let sys_chunk_array_size = le::u32(b, 0xa0)?;
        if sys_chunk_array_size as usize > SYS_CHUNK_ARRAY_MAX {
            return Err(Error::corrupt(format!(
                "system chunk array size {sys_chunk_array_size}"
            )));
        }
        let sys = &b[SYS_CHUNK_ARRAY_OFF..SYS_CHUNK_ARRAY_OFF + sys_chunk_array_size as usize];
        let mut sys_chunks = Vec::new();
        let mut off = 0;
        while off < sys.len() {
            let key = Key::parse(sys, off)?;
            if key.item_type != CHUNK_ITEM_KEY {
                return Err(Error::corrupt(format!(
                    "system chunk array holds key {key}"
                )));
            }
            off += KEY_SIZE;
            let (chunk, len) = ChunkItem::parse_prefix(&sys[off..])?;
            off += len;
            sys_chunks.push((key, chunk));
        }
        let mut backup_roots = Vec::new();
        for i in 0..4 {
            let o = BACKUP_ROOTS_OFF + i * BACKUP_ROOT_SIZE;
            let q = |n: usize| le::u64(b, o + n * 8);
            let l = |n: usize| le::u8(b, o + 152 + n);
            backup_roots.push(BackupRoot {
                tree_root: q(0)?,
                tree_root_gen: q(1)?,
                chunk_root: q(2)?,
                chunk_root_gen: q(3)?,
                extent_root: q(4)?,
                extent_root_gen: q(5)?,
                fs_root: q(6)?,
                fs_root_gen: q(7)?,
                dev_root: q(8)?,
                dev_root_gen: q(9)?,
                csum_root: q(10)?,
                csum_root_gen: q(11)?,
                total_bytes: q(12)?,
                bytes_used: q(13)?,
                num_devices: q(14)?,
                tree_root_level: l(0)?,
                chunk_root_level: l(1)?,
                extent_root_level: l(2)?,
                fs_root_level: l(3)?,
                dev_root_level: l(4)?,
                csum_root_level: l(5)?,
            });
        }
        let label_raw = &b[0x12b..0x22b];
        let label_len = label_raw
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(label_raw.len());
        let mut raw = Box::new([0u8; SUPER_SIZE]);
        raw.copy_from_slice(&b[..SUPER_SIZE]);
        let mut csum = [0u8; 32];
        csum.copy_from_slice(&b[..32]);
        Ok(Superblock {
            csum,
            fsid: le::uuid(b, 0x20)?,
            bytenr,
            flags: le::u64(b, 0x38)?,
            magic,
            generation: le::u64(b, 0x48)?,
            root: le::u64(b, 0x50)?,
            chunk_root: le::u64(b, 0x58)?,
            log_root: le::u64(b, 0x60)?,
            log_root_transid: le::u64(b, 0x68)?,
            total_bytes: le::u64(b, 0x70)?,
            bytes_used: le::u64(b, 0x78)?,
            root_dir_objectid: le::u64(b, 0x80)?,
            num_devices: le::u64(b, 0x88)?,
            sectorsize,
            nodesize,
            stripesize: le::u32(b, 0x9c)?,
            sys_chunk_array_size,
            chunk_root_generation: le::u64(b, 0xa4)?,
            compat_flags: le::u64(b, 0xac)?,
            compat_ro_flags: le::u64(b, 0xb4)?,
            incompat_flags: le::u64(b, 0xbc)?,
            csum_type,
            root_level: le::u8(b, 0xc6)?,
            chunk_root_level: le::u8(b, 0xc7)?,
            log_root_level: le::u8(b, 0xc8)?,
            dev_item: DevItem::parse(&b[0xc9..0xc9 + DevItem::SIZE])?,
            label: String::from_utf8_lossy(&label_raw[..label_len]).into_owned(),
            cache_generation: le::u64(b, 0x22b)?,
            uuid_tree_generation: le::u64(b, 0x233)?,
            metadata_uuid: le::uuid(b, 0x23b)?,
            nr_global_roots: le::u64(b, 0x24b)?,
            block_group_root: le::u64(b, 0x253)?,
            block_group_root_generation: le::u64(b, 0x25b)?,
            block_group_root_level: le::u8(b, 0x263)?,
            sys_chunks,
            backup_roots,
            raw,
        })
    }

    /// The fsid stamped in tree block headers (the metadata UUID if set).
    pub fn tree_fsid(&self) -> [u8; 16] {
        if self.incompat_flags & INCOMPAT_METADATA_UUID != 0 {
            self.metadata_uuid
        } else {
            self.fsid
        }
    }

    /// Whether this is a seed device ([`SUPER_FLAG_SEEDING`]).
    pub fn is_seed(&self) -> bool {
        self.flags & SUPER_FLAG_SEEDING != 0
    }

    /// Whether the filesystem has the no-holes feature.
    pub fn no_holes(&self) -> bool {
        self.incompat_flags & INCOMPAT_NO_HOLES != 0
    }

    /// The tree holding the block group items: the block group tree when
    /// the filesystem has one, else the extent tree.
    pub fn block_group_tree(&self) -> u64 {
        if self.compat_ro_flags & COMPAT_RO_BLOCK_GROUP_TREE != 0 {
            BLOCK_GROUP_TREE_OBJECTID
        } else {
            EXTENT_TREE_OBJECTID
        }
    }
}

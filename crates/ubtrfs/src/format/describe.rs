//! Every item payload decoded into named fields, for inspection tools.
//!
//! [`describe`] turns the data of a leaf item, chosen by its key, into a
//! [`Description`]: a kind, a list of named [`Value`]s and, for items that
//! pack several records (directory entries, inode refs, inline back
//! references, chunk stripes, ...), a list of [`Entry`]s. It never fails and
//! never panics: what cannot be decoded is reported in
//! [`Description::problem`], after the fields that could be.

use super::consts::*;
use super::items::Timespec;
use super::key::{KEY_SIZE, Key};
use super::le;
use crate::Result;

/// One decoded value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A plain unsigned number.
    U64(u64),
    /// A number usually shown in octal (a file mode).
    Octal(u64),
    /// A code with a symbolic name (`None` if the code is unknown).
    Enum(u64, Option<&'static str>),
    /// A flag word and the names of the known bits that are set.
    Flags(u64, Vec<&'static str>),
    /// A key stored in the payload.
    Key(Key),
    /// A UUID.
    Uuid([u8; 16]),
    /// A timestamp.
    Time(Timespec),
    /// Raw bytes: a name, an xattr value, a string.
    Bytes(Vec<u8>),
}

/// A named value.
pub type Field = (&'static str, Value);

/// One record of an item that packs several (a directory entry, an inline
/// back reference, a chunk stripe, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What the record is, e.g. `dir_entry`, `tree_block_ref`, `stripe`.
    pub kind: &'static str,
    /// Its fields, in on-disk order.
    pub fields: Vec<Field>,
}

/// A decoded item payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Description {
    /// What the item is, e.g. `inode_item`, `extent_item`, `chunk_item`.
    pub kind: &'static str,
    /// Fields of the fixed part, in on-disk order.
    pub fields: Vec<Field>,
    /// Records that follow the fixed part (possibly none).
    pub entries: Vec<Entry>,
    /// Why decoding stopped early, or what is left over; `None` if the
    /// whole payload was decoded.
    pub problem: Option<String>,
}

impl Description {
    fn new(kind: &'static str) -> Self {
        Description {
            kind,
            fields: Vec::new(),
            entries: Vec::new(),
            problem: None,
        }
    }

    /// The first top-level field called `name`.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

impl Entry {
    /// The first field called `name`.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Filesystem constants some payloads need to be understood.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// Bytes of one data checksum (for EXTENT_CSUM items).
    pub csum_size: usize,
    /// Data sector size: each checksum covers one sector.
    pub sectorsize: u32,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx {
            csum_size: 4,
            sectorsize: 4096,
        }
    }
}

/// Decode the payload `data` of the item with key `key`.
pub fn describe(key: &Key, data: &[u8], ctx: &Ctx) -> Description {
    let (kind, decode): (&'static str, Decoder) = decoder(key);
    let mut d = Description::new(kind);
    if let Err(e) = decode(&mut d, key, data, ctx) {
        d.problem = Some(match e {
            crate::Error::Corrupt(msg) => msg,
            e => e.to_string(),
        });
    }
    d
}

type Decoder = fn(&mut Description, &Key, &[u8], &Ctx) -> Result<()>;

fn decoder(key: &Key) -> (&'static str, Decoder) {
    match key.item_type {
        INODE_ITEM_KEY => ("inode_item", inode_item),
        INODE_REF_KEY => ("inode_ref", inode_ref),
        INODE_EXTREF_KEY => ("inode_extref", inode_extref),
        XATTR_ITEM_KEY => ("xattr_item", dir_item),
        DIR_ITEM_KEY => ("dir_item", dir_item),
        DIR_INDEX_KEY => ("dir_index", dir_item),
        DIR_LOG_ITEM_KEY | DIR_LOG_INDEX_KEY => ("dir_log_item", dir_log_item),
        ORPHAN_ITEM_KEY => ("orphan_item", empty),
        VERITY_DESC_ITEM_KEY => ("verity_desc_item", raw_size),
        VERITY_MERKLE_ITEM_KEY => ("verity_merkle_item", raw_size),
        EXTENT_DATA_KEY => ("file_extent_item", file_extent),
        EXTENT_CSUM_KEY => ("extent_csum", extent_csum),
        ROOT_ITEM_KEY => ("root_item", root_item),
        ROOT_REF_KEY => ("root_ref", root_ref),
        ROOT_BACKREF_KEY => ("root_backref", root_ref),
        EXTENT_ITEM_KEY => ("extent_item", extent_item),
        METADATA_ITEM_KEY => ("metadata_item", extent_item),
        TREE_BLOCK_REF_KEY => ("tree_block_ref", tree_block_ref),
        SHARED_BLOCK_REF_KEY => ("shared_block_ref", shared_block_ref),
        EXTENT_DATA_REF_KEY => ("extent_data_ref", extent_data_ref),
        SHARED_DATA_REF_KEY => ("shared_data_ref", shared_data_ref),
        EXTENT_OWNER_REF_KEY => ("extent_owner_ref", extent_owner_ref),
        BLOCK_GROUP_ITEM_KEY => ("block_group_item", block_group),
        FREE_SPACE_INFO_KEY => ("free_space_info", free_space_info),
        FREE_SPACE_EXTENT_KEY => ("free_space_extent", free_space_extent),
        FREE_SPACE_BITMAP_KEY => ("free_space_bitmap", free_space_bitmap),
        DEV_EXTENT_KEY => ("dev_extent", dev_extent),
        DEV_ITEM_KEY => ("dev_item", dev_item),
        CHUNK_ITEM_KEY => ("chunk_item", chunk_item),
        RAID_STRIPE_KEY => ("raid_stripe", raid_stripe),
        QGROUP_STATUS_KEY => ("qgroup_status", qgroup_status),
        QGROUP_INFO_KEY => ("qgroup_info", qgroup_info),
        QGROUP_LIMIT_KEY => ("qgroup_limit", qgroup_limit),
        QGROUP_RELATION_KEY => ("qgroup_relation", empty),
        TEMPORARY_ITEM_KEY if key.objectid == BALANCE_OBJECTID => ("balance_item", balance_item),
        TEMPORARY_ITEM_KEY => ("temporary_item", raw_size),
        PERSISTENT_ITEM_KEY if key.objectid == DEV_STATS_OBJECTID => ("dev_stats", dev_stats),
        PERSISTENT_ITEM_KEY => ("persistent_item", raw_size),
        DEV_REPLACE_KEY => ("dev_replace_item", dev_replace),
        UUID_KEY_SUBVOL | UUID_KEY_RECEIVED_SUBVOL => ("uuid_item", uuid_item),
        STRING_ITEM_KEY => ("string_item", string_item),
        _ => ("unknown", raw_size),
    }
}

/// The name btrfs uses for an item type, if it has one.
pub fn item_type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        INODE_ITEM_KEY => "INODE_ITEM",
        INODE_REF_KEY => "INODE_REF",
        INODE_EXTREF_KEY => "INODE_EXTREF",
        XATTR_ITEM_KEY => "XATTR_ITEM",
        VERITY_DESC_ITEM_KEY => "VERITY_DESC_ITEM",
        VERITY_MERKLE_ITEM_KEY => "VERITY_MERKLE_ITEM",
        ORPHAN_ITEM_KEY => "ORPHAN_ITEM",
        DIR_LOG_ITEM_KEY => "DIR_LOG_ITEM",
        DIR_LOG_INDEX_KEY => "DIR_LOG_INDEX",
        DIR_ITEM_KEY => "DIR_ITEM",
        DIR_INDEX_KEY => "DIR_INDEX",
        EXTENT_DATA_KEY => "EXTENT_DATA",
        EXTENT_CSUM_KEY => "EXTENT_CSUM",
        ROOT_ITEM_KEY => "ROOT_ITEM",
        ROOT_BACKREF_KEY => "ROOT_BACKREF",
        ROOT_REF_KEY => "ROOT_REF",
        EXTENT_ITEM_KEY => "EXTENT_ITEM",
        METADATA_ITEM_KEY => "METADATA_ITEM",
        EXTENT_OWNER_REF_KEY => "EXTENT_OWNER_REF",
        TREE_BLOCK_REF_KEY => "TREE_BLOCK_REF",
        EXTENT_DATA_REF_KEY => "EXTENT_DATA_REF",
        SHARED_BLOCK_REF_KEY => "SHARED_BLOCK_REF",
        SHARED_DATA_REF_KEY => "SHARED_DATA_REF",
        BLOCK_GROUP_ITEM_KEY => "BLOCK_GROUP_ITEM",
        FREE_SPACE_INFO_KEY => "FREE_SPACE_INFO",
        FREE_SPACE_EXTENT_KEY => "FREE_SPACE_EXTENT",
        FREE_SPACE_BITMAP_KEY => "FREE_SPACE_BITMAP",
        DEV_EXTENT_KEY => "DEV_EXTENT",
        DEV_ITEM_KEY => "DEV_ITEM",
        CHUNK_ITEM_KEY => "CHUNK_ITEM",
        RAID_STRIPE_KEY => "RAID_STRIPE",
        QGROUP_STATUS_KEY => "QGROUP_STATUS",
        QGROUP_INFO_KEY => "QGROUP_INFO",
        QGROUP_LIMIT_KEY => "QGROUP_LIMIT",
        QGROUP_RELATION_KEY => "QGROUP_RELATION",
        TEMPORARY_ITEM_KEY => "TEMPORARY_ITEM",
        PERSISTENT_ITEM_KEY => "PERSISTENT_ITEM",
        DEV_REPLACE_KEY => "DEV_REPLACE",
        UUID_KEY_SUBVOL => "UUID_KEY_SUBVOL",
        UUID_KEY_RECEIVED_SUBVOL => "UUID_KEY_RECEIVED_SUBVOL",
        STRING_ITEM_KEY => "STRING_ITEM",
        _ => return None,
    })
}

/// The item type called `name` (the inverse of [`item_type_name`]).
pub fn item_type_from_name(name: &str) -> Option<u8> {
    (0..=u8::MAX).find(|&t| item_type_name(t) == Some(name))
}

/// The name of a well-known tree id or reserved objectid, if it has one.
pub fn tree_name(id: u64) -> Option<&'static str> {
    Some(match id {
        ROOT_TREE_OBJECTID => "ROOT_TREE",
        EXTENT_TREE_OBJECTID => "EXTENT_TREE",
        CHUNK_TREE_OBJECTID => "CHUNK_TREE",
        DEV_TREE_OBJECTID => "DEV_TREE",
        FS_TREE_OBJECTID => "FS_TREE",
        ROOT_TREE_DIR_OBJECTID => "ROOT_TREE_DIR",
        CSUM_TREE_OBJECTID => "CSUM_TREE",
        QUOTA_TREE_OBJECTID => "QUOTA_TREE",
        UUID_TREE_OBJECTID => "UUID_TREE",
        FREE_SPACE_TREE_OBJECTID => "FREE_SPACE_TREE",
        BLOCK_GROUP_TREE_OBJECTID => "BLOCK_GROUP_TREE",
        RAID_STRIPE_TREE_OBJECTID => "RAID_STRIPE_TREE",
        BALANCE_OBJECTID => "BALANCE",
        ORPHAN_OBJECTID => "ORPHAN",
        TREE_LOG_OBJECTID => "TREE_LOG",
        TREE_LOG_FIXUP_OBJECTID => "TREE_LOG_FIXUP",
        TREE_RELOC_OBJECTID => "TREE_RELOC",
        DATA_RELOC_TREE_OBJECTID => "DATA_RELOC_TREE",
        EXTENT_CSUM_OBJECTID => "EXTENT_CSUM",
        FREE_SPACE_OBJECTID => "FREE_SPACE",
        FREE_INO_OBJECTID => "FREE_INO",
        MULTIPLE_OBJECTIDS => "MULTIPLE",
        _ => return None,
    })
}

/// Name of a directory entry type.
pub fn file_type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        FT_UNKNOWN => "UNKNOWN",
        FT_REG_FILE => "FILE",
        FT_DIR => "DIR",
        FT_CHRDEV => "CHRDEV",
        FT_BLKDEV => "BLKDEV",
        FT_FIFO => "FIFO",
        FT_SOCK => "SOCK",
        FT_SYMLINK => "SYMLINK",
        FT_XATTR => "XATTR",
        _ => return None,
    })
}

/// Names of inode flag bits.
pub const INODE_FLAG_NAMES: &[(u64, &str)] = &[
    (INODE_NODATASUM, "NODATASUM"),
    (INODE_NODATACOW, "NODATACOW"),
    (INODE_READONLY, "READONLY"),
    (INODE_NOCOMPRESS, "NOCOMPRESS"),
    (INODE_PREALLOC, "PREALLOC"),
    (INODE_SYNC, "SYNC"),
    (INODE_IMMUTABLE, "IMMUTABLE"),
    (INODE_APPEND, "APPEND"),
    (INODE_NODUMP, "NODUMP"),
    (INODE_NOATIME, "NOATIME"),
    (INODE_DIRSYNC, "DIRSYNC"),
    (INODE_COMPRESS, "COMPRESS"),
    (1 << 31, "ROOT_ITEM_INIT"),
    (1 << 32, "VERITY"),
];

/// Names of root item flag bits.
pub const ROOT_FLAG_NAMES: &[(u64, &str)] = &[(ROOT_SUBVOL_RDONLY, "RDONLY"), (1 << 48, "DEAD")];

/// Names of extent item flag bits.
pub const EXTENT_FLAG_NAMES: &[(u64, &str)] = &[
    (EXTENT_FLAG_DATA, "DATA"),
    (EXTENT_FLAG_TREE_BLOCK, "TREE_BLOCK"),
    (BLOCK_FLAG_FULL_BACKREF, "FULL_BACKREF"),
];

/// Names of block group and chunk type bits.
pub const BLOCK_GROUP_FLAG_NAMES: &[(u64, &str)] = &[
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

/// Names of tree block header flag bits.
pub const HEADER_FLAG_NAMES: &[(u64, &str)] = &[
    (HEADER_FLAG_WRITTEN, "WRITTEN"),
    (HEADER_FLAG_RELOC, "RELOC"),
];

/// Free space info flag: the block group's free space is kept as bitmaps.
pub const FREE_SPACE_USING_BITMAPS: u64 = 1;

const FREE_SPACE_FLAG_NAMES: &[(u64, &str)] = &[(FREE_SPACE_USING_BITMAPS, "USING_BITMAPS")];

const QGROUP_STATUS_FLAG_NAMES: &[(u64, &str)] = &[
    (1, "ON"),
    (2, "RESCAN"),
    (4, "INCONSISTENT"),
    (8, "SIMPLE_MODE"),
];

const QGROUP_LIMIT_FLAG_NAMES: &[(u64, &str)] = &[
    (1, "MAX_RFER"),
    (2, "MAX_EXCL"),
    (4, "RSV_RFER"),
    (8, "RSV_EXCL"),
    (16, "RFER_CMPR"),
    (32, "EXCL_CMPR"),
];

/// A flag word as a [`Value::Flags`] with the names of its known set bits.
pub fn flags(value: u64, names: &[(u64, &'static str)]) -> Value {
    Value::Flags(
        value,
        names
            .iter()
            .filter(|(bit, _)| value & bit != 0)
            .map(|(_, n)| *n)
            .collect(),
    )
}

/// Block group or chunk type flags; `single` is named when no profile bit is set.
pub fn block_group_flags(value: u64) -> Value {
    let mut v = flags(value, BLOCK_GROUP_FLAG_NAMES);
    if value & BLOCK_GROUP_PROFILE_MASK == 0
        && let Value::Flags(_, names) = &mut v
    {
        names.push("single");
    }
    v
}

fn file_extent_type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        FILE_EXTENT_INLINE => "inline",
        FILE_EXTENT_REG => "regular",
        FILE_EXTENT_PREALLOC => "prealloc",
        _ => return None,
    })
}

fn compression_name(c: u8) -> Option<&'static str> {
    Some(match c {
        COMPRESS_NONE => "none",
        COMPRESS_ZLIB => "zlib",
        COMPRESS_LZO => "lzo",
        COMPRESS_ZSTD => "zstd",
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Decoders. Each pushes fields in on-disk order and stops at the first field
// it cannot read.

fn u64f(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::U64(le::u64(b, off)?))
}

fn u32f(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::U64(le::u32(b, off)?.into()))
}

fn u16f(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::U64(le::u16(b, off)?.into()))
}

fn u8f(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::U64(le::u8(b, off)?.into()))
}

fn time(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::Time(Timespec {
        sec: le::u64(b, off)? as i64,
        nsec: le::u32(b, off + 8)?,
    }))
}

fn uuid(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::Uuid(le::uuid(b, off)?))
}

fn key_at(b: &[u8], off: usize) -> Result<Value> {
    Ok(Value::Key(Key::parse(b, off)?))
}

fn bytes(b: &[u8], off: usize, len: usize) -> Result<Value> {
    Ok(Value::Bytes(le::bytes(b, off, len)?.to_vec()))
}

/// Error unless exactly `len` bytes were used.
fn exact(b: &[u8], len: usize) -> Result<()> {
    if b.len() > len {
        return Err(crate::Error::corrupt(format!(
            "{} bytes left over after {len}",
            b.len() - len
        )));
    }
    Ok(())
}

fn empty(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let _ = d;
    exact(b, 0)
}

fn raw_size(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("size", Value::U64(b.len() as u64)));
    Ok(())
}

/// The 160-byte inode item at `off`, pushed to `fields`.
fn inode_fields(fields: &mut Vec<Field>, b: &[u8], off: usize) -> Result<()> {
    let f = fields;
    f.push(("generation", u64f(b, off)?));
    f.push(("transid", u64f(b, off + 8)?));
    f.push(("size", u64f(b, off + 16)?));
    f.push(("nbytes", u64f(b, off + 24)?));
    f.push(("block_group", u64f(b, off + 32)?));
    f.push(("nlink", u32f(b, off + 40)?));
    f.push(("uid", u32f(b, off + 44)?));
    f.push(("gid", u32f(b, off + 48)?));
    f.push(("mode", Value::Octal(le::u32(b, off + 52)?.into())));
    f.push(("rdev", u64f(b, off + 56)?));
    f.push(("flags", flags(le::u64(b, off + 64)?, INODE_FLAG_NAMES)));
    f.push(("sequence", u64f(b, off + 72)?));
    f.push(("atime", time(b, off + 112)?));
    f.push(("ctime", time(b, off + 124)?));
    f.push(("mtime", time(b, off + 136)?));
    f.push(("otime", time(b, off + 148)?));
    Ok(())
}

fn inode_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    inode_fields(&mut d.fields, b, 0)?;
    exact(b, 160)
}

fn inode_ref(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let mut off = 0;
    while off < b.len() {
        let index = le::u64(b, off)?;
        let len = le::u16(b, off + 8)? as usize;
        let name = bytes(b, off + 10, len)?;
        d.entries.push(Entry {
            kind: "ref",
            fields: vec![("index", Value::U64(index)), ("name", name)],
        });
        off += 10 + len;
    }
    Ok(())
}

fn inode_extref(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let mut off = 0;
    while off < b.len() {
        let parent = le::u64(b, off)?;
        let index = le::u64(b, off + 8)?;
        let len = le::u16(b, off + 16)? as usize;
        let name = bytes(b, off + 18, len)?;
        d.entries.push(Entry {
            kind: "extref",
            fields: vec![
                ("parent", Value::U64(parent)),
                ("index", Value::U64(index)),
                ("name", name),
            ],
        });
        off += 18 + len;
    }
    Ok(())
}

fn dir_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let mut off = 0;
    while off < b.len() {
        let location = key_at(b, off)?;
        let transid = le::u64(b, off + KEY_SIZE)?;
        let data_len = le::u16(b, off + KEY_SIZE + 8)? as usize;
        let name_len = le::u16(b, off + KEY_SIZE + 10)? as usize;
        let t = le::u8(b, off + KEY_SIZE + 12)?;
        let start = off + KEY_SIZE + 13;
        let name = bytes(b, start, name_len)?;
        let data = bytes(b, start + name_len, data_len)?;
        d.entries.push(Entry {
            kind: "dir_entry",
            fields: vec![
                ("location", location),
                ("type", Value::Enum(t.into(), file_type_name(t))),
                ("transid", Value::U64(transid)),
                ("data_len", Value::U64(data_len as u64)),
                ("name_len", Value::U64(name_len as u64)),
                ("name", name),
                ("data", data),
            ],
        });
        off = start + name_len + data_len;
    }
    Ok(())
}

fn dir_log_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("end", u64f(b, 0)?));
    exact(b, 8)
}

fn file_extent(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("generation", u64f(b, 0)?));
    f.push(("ram_bytes", u64f(b, 8)?));
    let c = le::u8(b, 16)?;
    f.push(("compression", Value::Enum(c.into(), compression_name(c))));
    f.push(("encryption", u8f(b, 17)?));
    f.push(("other_encoding", u16f(b, 18)?));
    let t = le::u8(b, 20)?;
    f.push(("type", Value::Enum(t.into(), file_extent_type_name(t))));
    match t {
        FILE_EXTENT_INLINE => {
            f.push(("inline_size", Value::U64(b.len().saturating_sub(21) as u64)));
            Ok(())
        }
        FILE_EXTENT_REG | FILE_EXTENT_PREALLOC => {
            f.push(("disk_bytenr", u64f(b, 21)?));
            f.push(("disk_num_bytes", u64f(b, 29)?));
            f.push(("offset", u64f(b, 37)?));
            f.push(("num_bytes", u64f(b, 45)?));
            exact(b, 53)
        }
        t => Err(crate::Error::corrupt(format!("file extent type {t}"))),
    }
}

fn extent_csum(d: &mut Description, key: &Key, b: &[u8], ctx: &Ctx) -> Result<()> {
    let size = ctx.csum_size.max(1);
    let count = (b.len() / size) as u64;
    let length = count.saturating_mul(ctx.sectorsize.into());
    d.fields.push(("count", Value::U64(count)));
    d.fields.push(("start", Value::U64(key.offset)));
    d.fields
        .push(("end", Value::U64(key.offset.saturating_add(length))));
    d.fields.push(("length", Value::U64(length)));
    if (count as usize).saturating_mul(size) != b.len() {
        return Err(crate::Error::corrupt(format!(
            "{} bytes is not a multiple of the checksum size {size}",
            b.len()
        )));
    }
    Ok(())
}

fn root_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("generation", u64f(b, 160)?));
    f.push(("root_dirid", u64f(b, 168)?));
    f.push(("bytenr", u64f(b, 176)?));
    f.push(("byte_limit", u64f(b, 184)?));
    f.push(("bytes_used", u64f(b, 192)?));
    f.push(("last_snapshot", u64f(b, 200)?));
    f.push(("flags", flags(le::u64(b, 208)?, ROOT_FLAG_NAMES)));
    f.push(("refs", u32f(b, 216)?));
    f.push(("drop_progress", key_at(b, 220)?));
    f.push(("drop_level", u8f(b, 237)?));
    f.push(("level", u8f(b, 238)?));
    // The items of old kernels end here; newer ones carry the v2 fields.
    if b.len() > 239 {
        f.push(("generation_v2", u64f(b, 239)?));
        f.push(("uuid", uuid(b, 247)?));
        f.push(("parent_uuid", uuid(b, 263)?));
        f.push(("received_uuid", uuid(b, 279)?));
        f.push(("ctransid", u64f(b, 295)?));
        f.push(("otransid", u64f(b, 303)?));
        f.push(("stransid", u64f(b, 311)?));
        f.push(("rtransid", u64f(b, 319)?));
        f.push(("ctime", time(b, 327)?));
        f.push(("otime", time(b, 339)?));
        f.push(("stime", time(b, 351)?));
        f.push(("rtime", time(b, 363)?));
    }
    // The embedded inode item comes last: it is rarely of interest.
    let mut inode = Vec::new();
    inode_fields(&mut inode, b, 0)?;
    d.entries.push(Entry {
        kind: "inode",
        fields: inode,
    });
    if b.len() > 239 { exact(b, 439) } else { Ok(()) }
}

fn root_ref(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("dirid", u64f(b, 0)?));
    d.fields.push(("sequence", u64f(b, 8)?));
    let len = le::u16(b, 16)? as usize;
    d.fields.push(("name", bytes(b, 18, len)?));
    exact(b, 18 + len)
}

/// Size of the extent item's fixed part: refs, generation, flags.
const EXTENT_ITEM_FIXED: usize = 24;

fn extent_item(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    if b.len() < EXTENT_ITEM_FIXED {
        return Err(crate::Error::corrupt(format!(
            "extent item of {} bytes (the pre-2.6.31 format is not decoded)",
            b.len()
        )));
    }
    let refs = le::u64(b, 0)?;
    let generation = le::u64(b, 8)?;
    let fl = le::u64(b, 16)?;
    d.fields.push(("refs", Value::U64(refs)));
    d.fields.push(("generation", Value::U64(generation)));
    d.fields.push(("flags", flags(fl, EXTENT_FLAG_NAMES)));
    let mut off = EXTENT_ITEM_FIXED;
    if fl & EXTENT_FLAG_TREE_BLOCK != 0 {
        if key.item_type == EXTENT_ITEM_KEY {
            // Non-skinny: the first key of the block and its level.
            d.fields.push(("key", key_at(b, off)?));
            d.fields.push(("level", u8f(b, off + KEY_SIZE)?));
            off += KEY_SIZE + 1;
        } else {
            d.fields.push(("level", Value::U64(key.offset)));
        }
    }
    while off < b.len() {
        let t = le::u8(b, off)?;
        let p = off + 1;
        let (entry, len) = match t {
            TREE_BLOCK_REF_KEY => (
                Entry {
                    kind: "tree_block_ref",
                    fields: vec![("root", u64f(b, p)?)],
                },
                8,
            ),
            SHARED_BLOCK_REF_KEY => (
                Entry {
                    kind: "shared_block_ref",
                    fields: vec![("parent", u64f(b, p)?)],
                },
                8,
            ),
            EXTENT_OWNER_REF_KEY => (
                Entry {
                    kind: "extent_owner_ref",
                    fields: vec![("root", u64f(b, p)?)],
                },
                8,
            ),
            EXTENT_DATA_REF_KEY => (
                Entry {
                    kind: "extent_data_ref",
                    fields: data_ref_fields(b, p)?,
                },
                28,
            ),
            SHARED_DATA_REF_KEY => (
                Entry {
                    kind: "shared_data_ref",
                    fields: vec![("parent", u64f(b, p)?), ("count", u32f(b, p + 8)?)],
                },
                12,
            ),
            t => {
                return Err(crate::Error::corrupt(format!(
                    "inline back reference of unknown type {t} at byte {off}"
                )));
            }
        };
        d.entries.push(entry);
        off = p + len;
    }
    Ok(())
}

fn data_ref_fields(b: &[u8], p: usize) -> Result<Vec<Field>> {
    Ok(vec![
        ("root", u64f(b, p)?),
        ("objectid", u64f(b, p + 8)?),
        ("offset", u64f(b, p + 16)?),
        ("count", u32f(b, p + 24)?),
    ])
}

fn tree_block_ref(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("root", Value::U64(key.offset)));
    exact(b, 0)
}

fn shared_block_ref(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("parent", Value::U64(key.offset)));
    exact(b, 0)
}

fn extent_owner_ref(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    if b.is_empty() {
        d.fields.push(("root", Value::U64(key.offset)));
        return Ok(());
    }
    d.fields.push(("root", u64f(b, 0)?));
    exact(b, 8)
}

fn extent_data_ref(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields = data_ref_fields(b, 0)?;
    exact(b, 28)
}

fn shared_data_ref(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("parent", Value::U64(key.offset)));
    d.fields.push(("count", u32f(b, 0)?));
    exact(b, 4)
}

fn block_group(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("used", u64f(b, 0)?));
    d.fields.push(("chunk_objectid", u64f(b, 8)?));
    d.fields.push(("flags", block_group_flags(le::u64(b, 16)?)));
    exact(b, 24)
}

fn free_space_info(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("extent_count", u32f(b, 0)?));
    d.fields
        .push(("flags", flags(le::u32(b, 4)?.into(), FREE_SPACE_FLAG_NAMES)));
    exact(b, 8)
}

fn free_space_extent(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("start", Value::U64(key.objectid)));
    d.fields.push(("length", Value::U64(key.offset)));
    exact(b, 0)
}

fn free_space_bitmap(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("start", Value::U64(key.objectid)));
    d.fields.push(("length", Value::U64(key.offset)));
    d.fields.push(("bitmap_bytes", Value::U64(b.len() as u64)));
    let set: u32 = b.iter().map(|x| x.count_ones()).sum();
    d.fields.push(("bits_set", Value::U64(set.into())));
    Ok(())
}

fn dev_extent(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("chunk_tree", u64f(b, 0)?));
    f.push(("chunk_objectid", u64f(b, 8)?));
    f.push(("chunk_offset", u64f(b, 16)?));
    f.push(("length", u64f(b, 24)?));
    f.push(("chunk_tree_uuid", uuid(b, 32)?));
    exact(b, 48)
}

fn dev_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("devid", u64f(b, 0)?));
    f.push(("total_bytes", u64f(b, 8)?));
    f.push(("bytes_used", u64f(b, 16)?));
    f.push(("io_align", u32f(b, 24)?));
    f.push(("io_width", u32f(b, 28)?));
    f.push(("sector_size", u32f(b, 32)?));
    f.push(("type", u64f(b, 36)?));
    f.push(("generation", u64f(b, 44)?));
    f.push(("start_offset", u64f(b, 52)?));
    f.push(("dev_group", u32f(b, 60)?));
    f.push(("seek_speed", u8f(b, 64)?));
    f.push(("bandwidth", u8f(b, 65)?));
    f.push(("uuid", uuid(b, 66)?));
    f.push(("fsid", uuid(b, 82)?));
    exact(b, 98)
}

fn chunk_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("length", u64f(b, 0)?));
    f.push(("owner", u64f(b, 8)?));
    f.push(("stripe_len", u64f(b, 16)?));
    f.push(("type", block_group_flags(le::u64(b, 24)?)));
    f.push(("io_align", u32f(b, 32)?));
    f.push(("io_width", u32f(b, 36)?));
    f.push(("sector_size", u32f(b, 40)?));
    let n = le::u16(b, 44)? as usize;
    f.push(("num_stripes", Value::U64(n as u64)));
    f.push(("sub_stripes", u16f(b, 46)?));
    for i in 0..n {
        let o = 48 + i * 32;
        d.entries.push(Entry {
            kind: "stripe",
            fields: vec![
                ("devid", u64f(b, o)?),
                ("offset", u64f(b, o + 8)?),
                ("dev_uuid", uuid(b, o + 16)?),
            ],
        });
    }
    exact(b, 48 + n * 32)
}

fn raid_stripe(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let mut off = 0;
    while off < b.len() {
        d.entries.push(Entry {
            kind: "stripe",
            fields: vec![("devid", u64f(b, off)?), ("physical", u64f(b, off + 8)?)],
        });
        off += 16;
    }
    Ok(())
}

fn qgroup_status(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("version", u64f(b, 0)?));
    f.push(("generation", u64f(b, 8)?));
    f.push(("flags", flags(le::u64(b, 16)?, QGROUP_STATUS_FLAG_NAMES)));
    f.push(("scan", u64f(b, 24)?));
    // Simple quotas add the generation they were enabled in.
    if b.len() > 32 {
        f.push(("enable_gen", u64f(b, 32)?));
        return exact(b, 40);
    }
    exact(b, 32)
}

fn qgroup_info(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("generation", u64f(b, 0)?));
    f.push(("referenced", u64f(b, 8)?));
    f.push(("referenced_compressed", u64f(b, 16)?));
    f.push(("exclusive", u64f(b, 24)?));
    f.push(("exclusive_compressed", u64f(b, 32)?));
    exact(b, 40)
}

fn qgroup_limit(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("flags", flags(le::u64(b, 0)?, QGROUP_LIMIT_FLAG_NAMES)));
    f.push(("max_referenced", u64f(b, 8)?));
    f.push(("max_exclusive", u64f(b, 16)?));
    f.push(("rsv_referenced", u64f(b, 24)?));
    f.push(("rsv_exclusive", u64f(b, 32)?));
    exact(b, 40)
}

/// Size of one balance argument block.
const BALANCE_ARGS_SIZE: usize = 136;

fn balance_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("flags", u64f(b, 0)?));
    for (i, kind) in ["data", "metadata", "system"].into_iter().enumerate() {
        let o = 8 + i * BALANCE_ARGS_SIZE;
        d.entries.push(Entry {
            kind,
            fields: vec![
                ("profiles", u64f(b, o)?),
                ("usage", u64f(b, o + 8)?),
                ("devid", u64f(b, o + 16)?),
                ("pstart", u64f(b, o + 24)?),
                ("pend", u64f(b, o + 32)?),
                ("vstart", u64f(b, o + 40)?),
                ("vend", u64f(b, o + 48)?),
                ("target", u64f(b, o + 56)?),
                ("flags", u64f(b, o + 64)?),
                ("limit", u64f(b, o + 72)?),
                ("stripes_min", u32f(b, o + 80)?),
                ("stripes_max", u32f(b, o + 84)?),
            ],
        });
    }
    Ok(())
}

/// Names of the device statistics counters, in on-disk order.
const DEV_STATS_NAMES: [&str; 5] = [
    "write_errs",
    "read_errs",
    "flush_errs",
    "corruption_errs",
    "generation_errs",
];

fn dev_stats(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("devid", Value::U64(key.offset)));
    for (i, name) in DEV_STATS_NAMES.into_iter().enumerate() {
        if i * 8 >= b.len() {
            break;
        }
        d.fields.push((name, u64f(b, i * 8)?));
    }
    Ok(())
}

fn dev_replace(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    let f = &mut d.fields;
    f.push(("src_devid", u64f(b, 0)?));
    f.push(("cursor_left", u64f(b, 8)?));
    f.push(("cursor_right", u64f(b, 16)?));
    f.push(("cont_reading_from_srcdev_mode", u64f(b, 24)?));
    f.push(("replace_state", u64f(b, 32)?));
    f.push(("time_started", u64f(b, 40)?));
    f.push(("time_stopped", u64f(b, 48)?));
    f.push(("num_write_errors", u64f(b, 56)?));
    f.push(("num_uncorrectable_read_errors", u64f(b, 64)?));
    exact(b, 72)
}

fn uuid_item(d: &mut Description, key: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    // The key holds the UUID: objectid is its first 8 bytes, offset the last
    // 8, both little-endian.
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&key.objectid.to_le_bytes());
    u[8..].copy_from_slice(&key.offset.to_le_bytes());
    d.fields.push(("uuid", Value::Uuid(u)));
    let mut off = 0;
    while off < b.len() {
        d.entries.push(Entry {
            kind: "subvol",
            fields: vec![("subvol_id", u64f(b, off)?)],
        });
        off += 8;
    }
    Ok(())
}

fn string_item(d: &mut Description, _: &Key, b: &[u8], _: &Ctx) -> Result<()> {
    d.fields.push(("string", Value::Bytes(b.to_vec())));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator (xorshift), so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn random_bytes_never_panic_for_any_key_type() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let ctxs = [
            Ctx::default(),
            Ctx {
                csum_size: 32,
                sectorsize: 65536,
            },
            Ctx {
                csum_size: 0,
                sectorsize: 0,
            },
        ];
        for t in 0..=u8::MAX {
            for round in 0..300 {
                let len = match round % 4 {
                    0 => (rng.next() % 16) as usize,
                    1 => (rng.next() % 64) as usize,
                    2 => (rng.next() % 600) as usize,
                    _ => (rng.next() % 4096) as usize,
                };
                let mut data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                // Make packed-record lengths small sometimes so more records parse.
                if round % 3 == 0 {
                    for b in data.iter_mut().skip(1).step_by(3) {
                        *b &= 0x07;
                    }
                }
                let objectid = match round % 5 {
                    0 => BALANCE_OBJECTID,
                    1 => DEV_STATS_OBJECTID,
                    _ => rng.next(),
                };
                let key = Key::new(objectid, t, rng.next());
                let d = describe(&key, &data, &ctxs[round % ctxs.len()]);
                assert!(!d.kind.is_empty());
            }
        }
    }

    fn inode_bytes() -> Vec<u8> {
        let mut b = vec![0u8; 160];
        b[0..8].copy_from_slice(&7u64.to_le_bytes());
        b[16..24].copy_from_slice(&1234u64.to_le_bytes());
        b[40..44].copy_from_slice(&2u32.to_le_bytes());
        b[52..56].copy_from_slice(&0o100644u32.to_le_bytes());
        b[64..72].copy_from_slice(&(INODE_NOCOMPRESS | INODE_PREALLOC).to_le_bytes());
        b[136..144].copy_from_slice(&1_700_000_000u64.to_le_bytes());
        b[144..148].copy_from_slice(&5u32.to_le_bytes());
        b
    }

    #[test]
    fn inode_item_fields() {
        let d = describe(
            &Key::new(256, INODE_ITEM_KEY, 0),
            &inode_bytes(),
            &Ctx::default(),
        );
        assert_eq!(d.kind, "inode_item");
        assert_eq!(d.problem, None);
        assert_eq!(d.field("generation"), Some(&Value::U64(7)));
        assert_eq!(d.field("size"), Some(&Value::U64(1234)));
        assert_eq!(d.field("nlink"), Some(&Value::U64(2)));
        assert_eq!(d.field("mode"), Some(&Value::Octal(0o100644)));
        assert_eq!(
            d.field("flags"),
            Some(&Value::Flags(0x18, vec!["NOCOMPRESS", "PREALLOC"]))
        );
        assert_eq!(
            d.field("mtime"),
            Some(&Value::Time(Timespec {
                sec: 1_700_000_000,
                nsec: 5
            }))
        );
        let short = describe(
            &Key::new(256, INODE_ITEM_KEY, 0),
            &inode_bytes()[..100],
            &Ctx::default(),
        );
        assert!(short.problem.is_some());
        assert_eq!(short.field("size"), Some(&Value::U64(1234)));
    }

    fn dir_entry(name: &[u8], data: &[u8], t: u8) -> Vec<u8> {
        let mut b = Key::new(300, INODE_ITEM_KEY, 0).to_bytes().to_vec();
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&(data.len() as u16).to_le_bytes());
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.push(t);
        b.extend_from_slice(name);
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn dir_item_with_two_entries() {
        let mut b = dir_entry(b"a", b"", FT_REG_FILE);
        b.extend(dir_entry(b"bc", b"xy", FT_XATTR));
        let d = describe(&Key::new(256, DIR_ITEM_KEY, 77), &b, &Ctx::default());
        assert_eq!(d.problem, None);
        assert_eq!(d.entries.len(), 2);
        assert_eq!(
            d.entries[0].field("name"),
            Some(&Value::Bytes(b"a".to_vec()))
        );
        assert_eq!(
            d.entries[1].field("type"),
            Some(&Value::Enum(8, Some("XATTR")))
        );
        assert_eq!(
            d.entries[1].field("data"),
            Some(&Value::Bytes(b"xy".to_vec()))
        );
        b.push(1);
        let d = describe(&Key::new(256, DIR_ITEM_KEY, 77), &b, &Ctx::default());
        assert_eq!(d.entries.len(), 2);
        assert!(d.problem.is_some());
    }

    #[test]
    fn skinny_and_fat_extent_items() {
        let mut b = Vec::new();
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&10u64.to_le_bytes());
        b.extend_from_slice(&EXTENT_FLAG_TREE_BLOCK.to_le_bytes());
        let mut fat = b.clone();
        fat.extend_from_slice(&Key::new(256, 1, 0).to_bytes());
        fat.push(1);
        for tail in [&mut b, &mut fat] {
            tail.push(TREE_BLOCK_REF_KEY);
            tail.extend_from_slice(&5u64.to_le_bytes());
            tail.push(SHARED_BLOCK_REF_KEY);
            tail.extend_from_slice(&(1u64 << 30).to_le_bytes());
        }
        let d = describe(
            &Key::new(1 << 20, METADATA_ITEM_KEY, 1),
            &b,
            &Ctx::default(),
        );
        assert_eq!(d.problem, None);
        assert_eq!(d.field("level"), Some(&Value::U64(1)));
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[0].kind, "tree_block_ref");
        assert_eq!(d.entries[1].field("parent"), Some(&Value::U64(1 << 30)));
        let d = describe(
            &Key::new(1 << 20, EXTENT_ITEM_KEY, 4096),
            &fat,
            &Ctx::default(),
        );
        assert_eq!(d.problem, None);
        assert_eq!(d.field("key"), Some(&Value::Key(Key::new(256, 1, 0))));
        assert_eq!(d.entries.len(), 2);

        let mut data = Vec::new();
        data.extend_from_slice(&3u64.to_le_bytes());
        data.extend_from_slice(&10u64.to_le_bytes());
        data.extend_from_slice(&EXTENT_FLAG_DATA.to_le_bytes());
        data.push(EXTENT_DATA_REF_KEY);
        for v in [5u64, 257, 0] {
            data.extend_from_slice(&v.to_le_bytes());
        }
        data.extend_from_slice(&2u32.to_le_bytes());
        data.push(SHARED_DATA_REF_KEY);
        data.extend_from_slice(&4096u64.to_le_bytes());
        data.extend_from_slice(&1u32.to_le_bytes());
        let d = describe(
            &Key::new(1 << 20, EXTENT_ITEM_KEY, 8192),
            &data,
            &Ctx::default(),
        );
        assert_eq!(d.problem, None);
        assert_eq!(d.entries[0].field("objectid"), Some(&Value::U64(257)));
        assert_eq!(d.entries[0].field("count"), Some(&Value::U64(2)));
        assert_eq!(d.entries[1].kind, "shared_data_ref");
    }

    #[test]
    fn chunk_item_and_block_group_flags() {
        let mut b = vec![0u8; 48 + 64];
        b[0..8].copy_from_slice(&(8u64 << 20).to_le_bytes());
        b[24..32].copy_from_slice(&(BLOCK_GROUP_METADATA | BLOCK_GROUP_DUP).to_le_bytes());
        b[44..46].copy_from_slice(&2u16.to_le_bytes());
        b[48..56].copy_from_slice(&1u64.to_le_bytes());
        b[88..96].copy_from_slice(&(1u64 << 30).to_le_bytes());
        let d = describe(&Key::new(256, CHUNK_ITEM_KEY, 0), &b, &Ctx::default());
        assert_eq!(d.problem, None);
        assert_eq!(
            d.field("type"),
            Some(&Value::Flags(0x24, vec!["METADATA", "DUP"]))
        );
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[1].field("offset"), Some(&Value::U64(1 << 30)));
        assert_eq!(
            block_group_flags(BLOCK_GROUP_DATA),
            Value::Flags(1, vec!["DATA", "single"])
        );
    }

    #[test]
    fn csum_count_and_names() {
        let d = describe(
            &Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 1 << 20),
            &[0u8; 40],
            &Ctx::default(),
        );
        assert_eq!(d.field("count"), Some(&Value::U64(10)));
        assert_eq!(d.field("end"), Some(&Value::U64((1 << 20) + 40960)));
        for t in 0..=u8::MAX {
            if let Some(n) = item_type_name(t) {
                assert_eq!(item_type_from_name(n), Some(t));
            }
        }
        assert_eq!(tree_name(DATA_RELOC_TREE_OBJECTID), Some("DATA_RELOC_TREE"));
    }
}

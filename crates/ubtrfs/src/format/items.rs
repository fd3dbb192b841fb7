//! Item payloads: the structures stored in leaf items.

use super::consts::*;
use super::key::{KEY_SIZE, Key};
use super::le;
use crate::{Error, Result};

/// Seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    /// Size on disk.
    pub const SIZE: usize = 12;

    /// Append the 12-byte encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.sec as u64).to_le_bytes());
        out.extend_from_slice(&self.nsec.to_le_bytes());
    }

    /// The current time, from the clock the kernel stamps inodes with
    /// (`CLOCK_REALTIME_COARSE`): a FUSE mount's kernel sets the times of
    /// writes itself, and a create stamped by a finer clock would look
    /// later than a write that followed it.
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
            return Timespec {
                sec: ts.tv_sec,
                nsec: ts.tv_nsec as u32,
            };
        }
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    fn parse(b: &[u8], off: usize) -> Result<Self> {
        Ok(Timespec {
            sec: le::u64(b, off)? as i64,
            nsec: le::u32(b, off + 8)?,
        })
    }
}

/// A device of the filesystem (chunk tree item and superblock copy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevItem {
    pub devid: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub io_align: u32,
    pub io_width: u32,
    pub sector_size: u32,
    pub dev_type: u64,
    pub generation: u64,
    pub start_offset: u64,
    pub dev_group: u32,
    pub seek_speed: u8,
    pub bandwidth: u8,
    pub uuid: [u8; 16],
    pub fsid: [u8; 16],
}

impl DevItem {
    /// Size on disk.
    pub const SIZE: usize = 98;

    /// The 98-byte encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::SIZE);
        for x in [self.devid, self.total_bytes, self.bytes_used] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.io_align, self.io_width, self.sector_size] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.dev_type, self.generation, self.start_offset] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&self.dev_group.to_le_bytes());
        v.push(self.seek_speed);
        v.push(self.bandwidth);
        v.extend_from_slice(&self.uuid);
        v.extend_from_slice(&self.fsid);
        v
    }

    /// Decode a dev item.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Ok(DevItem {
            devid: le::u64(b, 0)?,
            total_bytes: le::u64(b, 8)?,
            bytes_used: le::u64(b, 16)?,
            io_align: le::u32(b, 24)?,
            io_width: le::u32(b, 28)?,
            sector_size: le::u32(b, 32)?,
            dev_type: le::u64(b, 36)?,
            generation: le::u64(b, 44)?,
            start_offset: le::u64(b, 52)?,
            dev_group: le::u32(b, 60)?,
            seek_speed: le::u8(b, 64)?,
            bandwidth: le::u8(b, 65)?,
            uuid: le::uuid(b, 66)?,
            fsid: le::uuid(b, 82)?,
        })
    }
}

/// One stripe of a chunk: where on which device a copy or a stripe lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    pub devid: u64,
    pub offset: u64,
    pub dev_uuid: [u8; 16],
}

/// A chunk: a range of logical addresses and the device ranges behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkItem {
    pub length: u64,
    pub owner: u64,
    pub stripe_len: u64,
    pub chunk_type: u64,
    pub io_align: u32,
    pub io_width: u32,
    pub sector_size: u32,
    pub sub_stripes: u16,
    pub stripes: Vec<Stripe>,
}

impl ChunkItem {
    const FIXED: usize = 48;
    const STRIPE: usize = 32;

    /// The encoding, stripes included.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::FIXED + Self::STRIPE * self.stripes.len());
        for x in [self.length, self.owner, self.stripe_len, self.chunk_type] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.io_align, self.io_width, self.sector_size] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&(self.stripes.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.sub_stripes.to_le_bytes());
        for s in &self.stripes {
            v.extend_from_slice(&s.devid.to_le_bytes());
            v.extend_from_slice(&s.offset.to_le_bytes());
            v.extend_from_slice(&s.dev_uuid);
        }
        v
    }

    /// Decode a chunk item at the start of `b`; returns it and its length.
    pub fn parse_prefix(b: &[u8]) -> Result<(Self, usize)> {
        let num_stripes = le::u16(b, 44)? as usize;
        if num_stripes == 0 {
            return Err(Error::corrupt("chunk with no stripes"));
        }
        let mut stripes = Vec::with_capacity(num_stripes);
        for i in 0..num_stripes {
            let o = Self::FIXED + i * Self::STRIPE;
            stripes.push(Stripe {
                devid: le::u64(b, o)?,
                offset: le::u64(b, o + 8)?,
                dev_uuid: le::uuid(b, o + 16)?,
            });
        }
        let chunk = ChunkItem {
            length: le::u64(b, 0)?,
            owner: le::u64(b, 8)?,
            stripe_len: le::u64(b, 16)?,
            chunk_type: le::u64(b, 24)?,
            io_align: le::u32(b, 32)?,
            io_width: le::u32(b, 36)?,
            sector_size: le::u32(b, 40)?,
            sub_stripes: le::u16(b, 46)?,
            stripes,
        };
        Ok((chunk, Self::FIXED + num_stripes * Self::STRIPE))
    }

    /// Decode a chunk item that fills `b`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Ok(Self::parse_prefix(b)?.0)
    }
}

/// The inode item: an inode's attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeItem {
    pub generation: u64,
    pub transid: u64,
    pub size: u64,
    pub nbytes: u64,
    pub block_group: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub rdev: u64,
    pub flags: u64,
    pub sequence: u64,
    pub atime: Timespec,
    pub ctime: Timespec,
    pub mtime: Timespec,
    pub otime: Timespec,
}

impl InodeItem {
    /// Size on disk.
    pub const SIZE: usize = 160;

    /// The 160-byte encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::SIZE);
        for x in [
            self.generation,
            self.transid,
            self.size,
            self.nbytes,
            self.block_group,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.nlink, self.uid, self.gid, self.mode] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.rdev, self.flags, self.sequence, 0, 0, 0, 0] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for t in [self.atime, self.ctime, self.mtime, self.otime] {
            t.encode(&mut v);
        }
        v
    }

    /// Decode an inode item.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::SIZE {
            return Err(Error::corrupt(format!("inode item of {} bytes", b.len())));
        }
        Ok(InodeItem {
            generation: le::u64(b, 0)?,
            transid: le::u64(b, 8)?,
            size: le::u64(b, 16)?,
            nbytes: le::u64(b, 24)?,
            block_group: le::u64(b, 32)?,
            nlink: le::u32(b, 40)?,
            uid: le::u32(b, 44)?,
            gid: le::u32(b, 48)?,
            mode: le::u32(b, 52)?,
            rdev: le::u64(b, 56)?,
            flags: le::u64(b, 64)?,
            sequence: le::u64(b, 72)?,
            atime: Timespec::parse(b, 112)?,
            ctime: Timespec::parse(b, 124)?,
            mtime: Timespec::parse(b, 136)?,
            otime: Timespec::parse(b, 148)?,
        })
    }
}

/// One entry of a DIR_ITEM, DIR_INDEX or XATTR_ITEM (several may share an item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    /// The target: an inode key, or a root item key for a subvolume.
    pub location: Key,
    pub transid: u64,
    /// One of the `FT_*` types.
    pub file_type: u8,
    pub name: Vec<u8>,
    /// Xattr value (empty for directory entries).
    pub data: Vec<u8>,
}

impl DirItem {
    const FIXED: usize = KEY_SIZE + 13;

    /// Append this entry's encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.location.to_bytes());
        out.extend_from_slice(&self.transid.to_le_bytes());
        out.extend_from_slice(&(self.data.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        out.push(self.file_type);
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&self.data);
    }

    /// Decode every entry packed in one item.
    pub fn parse_all(b: &[u8]) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let data_len = le::u16(b, off + 25)? as usize;
            let name_len = le::u16(b, off + 27)? as usize;
            let name = le::bytes(b, off + Self::FIXED, name_len)?.to_vec();
            let data = le::bytes(b, off + Self::FIXED + name_len, data_len)?.to_vec();
            out.push(DirItem {
                location: Key::parse(b, off)?,
                transid: le::u64(b, off + KEY_SIZE)?,
                file_type: le::u8(b, off + 29)?,
                name,
                data,
            });
            off += Self::FIXED + name_len + data_len;
        }
        Ok(out)
    }
}

/// One name of an inode in a directory (INODE_REF or INODE_EXTREF entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRef {
    /// The directory holding the name.
    pub parent: u64,
    /// The name's DIR_INDEX offset.
    pub index: u64,
    pub name: Vec<u8>,
}

impl InodeRef {
    /// Append this name as an INODE_REF entry (the parent is in the key).
    pub fn encode_ref(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.name);
    }

    /// Append this name as an INODE_EXTREF entry.
    pub fn encode_extref(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.parent.to_le_bytes());
        self.encode_ref(out);
    }
    /// Decode the entries of an INODE_REF item (the parent is the key offset).
    pub fn parse_refs(b: &[u8], parent: u64) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let name_len = le::u16(b, off + 8)? as usize;
            out.push(InodeRef {
                parent,
                index: le::u64(b, off)?,
                name: le::bytes(b, off + 10, name_len)?.to_vec(),
            });
            off += 10 + name_len;
        }
        Ok(out)
    }

    /// Decode the entries of an INODE_EXTREF item.
    pub fn parse_extrefs(b: &[u8]) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let name_len = le::u16(b, off + 16)? as usize;
            out.push(InodeRef {
                parent: le::u64(b, off)?,
                index: le::u64(b, off + 8)?,
                name: le::bytes(b, off + 18, name_len)?.to_vec(),
            });
            off += 18 + name_len;
        }
        Ok(out)
    }
}

/// Where a file extent's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtentBody {
    /// Bytes stored in the item itself (possibly compressed).
    Inline(Vec<u8>),
    /// Bytes in a data extent. `disk_bytenr` 0 means a hole.
    Regular {
        disk_bytenr: u64,
        disk_num_bytes: u64,
        /// Offset of this file range inside the (uncompressed) extent.
        offset: u64,
        num_bytes: u64,
    },
}

/// A file extent item (EXTENT_DATA).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileExtentItem {
    pub generation: u64,
    /// Size of the extent once decompressed.
    pub ram_bytes: u64,
    pub compression: u8,
    pub encryption: u8,
    pub other_encoding: u16,
    /// `FILE_EXTENT_INLINE`, `_REG` or `_PREALLOC`.
    pub extent_type: u8,
    pub body: ExtentBody,
}

impl FileExtentItem {
    /// A hole of `len` bytes (no data extent) written in transaction
    /// `generation`.
    pub fn hole(generation: u64, len: u64) -> Self {
        FileExtentItem {
            generation,
            ram_bytes: len,
            compression: 0,
            encryption: 0,
            other_encoding: 0,
            extent_type: crate::format::consts::FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr: 0,
                disk_num_bytes: 0,
                offset: 0,
                num_bytes: len,
            },
        }
    }

    /// Offset of the extent type in the item.
    pub const TYPE_OFF: usize = 20;
    /// Offset of inline data in the item.
    pub const INLINE_DATA_OFF: usize = 21;
    /// Size of a regular extent item.
    pub const REG_SIZE: usize = 53;

    /// The item's encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::REG_SIZE);
        v.extend_from_slice(&self.generation.to_le_bytes());
        v.extend_from_slice(&self.ram_bytes.to_le_bytes());
        v.push(self.compression);
        v.push(self.encryption);
        v.extend_from_slice(&self.other_encoding.to_le_bytes());
        v.push(self.extent_type);
        match &self.body {
            ExtentBody::Inline(d) => v.extend_from_slice(d),
            ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => {
                for x in [disk_bytenr, disk_num_bytes, offset, num_bytes] {
                    v.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        v
    }

    /// Decode a file extent item.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let extent_type = le::u8(b, 20)?;
        let body = match extent_type {
            FILE_EXTENT_INLINE => {
                ExtentBody::Inline(b[Self::INLINE_DATA_OFF.min(b.len())..].to_vec())
            }
            FILE_EXTENT_REG | FILE_EXTENT_PREALLOC => ExtentBody::Regular {
                disk_bytenr: le::u64(b, 21)?,
                disk_num_bytes: le::u64(b, 29)?,
                offset: le::u64(b, 37)?,
                num_bytes: le::u64(b, 45)?,
            },
            t => return Err(Error::corrupt(format!("file extent type {t}"))),
        };
        Ok(FileExtentItem {
            generation: le::u64(b, 0)?,
            ram_bytes: le::u64(b, 8)?,
            compression: le::u8(b, 16)?,
            encryption: le::u8(b, 17)?,
            other_encoding: le::u16(b, 18)?,
            extent_type,
            body,
        })
    }

    /// Bytes of the file this extent covers.
    pub fn len(&self) -> u64 {
        match &self.body {
            ExtentBody::Inline(_) => self.ram_bytes,
            ExtentBody::Regular { num_bytes, .. } => *num_bytes,
        }
    }

    /// Whether the extent covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Check the numbers of an extent that names disk space (regular or
    /// preallocated, not a hole): the part used lies inside the extent,
    /// the extent fits the address space and is not absurdly long (see
    /// [`LONGEST_PLAIN_EXTENT`]), and all is in whole sectors. Callers index, allocate
    /// and loop by these numbers, so a damaged item must stop here.
    /// Inline extents and holes pass unchecked.
    pub fn check_disk_extent(&self, sectorsize: u64) -> Result<()> {
        let ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } = self.body
        else {
            return Ok(());
        };
        if disk_bytenr == 0 {
            return Ok(());
        }
        let bad = |why: &str| {
            Error::corrupt(format!(
                "file extent item at disk {disk_bytenr}+{disk_num_bytes} (offset {offset}, {num_bytes} bytes, {} bytes decoded): {why}",
                self.ram_bytes
            ))
        };
        let aligned = [disk_bytenr, disk_num_bytes, offset, num_bytes]
            .iter()
            .all(|x| x.is_multiple_of(sectorsize.max(1)));
        if !aligned {
            return Err(bad("not in whole sectors"));
        }
        if disk_bytenr.checked_add(disk_num_bytes).is_none() {
            return Err(bad("extent past the end of the address space"));
        }
        // What the item's offset and length count in: the decoded bytes
        // of a compressed extent, the disk bytes of a plain one.
        let (room, max) = if self.compression != COMPRESS_NONE {
            if disk_num_bytes > MAX_COMPRESSED_RAM {
                return Err(bad("compressed extent too long"));
            }
            (self.ram_bytes, MAX_COMPRESSED_RAM)
        } else {
            (disk_num_bytes, LONGEST_PLAIN_EXTENT)
        };
        if room > max {
            return Err(bad("extent too long"));
        }
        if offset.checked_add(num_bytes).is_none_or(|e| e > room) {
            return Err(bad("the part used reaches past the end of the extent"));
        }
        Ok(())
    }
}

/// Longest plain disk extent [`FileExtentItem::check_disk_extent`]
/// accepts. The kernel writes data extents of at most [`MAX_EXTENT_SIZE`]
/// (128 MiB), and preallocated ones of up to 256 MiB in some versions; the
/// margin is for other writers, still small enough to bound the work done
/// per extent.
pub const LONGEST_PLAIN_EXTENT: u64 = 8 * MAX_EXTENT_SIZE;

/// A root item: where a tree's root block is, and the subvolume's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootItem {
    pub inode: InodeItem,
    pub generation: u64,
    pub root_dirid: u64,
    pub bytenr: u64,
    pub byte_limit: u64,
    pub bytes_used: u64,
    pub last_snapshot: u64,
    pub flags: u64,
    pub refs: u32,
    pub drop_progress: Key,
    pub drop_level: u8,
    pub level: u8,
    pub generation_v2: u64,
    pub uuid: [u8; 16],
    pub parent_uuid: [u8; 16],
    pub received_uuid: [u8; 16],
    pub ctransid: u64,
    pub otransid: u64,
    pub stransid: u64,
    pub rtransid: u64,
    pub ctime: Timespec,
    pub otime: Timespec,
    pub stime: Timespec,
    pub rtime: Timespec,
}

impl RootItem {
    /// Size of the original (pre-v2) root item.
    pub const V1_SIZE: usize = 239;

    /// Decode a root item (the v2 fields are zero in an old, short item).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::V1_SIZE {
            return Err(Error::corrupt(format!("root item of {} bytes", b.len())));
        }
        let v2 = b.len() >= 439;
        let opt_u64 = |o: usize| if v2 { le::u64(b, o) } else { Ok(0) };
        let opt_uuid = |o: usize| if v2 { le::uuid(b, o) } else { Ok([0u8; 16]) };
        let opt_ts = |o: usize| {
            if v2 {
                Timespec::parse(b, o)
            } else {
                Ok(Timespec::default())
            }
        };
        Ok(RootItem {
            inode: InodeItem::parse(b)?,
            generation: le::u64(b, 160)?,
            root_dirid: le::u64(b, 168)?,
            bytenr: le::u64(b, 176)?,
            byte_limit: le::u64(b, 184)?,
            bytes_used: le::u64(b, 192)?,
            last_snapshot: le::u64(b, 200)?,
            flags: le::u64(b, 208)?,
            refs: le::u32(b, 216)?,
            drop_progress: Key::parse(b, 220)?,
            drop_level: le::u8(b, 237)?,
            level: le::u8(b, 238)?,
            generation_v2: opt_u64(239)?,
            uuid: opt_uuid(247)?,
            parent_uuid: opt_uuid(263)?,
            received_uuid: opt_uuid(279)?,
            ctransid: opt_u64(295)?,
            otransid: opt_u64(303)?,
            stransid: opt_u64(311)?,
            rtransid: opt_u64(319)?,
            ctime: opt_ts(327)?,
            otime: opt_ts(339)?,
            stime: opt_ts(351)?,
            rtime: opt_ts(363)?,
        })
    }
}

/// A ROOT_REF / ROOT_BACKREF: where a subvolume is linked in its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootRef {
    /// Directory inode (in the parent subvolume) holding the entry.
    pub dirid: u64,
    pub sequence: u64,
    pub name: Vec<u8>,
}

impl RootRef {
    /// Decode a root ref.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let name_len = le::u16(b, 16)? as usize;
        Ok(RootRef {
            dirid: le::u64(b, 0)?,
            sequence: le::u64(b, 8)?,
            name: le::bytes(b, 18, name_len)?.to_vec(),
        })
    }
}

/// A block group item: usage of one chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockGroupItem {
    pub used: u64,
    pub chunk_objectid: u64,
    pub flags: u64,
}

impl BlockGroupItem {
    /// Decode a block group item.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Ok(BlockGroupItem {
            used: le::u64(b, 0)?,
            chunk_objectid: le::u64(b, 8)?,
            flags: le::u64(b, 16)?,
        })
    }
}

/// A dev extent: a device range owned by a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevExtent {
    pub chunk_tree: u64,
    pub chunk_objectid: u64,
    pub chunk_offset: u64,
    pub length: u64,
    pub chunk_tree_uuid: [u8; 16],
}

impl DevExtent {
    /// The 48-byte encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(48);
        for x in [
            self.chunk_tree,
            self.chunk_objectid,
            self.chunk_offset,
            self.length,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&self.chunk_tree_uuid);
        v
    }

    /// Decode a dev extent.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Ok(DevExtent {
            chunk_tree: le::u64(b, 0)?,
            chunk_objectid: le::u64(b, 8)?,
            chunk_offset: le::u64(b, 16)?,
            length: le::u64(b, 24)?,
            chunk_tree_uuid: le::uuid(b, 32)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(compression: u8, ram: u64, body: [u64; 4]) -> FileExtentItem {
        let [disk_bytenr, disk_num_bytes, offset, num_bytes] = body;
        FileExtentItem {
            generation: 1,
            ram_bytes: ram,
            compression,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            },
        }
    }

    #[test]
    fn disk_extent_checks() {
        let ok = |fe: FileExtentItem| fe.check_disk_extent(4096).is_ok();
        let m = 1 << 20;
        assert!(ok(extent(0, 8192, [m, 8192, 4096, 4096])));
        assert!(ok(extent(0, 0, [m, MAX_EXTENT_SIZE, 0, MAX_EXTENT_SIZE])));
        assert!(ok(extent(1, 131072, [m, 4096, 65536, 65536])));
        // Holes and inline extents carry no disk range to check.
        assert!(ok(extent(0, u64::MAX, [0, 0, 1, u64::MAX])));
        let inline = FileExtentItem {
            extent_type: FILE_EXTENT_INLINE,
            body: ExtentBody::Inline(vec![1; 3]),
            ..extent(0, 3, [0; 4])
        };
        assert!(ok(inline));
        // Partial sectors.
        assert!(!ok(extent(0, 8192, [m, 8192, 0, 4097])));
        assert!(!ok(extent(0, 8192, [m + 1, 8192, 0, 4096])));
        assert!(!ok(extent(0, 8192, [m, 8192, 1, 4096])));
        // The part used reaches past the extent.
        assert!(!ok(extent(0, 8192, [m, 8192, 4096, 8192])));
        assert!(!ok(extent(
            0,
            8192,
            [m, 8192, u64::MAX / 4096 * 4096, 8192]
        )));
        assert!(!ok(extent(1, 65536, [m, 4096, 65536, 4096])));
        // Too long.
        assert!(ok(extent(0, 0, [m, 2 * MAX_EXTENT_SIZE, 0, 4096])));
        let big = LONGEST_PLAIN_EXTENT + 4096;
        assert!(!ok(extent(0, big, [m, big, 0, big])));
        assert!(!ok(extent(1, 262144, [m, 4096, 0, 262144])));
        assert!(!ok(extent(1, 131072, [m, 262144, 0, 4096])));
        // Past the end of the address space.
        assert!(!ok(extent(
            0,
            8192,
            [u64::MAX / 4096 * 4096, 8192, 0, 8192]
        )));
    }

    #[test]
    fn encodings_round_trip() {
        let t = Timespec {
            sec: 1_700_000_000,
            nsec: 123,
        };
        let i = InodeItem {
            generation: 7,
            transid: 8,
            size: 9,
            nbytes: 4096,
            nlink: 2,
            uid: 1000,
            gid: 100,
            mode: 0o100644,
            rdev: 0,
            flags: 3,
            sequence: 5,
            atime: t,
            ctime: t,
            mtime: t,
            otime: t,
            ..Default::default()
        };
        assert_eq!(InodeItem::parse(&i.to_bytes()).unwrap(), i);
        let d = DirItem {
            location: Key::new(257, 1, 0),
            transid: 9,
            file_type: FT_REG_FILE,
            name: b"abc".to_vec(),
            data: Vec::new(),
        };
        let mut v = Vec::new();
        d.encode(&mut v);
        d.encode(&mut v);
        assert_eq!(DirItem::parse_all(&v).unwrap(), vec![d.clone(), d]);
        let f = FileExtentItem {
            generation: 1,
            ram_bytes: 8192,
            compression: 0,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr: 1 << 20,
                disk_num_bytes: 8192,
                offset: 0,
                num_bytes: 8192,
            },
        };
        assert_eq!(FileExtentItem::parse(&f.to_bytes()).unwrap(), f);
        let r = InodeRef {
            parent: 256,
            index: 2,
            name: b"n".to_vec(),
        };
        let mut v = Vec::new();
        r.encode_extref(&mut v);
        assert_eq!(InodeRef::parse_extrefs(&v).unwrap(), vec![r]);
    }
}

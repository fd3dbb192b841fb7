//! Tree blocks: a header, then either leaf items or internal key pointers.
//!
//! A [`Node`] is built only by [`Node::parse`], which verifies everything a
//! reader later relies on (checksum, address, fsid, level, item bounds, key
//! order), so accessors never fail on a constructed node.

use super::csum::CsumType;
use super::key::{KEY_SIZE, Key};
use super::le;
use crate::Result;

/// Size of the tree block header.
pub const HEADER_SIZE: usize = 0x65;
/// Size of a leaf item header: key, data offset, data size.
pub const ITEM_SIZE: usize = KEY_SIZE + 8;
/// Size of an internal node's key pointer: key, block pointer, generation.
pub const KEY_PTR_SIZE: usize = KEY_SIZE + 16;
/// Highest tree level btrfs allows.
pub const MAX_LEVEL: u8 = 7;

/// The header every tree block starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub csum: [u8; 32],
    pub fsid: [u8; 16],
    pub bytenr: u64,
    pub flags: u64,
    pub chunk_tree_uuid: [u8; 16],
    pub generation: u64,
    pub owner: u64,
    pub nritems: u32,
    pub level: u8,
}

impl Header {
    /// Decode the header at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let mut csum = [0u8; 32];
        csum.copy_from_slice(le::bytes(b, 0, 32)?);
        Ok(Header {
            csum,
            fsid: le::uuid(b, 0x20)?,
            bytenr: le::u64(b, 0x30)?,
            flags: le::u64(b, 0x38)?,
            chunk_tree_uuid: le::uuid(b, 0x40)?,
            generation: le::u64(b, 0x50)?,
            owner: le::u64(b, 0x58)?,
            nritems: le::u32(b, 0x60)?,
            level: le::u8(b, 0x64)?,
        })
    }
}

/// What the reader expects of a block, from the pointer that led to it.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// Logical address the block must claim.
    pub bytenr: u64,
    /// Generation recorded in the parent pointer (or root item), if known.
    pub generation: Option<u64>,
    /// Level the block must have, if known.
    pub level: Option<u8>,
    /// First key the block must have (from the parent pointer), if known.
    pub first_key: Option<Key>,
}

/// A verified tree block.
#[derive(Debug)]
pub struct Node {
    pub header: Header,
    data: Box<[u8]>,
}

/// One leaf item: its key and its data.
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    pub key: Key,
    pub data: &'a [u8],
}

/// One key pointer of an internal node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPtr {
    pub key: Key,
    pub blockptr: u64,
    pub generation: u64,
}

impl Node {
    /// Verify `data` as the block `expect` describes and build the node.
    /// `super_generation` bounds the block's generation.
    pub fn parse(
        data: Box<[u8]>,
        csum_type: CsumType,
        fsid: &[u8; 16],
        expect: &Expect,
        super_generation: u64,
    ) -> std::result::Result<Self, String> {
        if data.len() < HEADER_SIZE {
            return Err("block shorter than its header".into());
        }
        if !csum_type.verify(&data[32..], &data[..32]) {
            return Err(format!("{} checksum mismatch", csum_type.name()));
        }
        let header = Header::parse(&data).map_err(|e| e.to_string())?;
        if header.bytenr != expect.bytenr {
            return Err(format!("block claims bytenr {}", header.bytenr));
        }
        if &header.fsid != fsid {
            return Err(format!(
                "fsid {} is not this filesystem's",
                super::uuid_string(&header.fsid)
            ));
        }
        if header.level > MAX_LEVEL {
            return Err(format!("level {} above {MAX_LEVEL}", header.level));
        }
        if header.generation > super_generation + 1 {
            return Err(format!(
                "generation {} is newer than the superblock's {super_generation}",
                header.generation
            ));
        }
        let node = Node { header, data };
        node.check_items()?;
        node.check_expect(expect)?;
        Ok(node)
    }

    /// Check what the pointer to this block says of it: level, generation,
    /// first key. A cached block is re-checked this way on every use.
    pub fn check_expect(&self, expect: &Expect) -> std::result::Result<(), String> {
        if let Some(level) = expect.level
            && self.header.level != level
        {
            return Err(format!(
                "level {} where {level} was expected",
                self.header.level
            ));
        }
        if let Some(generation) = expect.generation
            && self.header.generation != generation
        {
            return Err(format!(
                "generation {} where the parent says {generation} (stale or misplaced block)",
                self.header.generation
            ));
        }
        if let Some(first) = expect.first_key
            && self.nritems() > 0
            && self.key(0) != first
        {
            return Err(format!(
                "first key {} where the parent says {first}",
                self.key(0)
            ));
        }
        Ok(())
    }

    fn check_items(&self) -> std::result::Result<(), String> {
        let n = self.header.nritems as usize;
        let size = self.data.len();
        if n == 0 {
            return Ok(());
        }
        if self.is_leaf() {
            if HEADER_SIZE + n * ITEM_SIZE > size {
                return Err(format!("{n} items do not fit in a leaf"));
            }
            // Item data grows down from the end of the block without overlap.
            let mut data_end = size - HEADER_SIZE;
            for i in 0..n {
                let (off, len) = self.raw_item_range(i);
                let end = off.checked_add(len).ok_or("item bounds overflow")?;
                if end != data_end {
                    return Err(format!(
                        "item {i} data [{off}, {end}) does not end at {data_end}"
                    ));
                }
                if off < n * ITEM_SIZE {
                    return Err(format!("item {i} data overlaps the item headers"));
                }
                data_end = off;
            }
        } else {
            if HEADER_SIZE + n * KEY_PTR_SIZE > size {
                return Err(format!("{n} key pointers do not fit in a node"));
            }
        }
        for i in 1..n {
            if self.key(i - 1) >= self.key(i) {
                return Err(format!(
                    "keys out of order at slot {i}: {} then {}",
                    self.key(i - 1),
                    self.key(i)
                ));
            }
        }
        Ok(())
    }

    fn raw_item_range(&self, i: usize) -> (usize, usize) {
        let o = HEADER_SIZE + i * ITEM_SIZE + KEY_SIZE;
        let off = u32::from_le_bytes(self.data[o..o + 4].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(self.data[o + 4..o + 8].try_into().unwrap_or_default());
        (off as usize, len as usize)
    }

    /// The block's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Whether this is a leaf (level 0).
    pub fn is_leaf(&self) -> bool {
        self.header.level == 0
    }

    /// Level of the block (0 for a leaf).
    pub fn level(&self) -> u8 {
        self.header.level
    }

    /// Number of items or key pointers.
    pub fn nritems(&self) -> usize {
        self.header.nritems as usize
    }

    /// Key of slot `i` (item or key pointer). `i` must be below [`Node::nritems`].
    pub fn key(&self, i: usize) -> Key {
        let stride = if self.is_leaf() {
            ITEM_SIZE
        } else {
            KEY_PTR_SIZE
        };
        // Bounds were verified in parse.
        Key::parse(&self.data, HEADER_SIZE + i * stride).unwrap_or_default()
    }

    /// Leaf item `i`.
    pub fn item(&self, i: usize) -> Item<'_> {
        let (off, len) = self.raw_item_range(i);
        let start = HEADER_SIZE + off;
        Item {
            key: self.key(i),
            data: &self.data[start..start + len],
        }
    }

    /// Key pointer `i` of an internal node.
    pub fn key_ptr(&self, i: usize) -> KeyPtr {
        let o = HEADER_SIZE + i * KEY_PTR_SIZE;
        KeyPtr {
            key: self.key(i),
            blockptr: le::u64(&self.data, o + KEY_SIZE).unwrap_or_default(),
            generation: le::u64(&self.data, o + KEY_SIZE + 8).unwrap_or_default(),
        }
    }

    /// The last slot whose key is <= `key`, or `None` if every key is greater.
    pub fn slot_le(&self, key: &Key) -> Option<usize> {
        let (mut lo, mut hi) = (0usize, self.nritems());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(mid) <= *key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }
}

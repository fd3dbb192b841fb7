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
#[derive(Clone, Debug)]
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

impl KeyPtr {
    /// What the child this pointer leads to must be, in a node at
    /// `parent_level`.
    pub fn expect(&self, parent_level: u8) -> Expect {
        Expect {
            bytenr: self.blockptr,
            generation: Some(self.generation),
            level: Some(parent_level.wrapping_sub(1)),
            first_key: Some(self.key),
        }
    }
}

impl Node {
    /// Verify `data` as the block `expect` describes and build the node.
    /// `super_generation` bounds the block's generation; its header must
    /// carry one of `fsids` (a sprouted filesystem's blocks written before
    /// the sprout carry their seed's).
    pub fn parse(
        data: Box<[u8]>,
        csum_type: CsumType,
        fsids: &[[u8; 16]],
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
        if !fsids.contains(&header.fsid) {
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
        if n == 0 && !self.is_leaf() {
            // Only a leaf may be empty (an empty tree); searches and edits
            // step into a child of every node.
            return Err("internal node without key pointers".into());
        }
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

/// The contents of a tree block, decoded for editing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Leaf items in key order.
    Leaf(Vec<(Key, Vec<u8>)>),
    /// Key pointers in key order.
    Internal(Vec<KeyPtr>),
}

/// Bytes leaf `items` take in a block: each item's header and data.
pub fn leaf_items_used(items: &[(Key, Vec<u8>)]) -> usize {
    items.iter().map(|(_, d)| ITEM_SIZE + d.len()).sum()
}

impl Body {
    /// Number of items or pointers.
    pub fn len(&self) -> usize {
        match self {
            Body::Leaf(v) => v.len(),
            Body::Internal(v) => v.len(),
        }
    }

    /// Whether the block holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the contents take after the header.
    pub fn used(&self) -> usize {
        match self {
            Body::Leaf(v) => leaf_items_used(v),
            Body::Internal(v) => v.len() * KEY_PTR_SIZE,
        }
    }

    /// First key, if any.
    pub fn first_key(&self) -> Option<Key> {
        match self {
            Body::Leaf(v) => v.first().map(|(k, _)| *k),
            Body::Internal(v) => v.first().map(|p| p.key),
        }
    }
}

impl Node {
    /// Decode the block's items or pointers for editing.
    pub fn body(&self) -> Body {
        let n = self.nritems();
        if self.is_leaf() {
            Body::Leaf(
                (0..n)
                    .map(|i| {
                        let it = self.item(i);
                        (it.key, it.data.to_vec())
                    })
                    .collect(),
            )
        } else {
            Body::Internal((0..n).map(|i| self.key_ptr(i)).collect())
        }
    }

    /// Build a block of `nodesize` bytes from a header and contents. The
    /// header's `nritems` and `level` must agree with `body` (leaf iff level
    /// 0); the checksum is left zero until [`Node::seal`]. Fails if the
    /// contents do not fit.
    pub fn build(header: &Header, body: &Body, nodesize: usize) -> Result<Node> {
        if HEADER_SIZE + body.used() > nodesize {
            return Err(crate::Error::Invalid(format!(
                "{} bytes of items do not fit in a {nodesize}-byte block",
                body.used()
            )));
        }
        let mut data = vec![0u8; nodesize].into_boxed_slice();
        let mut h = header.clone();
        h.nritems = body.len() as u32;
        h.csum = [0; 32];
        data[0x20..0x30].copy_from_slice(&h.fsid);
        data[0x30..0x38].copy_from_slice(&h.bytenr.to_le_bytes());
        data[0x38..0x40].copy_from_slice(&h.flags.to_le_bytes());
        data[0x40..0x50].copy_from_slice(&h.chunk_tree_uuid);
        data[0x50..0x58].copy_from_slice(&h.generation.to_le_bytes());
        data[0x58..0x60].copy_from_slice(&h.owner.to_le_bytes());
        data[0x60..0x64].copy_from_slice(&h.nritems.to_le_bytes());
        data[0x64] = h.level;
        match body {
            Body::Leaf(items) => {
                // Item data is packed from the end of the block downwards.
                let mut end = nodesize - HEADER_SIZE;
                for (i, (key, d)) in items.iter().enumerate() {
                    let off = end - d.len();
                    let o = HEADER_SIZE + i * ITEM_SIZE;
                    data[o..o + KEY_SIZE].copy_from_slice(&key.to_bytes());
                    data[o + KEY_SIZE..o + KEY_SIZE + 4]
                        .copy_from_slice(&(off as u32).to_le_bytes());
                    data[o + KEY_SIZE + 4..o + ITEM_SIZE]
                        .copy_from_slice(&(d.len() as u32).to_le_bytes());
                    data[HEADER_SIZE + off..HEADER_SIZE + end].copy_from_slice(d);
                    end = off;
                }
            }
            Body::Internal(ptrs) => {
                for (i, p) in ptrs.iter().enumerate() {
                    let o = HEADER_SIZE + i * KEY_PTR_SIZE;
                    data[o..o + KEY_SIZE].copy_from_slice(&p.key.to_bytes());
                    data[o + KEY_SIZE..o + KEY_SIZE + 8].copy_from_slice(&p.blockptr.to_le_bytes());
                    data[o + KEY_SIZE + 8..o + KEY_PTR_SIZE]
                        .copy_from_slice(&p.generation.to_le_bytes());
                }
            }
        }
        Ok(Node { header: h, data })
    }

    /// The block's bytes with its checksum filled in, ready to write.
    pub fn sealed_bytes(&self, csum_type: CsumType) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len());
        self.seal_into(csum_type, &mut out);
        out
    }

    /// Append the block's bytes with its checksum filled in to `out`.
    pub fn seal_into(&self, csum_type: CsumType, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.data);
        let c = csum_type.compute(&out[at + 32..]);
        out[at..at + 32].copy_from_slice(&c);
    }
}

/// In-place edits of a block's contents, for the copy-on-write editor:
/// each keeps the layout [`Node::build`] makes (item headers packed after
/// the header, item data packed down from the end, the gap zeroed), so an
/// edited block is byte for byte what building its items anew would give.
/// Each checks that the result fits and fails without changing anything if
/// it does not.
impl Node {
    /// Bytes the items (headers and data) or key pointers take after the header.
    pub fn used(&self) -> usize {
        let n = self.nritems();
        if !self.is_leaf() {
            return n * KEY_PTR_SIZE;
        }
        n * ITEM_SIZE + self.data_area() - self.data_low()
    }

    /// Bytes still free in the block.
    pub fn free_space(&self) -> usize {
        self.data_area().saturating_sub(self.used())
    }

    /// Size of the area after the header.
    fn data_area(&self) -> usize {
        self.data.len() - HEADER_SIZE
    }

    /// Leaf: where the lowest item data starts (offset after the header).
    fn data_low(&self) -> usize {
        match self.nritems() {
            0 => self.data_area(),
            n => self.raw_item_range(n - 1).0,
        }
    }

    /// Leaf: where item `i`'s data ends (item 0's at the end of the block).
    fn data_end(&self, i: usize) -> usize {
        match i {
            0 => self.data_area(),
            _ => self.raw_item_range(i - 1).0,
        }
    }

    fn set_item_off(&mut self, i: usize, off: usize) {
        let o = HEADER_SIZE + i * ITEM_SIZE + KEY_SIZE;
        self.data[o..o + 4].copy_from_slice(&(off as u32).to_le_bytes());
    }

    fn set_nritems(&mut self, n: usize) {
        self.header.nritems = n as u32;
        self.data[0x60..0x64].copy_from_slice(&(n as u32).to_le_bytes());
    }

    fn zero(&mut self, from: usize, to: usize) {
        self.data[HEADER_SIZE + from..HEADER_SIZE + to].fill(0);
    }

    fn edit_error(&self, what: String) -> crate::Error {
        crate::Error::Invalid(format!(
            "tree block {} (level {}, {} items): {what}",
            self.header.bytenr,
            self.level(),
            self.nritems()
        ))
    }

    /// Give a copy of the block a new identity: everything in `h` but the
    /// item count and level, which stay the block's own. The checksum is
    /// left zero until [`Node::sealed_bytes`].
    pub fn set_header(&mut self, h: &Header) {
        let d = &mut self.data;
        d[..0x20].fill(0);
        d[0x20..0x30].copy_from_slice(&h.fsid);
        d[0x30..0x38].copy_from_slice(&h.bytenr.to_le_bytes());
        d[0x38..0x40].copy_from_slice(&h.flags.to_le_bytes());
        d[0x40..0x50].copy_from_slice(&h.chunk_tree_uuid);
        d[0x50..0x58].copy_from_slice(&h.generation.to_le_bytes());
        d[0x58..0x60].copy_from_slice(&h.owner.to_le_bytes());
        self.header = Header {
            csum: [0; 32],
            nritems: self.header.nritems,
            level: self.header.level,
            ..h.clone()
        };
    }

    /// Leaf: insert an item at `slot`, moving the items from `slot` on.
    /// The caller keeps the keys in order.
    pub fn leaf_insert(&mut self, slot: usize, key: &Key, item: &[u8]) -> Result<()> {
        let n = self.nritems();
        let len = item.len();
        if !self.is_leaf() || slot > n || self.free_space() < ITEM_SIZE + len {
            return Err(self.edit_error(format!("no room for a {len}-byte item at slot {slot}")));
        }
        let (low, end) = (self.data_low(), self.data_end(slot));
        let h = HEADER_SIZE;
        // The data of the items after the new one moves down to make room.
        self.data.copy_within(h + low..h + end, h + low - len);
        for i in slot..n {
            let off = self.raw_item_range(i).0;
            self.set_item_off(i, off - len);
        }
        self.data.copy_within(
            h + slot * ITEM_SIZE..h + n * ITEM_SIZE,
            h + (slot + 1) * ITEM_SIZE,
        );
        let o = h + slot * ITEM_SIZE;
        self.data[o..o + KEY_SIZE].copy_from_slice(&key.to_bytes());
        self.set_item_off(slot, end - len);
        self.data[o + KEY_SIZE + 4..o + ITEM_SIZE].copy_from_slice(&(len as u32).to_le_bytes());
        self.data[h + end - len..h + end].copy_from_slice(item);
        self.set_nritems(n + 1);
        Ok(())
    }

    /// Leaf: remove the item at `slot`.
    pub fn leaf_remove(&mut self, slot: usize) -> Result<()> {
        let n = self.nritems();
        if !self.is_leaf() || slot >= n {
            return Err(self.edit_error(format!("no item at slot {slot} to remove")));
        }
        let (off, len) = self.raw_item_range(slot);
        let low = self.data_low();
        let h = HEADER_SIZE;
        self.data.copy_within(h + low..h + off, h + low + len);
        for i in slot + 1..n {
            let o = self.raw_item_range(i).0;
            self.set_item_off(i, o + len);
        }
        self.data.copy_within(
            h + (slot + 1) * ITEM_SIZE..h + n * ITEM_SIZE,
            h + slot * ITEM_SIZE,
        );
        self.zero(low, low + len);
        self.zero((n - 1) * ITEM_SIZE, n * ITEM_SIZE);
        self.set_nritems(n - 1);
        Ok(())
    }

    /// Leaf: replace the data of the item at `slot` (of any new size).
    pub fn leaf_set_data(&mut self, slot: usize, item: &[u8]) -> Result<()> {
        let n = self.nritems();
        if !self.is_leaf() || slot >= n {
            return Err(self.edit_error(format!("no item at slot {slot} to change")));
        }
        let (off, len) = self.raw_item_range(slot);
        let new = item.len();
        if new > len && self.free_space() < new - len {
            return Err(self.edit_error(format!("no room to grow item {slot} to {new} bytes")));
        }
        let (low, end) = (self.data_low(), off + len);
        let h = HEADER_SIZE;
        // The data of the items after this one moves by the change in size.
        let new_low = low + len - new;
        self.data.copy_within(h + low..h + off, h + new_low);
        for i in slot + 1..n {
            let o = self.raw_item_range(i).0;
            self.set_item_off(i, o + len - new);
        }
        self.set_item_off(slot, end - new);
        let o = h + slot * ITEM_SIZE + KEY_SIZE + 4;
        self.data[o..o + 4].copy_from_slice(&(new as u32).to_le_bytes());
        self.data[h + end - new..h + end].copy_from_slice(item);
        if new_low > low {
            self.zero(low, new_low);
        }
        Ok(())
    }

    /// Internal node: replace the key pointer at `slot` with `ptrs` (none,
    /// one or several). The caller keeps the keys in order.
    pub fn replace_ptrs(&mut self, slot: usize, ptrs: &[KeyPtr]) -> Result<()> {
        let n = self.nritems();
        let new_n = n + ptrs.len();
        if self.is_leaf() || slot >= n || (new_n - 1) * KEY_PTR_SIZE > self.data_area() {
            return Err(self.edit_error(format!(
                "cannot put {} pointers in place of slot {slot}",
                ptrs.len()
            )));
        }
        let new_n = new_n - 1;
        let h = HEADER_SIZE;
        self.data.copy_within(
            h + (slot + 1) * KEY_PTR_SIZE..h + n * KEY_PTR_SIZE,
            h + (slot + ptrs.len()) * KEY_PTR_SIZE,
        );
        for (i, p) in ptrs.iter().enumerate() {
            let o = h + (slot + i) * KEY_PTR_SIZE;
            self.data[o..o + KEY_SIZE].copy_from_slice(&p.key.to_bytes());
            self.data[o + KEY_SIZE..o + KEY_SIZE + 8].copy_from_slice(&p.blockptr.to_le_bytes());
            self.data[o + KEY_SIZE + 8..o + KEY_PTR_SIZE]
                .copy_from_slice(&p.generation.to_le_bytes());
        }
        if new_n < n {
            self.zero(new_n * KEY_PTR_SIZE, n * KEY_PTR_SIZE);
        }
        self.set_nritems(new_n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(level: u8) -> Header {
        Header {
            csum: [0; 32],
            fsid: [7; 16],
            bytenr: 1 << 20,
            flags: 1 | (1 << 56),
            chunk_tree_uuid: [9; 16],
            generation: 42,
            owner: 5,
            nritems: 0,
            level,
        }
    }

    #[test]
    fn build_then_parse_round_trips() {
        let items: Vec<(Key, Vec<u8>)> = (0..50u64)
            .map(|i| {
                (
                    Key::new(256 + i, 1, i),
                    vec![i as u8; (i % 7) as usize * 10],
                )
            })
            .collect();
        let body = Body::Leaf(items);
        let node = Node::build(&header(0), &body, 4096).unwrap();
        let bytes = node.sealed_bytes(CsumType::Crc32c).into_boxed_slice();
        let expect = Expect {
            bytenr: 1 << 20,
            generation: Some(42),
            level: Some(0),
            first_key: Some(Key::new(256, 1, 0)),
        };
        let back = Node::parse(bytes, CsumType::Crc32c, &[[7; 16]], &expect, 42).unwrap();
        assert_eq!(back.body(), body);
        let ptrs: Vec<KeyPtr> = (0..10u64)
            .map(|i| KeyPtr {
                key: Key::new(i, 2, 3),
                blockptr: i << 14,
                generation: 40,
            })
            .collect();
        let node = Node::build(&header(1), &Body::Internal(ptrs.clone()), 4096).unwrap();
        let bytes = node.sealed_bytes(CsumType::Sha256).into_boxed_slice();
        let expect = Expect {
            bytenr: 1 << 20,
            generation: None,
            level: Some(1),
            first_key: None,
        };
        let back = Node::parse(bytes, CsumType::Sha256, &[[7; 16]], &expect, 42).unwrap();
        assert_eq!(back.body(), Body::Internal(ptrs));
        let big = Body::Leaf(vec![(Key::MIN, vec![0; 5000])]);
        assert!(Node::build(&header(0), &big, 4096).is_err());
    }

    /// An internal node must point somewhere: edits step into a child.
    #[test]
    fn empty_internal_node_is_refused() {
        let expect = |level| Expect {
            bytenr: 1 << 20,
            generation: None,
            level: Some(level),
            first_key: None,
        };
        let node = Node::build(&header(1), &Body::Internal(Vec::new()), 4096).unwrap();
        let bytes = node.sealed_bytes(CsumType::Crc32c).into_boxed_slice();
        let e = Node::parse(bytes, CsumType::Crc32c, &[[7; 16]], &expect(1), 42).unwrap_err();
        assert!(e.contains("without key pointers"), "{e}");
        // An empty leaf is an empty tree, and fine.
        let node = Node::build(&header(0), &Body::Leaf(Vec::new()), 4096).unwrap();
        let bytes = node.sealed_bytes(CsumType::Crc32c).into_boxed_slice();
        Node::parse(bytes, CsumType::Crc32c, &[[7; 16]], &expect(0), 42).unwrap();
    }

    /// Random in-place edits give exactly the block that building the same
    /// items anew gives, and refuse what does not fit without changing anything.
    #[test]
    fn in_place_edits_match_a_fresh_build() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut node = Node::build(&header(0), &Body::Leaf(Vec::new()), 4096).unwrap();
        let mut model: Vec<(Key, Vec<u8>)> = Vec::new();
        let (mut refused, mut done) = (0, 0);
        for step in 0..20_000u64 {
            let before = node.bytes().to_vec();
            let data = vec![(step % 251) as u8; rnd(200) as usize];
            let ok = match rnd(3) {
                0 => {
                    let key = Key::new(rnd(500), 1, 0);
                    match model.binary_search_by(|(k, _)| k.cmp(&key)) {
                        Ok(_) => continue,
                        Err(pos) => {
                            let ok = node.leaf_insert(pos, &key, &data).is_ok();
                            if ok {
                                model.insert(pos, (key, data));
                            }
                            ok
                        }
                    }
                }
                1 if !model.is_empty() => {
                    let pos = rnd(model.len() as u64) as usize;
                    node.leaf_remove(pos).unwrap();
                    model.remove(pos);
                    true
                }
                _ if !model.is_empty() => {
                    let pos = rnd(model.len() as u64) as usize;
                    let ok = node.leaf_set_data(pos, &data).is_ok();
                    if ok {
                        model[pos].1 = data;
                    }
                    ok
                }
                _ => continue,
            };
            if ok {
                done += 1;
            } else {
                refused += 1;
                assert_eq!(
                    node.bytes(),
                    &before[..],
                    "a refused edit changed the block"
                );
            }
            let body = Body::Leaf(model.clone());
            assert_eq!(node.body(), body);
            assert_eq!(node.used(), body.used());
            let fresh = Node::build(&node.header, &body, 4096).unwrap();
            assert_eq!(node.bytes(), fresh.bytes(), "step {step}");
        }
        assert!(
            refused > 100 && done > 10_000,
            "{refused} refused, {done} done"
        );
        // Internal nodes: replace one pointer by none, one or several.
        let ptr = |i: u64| KeyPtr {
            key: Key::new(i, 2, 0),
            blockptr: i << 12,
            generation: 7,
        };
        let mut ptrs: Vec<KeyPtr> = (0..10).map(|i| ptr(i * 1000)).collect();
        let mut node = Node::build(&header(1), &Body::Internal(ptrs.clone()), 4096).unwrap();
        for step in 0..2000u64 {
            let slot = rnd(ptrs.len() as u64) as usize;
            let lo = ptrs[slot].key.objectid;
            let hi = ptrs.get(slot + 1).map_or(u64::MAX, |p| p.key.objectid);
            let k = if ptrs.len() > 2 { rnd(4) } else { 1 + rnd(3) };
            let new: Vec<KeyPtr> = (0..k)
                .map(|i| ptr(lo + i * ((hi - lo) / 4).max(1)))
                .filter(|p| p.key.objectid < hi)
                .collect();
            let before = node.bytes().to_vec();
            if node.replace_ptrs(slot, &new).is_ok() {
                ptrs.splice(slot..=slot, new);
            } else {
                assert_eq!(node.bytes(), &before[..]);
            }
            let fresh = Node::build(&node.header, &Body::Internal(ptrs.clone()), 4096).unwrap();
            assert_eq!(node.bytes(), fresh.bytes(), "step {step}");
        }
        let mut h = header(1);
        h.bytenr = 5 << 20;
        h.generation = 99;
        node.set_header(&h);
        let fresh = Node::build(&h, &Body::Internal(ptrs.clone()), 4096).unwrap();
        assert_eq!(node.bytes(), fresh.bytes());
        assert_eq!(node.header.nritems as usize, ptrs.len());
    }
}

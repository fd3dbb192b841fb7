//! The extent tree: one item per allocated extent with its references, as
//! the kernel writes them.
//!
//! A tree block's item is a METADATA_ITEM keyed by level (skinny metadata)
//! or an EXTENT_ITEM keyed by size that carries the block's first key and
//! level (without skinny metadata). References sit inline in the item
//! while it stays small and no keyed reference item exists for the extent;
//! else each gets its own keyed item. Inline references are ordered by
//! type, and within a type by decreasing root, parent or data-ref hash
//! (the kernel's tree checker refuses other orders).

use super::delayed_ref::{BlockRef, DataOwner, DataRef, DataRefs, TreeRefs};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::le;
use crate::format::node::{HEADER_SIZE, ITEM_SIZE};
use crate::tree::{RootPtr, Tree, TreeEditor};
use crate::{Error, Result};

/// An effect of a reference change on space accounting, applied by the
/// caller to the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceOp {
    /// The block group holding `bytenr` uses `delta` more bytes.
    Used { bytenr: u64, delta: i64 },
    /// The extent is free once the transaction commits.
    Pin { bytenr: u64, len: u64 },
    /// A data extent is gone: its checksums must go too.
    DropCsums { bytenr: u64, len: u64 },
}

/// What the reference updates need to know of the filesystem.
#[derive(Clone, Copy, Debug)]
pub struct ExtentCtx {
    /// The running transaction.
    pub transid: u64,
    /// Tree block size.
    pub nodesize: u64,
    /// Whether new tree block items are METADATA_ITEMs.
    pub skinny: bool,
}

/// The hash that orders inline data refs and keys keyed ones: CRC32C of
/// the root, and of the inode and offset, combined as the kernel does.
pub fn data_ref_hash(o: &DataOwner) -> u64 {
    // Raw CRC32C registers seeded with all ones, without the final inversion.
    let high = !crc32c::crc32c(&o.root.to_le_bytes());
    let low = !crc32c::crc32c(&o.objectid.to_le_bytes());
    let low = !crc32c::crc32c_append(!low, &o.offset.to_le_bytes());
    ((high as u64) << 31) ^ low as u64
}

/// Size of the tree_block_info of a non-skinny tree block item.
const TREE_BLOCK_INFO: usize = 18;

/// Largest extent item that may take another inline reference.
fn max_extent_item(nodesize: u64) -> usize {
    ((nodesize as usize - HEADER_SIZE) >> 4) - ITEM_SIZE
}

/// A reference of any kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AnyRef {
    Block(BlockRef),
    Data(DataRef),
}

impl AnyRef {
    fn type_byte(self) -> u8 {
        match self {
            AnyRef::Block(BlockRef::Root(_)) => TREE_BLOCK_REF_KEY,
            AnyRef::Block(BlockRef::Parent(_)) => SHARED_BLOCK_REF_KEY,
            AnyRef::Data(DataRef::Root(_)) => EXTENT_DATA_REF_KEY,
            AnyRef::Data(DataRef::Parent(_)) => SHARED_DATA_REF_KEY,
        }
    }

    /// Key offset of the keyed item, and the inline sort value.
    fn seq(self) -> u64 {
        match self {
            AnyRef::Block(BlockRef::Root(x) | BlockRef::Parent(x)) => x,
            AnyRef::Data(DataRef::Parent(x)) => x,
            AnyRef::Data(DataRef::Root(o)) => data_ref_hash(&o),
        }
    }

    fn inline_size(self) -> usize {
        match self {
            AnyRef::Block(_) => 9,
            AnyRef::Data(DataRef::Root(_)) => 29,
            AnyRef::Data(DataRef::Parent(_)) => 13,
        }
    }

    pub(crate) fn describe(self) -> String {
        match self {
            AnyRef::Block(BlockRef::Root(r)) => format!("tree block ref of root {r}"),
            AnyRef::Block(BlockRef::Parent(p)) => format!("shared block ref of parent {p}"),
            AnyRef::Data(DataRef::Root(o)) => format!(
                "data ref of root {} inode {} offset {}",
                o.root, o.objectid, o.offset
            ),
            AnyRef::Data(DataRef::Parent(p)) => format!("shared data ref of parent {p}"),
        }
    }
}

/// One inline reference of an extent item, with its count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Inline {
    Ref(AnyRef, u32),
    /// Any other kind (simple-quota owner refs), kept as raw bytes.
    Other(u8, Vec<u8>),
}

impl Inline {
    fn sort_key(&self) -> (u8, std::cmp::Reverse<u64>) {
        match self {
            Inline::Ref(r, _) => (r.type_byte(), std::cmp::Reverse(r.seq())),
            Inline::Other(t, raw) => (*t, std::cmp::Reverse(le::u64(raw, 1).unwrap_or_default())),
        }
    }

    fn size(&self) -> usize {
        match self {
            Inline::Ref(r, _) => r.inline_size(),
            Inline::Other(_, raw) => raw.len(),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Inline::Ref(r, count) => {
                out.push(r.type_byte());
                match r {
                    AnyRef::Block(BlockRef::Root(x) | BlockRef::Parent(x)) => {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                    AnyRef::Data(DataRef::Root(o)) => {
                        encode_owner(o, out);
                        out.extend_from_slice(&count.to_le_bytes());
                    }
                    AnyRef::Data(DataRef::Parent(p)) => {
                        out.extend_from_slice(&p.to_le_bytes());
                        out.extend_from_slice(&count.to_le_bytes());
                    }
                }
            }
            Inline::Other(_, raw) => out.extend_from_slice(raw),
        }
    }
}

fn encode_owner(o: &DataOwner, out: &mut Vec<u8>) {
    out.extend_from_slice(&o.root.to_le_bytes());
    out.extend_from_slice(&o.objectid.to_le_bytes());
    out.extend_from_slice(&o.offset.to_le_bytes());
}

/// For an extent tree item `key`/`data` that records a tree block (a
/// skinny METADATA_ITEM, or an EXTENT_ITEM flagged as a tree block): the
/// block's level, where the item has it, and the generation it was
/// written in. `None` for any other item.
pub(crate) fn tree_block_item(key: Key, data: &[u8]) -> Option<(Option<u8>, Option<u64>)> {
    let generation = le::u64(data, 8).ok();
    match key.item_type {
        METADATA_ITEM_KEY => Some((u8::try_from(key.offset).ok(), generation)),
        EXTENT_ITEM_KEY if le::u64(data, 16).is_ok_and(|f| f & EXTENT_FLAG_TREE_BLOCK != 0) => {
            // The tree block info after the item: a key, then the level.
            Some((le::u8(data, 24 + TREE_BLOCK_INFO - 1).ok(), generation))
        }
        _ => None,
    }
}

/// Who holds the references a block has on its children.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Holder {
    /// A tree, through blocks with normal back references.
    Root(u64),
    /// The block itself (it is flagged FULL_BACKREF).
    Parent,
}

/// One reference a tree block holds on what it points at.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ChildRef {
    /// A child block, at `level`.
    Block { bytenr: u64, level: u8, r: BlockRef },
    /// The data extent of the file extent item `key` of a leaf.
    Data {
        key: Key,
        bytenr: u64,
        len: u64,
        r: DataRef,
    },
}

/// The references `node` holds on its children when `by` holds them: its
/// child blocks for a node, the data extents of its file extent items
/// for a leaf (holes and inline extents hold none). A file extent item
/// that does not decode is an error with its key; the rest still come.
pub(crate) fn child_refs(
    node: &crate::format::node::Node,
    by: Holder,
) -> Vec<std::result::Result<ChildRef, (Key, Error)>> {
    use crate::format::items::{ExtentBody, FileExtentItem};
    let parent = node.header.bytenr;
    let mut out = Vec::new();
    if !node.is_leaf() {
        let r = match by {
            Holder::Root(root) => BlockRef::Root(root),
            Holder::Parent => BlockRef::Parent(parent),
        };
        for slot in 0..node.nritems() {
            let p = node.key_ptr(slot);
            out.push(Ok(ChildRef::Block {
                bytenr: p.blockptr,
                level: node.level() - 1,
                r,
            }));
        }
        return out;
    }
    for slot in 0..node.nritems() {
        let key = node.key(slot);
        if key.item_type != EXTENT_DATA_KEY {
            continue;
        }
        let fe = match FileExtentItem::parse(node.item(slot).data) {
            Ok(fe) => fe,
            Err(e) => {
                out.push(Err((key, e)));
                continue;
            }
        };
        let ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            ..
        } = fe.body
        else {
            continue;
        };
        if disk_bytenr == 0 {
            continue;
        }
        let r = match by {
            Holder::Root(root) => DataRef::Root(DataOwner {
                root,
                objectid: key.objectid,
                offset: key.offset.wrapping_sub(offset),
            }),
            Holder::Parent => DataRef::Parent(parent),
        };
        out.push(Ok(ChildRef::Data {
            key,
            bytenr: disk_bytenr,
            len: disk_num_bytes,
            r,
        }));
    }
    out
}

/// A decoded extent item.
pub(crate) struct ExtentItem {
    pub(crate) refs: u64,
    pub(crate) generation: u64,
    pub(crate) flags: u64,
    /// tree_block_info of a non-skinny tree block item, raw.
    pub(crate) info: Option<Vec<u8>>,
    pub(crate) inline: Vec<Inline>,
}

impl ExtentItem {
    /// Decode an item; `with_info` for an EXTENT_ITEM of a tree block.
    pub(crate) fn parse(b: &[u8], key_type: u8) -> Result<Self> {
        let flags = le::u64(b, 16)?;
        let mut off = 24;
        let info = if key_type == EXTENT_ITEM_KEY && flags & EXTENT_FLAG_TREE_BLOCK != 0 {
            off += TREE_BLOCK_INFO;
            Some(le::bytes(b, 24, TREE_BLOCK_INFO)?.to_vec())
        } else {
            None
        };
        let mut inline = Vec::new();
        while off < b.len() {
            let t = le::u8(b, off)?;
            let (size, r) = match t {
                TREE_BLOCK_REF_KEY => (9, AnyRef::Block(BlockRef::Root(le::u64(b, off + 1)?))),
                SHARED_BLOCK_REF_KEY => (9, AnyRef::Block(BlockRef::Parent(le::u64(b, off + 1)?))),
                EXTENT_DATA_REF_KEY => (
                    29,
                    AnyRef::Data(DataRef::Root(DataOwner {
                        root: le::u64(b, off + 1)?,
                        objectid: le::u64(b, off + 9)?,
                        offset: le::u64(b, off + 17)?,
                    })),
                ),
                SHARED_DATA_REF_KEY => (13, AnyRef::Data(DataRef::Parent(le::u64(b, off + 1)?))),
                EXTENT_OWNER_REF_KEY => {
                    inline.push(Inline::Other(t, le::bytes(b, off, 9)?.to_vec()));
                    off += 9;
                    continue;
                }
                _ => {
                    return Err(Error::corrupt(format!(
                        "inline ref type {t} in extent item"
                    )));
                }
            };
            let count = match r {
                AnyRef::Block(_) => 1,
                AnyRef::Data(DataRef::Root(_)) => le::u32(b, off + 25)?,
                AnyRef::Data(DataRef::Parent(_)) => le::u32(b, off + 9)?,
            };
            inline.push(Inline::Ref(r, count));
            off += size;
        }
        Ok(ExtentItem {
            refs: le::u64(b, 0)?,
            generation: le::u64(b, 8)?,
            flags,
            info,
            inline,
        })
    }

    fn size(&self) -> usize {
        24 + self.info.as_ref().map_or(0, Vec::len)
            + self.inline.iter().map(Inline::size).sum::<usize>()
    }

    fn encode(&mut self) -> Vec<u8> {
        self.inline.sort_by_key(Inline::sort_key);
        let mut out = Vec::with_capacity(self.size());
        out.extend_from_slice(&self.refs.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        if let Some(info) = &self.info {
            out.extend_from_slice(info);
        }
        for r in &self.inline {
            r.encode(&mut out);
        }
        out
    }

    fn find(&self, r: AnyRef) -> Option<usize> {
        self.inline
            .iter()
            .position(|i| matches!(i, Inline::Ref(x, _) if *x == r))
    }
}

/// The item of tree block `bytenr`: its key and data, skinny or not.
fn find_tree_block_item(
    tree: &Tree<'_>,
    bytenr: u64,
    level: u8,
    nodesize: u64,
) -> Result<Option<(Key, Vec<u8>)>> {
    for key in [
        Key::new(bytenr, METADATA_ITEM_KEY, level as u64),
        Key::new(bytenr, EXTENT_ITEM_KEY, nodesize),
    ] {
        if let Some(it) = tree.get(&key)? {
            return Ok(Some((key, it.data().to_vec())));
        }
    }
    Ok(None)
}

/// Reference count and flags of tree block `bytenr` as the extent tree
/// records them, if it has an item.
pub fn tree_block_info(
    tree: &Tree<'_>,
    bytenr: u64,
    level: u8,
    nodesize: u64,
) -> Result<Option<(u64, u64)>> {
    Ok(find_tree_block_item(tree, bytenr, level, nodesize)?
        .map(|(_, d)| (le::u64(&d, 0).unwrap_or(0), le::u64(&d, 16).unwrap_or(0))))
}

/// Whether tree block `bytenr` has the back reference `r` on disk
/// (inline in its extent item, or keyed).
pub fn tree_block_has_ref(
    tree: &Tree<'_>,
    bytenr: u64,
    level: u8,
    nodesize: u64,
    r: BlockRef,
) -> Result<bool> {
    let Some((key, data)) = find_tree_block_item(tree, bytenr, level, nodesize)? else {
        return Ok(false);
    };
    let r = AnyRef::Block(r);
    if ExtentItem::parse(&data, key.item_type)?.find(r).is_some() {
        return Ok(true);
    }
    Ok(tree
        .get(&Key::new(bytenr, r.type_byte(), r.seq()))?
        .is_some())
}

/// Applies reference changes to one extent's item and its keyed refs.
struct RefEditor<'e, 'a> {
    ed: &'e mut TreeEditor<'a>,
    root: &'e mut RootPtr,
    bytenr: u64,
    max_item: usize,
    /// Whether a keyed reference item exists: new refs then go keyed too.
    keyed: bool,
}

impl RefEditor<'_, '_> {
    fn keyed_key(&self, r: AnyRef) -> Key {
        Key::new(self.bytenr, r.type_byte(), r.seq())
    }

    /// Count of a keyed reference, if it exists.
    fn keyed_count(&self, r: AnyRef) -> Result<Option<u32>> {
        let key = self.keyed_key(r);
        let Some(it) = self.ed.reader().tree(*self.root).get(&key)? else {
            return Ok(None);
        };
        let d = it.data();
        Ok(Some(match r {
            AnyRef::Block(_) => 1,
            AnyRef::Data(DataRef::Parent(_)) => le::u32(d, 0)?,
            AnyRef::Data(DataRef::Root(o)) => {
                let same = le::u64(d, 0)? == o.root
                    && le::u64(d, 8)? == o.objectid
                    && le::u64(d, 16)? == o.offset;
                if !same {
                    return Err(Error::Unsupported(format!(
                        "data ref hash collision on extent {}",
                        self.bytenr
                    )));
                }
                le::u32(d, 24)?
            }
        }))
    }

    fn put_keyed(&mut self, r: AnyRef, count: u32) -> Result<()> {
        let key = self.keyed_key(r);
        let data = match r {
            AnyRef::Block(_) => Vec::new(),
            AnyRef::Data(DataRef::Parent(_)) => count.to_le_bytes().to_vec(),
            AnyRef::Data(DataRef::Root(o)) => {
                let mut v = Vec::with_capacity(28);
                encode_owner(&o, &mut v);
                v.extend_from_slice(&count.to_le_bytes());
                v
            }
        };
        self.ed.put(self.root, key, data)
    }

    fn change(&mut self, item: &mut ExtentItem, r: AnyRef, d: i64) -> Result<()> {
        let bad = |what: &str| {
            Error::corrupt(format!(
                "extent {}: {what} ({}, change {d})",
                self.bytenr,
                r.describe()
            ))
        };
        let refs = i64::try_from(item.refs)
            .ok()
            .and_then(|r| r.checked_add(d))
            .ok_or_else(|| bad("reference count out of range"))?;
        if refs < 0 {
            return Err(bad("reference count would go below zero"));
        }
        item.refs = refs as u64;
        let max = match r {
            AnyRef::Block(_) => 1,
            AnyRef::Data(_) => u32::MAX as i64,
        };
        if let Some(i) = item.find(r) {
            let Inline::Ref(_, c) = &mut item.inline[i] else {
                return Err(bad("inline ref changed kind"));
            };
            let n = *c as i64 + d;
            if n < 0 || n > max {
                return Err(bad("reference count out of range"));
            }
            if n == 0 {
                item.inline.remove(i);
            } else {
                *c = n as u32;
            }
            return Ok(());
        }
        if let Some(c) = self.keyed_count(r)? {
            let n = c as i64 + d;
            if n < 0 || n > max {
                return Err(bad("reference count out of range"));
            }
            if n == 0 {
                self.ed.delete(self.root, self.keyed_key(r))?;
            } else {
                self.put_keyed(r, n as u32)?;
            }
            return Ok(());
        }
        if d <= 0 {
            return Err(bad("no such reference to drop"));
        }
        if d > max {
            return Err(bad("reference added twice"));
        }
        if !self.keyed && item.size() + r.inline_size() < self.max_item {
            item.inline.push(Inline::Ref(r, d as u32));
        } else {
            self.put_keyed(r, d as u32)?;
            self.keyed = true;
        }
        Ok(())
    }

    /// Whether any keyed reference item of the extent exists.
    fn any_keyed(&self) -> Result<bool> {
        let tree = self.ed.reader().tree(*self.root);
        let mut it = tree.range(
            Key::new(self.bytenr, METADATA_ITEM_KEY + 1, 0),
            Key::new(self.bytenr, BLOCK_GROUP_ITEM_KEY - 1, u64::MAX),
        )?;
        Ok(it.next().transpose()?.is_some())
    }

    /// Apply `changes`: additions first (as the kernel does, so a count
    /// never passes through zero while references remain).
    fn apply(&mut self, item: &mut ExtentItem, changes: &[(AnyRef, i64)]) -> Result<()> {
        for &(r, d) in changes.iter().filter(|(_, d)| *d > 0) {
            self.change(item, r, d)?;
        }
        for &(r, d) in changes.iter().filter(|(_, d)| *d < 0) {
            self.change(item, r, d)?;
        }
        Ok(())
    }
}

/// Apply one tree block's pending reference changes. `first_key` gives
/// the block's first key for a new non-skinny item.
pub fn run_tree_refs(
    ed: &mut TreeEditor<'_>,
    root: &mut RootPtr,
    bytenr: u64,
    r: &TreeRefs,
    ctx: ExtentCtx,
    first_key: impl FnOnce() -> Key,
) -> Result<Vec<SpaceOp>> {
    let nodesize = ctx.nodesize;
    let existing = find_tree_block_item(&ed.reader().tree(*root), bytenr, r.level, nodesize)?;
    if existing.is_some() && r.new {
        return Err(Error::corrupt(format!(
            "new tree block {bytenr} already has an extent item"
        )));
    }
    let (key, mut item) = match existing {
        Some((k, d)) => (k, ExtentItem::parse(&d, k.item_type)?),
        None if !r.new => {
            return Err(Error::corrupt(format!(
                "tree block {bytenr} has no extent item"
            )));
        }
        None => {
            let info = (!ctx.skinny).then(|| {
                let mut v = first_key().to_bytes().to_vec();
                v.push(r.level);
                v
            });
            let key = if ctx.skinny {
                Key::new(bytenr, METADATA_ITEM_KEY, r.level as u64)
            } else {
                Key::new(bytenr, EXTENT_ITEM_KEY, nodesize)
            };
            let item = ExtentItem {
                refs: 0,
                generation: ctx.transid,
                flags: EXTENT_FLAG_TREE_BLOCK,
                info,
                inline: Vec::new(),
            };
            (key, item)
        }
    };
    item.flags |= r.set_flags;
    let changes: Vec<(AnyRef, i64)> = r
        .changes
        .iter()
        .map(|(k, d)| (AnyRef::Block(*k), *d))
        .collect();
    let mut re = RefEditor {
        ed,
        root,
        bytenr,
        max_item: max_extent_item(nodesize),
        keyed: false,
    };
    re.keyed = !r.new && re.any_keyed()?;
    re.apply(&mut item, &changes)?;
    if item.refs == 0 {
        if r.new {
            // Allocated and dropped again in this transaction.
            return Ok(vec![SpaceOp::Pin {
                bytenr,
                len: nodesize,
            }]);
        }
        if !item.inline.is_empty() {
            return Err(Error::corrupt(format!(
                "tree block {bytenr} keeps inline refs with no reference count"
            )));
        }
        re.ed.delete(re.root, key)?;
        return Ok(vec![
            SpaceOp::Used {
                bytenr,
                delta: -(nodesize as i64),
            },
            SpaceOp::Pin {
                bytenr,
                len: nodesize,
            },
        ]);
    }
    let data = item.encode();
    re.ed.put(re.root, key, data)?;
    Ok(if r.new {
        vec![SpaceOp::Used {
            bytenr,
            delta: nodesize as i64,
        }]
    } else {
        Vec::new()
    })
}

/// Who a data extent belongs to, as its extent item says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DataExtentOwners {
    /// No extent item (one made by the running transaction has none yet).
    NoItem,
    /// The item; `sole` when every reference it counts is a file extent
    /// item of the one owner asked about (none keyed, none shared).
    Item { sole: bool, generation: u64 },
}

/// Whether data extent `bytenr` of `len` bytes is referenced by `owner`
/// alone: an overwrite in place changes no one else's file then.
pub(crate) fn data_extent_owners(
    tree: &Tree<'_>,
    bytenr: u64,
    len: u64,
    owner: DataOwner,
) -> Result<DataExtentOwners> {
    let Some(it) = tree.get(&Key::new(bytenr, EXTENT_ITEM_KEY, len))? else {
        return Ok(DataExtentOwners::NoItem);
    };
    let item = ExtentItem::parse(it.data(), EXTENT_ITEM_KEY)?;
    let mut counted = 0u64;
    let mut others = false;
    for r in &item.inline {
        match r {
            Inline::Ref(AnyRef::Data(DataRef::Root(o)), n) if *o == owner => {
                counted += u64::from(*n)
            }
            Inline::Ref(..) => others = true,
            Inline::Other(..) => {}
        }
    }
    // References beyond the inline ones are keyed items: someone else's,
    // as far as this check goes.
    Ok(DataExtentOwners::Item {
        sole: !others && counted == item.refs,
        generation: item.generation,
    })
}

/// Apply one data extent's pending reference changes.
pub fn run_data_refs(
    ed: &mut TreeEditor<'_>,
    root: &mut RootPtr,
    bytenr: u64,
    refs: &DataRefs,
    ctx: ExtentCtx,
) -> Result<Vec<SpaceOp>> {
    let key = Key::new(bytenr, EXTENT_ITEM_KEY, refs.len);
    let existing = ed.reader().tree(*root).get(&key)?;
    let is_new = existing.is_none();
    if refs.changes.is_empty() && !is_new {
        return Ok(Vec::new());
    }
    let mut item = match existing {
        Some(it) => ExtentItem::parse(it.data(), EXTENT_ITEM_KEY)?,
        None => ExtentItem {
            refs: 0,
            generation: ctx.transid,
            flags: EXTENT_FLAG_DATA,
            info: None,
            inline: Vec::new(),
        },
    };
    let changes: Vec<(AnyRef, i64)> = refs
        .changes
        .iter()
        .map(|(k, d)| (AnyRef::Data(*k), *d))
        .collect();
    let mut re = RefEditor {
        ed,
        root,
        bytenr,
        max_item: max_extent_item(ctx.nodesize),
        keyed: false,
    };
    re.keyed = !is_new && re.any_keyed()?;
    re.apply(&mut item, &changes)?;
    let len = refs.len;
    if item.refs == 0 {
        if !is_new {
            re.ed.delete(re.root, key)?;
            return Ok(vec![
                SpaceOp::Used {
                    bytenr,
                    delta: -(len as i64),
                },
                SpaceOp::Pin { bytenr, len },
                SpaceOp::DropCsums { bytenr, len },
            ]);
        }
        // Allocated and dropped again in this transaction: its space is
        // free after the commit, and its checksums go.
        return Ok(vec![
            SpaceOp::Pin { bytenr, len },
            SpaceOp::DropCsums { bytenr, len },
        ]);
    }
    let data = item.encode();
    re.ed.put(re.root, key, data)?;
    Ok(if is_new {
        vec![SpaceOp::Used {
            bytenr,
            delta: len as i64,
        }]
    } else {
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_refs_sort_by_type_then_descending_value() {
        let o = |root| DataOwner {
            root,
            objectid: 257,
            offset: 0,
        };
        let mut item = ExtentItem {
            refs: 5,
            generation: 1,
            flags: EXTENT_FLAG_DATA,
            info: None,
            inline: vec![
                Inline::Ref(AnyRef::Data(DataRef::Parent(100)), 1),
                Inline::Ref(AnyRef::Data(DataRef::Root(o(256))), 1),
                Inline::Ref(AnyRef::Data(DataRef::Parent(300)), 1),
                Inline::Ref(AnyRef::Data(DataRef::Root(o(5))), 1),
            ],
        };
        let raw = item.encode();
        let back = ExtentItem::parse(&raw, EXTENT_ITEM_KEY).unwrap();
        let types: Vec<(u8, u64)> = back
            .inline
            .iter()
            .map(|i| match i {
                Inline::Ref(r, _) => (r.type_byte(), r.seq()),
                Inline::Other(t, _) => (*t, 0),
            })
            .collect();
        assert_eq!(types[0].0, EXTENT_DATA_REF_KEY);
        assert!(types[0].1 > types[1].1);
        assert_eq!(types[2], (SHARED_DATA_REF_KEY, 300));
        assert_eq!(types[3], (SHARED_DATA_REF_KEY, 100));
    }

    #[test]
    fn non_skinny_tree_block_item_round_trips() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&2u64.to_le_bytes());
        raw.extend_from_slice(&7u64.to_le_bytes());
        raw.extend_from_slice(&(EXTENT_FLAG_TREE_BLOCK | BLOCK_FLAG_FULL_BACKREF).to_le_bytes());
        raw.extend_from_slice(&Key::new(256, INODE_ITEM_KEY, 0).to_bytes());
        raw.push(1);
        raw.push(SHARED_BLOCK_REF_KEY);
        raw.extend_from_slice(&4096u64.to_le_bytes());
        raw.push(TREE_BLOCK_REF_KEY);
        raw.extend_from_slice(&257u64.to_le_bytes());
        let mut item = ExtentItem::parse(&raw, EXTENT_ITEM_KEY).unwrap();
        assert_eq!(item.inline.len(), 2);
        let out = item.encode();
        // The tree block ref sorts before the shared one.
        assert_eq!(out[42], TREE_BLOCK_REF_KEY);
        assert_eq!(out[51], SHARED_BLOCK_REF_KEY);
        assert_eq!(&out[24..42], &raw[24..42]);
    }

    #[test]
    fn kernel_inline_limit() {
        assert_eq!(max_extent_item(16384), 992);
        assert_eq!(max_extent_item(4096), 224);
    }
}

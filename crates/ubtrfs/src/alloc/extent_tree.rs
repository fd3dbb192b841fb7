//! The extent tree: one item per allocated extent with its references, as
//! the kernel writes them (skinny tree block items, inline data refs, keyed
//! data refs when an item grows too big).

use super::delayed_ref::{DataOwner, DataRefs, TreeRef};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::le;
use crate::tree::{RootPtr, TreeEditor};
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

/// The hash that orders inline data refs and keys keyed ones: CRC32C of
/// the root, and of the inode and offset, combined as the kernel does.
pub fn data_ref_hash(o: &DataOwner) -> u64 {
    // Raw CRC32C registers seeded with all ones, without the final inversion.
    let high = !crc32c::crc32c(&o.root.to_le_bytes());
    let low = !crc32c::crc32c(&o.objectid.to_le_bytes());
    let low = !crc32c::crc32c_append(!low, &o.offset.to_le_bytes());
    ((high as u64) << 31) ^ low as u64
}

/// One inline reference of an extent item.
#[derive(Clone, Debug, PartialEq, Eq)]
enum InlineRef {
    Data(DataOwner, u32),
    /// Any other reference kind, kept as raw bytes (type byte first).
    Other(u8, Vec<u8>),
}

impl InlineRef {
    fn type_byte(&self) -> u8 {
        match self {
            InlineRef::Data(..) => EXTENT_DATA_REF_KEY,
            InlineRef::Other(t, _) => *t,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            InlineRef::Data(o, count) => {
                out.push(EXTENT_DATA_REF_KEY);
                out.extend_from_slice(&o.root.to_le_bytes());
                out.extend_from_slice(&o.objectid.to_le_bytes());
                out.extend_from_slice(&o.offset.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            InlineRef::Other(_, raw) => out.extend_from_slice(raw),
        }
    }
}

/// A decoded data extent item.
struct ExtentItem {
    refs: u64,
    generation: u64,
    flags: u64,
    inline: Vec<InlineRef>,
}

impl ExtentItem {
    fn parse(b: &[u8]) -> Result<Self> {
        let mut inline = Vec::new();
        let mut off = 24;
        while off < b.len() {
            let t = le::u8(b, off)?;
            let size = match t {
                TREE_BLOCK_REF_KEY | SHARED_BLOCK_REF_KEY | EXTENT_OWNER_REF_KEY => 9,
                EXTENT_DATA_REF_KEY => 29,
                SHARED_DATA_REF_KEY => 13,
                _ => {
                    return Err(Error::corrupt(format!(
                        "inline ref type {t} in extent item"
                    )));
                }
            };
            let raw = le::bytes(b, off, size)?;
            if t == EXTENT_DATA_REF_KEY {
                let o = DataOwner {
                    root: le::u64(raw, 1)?,
                    objectid: le::u64(raw, 9)?,
                    offset: le::u64(raw, 17)?,
                };
                inline.push(InlineRef::Data(o, le::u32(raw, 25)?));
            } else {
                inline.push(InlineRef::Other(t, raw.to_vec()));
            }
            off += size;
        }
        Ok(ExtentItem {
            refs: le::u64(b, 0)?,
            generation: le::u64(b, 8)?,
            flags: le::u64(b, 16)?,
            inline,
        })
    }

    fn encode(&mut self) -> Vec<u8> {
        // Inline refs: by type; data refs by descending hash.
        self.inline.sort_by(|a, b| {
            a.type_byte()
                .cmp(&b.type_byte())
                .then_with(|| match (a, b) {
                    (InlineRef::Data(x, _), InlineRef::Data(y, _)) => {
                        data_ref_hash(y).cmp(&data_ref_hash(x))
                    }
                    _ => std::cmp::Ordering::Equal,
                })
        });
        let mut out = Vec::with_capacity(24 + 29 * self.inline.len());
        out.extend_from_slice(&self.refs.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        for r in &self.inline {
            r.encode(&mut out);
        }
        out
    }
}

/// Apply one tree block's pending reference change.
pub fn run_tree_ref(
    ed: &mut TreeEditor<'_>,
    root: &mut RootPtr,
    bytenr: u64,
    r: TreeRef,
    transid: u64,
    nodesize: u64,
) -> Result<Vec<SpaceOp>> {
    let key = Key::new(bytenr, METADATA_ITEM_KEY, r.level as u64);
    match r.delta {
        1 => {
            let mut d = Vec::with_capacity(33);
            d.extend_from_slice(&1u64.to_le_bytes());
            d.extend_from_slice(&transid.to_le_bytes());
            d.extend_from_slice(&EXTENT_FLAG_TREE_BLOCK.to_le_bytes());
            d.push(TREE_BLOCK_REF_KEY);
            d.extend_from_slice(&r.owner.to_le_bytes());
            ed.insert(root, key, d)?;
            Ok(vec![SpaceOp::Used {
                bytenr,
                delta: nodesize as i64,
            }])
        }
        -1 => {
            let old = ed.delete(root, key)?.ok_or_else(|| {
                Error::corrupt(format!(
                    "tree block {bytenr} of tree {} has no extent item",
                    r.owner
                ))
            })?;
            let item = ExtentItem::parse(&old)?;
            if item.refs != 1 {
                return Err(Error::Unsupported(format!(
                    "tree block {bytenr} has {} references (shared with a snapshot)",
                    item.refs
                )));
            }
            Ok(vec![
                SpaceOp::Used {
                    bytenr,
                    delta: -(nodesize as i64),
                },
                SpaceOp::Pin {
                    bytenr,
                    len: nodesize,
                },
            ])
        }
        d => Err(Error::Invalid(format!(
            "tree block {bytenr} reference change {d}"
        ))),
    }
}

/// Inline refs are kept while the item stays this small.
fn max_inline_item(nodesize: u64) -> usize {
    (nodesize as usize / 16).max(64)
}

/// Apply one data extent's pending reference changes.
pub fn run_data_refs(
    ed: &mut TreeEditor<'_>,
    root: &mut RootPtr,
    bytenr: u64,
    refs: &DataRefs,
    transid: u64,
    nodesize: u64,
) -> Result<Vec<SpaceOp>> {
    let key = Key::new(bytenr, EXTENT_ITEM_KEY, refs.len);
    let existing = ed.reader().tree(*root).get(&key)?;
    let is_new = existing.is_none();
    if refs.changes.is_empty() && !is_new {
        return Ok(Vec::new());
    }
    let mut item = match existing {
        Some(it) => ExtentItem::parse(it.data())?,
        None => ExtentItem {
            refs: 0,
            generation: transid,
            flags: EXTENT_FLAG_DATA,
            inline: Vec::new(),
        },
    };
    for (owner, &d) in &refs.changes {
        let total = item.refs as i64 + d;
        if total < 0 {
            return Err(Error::corrupt(format!(
                "data extent {bytenr} would have {total} references"
            )));
        }
        item.refs = total as u64;
        let slot = item
            .inline
            .iter()
            .position(|r| matches!(r, InlineRef::Data(o, _) if o == owner));
        if let Some(i) = slot {
            let InlineRef::Data(_, c) = &mut item.inline[i] else {
                return Err(Error::Invalid("inline ref changed kind".into()));
            };
            let n = *c as i64 + d;
            if n < 0 {
                return Err(Error::corrupt(format!(
                    "data extent {bytenr}: negative ref count"
                )));
            }
            if n == 0 {
                item.inline.remove(i);
            } else {
                *c = n as u32;
            }
            continue;
        }
        let kkey = Key::new(bytenr, EXTENT_DATA_REF_KEY, data_ref_hash(owner));
        let keyed = ed
            .reader()
            .tree(*root)
            .get(&kkey)?
            .map(|it| it.data().to_vec());
        match keyed {
            Some(raw)
                if le::u64(&raw, 0)? == owner.root
                    && le::u64(&raw, 8)? == owner.objectid
                    && le::u64(&raw, 16)? == owner.offset =>
            {
                let n = le::u32(&raw, 24)? as i64 + d;
                if n <= 0 {
                    ed.delete(root, kkey)?;
                } else {
                    let mut v = raw;
                    v[24..28].copy_from_slice(&(n as u32).to_le_bytes());
                    ed.put(root, kkey, v)?;
                }
            }
            Some(_) => {
                return Err(Error::Unsupported(format!(
                    "data ref hash collision on extent {bytenr}"
                )));
            }
            None if d > 0 => {
                if 24 + 29 * (item.inline.len() + 1) <= max_inline_item(nodesize) {
                    item.inline.push(InlineRef::Data(*owner, d as u32));
                } else {
                    let mut v = Vec::with_capacity(28);
                    v.extend_from_slice(&owner.root.to_le_bytes());
                    v.extend_from_slice(&owner.objectid.to_le_bytes());
                    v.extend_from_slice(&owner.offset.to_le_bytes());
                    v.extend_from_slice(&(d as u32).to_le_bytes());
                    ed.insert(root, kkey, v)?;
                }
            }
            None => {
                return Err(Error::corrupt(format!(
                    "data extent {bytenr} has no reference from root {} inode {} offset {}",
                    owner.root, owner.objectid, owner.offset
                )));
            }
        }
    }
    let len = refs.len;
    if item.refs == 0 {
        if !is_new {
            ed.delete(root, key)?;
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
    ed.put(root, key, item.encode())?;
    Ok(if is_new {
        vec![SpaceOp::Used {
            bytenr,
            delta: len as i64,
        }]
    } else {
        Vec::new()
    })
}

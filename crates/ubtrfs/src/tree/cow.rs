//! Copy-on-write edits of a B-tree inside a transaction.
//!
//! One mechanism serves every change: [`TreeEditor::edit`] descends to the
//! leaf where a key belongs, copying each block on the path that the
//! running transaction has not written yet, lets a closure change that
//! leaf's items, and then restores the tree's shape on the way back up:
//! an overfull block is split, an empty one removed, a small one merged
//! with a neighbour, parent keys follow their children's first keys, and
//! the root grows or shrinks a level.

use super::{RootPtr, TreeReader};
use crate::format::Key;
use crate::format::consts::{HEADER_FLAG_WRITTEN, MIXED_BACKREF_REV};
use crate::format::node::{
    Body, Expect, HEADER_SIZE, Header, ITEM_SIZE, KEY_PTR_SIZE, KeyPtr, Node,
};
use crate::{Error, Result};
use std::sync::Arc;

/// Leaf items as the edit closure sees them, in key order.
pub type Items = Vec<(Key, Vec<u8>)>;

/// What a tree edit needs from the transaction: fresh blocks and the
/// bookkeeping of references to them.
pub trait BlockSource {
    /// The running transaction's id; blocks it writes carry it.
    fn transid(&self) -> u64;
    /// A new tree block for tree `owner` at `level`; its reference is recorded.
    fn alloc_tree_block(&mut self, owner: u64, level: u8) -> Result<u64>;
    /// Tree `owner` drops its reference to the block (of `generation`).
    fn free_tree_block(
        &mut self,
        bytenr: u64,
        owner: u64,
        level: u8,
        generation: u64,
    ) -> Result<()>;
    /// Whether a block the transaction did not write may be copied by tree
    /// `owner` (a block shared with a snapshot needs reference updates the
    /// caller may not support).
    fn check_cow(&self, _owner: u64, _header: &Header) -> Result<()> {
        Ok(())
    }
}

/// Edits one tree through a [`TreeReader`], taking blocks from a [`BlockSource`].
pub struct TreeEditor<'a> {
    reader: &'a TreeReader,
    blocks: &'a mut dyn BlockSource,
    owner: u64,
    chunk_tree_uuid: [u8; 16],
}

/// Blocks smaller than this fraction of the node's capacity try to merge.
const MERGE_BELOW_QUARTERS: usize = 1;

impl<'a> TreeEditor<'a> {
    /// An editor for tree `owner`.
    pub fn new(
        reader: &'a TreeReader,
        blocks: &'a mut dyn BlockSource,
        owner: u64,
        chunk_tree_uuid: [u8; 16],
    ) -> Self {
        TreeEditor {
            reader,
            blocks,
            owner,
            chunk_tree_uuid,
        }
    }

    /// The reader this editor reads through.
    pub fn reader(&self) -> &'a TreeReader {
        self.reader
    }

    fn capacity(&self) -> usize {
        self.reader.nodesize() - HEADER_SIZE
    }

    /// Largest item data a leaf can hold.
    pub fn max_item_size(&self) -> usize {
        self.capacity() - ITEM_SIZE
    }

    /// Change the leaf holding `key`'s position with `f`, then fix the
    /// tree's shape. `root` is updated to the new root block.
    pub fn edit<R>(
        &mut self,
        root: &mut RootPtr,
        key: &Key,
        f: impl FnOnce(&mut Items) -> Result<R>,
    ) -> Result<R> {
        let node = self.read(root.bytenr, Some(root.level), root.generation, None)?;
        let (mut ptrs, r) = self.edit_node(node, key, f, true)?;
        // Grow: several blocks at the top become children of a new root.
        let mut level = root.level;
        while ptrs.len() > 1 {
            level += 1;
            ptrs = self.write_blocks(None, level, Body::Internal(ptrs))?;
        }
        let top = ptrs
            .pop()
            .ok_or_else(|| Error::corrupt("tree edit left no root"))?;
        let mut new_root = RootPtr {
            bytenr: top.blockptr,
            level,
            generation: Some(top.generation),
        };
        // Shrink: a root with a single child hands over to it.
        while new_root.level > 0 {
            let node = self.read(
                new_root.bytenr,
                Some(new_root.level),
                new_root.generation,
                None,
            )?;
            if node.nritems() != 1 {
                break;
            }
            let child = node.key_ptr(0);
            self.free(&node)?;
            new_root = RootPtr {
                bytenr: child.blockptr,
                level: new_root.level - 1,
                generation: Some(child.generation),
            };
        }
        *root = new_root;
        Ok(r)
    }

    fn read(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Arc<Node>> {
        self.reader.read_node(&Expect {
            bytenr,
            generation,
            level,
            first_key,
        })
    }

    fn child(&self, node: &Node, slot: usize) -> Result<Arc<Node>> {
        let p = node.key_ptr(slot);
        self.read(
            p.blockptr,
            Some(node.level() - 1),
            Some(p.generation),
            Some(p.key),
        )
    }

    /// Edit below `node`; returns the pointers that replace it in its parent.
    fn edit_node<R>(
        &mut self,
        node: Arc<Node>,
        key: &Key,
        f: impl FnOnce(&mut Items) -> Result<R>,
        is_root: bool,
    ) -> Result<(Vec<KeyPtr>, R)> {
        if node.is_leaf() {
            let Body::Leaf(mut items) = node.body() else {
                return Err(Error::corrupt("leaf without items"));
            };
            let r = f(&mut items)?;
            for w in items.windows(2) {
                if w[0].0 >= w[1].0 {
                    return Err(Error::Invalid(format!(
                        "edit left keys out of order: {} then {}",
                        w[0].0, w[1].0
                    )));
                }
            }
            if let Some((k, d)) = items.iter().find(|(_, d)| d.len() > self.max_item_size()) {
                return Err(Error::Invalid(format!(
                    "item {k} of {} bytes is larger than a leaf holds",
                    d.len()
                )));
            }
            if items.is_empty() && !is_root {
                self.free(&node)?;
                return Ok((Vec::new(), r));
            }
            return Ok((self.write_blocks(Some(&node), 0, Body::Leaf(items))?, r));
        }
        let Body::Internal(mut ptrs) = node.body() else {
            return Err(Error::corrupt("node without pointers"));
        };
        let slot = node.slot_le(key).unwrap_or(0);
        let child = self.child(&node, slot)?;
        let (repl, r) = self.edit_node(child, key, f, false)?;
        let single = repl.len() == 1;
        ptrs.splice(slot..=slot, repl);
        if single {
            self.maybe_merge(&mut ptrs, slot, node.level() - 1)?;
        }
        if ptrs.is_empty() && !is_root {
            self.free(&node)?;
            return Ok((Vec::new(), r));
        }
        if ptrs.is_empty() {
            // The whole tree emptied: the root becomes an empty leaf.
            self.free(&node)?;
            return Ok((self.write_blocks(None, 0, Body::Leaf(Vec::new()))?, r));
        }
        Ok((
            self.write_blocks(Some(&node), node.level(), Body::Internal(ptrs))?,
            r,
        ))
    }

    /// If the child at `slot` is small, merge it with a neighbour when both fit in one block.
    fn maybe_merge(&mut self, ptrs: &mut Vec<KeyPtr>, slot: usize, level: u8) -> Result<()> {
        let cap = self.capacity();
        let read_ptr = |me: &Self, p: &KeyPtr| {
            me.read(p.blockptr, Some(level), Some(p.generation), Some(p.key))
        };
        let node = read_ptr(self, &ptrs[slot])?;
        let used = node.body().used();
        if used * 4 > cap * MERGE_BELOW_QUARTERS {
            return Ok(());
        }
        for (left, right) in [(slot.wrapping_sub(1), slot), (slot, slot + 1)] {
            if left >= ptrs.len() || right >= ptrs.len() {
                continue;
            }
            let (l, r) = (read_ptr(self, &ptrs[left])?, read_ptr(self, &ptrs[right])?);
            let (lb, rb) = (l.body(), r.body());
            // Leave room so the merged block does not split on the next insert.
            if lb.used() + rb.used() > cap * 3 / 4 {
                continue;
            }
            let merged = match (lb, rb) {
                (Body::Leaf(mut a), Body::Leaf(b)) => {
                    a.extend(b);
                    Body::Leaf(a)
                }
                (Body::Internal(mut a), Body::Internal(b)) => {
                    a.extend(b);
                    Body::Internal(a)
                }
                _ => return Err(Error::corrupt("siblings of different levels")),
            };
            self.free(&r)?;
            let out = self.write_blocks(Some(&l), level, merged)?;
            ptrs.splice(left..=right, out);
            return Ok(());
        }
        Ok(())
    }

    /// Drop a block from the tree.
    fn free(&mut self, node: &Node) -> Result<()> {
        let h = &node.header;
        self.reader.drop_dirty(h.bytenr);
        self.blocks
            .free_tree_block(h.bytenr, self.owner, h.level, h.generation)
    }

    /// Write `body` as one or more blocks at `level`, the first one in place
    /// of `old` (reused if this transaction already wrote it, else copied).
    fn write_blocks(&mut self, old: Option<&Node>, level: u8, body: Body) -> Result<Vec<KeyPtr>> {
        let pieces = self.split(body);
        let mut out = Vec::with_capacity(pieces.len());
        let transid = self.blocks.transid();
        for (i, piece) in pieces.into_iter().enumerate() {
            let reuse = match (i, old) {
                (0, Some(o))
                    if o.header.generation == transid && self.reader.is_dirty(o.header.bytenr) =>
                {
                    Some(o.header.bytenr)
                }
                _ => None,
            };
            let bytenr = match reuse {
                Some(b) => b,
                None => {
                    if let (0, Some(o)) = (i, old) {
                        self.blocks.check_cow(self.owner, &o.header)?;
                        self.free(o)?;
                    }
                    self.blocks.alloc_tree_block(self.owner, level)?
                }
            };
            let header = Header {
                csum: [0; 32],
                fsid: self.reader.fsid(),
                bytenr,
                flags: HEADER_FLAG_WRITTEN | (MIXED_BACKREF_REV << 56),
                chunk_tree_uuid: self.chunk_tree_uuid,
                generation: transid,
                owner: self.owner,
                nritems: 0,
                level,
            };
            let key = piece.first_key().unwrap_or_default();
            let node = Node::build(&header, &piece, self.reader.nodesize())?;
            self.reader.put_dirty(Arc::new(node));
            out.push(KeyPtr {
                key,
                blockptr: bytenr,
                generation: transid,
            });
        }
        Ok(out)
    }

    /// Cut `body` into blocks that fit, halving at the middle of its bytes.
    fn split(&self, body: Body) -> Vec<Body> {
        let cap = self.capacity();
        if body.used() <= cap || body.len() < 2 {
            return vec![body];
        }
        let half = body.used() / 2;
        let (a, b) = match body {
            Body::Leaf(mut items) => {
                let mut acc = 0;
                let mut at = items.len() - 1;
                for (i, (_, d)) in items.iter().enumerate() {
                    acc += ITEM_SIZE + d.len();
                    if acc >= half {
                        at = (i + 1).clamp(1, items.len() - 1);
                        break;
                    }
                }
                let right = items.split_off(at);
                (Body::Leaf(items), Body::Leaf(right))
            }
            Body::Internal(mut ptrs) => {
                let at = (half / KEY_PTR_SIZE).clamp(1, ptrs.len() - 1);
                let right = ptrs.split_off(at);
                (Body::Internal(ptrs), Body::Internal(right))
            }
        };
        let mut out = self.split(a);
        out.extend(self.split(b));
        out
    }

    /// Insert a new item; fails if the key exists.
    pub fn insert(&mut self, root: &mut RootPtr, key: Key, data: Vec<u8>) -> Result<()> {
        self.edit(root, &key, |items| {
            match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(_) => Err(Error::Invalid(format!("item {key} already exists"))),
                Err(pos) => {
                    items.insert(pos, (key, data));
                    Ok(())
                }
            }
        })
    }

    /// Insert or overwrite an item.
    pub fn put(&mut self, root: &mut RootPtr, key: Key, data: Vec<u8>) -> Result<()> {
        self.edit(root, &key, |items| {
            match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(pos) => items[pos].1 = data,
                Err(pos) => items.insert(pos, (key, data)),
            }
            Ok(())
        })
    }

    /// Delete an item; returns its data, or `None` if it did not exist.
    pub fn delete(&mut self, root: &mut RootPtr, key: Key) -> Result<Option<Vec<u8>>> {
        self.edit(root, &key, |items| {
            Ok(match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(pos) => Some(items.remove(pos).1),
                Err(_) => None,
            })
        })
    }

    /// Change an existing item's data in place with `f`; `None` if absent.
    pub fn update<R>(
        &mut self,
        root: &mut RootPtr,
        key: Key,
        f: impl FnOnce(&mut Vec<u8>) -> Result<R>,
    ) -> Result<Option<R>> {
        self.edit(root, &key, |items| {
            match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(pos) => f(&mut items[pos].1).map(Some),
                Err(_) => Ok(None),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Counters, Device};
    use crate::format::consts::*;
    use crate::format::items::{ChunkItem, Stripe};
    use crate::format::superblock::Superblock;
    use crate::volume::{ChunkMap, DeviceSet, Volume};
    use std::collections::{BTreeMap, HashSet};
    use std::path::Path;

    struct NullDevice(Counters);
    impl Device for NullDevice {
        fn path(&self) -> &Path {
            Path::new("null")
        }
        fn size(&self) -> u64 {
            1 << 40
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> Result<()> {
            Err(Error::Invalid("test device holds nothing".into()))
        }
        fn write_at(&self, _: u64, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
        fn write_fua(&self, _: u64, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn counters(&self) -> &Counters {
            &self.0
        }
    }

    /// Hands out consecutive addresses and tracks which are live.
    struct Blocks {
        transid: u64,
        next: u64,
        nodesize: u64,
        live: HashSet<u64>,
    }

    impl BlockSource for Blocks {
        fn transid(&self) -> u64 {
            self.transid
        }
        fn alloc_tree_block(&mut self, _owner: u64, _level: u8) -> Result<u64> {
            let b = self.next;
            self.next += self.nodesize;
            self.live.insert(b);
            Ok(b)
        }
        fn free_tree_block(
            &mut self,
            bytenr: u64,
            _owner: u64,
            _level: u8,
            _generation: u64,
        ) -> Result<()> {
            assert!(self.live.remove(&bytenr), "double free of {bytenr}");
            Ok(())
        }
    }

    fn reader(nodesize: u32) -> TreeReader {
        // A superblock with just what the reader needs.
        let mut raw = vec![0u8; 4096];
        raw[0x40..0x48].copy_from_slice(&BTRFS_MAGIC.to_le_bytes());
        raw[0x30..0x38].copy_from_slice(&0x10000u64.to_le_bytes());
        raw[0x48..0x50].copy_from_slice(&1u64.to_le_bytes());
        raw[0x90..0x94].copy_from_slice(&4096u32.to_le_bytes());
        raw[0x94..0x98].copy_from_slice(&nodesize.to_le_bytes());
        let c = CsumType::Crc32c.compute(&raw[32..]);
        raw[..32].copy_from_slice(&c);
        let sb = Superblock::parse(&raw, 0x10000).unwrap();
        let dev: Arc<dyn Device> = Arc::new(NullDevice(Counters::default()));
        let set = DeviceSet::with_superblock(vec![(1, dev)], sb.clone());
        let chunks = ChunkMap::default();
        chunks
            .insert(
                0,
                ChunkItem {
                    length: 1 << 40,
                    owner: 2,
                    stripe_len: STRIPE_LEN,
                    chunk_type: BLOCK_GROUP_METADATA,
                    io_align: 4096,
                    io_width: 4096,
                    sector_size: 4096,
                    sub_stripes: 1,
                    stripes: vec![Stripe {
                        devid: 1,
                        offset: 0,
                        dev_uuid: [0; 16],
                    }],
                },
            )
            .unwrap();
        TreeReader::new(
            Arc::new(Volume {
                devices: set,
                chunks,
            }),
            &sb,
        )
    }

    use crate::format::CsumType;

    fn check_tree(
        r: &TreeReader,
        root: RootPtr,
        model: &BTreeMap<Key, Vec<u8>>,
        live: &HashSet<u64>,
    ) {
        let tree = r.tree(root);
        let got: Vec<(Key, Vec<u8>)> = tree
            .range(Key::MIN, Key::MAX)
            .unwrap()
            .map(|i| {
                let i = i.unwrap();
                (i.key(), i.data().to_vec())
            })
            .collect();
        let want: Vec<(Key, Vec<u8>)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "tree differs from model");
        let mut seen = HashSet::new();
        tree.walk(&mut |n| {
            assert!(seen.insert(n.header.bytenr));
            assert!(
                live.contains(&n.header.bytenr),
                "block {} not live",
                n.header.bytenr
            );
            if root.bytenr != n.header.bytenr {
                assert!(n.nritems() > 0, "empty non-root block");
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), live.len(), "leaked blocks");
        for k in model.keys().step_by(7) {
            assert_eq!(tree.get(k).unwrap().unwrap().data(), &model[k][..]);
        }
    }

    #[test]
    fn random_edits_match_a_model() {
        for nodesize in [4096u32, 16384] {
            let r = reader(nodesize);
            let mut blocks = Blocks {
                transid: 1,
                next: 1 << 20,
                nodesize: nodesize as u64,
                live: HashSet::new(),
            };
            let mut root = {
                let mut ed = TreeEditor::new(&r, &mut blocks, 5, [0; 16]);
                let ptrs = ed.write_blocks(None, 0, Body::Leaf(Vec::new())).unwrap();
                RootPtr {
                    bytenr: ptrs[0].blockptr,
                    level: 0,
                    generation: Some(1),
                }
            };
            let mut model = BTreeMap::new();
            let mut max_level = 0;
            let mut x: u64 = 0x1234_5678 + nodesize as u64;
            let mut rnd = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for step in 0..6000u64 {
                if step % 1500 == 0 {
                    // A new transaction: every block is copied on its next change.
                    blocks.transid += 1;
                    r.commit_done(blocks.transid - 1);
                }
                let key = Key::new(rnd() % 400, (rnd() % 3) as u8, rnd() % 8);
                let op = rnd() % 10;
                let mut ed = TreeEditor::new(&r, &mut blocks, 5, [0; 16]);
                if op < 6 || step < 500 {
                    let len = (rnd() % 300) as usize;
                    let data = vec![(step % 251) as u8; len];
                    ed.put(&mut root, key, data.clone()).unwrap();
                    model.insert(key, data);
                } else {
                    let got = ed.delete(&mut root, key).unwrap();
                    assert_eq!(got, model.remove(&key));
                }
                max_level = max_level.max(root.level);
                if step % 500 == 499 {
                    check_tree(&r, root, &model, &blocks.live);
                }
            }
            assert!(
                max_level >= if nodesize == 4096 { 2 } else { 1 },
                "tree stayed at level {max_level}"
            );
            // Delete everything: the tree shrinks back to one empty leaf.
            let keys: Vec<Key> = model.keys().copied().collect();
            for k in keys {
                TreeEditor::new(&r, &mut blocks, 5, [0; 16])
                    .delete(&mut root, k)
                    .unwrap();
                model.remove(&k);
            }
            check_tree(&r, root, &model, &blocks.live);
            assert_eq!(root.level, 0);
            assert_eq!(blocks.live.len(), 1);
        }
    }

    #[test]
    fn oversized_item_is_refused() {
        let r = reader(4096);
        let mut blocks = Blocks {
            transid: 1,
            next: 1 << 20,
            nodesize: 4096,
            live: HashSet::new(),
        };
        let mut ed = TreeEditor::new(&r, &mut blocks, 5, [0; 16]);
        let ptrs = ed.write_blocks(None, 0, Body::Leaf(Vec::new())).unwrap();
        let mut root = RootPtr {
            bytenr: ptrs[0].blockptr,
            level: 0,
            generation: Some(1),
        };
        assert!(ed.insert(&mut root, Key::MIN, vec![0; 4000]).is_err());
        ed.insert(&mut root, Key::MIN, vec![0; 100]).unwrap();
        assert!(ed.insert(&mut root, Key::MIN, vec![0; 100]).is_err());
    }
}

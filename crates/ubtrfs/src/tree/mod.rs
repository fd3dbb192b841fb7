//! B-trees: verified block reads, a node cache, search and iteration.

pub mod cow;
mod node_cache;

mod read_ahead;

pub use cow::{BlockSource, Leaf, TreeEditor};
use node_cache::AddrMap;
pub use node_cache::NodeCache;
use read_ahead::ReadAhead;

use crate::format::node::{Expect, Node};
use crate::format::superblock::Superblock;
use crate::format::{CsumType, Key};
use crate::volume::Volume;
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Where a tree's root block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootPtr {
    /// Logical address of the root block.
    pub bytenr: u64,
    /// Level of the root block.
    pub level: u8,
    /// Generation of the root block, when the pointer records it.
    pub generation: Option<u64>,
}

/// Reads and verifies tree blocks, trying every copy, through a cache.
pub struct TreeReader {
    volume: Arc<Volume>,
    cache: Arc<NodeCache>,
    csum_type: CsumType,
    fsid: [u8; 16],
    /// The ids blocks read may carry: `fsid`, then the seeds'.
    fsids: Arc<[[u8; 16]]>,
    nodesize: usize,
    super_generation: Arc<AtomicU64>,
    /// Blocks written by the running transaction, not yet on disk. Reads
    /// see them first.
    dirty: Arc<RwLock<AddrMap<Arc<Node>>>>,
    /// Leaves read ahead of scans, when switched on.
    ahead: Option<ReadAhead>,
    /// Blocks read from the devices because a lookup wanted them (not
    /// ahead of it).
    blocks_read: AtomicU64,
    /// Blocks read whose copies before the good one were bad, for a
    /// writable filesystem to mend (see [`TreeReader::want_mends`]).
    bad_copies: std::sync::Mutex<Vec<BadTreeCopies>>,
    mends_wanted: std::sync::atomic::AtomicBool,
}

/// A tree block found bad in copies `mirrors` and good in a later one.
#[derive(Clone, Debug)]
pub struct BadTreeCopies {
    pub expect: Expect,
    pub mirrors: Vec<usize>,
}

/// At most this many blocks wait to be mended (a damaged device read
/// all over would otherwise fill memory with them).
const MAX_BAD_COPIES: usize = 4096;

impl TreeReader {
    /// A reader for the filesystem described by `sb` on `volume`.
    pub fn new(volume: Arc<Volume>, sb: &Superblock) -> Self {
        let nodesize = sb.nodesize as usize;
        let mut fsids = volume.devices.tree_fsids();
        fsids[0] = sb.tree_fsid();
        TreeReader {
            fsids: fsids.into(),
            volume,
            cache: Arc::new(NodeCache::new((64 << 20) / nodesize)),
            csum_type: sb.csum_type,
            fsid: sb.tree_fsid(),
            nodesize,
            super_generation: Arc::new(AtomicU64::new(sb.generation)),
            dirty: Arc::new(RwLock::new(AddrMap::default())),
            ahead: None,
            blocks_read: AtomicU64::new(0),
            bad_copies: Default::default(),
            mends_wanted: Default::default(),
        }
    }

    /// Keep the blocks read whose first copies were bad, for
    /// [`TreeReader::take_bad_copies`] (a writable filesystem mends them).
    pub fn want_mends(&self) {
        self.mends_wanted.store(true, Ordering::Relaxed);
    }

    /// The blocks found with bad copies since the last call.
    pub fn take_bad_copies(&self) -> Vec<BadTreeCopies> {
        std::mem::take(&mut *self.bad_copies.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Read leaves ahead of scans on a thread of its own: when a leaf not
    /// in memory follows the last one read, the leaves after it under the
    /// same parent are read too, so a walk in key order (a listing, the
    /// lookups of one directory's files) finds them in memory, as the
    /// kernel's forward readahead does.
    pub fn with_read_ahead(mut self) -> Self {
        self.ahead = Some(ReadAhead::new(read_ahead::Target {
            volume: self.volume.clone(),
            cache: self.cache.clone(),
            dirty: self.dirty.clone(),
            super_generation: self.super_generation.clone(),
            csum_type: self.csum_type,
            fsids: self.fsids.clone(),
            nodesize: self.nodesize,
        }));
        self
    }

    /// Whether leaves asked for by readahead are still being read (a
    /// caller measuring I/O waits for this to turn false).
    pub fn reading_ahead(&self) -> bool {
        self.ahead.as_ref().is_some_and(|a| a.busy())
    }

    /// Blocks read from the devices because a lookup needed them, not
    /// ahead of it: what reading ahead spares shows here.
    pub fn blocks_read(&self) -> u64 {
        self.blocks_read.load(Ordering::Relaxed)
    }

    /// Node size of the filesystem.
    pub fn nodesize(&self) -> usize {
        self.nodesize
    }

    /// Checksum type of the filesystem.
    pub fn csum_type(&self) -> CsumType {
        self.csum_type
    }

    /// The fsid stamped in tree blocks.
    pub fn fsid(&self) -> [u8; 16] {
        self.fsid
    }

    /// The fsids blocks read may carry: [`Self::fsid`], then those of the
    /// seeds the filesystem was sprouted from.
    pub fn fsids(&self) -> &[[u8; 16]] {
        &self.fsids
    }

    /// Record a block written by the running transaction.
    pub fn put_dirty(&self, node: Arc<Node>) {
        let bytenr = node.header.bytenr;
        let was_dirty = self
            .dirty
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(bytenr, node)
            .is_some();
        // The address may have held another block before it was freed (a
        // block rewritten in place was dropped from the cache already).
        if !was_dirty {
            self.cache.remove(bytenr);
        }
    }

    /// Forget a dirty block that was freed in the same transaction.
    pub fn drop_dirty(&self, bytenr: u64) -> bool {
        self.dirty
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&bytenr)
            .is_some()
    }

    /// Whether `bytenr` was written by the running transaction.
    pub fn is_dirty(&self, bytenr: u64) -> bool {
        self.dirty
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&bytenr)
    }

    /// Every dirty block, by address (for the commit to write).
    pub fn dirty_blocks(&self) -> Vec<Arc<Node>> {
        let mut v: Vec<Arc<Node>> = self
            .dirty
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|n| n.header.bytenr);
        v
    }

    /// After a commit: the dirty blocks are on disk; keep them as clean
    /// cached blocks and raise the generation bound.
    pub fn commit_done(&self, generation: u64) {
        let dirty = std::mem::take(&mut *self.dirty.write().unwrap_or_else(|e| e.into_inner()));
        for (bytenr, node) in dirty {
            self.cache.insert(bytenr, node);
        }
        self.super_generation_set(generation);
    }

    fn super_generation_set(&self, generation: u64) {
        self.super_generation.store(generation, Ordering::Relaxed);
    }

    /// The volume blocks are read from.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.volume
    }

    /// Read the block `expect` describes; a copy that fails verification is
    /// skipped for the next one. Fails only if no copy is good.
    pub fn read_node(&self, expect: &Expect) -> Result<Arc<Node>> {
        match self.cached_block(expect)? {
            Some(node) => Ok(node),
            None => self.read_from_disk(expect),
        }
    }

    /// The block `expect` describes, if it is in memory. A cached block
    /// that does not match the pointer is dropped, to be read again: an
    /// address read ahead may have been rewritten since (its new block
    /// evicted). A dirty one that does not match is an error.
    fn cached_block(&self, expect: &Expect) -> Result<Option<Arc<Node>>> {
        let dirty = self
            .dirty
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&expect.bytenr)
            .cloned();
        if let Some(node) = dirty {
            node.check_expect(expect)
                .map_err(|why| Error::BadTreeBlock {
                    logical: expect.bytenr,
                    why,
                })?;
            return Ok(Some(node));
        }
        let Some(node) = self.cache.get(expect.bytenr) else {
            return Ok(None);
        };
        if node.check_expect(expect).is_ok() {
            return Ok(Some(node));
        }
        self.cache.remove_if(expect.bytenr, &node);
        Ok(None)
    }

    /// Read the block `expect` describes from its copies, the first good
    /// one cached.
    fn read_from_disk(&self, expect: &Expect) -> Result<Arc<Node>> {
        let copies = self.volume.num_copies(expect.bytenr)?;
        self.blocks_read.fetch_add(1, Ordering::Relaxed);
        let mut problems = Vec::new();
        let mut bad = Vec::new();
        for mirror in 0..copies {
            if !self.volume.copy_present(expect.bytenr, mirror) {
                problems.push(format!("copy {mirror}: device missing"));
                continue;
            }
            let mut buf = vec![0u8; self.nodesize].into_boxed_slice();
            if let Err(e) = self.volume.read_copy(expect.bytenr, mirror, &mut buf) {
                problems.push(format!("copy {mirror}: {e}"));
                bad.push(mirror);
                continue;
            }
            match Node::parse(
                buf,
                self.csum_type,
                &self.fsids,
                expect,
                self.super_generation.load(Ordering::Relaxed),
            ) {
                Ok(node) => {
                    let node = Arc::new(node);
                    self.cache.insert(expect.bytenr, node.clone());
                    if !bad.is_empty() && self.mends_wanted.load(Ordering::Relaxed) {
                        let mut held = self.bad_copies.lock().unwrap_or_else(|e| e.into_inner());
                        if held.len() < MAX_BAD_COPIES {
                            held.push(BadTreeCopies {
                                expect: *expect,
                                mirrors: bad,
                            });
                        }
                    }
                    return Ok(node);
                }
                Err(why) => {
                    problems.push(format!("copy {mirror}: {why}"));
                    bad.push(mirror);
                }
            }
        }
        Err(Error::BadTreeBlock {
            logical: expect.bytenr,
            why: problems.join("; "),
        })
    }

    /// The tree rooted at `root`.
    pub fn tree(&self, root: RootPtr) -> Tree<'_> {
        Tree { reader: self, root }
    }
}

/// A leaf item held by a reference to its block.
#[derive(Clone)]
pub struct ItemRef {
    node: Arc<Node>,
    slot: usize,
}

impl ItemRef {
    /// The item's key.
    pub fn key(&self) -> Key {
        self.node.key(self.slot)
    }

    /// The item's data.
    pub fn data(&self) -> &[u8] {
        self.node.item(self.slot).data
    }

    /// The leaf holding the item.
    pub fn leaf(&self) -> &Arc<Node> {
        &self.node
    }
}

impl std::fmt::Debug for ItemRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ItemRef({} in {})", self.key(), self.node.header.bytenr)
    }
}

/// One B-tree, read through a [`TreeReader`].
#[derive(Clone, Copy)]
pub struct Tree<'a> {
    reader: &'a TreeReader,
    root: RootPtr,
}

/// Leaves read ahead after a leaf that was not in memory.
const READ_AHEAD_LEAVES: usize = 8;

/// Whether blocks owned by `owner` belong to a subvolume's tree: the
/// trees read in key order (listings, a directory's lookups). Only those
/// are read ahead: the checksum tree is read beside a file's data, and
/// leaves read ahead there cost a long read of data more than they save.
fn is_subvolume_tree(owner: u64) -> bool {
    use crate::format::consts::{FIRST_FREE_OBJECTID, FS_TREE_OBJECTID};
    owner == FS_TREE_OBJECTID || (FIRST_FREE_OBJECTID..u64::MAX - 256).contains(&owner)
}

/// What the block under pointer `slot` of internal `node` must be.
fn child_expect(node: &Node, slot: usize) -> Expect {
    let ptr = node.key_ptr(slot);
    Expect {
        bytenr: ptr.blockptr,
        generation: Some(ptr.generation),
        level: Some(node.level() - 1),
        first_key: Some(ptr.key),
    }
}

/// How to pick the slot in a node while descending.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Find {
    /// First item with key >= target.
    Ge,
    /// Last item with key <= target.
    Le,
}

impl<'a> Tree<'a> {
    /// The root pointer.
    pub fn root(&self) -> RootPtr {
        self.root
    }

    fn root_node(&self) -> Result<Arc<Node>> {
        self.reader.read_node(&Expect {
            bytenr: self.root.bytenr,
            generation: self.root.generation,
            level: Some(self.root.level),
            first_key: None,
        })
    }

    fn child(&self, node: &Node, slot: usize) -> Result<Arc<Node>> {
        let expect = child_expect(node, slot);
        let reader = self.reader;
        let Some(ahead) = reader
            .ahead
            .as_ref()
            .filter(|_| node.level() == 1 && is_subvolume_tree(node.header.owner))
        else {
            return reader.read_node(&expect);
        };
        // A leaf read ahead and used now for the first time, or one not in
        // memory that follows the last leaf read: a walk in key order
        // wants the leaves after it next.
        let ask = || {
            let next = slot + 1..node.nritems().min(slot + 1 + READ_AHEAD_LEAVES);
            ahead.ask(
                next.map(|s| child_expect(node, s))
                    .filter(|e| !reader.cache.contains(e.bytenr) && !reader.is_dirty(e.bytenr)),
            );
        };
        match reader.cached_block(&expect)? {
            Some(leaf) => {
                if ahead.first_use(expect.bytenr) {
                    ahead.used_ahead(node, slot);
                    ask();
                }
                Ok(leaf)
            }
            None => {
                if ahead.cold_read(node, slot) {
                    ask();
                }
                reader.read_from_disk(&expect)
            }
        }
    }

    /// Descend to the leaf for `key`, returning the path (root first) with
    /// the slot taken in each node.
    fn descend(&self, key: &Key, find: Find) -> Result<Vec<(Arc<Node>, usize)>> {
        let mut path = Vec::new();
        let mut node = self.root_node()?;
        loop {
            if node.is_leaf() {
                let slot = match find {
                    Find::Le => node.slot_le(key).map_or(usize::MAX, |s| s),
                    Find::Ge => match node.slot_le(key) {
                        Some(s) if node.key(s) == *key => s,
                        Some(s) => s + 1,
                        None => 0,
                    },
                };
                path.push((node, slot));
                return Ok(path);
            }
            if node.nritems() == 0 {
                return Err(Error::BadTreeBlock {
                    logical: node.header.bytenr,
                    why: "internal node with no pointers".into(),
                });
            }
            let slot = node.slot_le(key).unwrap_or(0);
            let child = self.child(&node, slot)?;
            path.push((node, slot));
            node = child;
        }
    }

    /// The item with exactly `key`.
    pub fn get(&self, key: &Key) -> Result<Option<ItemRef>> {
        Ok(self.get_le(key)?.filter(|it| it.key() == *key))
    }

    /// The last item with a key <= `key`.
    pub fn get_le(&self, key: &Key) -> Result<Option<ItemRef>> {
        let mut path = self.descend(key, Find::Le)?;
        let (leaf, slot) = path
            .pop()
            .ok_or_else(|| Error::corrupt("empty tree path"))?;
        if slot != usize::MAX {
            return Ok(Some(ItemRef { node: leaf, slot }));
        }
        // Every key of this leaf is greater; only possible at the far left.
        Ok(None)
    }

    /// Items with keys in `start..=end`, in order.
    pub fn range(&self, start: Key, end: Key) -> Result<TreeIter<'a>> {
        let path = self.descend(&start, Find::Ge)?;
        Ok(TreeIter {
            tree: *self,
            path,
            end,
            done: false,
        })
    }

    /// The leaves holding keys in `start..=end`, in order (the first may
    /// hold only keys before `start`). A leaf changed since is a new
    /// block, so holding these tells later which ones changed.
    pub fn leaves(&self, start: Key, end: Key) -> Result<Vec<Arc<Node>>> {
        let mut it = self.range(start, end)?;
        let mut out = Vec::new();
        loop {
            match it.path.last() {
                Some((leaf, _)) => out.push(leaf.clone()),
                None => return Ok(out),
            }
            if !it.next_leaf()? {
                return Ok(out);
            }
        }
    }

    /// Every item whose objectid and type are given (any offset).
    pub fn items_of(&self, objectid: u64, item_type: u8) -> Result<TreeIter<'a>> {
        self.range(
            Key::new(objectid, item_type, 0),
            Key::new(objectid, item_type, u64::MAX),
        )
    }

    /// Call `f` on every block of the tree, parents before children, in key order.
    pub fn walk(&self, f: &mut dyn FnMut(&Node) -> Result<()>) -> Result<()> {
        let root = self.root_node()?;
        self.walk_node(&root, f)
    }

    fn walk_node(&self, node: &Arc<Node>, f: &mut dyn FnMut(&Node) -> Result<()>) -> Result<()> {
        f(node)?;
        if !node.is_leaf() {
            for slot in 0..node.nritems() {
                let child = self.child(node, slot)?;
                self.walk_node(&child, f)?;
            }
        }
        Ok(())
    }
}

/// Iterator over a key range of a tree.
pub struct TreeIter<'a> {
    tree: Tree<'a>,
    path: Vec<(Arc<Node>, usize)>,
    end: Key,
    done: bool,
}

impl TreeIter<'_> {
    /// Move to the next leaf; false at the end of the tree.
    fn next_leaf(&mut self) -> Result<bool> {
        // Climb until a node has a slot to the right.
        self.path.pop();
        loop {
            let Some((node, slot)) = self.path.last_mut() else {
                return Ok(false);
            };
            if *slot + 1 < node.nritems() {
                // Every key under the next pointer is >= its key: past the
                // end, stop without reading blocks the range does not need.
                if node.key(*slot + 1) > self.end {
                    return Ok(false);
                }
                *slot += 1;
                break;
            }
            self.path.pop();
        }
        // Descend along leftmost children.
        loop {
            let (node, slot) = self
                .path
                .last()
                .cloned()
                .ok_or_else(|| Error::corrupt("empty path"))?;
            let child = self.tree.child(&node, slot)?;
            let leaf = child.is_leaf();
            self.path.push((child, 0));
            if leaf {
                return Ok(true);
            }
        }
    }

    fn advance(&mut self) -> Result<Option<ItemRef>> {
        if self.done {
            return Ok(None);
        }
        loop {
            let Some((leaf, slot)) = self.path.last_mut() else {
                self.done = true;
                return Ok(None);
            };
            if *slot < leaf.nritems() {
                let item = ItemRef {
                    node: leaf.clone(),
                    slot: *slot,
                };
                *slot += 1;
                if item.key() > self.end {
                    self.done = true;
                    return Ok(None);
                }
                return Ok(Some(item));
            }
            if !self.next_leaf()? {
                self.done = true;
                return Ok(None);
            }
        }
    }
}

impl Iterator for TreeIter<'_> {
    type Item = Result<ItemRef>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.advance() {
            Ok(Some(item)) => Some(Ok(item)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

//! Extent references: walk every tree once, note who references each tree
//! block and data extent, and match that against the extent tree.
//!
//! A reference is named the way the extent tree names it: a block or a
//! file extent item in a block flagged FULL_BACKREF is referenced by that
//! parent block (shared refs); in any other block, by the block's owner
//! (tree block refs, and data refs by root, inode and file offset). A
//! block reached from several parents is walked once: the references of
//! what is below it are its own, whoever reaches it.

use super::{CheckArea, CheckReport};
use crate::Result;
use crate::alloc::delayed_ref::{BlockRef, DataOwner, DataRef};
use crate::alloc::extent_tree::{
    AnyRef, ChildRef, ExtentItem, Holder, Inline, child_refs, data_ref_hash,
};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::RootItem;
use crate::format::le;
use crate::format::node::Expect;
use crate::fs::Filesystem;
use crate::tree::RootPtr;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One extent item, with the references declared in the extent tree and
/// those found in the trees.
#[derive(Debug, Default)]
pub(super) struct ExtentRecord {
    /// Bytes it covers (the node size for a tree block).
    pub len: u64,
    /// A tree block, not data.
    pub tree_block: bool,
    /// The item's flags.
    pub flags: u64,
    /// The block's level, where the item records it.
    pub level: Option<u8>,
    /// The item's reference count.
    pub refs: u64,
    /// Back references in the extent tree, with their counts.
    pub declared: HashMap<AnyRef, u64>,
    /// References found in the trees.
    pub found: HashMap<AnyRef, u64>,
}

/// The extent tree as the check read it.
#[derive(Debug, Default)]
pub(super) struct Extents {
    /// Extent items by start.
    pub records: BTreeMap<u64, ExtentRecord>,
    /// Whether the whole extent tree was read (else comparisons that need
    /// all of it are left out).
    pub complete: bool,
}

impl Extents {
    /// The data extent holding `addr`, as (start, len).
    pub fn data_extent_at(&self, addr: u64) -> Option<(u64, u64)> {
        // Addresses referenced without an item are in the map too: skip them.
        self.records
            .range(..=addr)
            .rev()
            .find(|(_, r)| r.refs != u64::MAX)
            .filter(|(s, r)| !r.tree_block && addr < s.saturating_add(r.len))
            .map(|(s, r)| (*s, r.len))
    }
}

/// Read the extent tree, walk every tree, and compare.
pub(super) fn check(fs: &Filesystem, report: &mut CheckReport) -> Result<Extents> {
    let nodesize = fs.superblock().nodesize as u64;
    let mut extents = load(fs, nodesize, report);
    let mut walk = Walk {
        fs,
        visited: HashSet::new(),
        unsure: false,
    };
    let sb = fs.superblock();
    walk.tree(
        ROOT_TREE_OBJECTID,
        RootPtr {
            bytenr: sb.root,
            level: sb.root_level,
            generation: Some(sb.generation),
        },
        None,
        &mut extents,
        report,
    );
    walk.tree(
        CHUNK_TREE_OBJECTID,
        RootPtr {
            bytenr: sb.chunk_root,
            level: sb.chunk_root_level,
            generation: Some(sb.chunk_root_generation),
        },
        None,
        &mut extents,
        report,
    );
    let mut roots = Vec::new();
    for item in fs.root_tree().range(Key::MIN, Key::MAX)? {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                report.problem(CheckArea::TreeBlocks, format!("root tree: {e}"));
                walk.unsure = true;
                break;
            }
        };
        let key = item.key();
        if key.item_type != ROOT_ITEM_KEY {
            continue;
        }
        match RootItem::parse(item.data()) {
            Ok(r) => roots.push((key, r)),
            Err(e) => report.problem(CheckArea::TreeBlocks, format!("root item {key}: {e}")),
        }
    }
    for (key, r) in roots {
        // A deletion the cleaner stopped half way has dropped the
        // references of everything before its drop progress key.
        let dropped_before =
            (r.refs == 0 && r.drop_progress.objectid != 0).then_some(r.drop_progress);
        walk.tree(
            key.objectid,
            RootPtr {
                bytenr: r.bytenr,
                level: r.level,
                generation: Some(r.generation),
            },
            dropped_before,
            &mut extents,
            report,
        );
    }
    if sb.log_root != 0 {
        report.notes.push(
            "a log tree is present (fsyncs since the last commit): it is replayed at the next read-write open; its blocks are not checked".into(),
        );
    }
    report.tree_blocks = walk.visited.len() as u64;
    if extents.complete && !walk.unsure {
        compare(&extents, report);
    }
    block_group_usage(fs, &extents, report)?;
    Ok(extents)
}

/// Read every extent item and keyed back reference.
fn load(fs: &Filesystem, nodesize: u64, report: &mut CheckReport) -> Extents {
    let mut out = Extents::default();
    let tree = match fs.tree_by_id(EXTENT_TREE_OBJECTID) {
        Ok(t) => t,
        Err(e) => {
            report.problem(CheckArea::ExtentRefs, format!("extent tree: {e}"));
            return out;
        }
    };
    let iter = match tree.range(Key::MIN, Key::MAX) {
        Ok(i) => i,
        Err(e) => {
            report.problem(CheckArea::TreeBlocks, format!("extent tree: {e}"));
            return out;
        }
    };
    let mut last_end = 0u64;
    for item in iter {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                report.problem(CheckArea::TreeBlocks, format!("extent tree: {e}"));
                return out;
            }
        };
        let key = item.key();
        let bytenr = key.objectid;
        match key.item_type {
            EXTENT_ITEM_KEY | METADATA_ITEM_KEY => {
                let e = match ExtentItem::parse(item.data(), key.item_type) {
                    Ok(e) => e,
                    Err(e) => {
                        report.problem(CheckArea::ExtentRefs, format!("extent item {key}: {e}"));
                        continue;
                    }
                };
                let tree_block = e.flags & EXTENT_FLAG_TREE_BLOCK != 0;
                let (len, level) = if key.item_type == METADATA_ITEM_KEY {
                    (nodesize, u8::try_from(key.offset).ok())
                } else {
                    let level = e.info.as_ref().and_then(|i| i.last().copied());
                    (key.offset, level)
                };
                if (key.item_type == METADATA_ITEM_KEY || tree_block) && len != nodesize {
                    report.problem(
                        CheckArea::ExtentRefs,
                        format!("tree block extent {bytenr} is {len} bytes, not the node size {nodesize}"),
                    );
                }
                if key.item_type == METADATA_ITEM_KEY && !tree_block {
                    report.problem(
                        CheckArea::ExtentRefs,
                        format!("metadata item {bytenr} is not flagged as a tree block"),
                    );
                }
                if e.flags & (EXTENT_FLAG_DATA | EXTENT_FLAG_TREE_BLOCK) == 0 {
                    report.problem(
                        CheckArea::ExtentRefs,
                        format!("extent {bytenr} is flagged neither data nor tree block"),
                    );
                }
                if bytenr < last_end {
                    report.problem(
                        CheckArea::ExtentRefs,
                        format!("extent {bytenr}+{len} overlaps the extent before it (which ends at {last_end})"),
                    );
                }
                last_end = last_end.max(bytenr.saturating_add(len));
                let mut rec = ExtentRecord {
                    len,
                    tree_block: tree_block || key.item_type == METADATA_ITEM_KEY,
                    flags: e.flags,
                    level,
                    refs: e.refs,
                    ..Default::default()
                };
                for i in &e.inline {
                    if let Inline::Ref(r, count) = i {
                        *rec.declared.entry(*r).or_default() += *count as u64;
                    }
                }
                if out.records.insert(bytenr, rec).is_some() {
                    report.problem(
                        CheckArea::ExtentRefs,
                        format!("extent {bytenr} has two extent items"),
                    );
                }
            }
            TREE_BLOCK_REF_KEY | SHARED_BLOCK_REF_KEY | EXTENT_DATA_REF_KEY
            | SHARED_DATA_REF_KEY => {
                let Some(r) = keyed_ref(key, item.data(), report) else {
                    continue;
                };
                match out.records.get_mut(&bytenr) {
                    Some(rec) => *rec.declared.entry(r.0).or_default() += r.1,
                    None => report.problem(
                        CheckArea::ExtentRefs,
                        format!("back reference {key} with no extent item {bytenr}"),
                    ),
                }
            }
            _ => {}
        }
    }
    report.extents = out.records.len() as u64;
    out.complete = true;
    out
}

/// A keyed back reference item and its count.
fn keyed_ref(key: Key, b: &[u8], report: &mut CheckReport) -> Option<(AnyRef, u64)> {
    let parsed = match key.item_type {
        TREE_BLOCK_REF_KEY => Ok((AnyRef::Block(BlockRef::Root(key.offset)), 1)),
        SHARED_BLOCK_REF_KEY => Ok((AnyRef::Block(BlockRef::Parent(key.offset)), 1)),
        SHARED_DATA_REF_KEY => {
            le::u32(b, 0).map(|c| (AnyRef::Data(DataRef::Parent(key.offset)), c as u64))
        }
        _ => (|| {
            let owner = DataOwner {
                root: le::u64(b, 0)?,
                objectid: le::u64(b, 8)?,
                offset: le::u64(b, 16)?,
            };
            if data_ref_hash(&owner) != key.offset {
                report.problem(
                    CheckArea::ExtentRefs,
                    format!(
                        "data back reference {key}: its key offset is not the hash of root {} inode {} offset {}",
                        owner.root, owner.objectid, owner.offset
                    ),
                );
            }
            Ok((AnyRef::Data(DataRef::Root(owner)), le::u32(b, 24)? as u64))
        })(),
    };
    match parsed {
        Ok(r) => Some(r),
        Err(e) => {
            report.problem(CheckArea::ExtentRefs, format!("back reference {key}: {e}"));
            None
        }
    }
}

/// The walk over every tree.
struct Walk<'a> {
    fs: &'a Filesystem,
    /// Blocks walked already.
    visited: HashSet<u64>,
    /// Some references could not be found (a tree unreadable, or being
    /// deleted): comparing would report what is not wrong.
    unsure: bool,
}

impl Walk<'_> {
    /// Walk tree `id` from `root`. With `dropped_before` (a deletion
    /// stopped half way), children whose keys all lie before that key are
    /// gone from the tree's references and are not walked.
    fn tree(
        &mut self,
        id: u64,
        root: RootPtr,
        dropped_before: Option<Key>,
        ex: &mut Extents,
        report: &mut CheckReport,
    ) {
        report.trees += 1;
        add_found(ex, root.bytenr, AnyRef::Block(BlockRef::Root(id)));
        // Each block with the first key after its own range (None: the
        // end of the tree).
        let mut stack = vec![(
            Expect {
                bytenr: root.bytenr,
                generation: root.generation,
                level: Some(root.level),
                first_key: None,
            },
            None::<Key>,
        )];
        while let Some((expect, upper)) = stack.pop() {
            if !self.visited.insert(expect.bytenr) {
                continue;
            }
            let node = match self.fs.tree_reader().read_node(&expect) {
                Ok(n) => n,
                Err(e) => {
                    report.problem(
                        CheckArea::TreeBlocks,
                        format!("tree {}: block {}: {e}", tree_name(id), expect.bytenr),
                    );
                    self.unsure = true;
                    continue;
                }
            };
            let bytenr = node.header.bytenr;
            let full_backref = match ex.records.get(&bytenr) {
                Some(r) => {
                    if !r.tree_block {
                        report.problem(
                            CheckArea::ExtentRefs,
                            format!(
                                "tree block {bytenr} of tree {} has a data extent item",
                                tree_name(id)
                            ),
                        );
                    } else if r.level.is_some_and(|l| l != node.level()) {
                        report.problem(
                            CheckArea::ExtentRefs,
                            format!(
                                "tree block {bytenr} is at level {}, its extent item says {}",
                                node.level(),
                                r.level.unwrap_or_default()
                            ),
                        );
                    }
                    r.flags & BLOCK_FLAG_FULL_BACKREF != 0
                }
                None => false,
            };
            let owner = node.header.owner;
            if node.is_leaf() {
                let by = if full_backref {
                    Holder::Parent
                } else {
                    Holder::Root(owner)
                };
                for c in child_refs(&node, by) {
                    let (key, disk_bytenr, disk_num_bytes, r) = match c {
                        Ok(ChildRef::Data {
                            key,
                            bytenr,
                            len,
                            r,
                        }) => (key, bytenr, len, r),
                        Ok(ChildRef::Block { .. }) => continue,
                        Err((key, e)) => {
                            report.problem(
                                CheckArea::FsTree,
                                format!("tree {}: file extent {key}: {e}", tree_name(id)),
                            );
                            continue;
                        }
                    };
                    if let Some(rec) = ex.records.get(&disk_bytenr)
                        && (rec.tree_block || rec.len != disk_num_bytes)
                    {
                        report.problem(
                            CheckArea::ExtentRefs,
                            format!(
                                "tree {} inode {} offset {}: file extent {disk_bytenr}+{disk_num_bytes} does not match its extent item ({}+{}{})",
                                tree_name(id),
                                key.objectid,
                                key.offset,
                                disk_bytenr,
                                rec.len,
                                if rec.tree_block { ", a tree block" } else { "" }
                            ),
                        );
                    }
                    add_found(ex, disk_bytenr, AnyRef::Data(r));
                }
            } else {
                // Pushed last first, so the walk goes in key order (and
                // mostly in disk order).
                let n = node.nritems();
                for slot in (0..n).rev() {
                    let ptr = node.key_ptr(slot);
                    let next = if slot + 1 < n {
                        Some(node.key_ptr(slot + 1).key)
                    } else {
                        upper
                    };
                    if let (Some(d), Some(next)) = (dropped_before, next)
                        && next <= d
                    {
                        continue;
                    }
                    let r = if full_backref {
                        BlockRef::Parent(bytenr)
                    } else {
                        BlockRef::Root(owner)
                    };
                    add_found(ex, ptr.blockptr, AnyRef::Block(r));
                    stack.push((ptr.expect(node.level()), next));
                }
            }
        }
    }
}

fn add_found(ex: &mut Extents, bytenr: u64, r: AnyRef) {
    // An address with no item is recorded too, to be named below.
    let rec = ex.records.entry(bytenr).or_insert_with(|| ExtentRecord {
        refs: u64::MAX,
        ..Default::default()
    });
    *rec.found.entry(r).or_default() += 1;
}

/// A tree's id as people know it.
pub(super) fn tree_name(id: u64) -> String {
    match id {
        ROOT_TREE_OBJECTID => "root".into(),
        EXTENT_TREE_OBJECTID => "extent".into(),
        CHUNK_TREE_OBJECTID => "chunk".into(),
        DEV_TREE_OBJECTID => "dev".into(),
        CSUM_TREE_OBJECTID => "csum".into(),
        FREE_SPACE_TREE_OBJECTID => "free space".into(),
        DATA_RELOC_TREE_OBJECTID => "data reloc".into(),
        TREE_RELOC_OBJECTID => "reloc".into(),
        _ => id.to_string(),
    }
}

/// Match found references with declared ones.
fn compare(ex: &Extents, report: &mut CheckReport) {
    for (&bytenr, rec) in &ex.records {
        if rec.refs == u64::MAX {
            // No extent item: only found references made this record.
            for (r, n) in &rec.found {
                let what = match ex.records.range(..bytenr).next_back() {
                    Some((s, p)) if p.refs != u64::MAX && bytenr < s.saturating_add(p.len) => {
                        format!(" (it points into extent {s}+{})", p.len)
                    }
                    _ => String::new(),
                };
                report.problem(
                    CheckArea::ExtentRefs,
                    format!(
                        "{} {bytenr} is referenced ({}; {n} in all) but has no extent item{what}",
                        if matches!(r, AnyRef::Block(_)) {
                            "tree block"
                        } else {
                            "data extent"
                        },
                        r.describe()
                    ),
                );
            }
            continue;
        }
        let declared: u64 = rec.declared.values().sum();
        if declared != rec.refs {
            report.problem(
                CheckArea::ExtentRefs,
                format!(
                    "extent {bytenr}: its item counts {} references, its back references add up to {declared}",
                    rec.refs
                ),
            );
        }
        if rec.found.is_empty() {
            report.problem(
                CheckArea::ExtentRefs,
                format!(
                    "extent {bytenr}+{} is allocated (with {declared} references) but no tree references it",
                    rec.len
                ),
            );
            continue;
        }
        for (r, &n) in &rec.declared {
            let f = rec.found.get(r).copied().unwrap_or(0);
            if f != n {
                report.problem(
                    CheckArea::ExtentRefs,
                    format!(
                        "extent {bytenr}: back reference ({}) counts {n}, the trees hold {f}",
                        r.describe()
                    ),
                );
            }
        }
        for (r, &f) in &rec.found {
            if !rec.declared.contains_key(r) {
                report.problem(
                    CheckArea::ExtentRefs,
                    format!(
                        "extent {bytenr} is referenced ({}; {f} in all) without a back reference",
                        r.describe()
                    ),
                );
            }
        }
    }
}

/// Each block group's `used` is the sum of the extents in it, of its type.
fn block_group_usage(fs: &Filesystem, ex: &Extents, report: &mut CheckReport) -> Result<()> {
    if !ex.complete {
        return Ok(());
    }
    let groups = match super::space::block_groups(fs) {
        Ok(g) => g,
        Err(e) => {
            report.problem(CheckArea::BlockGroups, format!("block group items: {e}"));
            return Ok(());
        }
    };
    let mut used: BTreeMap<u64, u64> = groups.iter().map(|g| (g.start, 0)).collect();
    let by_start: BTreeMap<u64, &crate::alloc::BlockGroup> =
        groups.iter().map(|g| (g.start, g)).collect();
    for (&bytenr, rec) in &ex.records {
        if rec.refs == u64::MAX {
            continue;
        }
        let g = by_start
            .range(..=bytenr)
            .next_back()
            .map(|(_, g)| *g)
            .filter(|g| bytenr < g.start + g.len);
        let Some(g) = g else {
            report.problem(
                CheckArea::BlockGroups,
                format!("extent {bytenr}+{} is in no block group", rec.len),
            );
            continue;
        };
        if bytenr.saturating_add(rec.len) > g.start + g.len {
            report.problem(
                CheckArea::BlockGroups,
                format!(
                    "extent {bytenr}+{} reaches past the end of block group {}",
                    rec.len, g.start
                ),
            );
        }
        let fits = if rec.tree_block {
            g.flags & (BLOCK_GROUP_METADATA | BLOCK_GROUP_SYSTEM) != 0
        } else {
            g.flags & BLOCK_GROUP_DATA != 0
        };
        if !fits {
            report.problem(
                CheckArea::BlockGroups,
                format!(
                    "{} extent {bytenr} is in block group {} of another type (flags {:#x})",
                    if rec.tree_block { "tree block" } else { "data" },
                    g.start,
                    g.flags
                ),
            );
        }
        *used.entry(g.start).or_default() += rec.len;
    }
    let mut total = 0;
    for g in &groups {
        let sum = used.get(&g.start).copied().unwrap_or(0);
        total += g.used;
        if sum != g.used {
            report.problem(
                CheckArea::BlockGroups,
                format!(
                    "block group {}: its item says {} bytes used, its extents add up to {sum}",
                    g.start, g.used
                ),
            );
        }
    }
    report.bytes_used = total;
    let sb_used = fs.superblock().bytes_used;
    if sb_used != total {
        report.problem(
            CheckArea::Superblock,
            format!("the superblock says {sb_used} bytes are used, the block groups {total}"),
        );
    }
    Ok(())
}

//! Space: chunks, block groups, device extents and device items agree with
//! one another, and the free-space tree lists exactly the space that no
//! extent (and no superblock copy) holds.

use super::extent_refs::Extents;
use super::{CheckArea, CheckReport};
use crate::Result;
use crate::alloc::block_group::{self, BlockGroup};
use crate::alloc::{RangeSet, free_space_tree};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DevExtent, DevItem};
use crate::fs::Filesystem;
use crate::volume::chunk_map::Chunk;
use std::collections::BTreeMap;

/// Every block group item, by start.
pub(super) fn block_groups(fs: &Filesystem) -> Result<Vec<BlockGroup>> {
    let tree = fs.tree_by_id(fs.superblock().block_group_tree())?;
    let mut groups = block_group::load_groups(&tree)?;
    groups.sort_by_key(|g| g.start);
    Ok(groups)
}

pub(super) fn check(fs: &Filesystem, ex: &Extents, report: &mut CheckReport) -> Result<()> {
    let groups = match block_groups(fs) {
        Ok(g) => g,
        Err(e) => {
            report.problem(CheckArea::BlockGroups, format!("block group items: {e}"));
            return Ok(());
        }
    };
    chunks_and_groups(fs, &groups, report);
    if let Err(e) = dev_extents(fs, report) {
        report.problem(CheckArea::Chunks, format!("device tree: {e}"));
    }
    free_space(fs, ex, groups, report);
    Ok(())
}

/// Every chunk has a block group item of its length and type, and every
/// block group a chunk.
fn chunks_and_groups(fs: &Filesystem, groups: &[BlockGroup], report: &mut CheckReport) {
    let chunks: BTreeMap<u64, std::sync::Arc<Chunk>> = fs
        .tree_reader()
        .volume()
        .chunks
        .all()
        .into_iter()
        .map(|c| (c.logical, c))
        .collect();
    for g in groups {
        match chunks.get(&g.start) {
            None => report.problem(
                CheckArea::BlockGroups,
                format!("block group {}+{} has no chunk", g.start, g.len),
            ),
            Some(c) if c.item.length != g.len || c.item.chunk_type != g.flags => report.problem(
                CheckArea::BlockGroups,
                format!(
                    "block group {}+{} (flags {:#x}) does not match its chunk ({} bytes, flags {:#x})",
                    g.start, g.len, g.flags, c.item.length, c.item.chunk_type
                ),
            ),
            Some(_) => {}
        }
    }
    for c in chunks.values() {
        if groups
            .binary_search_by_key(&c.logical, |g| g.start)
            .is_err()
        {
            report.problem(
                CheckArea::BlockGroups,
                format!(
                    "chunk {}+{} has no block group item",
                    c.logical, c.item.length
                ),
            );
        }
    }
}

/// Each chunk stripe has its device extent and each device extent its
/// chunk; device extents do not overlap; each device item's `bytes_used`
/// is the sum of its extents.
fn dev_extents(fs: &Filesystem, report: &mut CheckReport) -> Result<()> {
    // (devid, physical) -> (chunk logical, length) the chunks expect.
    let mut wanted: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for c in fs.tree_reader().volume().chunks.all() {
        let n = c.item.stripes.len() as u64;
        let Some(len) = Chunk::stripe_span(c.profile, &c.item, n) else {
            continue;
        };
        for s in &c.item.stripes {
            wanted.insert((s.devid, s.offset), (c.logical, len));
        }
    }
    let mut used: BTreeMap<u64, u64> = BTreeMap::new();
    let mut last: Option<(u64, u64)> = None;
    for item in fs
        .tree_by_id(DEV_TREE_OBJECTID)?
        .range(Key::MIN, Key::MAX)?
    {
        let item = item?;
        let key = item.key();
        if key.item_type != DEV_EXTENT_KEY {
            continue;
        }
        let (devid, physical) = (key.objectid, key.offset);
        let d = match DevExtent::parse(item.data()) {
            Ok(d) => d,
            Err(e) => {
                report.problem(CheckArea::Chunks, format!("device extent {key}: {e}"));
                continue;
            }
        };
        if let Some((ldev, lend)) = last
            && ldev == devid
            && physical < lend
        {
            report.problem(
                CheckArea::Chunks,
                format!("device {devid}: device extent at {physical} overlaps the one before it"),
            );
        }
        last = Some((devid, physical.saturating_add(d.length)));
        *used.entry(devid).or_default() += d.length;
        match wanted.remove(&(devid, physical)) {
            None => report.problem(
                CheckArea::Chunks,
                format!(
                    "device {devid}: device extent {physical}+{} belongs to no chunk (it names chunk {})",
                    d.length, d.chunk_offset
                ),
            ),
            Some((logical, len)) if logical != d.chunk_offset || len != d.length => {
                report.problem(
                    CheckArea::Chunks,
                    format!(
                        "device {devid}: device extent {physical}+{} (chunk {}) does not match chunk {logical}'s stripe of {len} bytes",
                        d.length, d.chunk_offset
                    ),
                )
            }
            Some(_) => {}
        }
    }
    for ((devid, physical), (logical, _)) in wanted {
        report.problem(
            CheckArea::Chunks,
            format!(
                "chunk {logical}: its stripe at {physical} on device {devid} has no device extent"
            ),
        );
    }
    for item in fs.chunk_tree().items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)? {
        let d = DevItem::parse(item?.data())?;
        let sum = used.get(&d.devid).copied().unwrap_or(0);
        if sum != d.bytes_used {
            report.problem(
                CheckArea::Chunks,
                format!(
                    "device {}: its item says {} bytes used, its device extents add up to {sum}",
                    d.devid, d.bytes_used
                ),
            );
        }
        if let Some((_, end)) = last.filter(|(id, _)| *id == d.devid)
            && end > d.total_bytes
        {
            report.problem(
                CheckArea::Chunks,
                format!(
                    "device {}: a device extent ends at {end}, past the device's {} bytes",
                    d.devid, d.total_bytes
                ),
            );
        }
    }
    Ok(())
}

/// The free-space tree against the extent tree.
fn free_space(fs: &Filesystem, ex: &Extents, groups: Vec<BlockGroup>, report: &mut CheckReport) {
    let sb = fs.superblock();
    if sb.compat_ro_flags & COMPAT_RO_FREE_SPACE_TREE == 0 {
        if sb.cache_generation != 0 && sb.cache_generation != u64::MAX {
            report
                .notes
                .push("the free space cache (v1) is not checked: the kernel rebuilds it when it does not match".into());
        }
        return;
    }
    if !ex.complete {
        return;
    }
    let nodesize = sb.nodesize as u64;
    // What is free by the extent items.
    let mut expected: BTreeMap<u64, BlockGroup> =
        groups.iter().map(|g| (g.start, g.clone())).collect();
    for g in expected.values_mut() {
        g.free = RangeSet::new();
        g.free.insert(g.start, g.len);
    }
    for (&start, rec) in &ex.records {
        if rec.refs == u64::MAX {
            continue;
        }
        let len = if rec.tree_block { nodesize } else { rec.len };
        if let Some((_, g)) = expected.range_mut(..=start).next_back()
            && g.holds(start, len)
        {
            g.free.remove(start, len);
        }
    }
    // What the free-space tree says.
    let mut listed: BTreeMap<u64, BlockGroup> = groups.into_iter().map(|g| (g.start, g)).collect();
    let tree = match fs.tree_by_id(FREE_SPACE_TREE_OBJECTID) {
        Ok(t) => t,
        Err(e) => {
            report.problem(CheckArea::FreeSpace, format!("free space tree: {e}"));
            return;
        }
    };
    if let Err(e) = free_space_tree::load(&mut listed, &tree, sb.sectorsize as u64) {
        report.problem(CheckArea::FreeSpace, format!("free space tree: {e}"));
        return;
    }
    let counts: BTreeMap<u64, u64> = listed
        .iter()
        .map(|(s, g)| (*s, g.free.len() as u64))
        .collect();
    // The kernel lists a new group's superblock copies as free (and never
    // allocates them); ubtrfs leaves them out: either is right.
    let chunks: Vec<(u64, crate::format::items::ChunkItem)> = fs
        .tree_reader()
        .volume()
        .chunks
        .all()
        .iter()
        .map(|c| (c.logical, c.item.clone()))
        .collect();
    for map in [&mut expected, &mut listed] {
        if let Err(e) = block_group::exclude_super_copies(map, &chunks) {
            report.problem(CheckArea::Chunks, format!("chunks: {e}"));
            return;
        }
    }
    for (start, want) in &expected {
        let Some(have) = listed.get(start) else {
            continue;
        };
        let (w, h) = (&want.free, &have.free);
        if w.iter().eq(h.iter()) {
            let runs = counts.get(start).copied().unwrap_or(0);
            match free_space_info(&tree, want) {
                Ok(Some(count)) if count != runs => report.problem(
                    CheckArea::FreeSpace,
                    format!(
                        "block group {start}: its free space info counts {count} free extents, the tree lists {runs}"
                    ),
                ),
                Ok(Some(_)) => {}
                Ok(None) => report.problem(
                    CheckArea::FreeSpace,
                    format!("block group {start} has no free space info item"),
                ),
                Err(e) => report.problem(CheckArea::FreeSpace, format!("block group {start}: {e}")),
            }
            continue;
        }
        // Name the first range that differs either way.
        let missing = w.iter().find(|&(s, l)| !h.contains(s, l));
        let extra = h.iter().find(|&(s, l)| !w.contains(s, l));
        let mut what = format!(
            "block group {start}: the free space tree lists {} free bytes, the extent tree leaves {} free",
            h.total(),
            w.total()
        );
        if let Some((s, l)) = missing {
            what += &format!("; {s}+{l} is free but not listed");
        }
        if let Some((s, l)) = extra {
            what += &format!("; {s}+{l} is listed free but in use");
        }
        report.problem(CheckArea::FreeSpace, what);
    }
}

/// The extent count of a group's FREE_SPACE_INFO item.
fn free_space_info(tree: &crate::tree::Tree<'_>, g: &BlockGroup) -> Result<Option<u64>> {
    let key = Key::new(g.start, FREE_SPACE_INFO_KEY, g.len);
    Ok(match tree.get(&key)? {
        Some(item) => Some(free_space_tree::parse_info(item.data())?.0 as u64),
        None => None,
    })
}

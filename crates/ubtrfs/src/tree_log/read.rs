//! Reading the log: the log root tree the superblock points at, and the
//! per-subvolume log trees its root items name, every block verified.
//!
//! Facts from kernel images (`dump-super`, `dump-tree -b`): `log_root` is
//! the root of a tree owned by TREE_LOG whose items are ROOT_ITEMs keyed
//! (TREE_LOG, ROOT_ITEM, subvolume id); each points at that subvolume's log
//! tree, also owned by TREE_LOG. Every log block belongs to the transaction
//! that was running when the kernel stopped: one past the superblock's
//! generation. Log blocks have no extent items: the committed free-space
//! tree counts them as free.

use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, RootItem};
use crate::fs::Filesystem;
use crate::tree::RootPtr;
use crate::{Error, Result};

/// One subvolume's log tree.
#[derive(Clone, Debug)]
pub struct SubvolLog {
    /// The subvolume the log belongs to.
    pub subvol: u64,
    /// The log tree's root.
    pub root: RootPtr,
    /// Every item of the log tree, in key order.
    pub items: Vec<(Key, Vec<u8>)>,
}

impl SubvolLog {
    /// The item with exactly `key`.
    pub fn get(&self, key: &Key) -> Option<&[u8]> {
        self.items
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| self.items[i].1.as_slice())
    }

    /// Items with keys in `start..=end`.
    pub fn range(&self, start: Key, end: Key) -> &[(Key, Vec<u8>)] {
        let lo = self.items.partition_point(|(k, _)| *k < start);
        let hi = self.items.partition_point(|(k, _)| *k <= end);
        &self.items[lo..hi.max(lo)]
    }

    /// Items of `objectid` with type `item_type`, any offset.
    pub fn items_of(&self, objectid: u64, item_type: u8) -> &[(Key, Vec<u8>)] {
        self.range(
            Key::new(objectid, item_type, 0),
            Key::new(objectid, item_type, u64::MAX),
        )
    }
}

/// The whole log of a crashed filesystem.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// Per-subvolume logs, by subvolume id.
    pub subvols: Vec<SubvolLog>,
    /// Address of every log tree block (log root tree included).
    pub blocks: Vec<u64>,
}

impl Log {
    /// Data extents the log's file extent items point at, as (start, length),
    /// deduplicated; an error if one is damaged (see
    /// [`FileExtentItem::check_disk_extent`]).
    pub fn data_extents(&self, sectorsize: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for log in &self.subvols {
            for (key, data) in &log.items {
                if key.item_type != EXTENT_DATA_KEY {
                    continue;
                }
                let fe = FileExtentItem::parse(data)?;
                fe.check_disk_extent(sectorsize)?;
                if let ExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    ..
                } = fe.body
                    && disk_bytenr != 0
                {
                    out.push((disk_bytenr, disk_num_bytes));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// Read and verify the log of `fs`; `None` if the superblock has none.
pub fn read_log(fs: &Filesystem) -> Result<Option<Log>> {
    let sb = fs.superblock();
    if sb.log_root == 0 {
        return Ok(None);
    }
    let log_gen = sb.generation + 1;
    let top = RootPtr {
        bytenr: sb.log_root,
        level: sb.log_root_level,
        generation: Some(log_gen),
    };
    let mut log = Log::default();
    let mut roots = Vec::new();
    for (key, data) in tree_items(fs, top, &mut log.blocks)? {
        if key.objectid != TREE_LOG_OBJECTID || key.item_type != ROOT_ITEM_KEY {
            return Err(Error::corrupt(format!(
                "the log root tree holds item {key}, not a log root item"
            )));
        }
        let r = RootItem::parse(&data)?;
        if r.generation != log_gen {
            return Err(Error::corrupt(format!(
                "the log of subvolume {} has generation {}, not the log's {log_gen}",
                key.offset, r.generation
            )));
        }
        roots.push((
            key.offset,
            RootPtr {
                bytenr: r.bytenr,
                level: r.level,
                generation: Some(r.generation),
            },
        ));
    }
    for (subvol, root) in roots {
        let items = tree_items(fs, root, &mut log.blocks)?;
        log.subvols.push(SubvolLog {
            subvol,
            root,
            items,
        });
    }
    log.blocks.sort_unstable();
    let n = log.blocks.len();
    log.blocks.dedup();
    if log.blocks.len() != n {
        return Err(Error::corrupt("a log tree block is reached twice"));
    }
    Ok(Some(log))
}

/// Every item of the log tree at `root`, recording its blocks in `blocks`.
/// Blocks are verified as any tree block is (checksum, address, fsid,
/// level, generation, first key) and must be owned by TREE_LOG.
fn tree_items(
    fs: &Filesystem,
    root: RootPtr,
    blocks: &mut Vec<u64>,
) -> Result<Vec<(Key, Vec<u8>)>> {
    let tree = fs.tree_reader().tree(root);
    let mut bad = None;
    tree.walk(&mut |node| {
        if node.header.owner != TREE_LOG_OBJECTID && bad.is_none() {
            bad = Some((node.header.bytenr, node.header.owner));
        }
        blocks.push(node.header.bytenr);
        Ok(())
    })?;
    if let Some((bytenr, owner)) = bad {
        return Err(Error::BadTreeBlock {
            logical: bytenr,
            why: format!("log tree block owned by tree {owner}, not the log"),
        });
    }
    tree.range(Key::MIN, Key::MAX)?
        .map(|it| it.map(|it| (it.key(), it.data().to_vec())))
        .collect()
}

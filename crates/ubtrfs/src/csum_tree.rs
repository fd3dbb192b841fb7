//! The checksum tree: per-sector data checksums keyed by logical address.
//!
//! Reads look checksums up here and nowhere else (seed 000): data still in
//! flight never reaches the read path.

use crate::Result;
use crate::format::Key;
use crate::format::consts::{EXTENT_CSUM_KEY, EXTENT_CSUM_OBJECTID};
use crate::tree::Tree;

/// The checksums of `count` sectors starting at the sector-aligned logical
/// address `logical`: `None` for sectors the tree has no checksum for.
pub fn lookup(
    tree: &Tree<'_>,
    logical: u64,
    count: usize,
    sectorsize: u32,
    csum_size: usize,
) -> Result<Vec<Option<[u8; 32]>>> {
    let mut out = vec![None; count];
    let ss = sectorsize as u64;
    let end = logical + count as u64 * ss;
    // The item holding `logical` may start before it.
    let first = tree
        .get_le(&Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, logical))?
        .filter(|it| {
            it.key().objectid == EXTENT_CSUM_OBJECTID && it.key().item_type == EXTENT_CSUM_KEY
        })
        .map(|it| it.key().offset)
        .unwrap_or(logical);
    let items = tree.range(
        Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, first),
        Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end.saturating_sub(1)),
    )?;
    for item in items {
        let item = item?;
        let start = item.key().offset;
        let data = item.data();
        for (i, csum) in data.chunks_exact(csum_size).enumerate() {
            let sector = start + i as u64 * ss;
            if sector < logical {
                continue;
            }
            if sector >= end {
                break;
            }
            let mut c = [0u8; 32];
            c[..csum_size].copy_from_slice(csum);
            out[((sector - logical) / ss) as usize] = Some(c);
        }
    }
    Ok(out)
}

/// Whether any sector in `[logical, logical + len)` has a checksum. Stops at
/// the first one found (seed 002: NOCOW decisions need no full collection).
pub fn any_in_range(
    tree: &Tree<'_>,
    logical: u64,
    len: u64,
    sectorsize: u32,
    csum_size: usize,
) -> Result<bool> {
    let end = logical + len;
    if let Some(it) = tree.get_le(&Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, logical))? {
        let k = it.key();
        let covered = (it.data().len() / csum_size) as u64 * sectorsize as u64;
        if k.objectid == EXTENT_CSUM_OBJECTID
            && k.item_type == EXTENT_CSUM_KEY
            && k.offset + covered > logical
        {
            return Ok(true);
        }
    }
    let mut next = tree.range(
        Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, logical),
        Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end.saturating_sub(1)),
    )?;
    Ok(next.next().transpose()?.is_some())
}

/// Add the checksums `sums` (one per sector, concatenated) of the data at
/// `logical`. The range must hold no checksums yet.
pub fn insert(
    ed: &mut crate::tree::TreeEditor<'_>,
    root: &mut crate::tree::RootPtr,
    logical: u64,
    sums: &[u8],
    sectorsize: u32,
    csum_size: usize,
) -> Result<()> {
    // Keep items to half a leaf so one insert never needs more than a split.
    let per_item = (ed.max_item_size() / 2 / csum_size).max(1);
    for (i, chunk) in sums.chunks(per_item * csum_size).enumerate() {
        let at = logical + (i * per_item) as u64 * sectorsize as u64;
        ed.insert(
            root,
            Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, at),
            chunk.to_vec(),
        )?;
    }
    Ok(())
}

/// Remove every checksum of sectors in `[logical, logical + len)`,
/// trimming items that reach outside it.
pub fn delete_range(
    ed: &mut crate::tree::TreeEditor<'_>,
    root: &mut crate::tree::RootPtr,
    logical: u64,
    len: u64,
    sectorsize: u32,
    csum_size: usize,
) -> Result<()> {
    let ss = sectorsize as u64;
    let end = logical + len;
    let mut hits = Vec::new();
    {
        let tree = ed.reader().tree(*root);
        let first = tree
            .get_le(&Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, logical))?
            .filter(|it| {
                it.key().objectid == EXTENT_CSUM_OBJECTID && it.key().item_type == EXTENT_CSUM_KEY
            })
            .map_or(logical, |it| it.key().offset);
        for item in tree.range(
            Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, first),
            Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end.saturating_sub(1)),
        )? {
            let item = item?;
            let start = item.key().offset;
            let item_end = start + (item.data().len() / csum_size) as u64 * ss;
            if item_end > logical && start < end {
                hits.push((item.key(), item.data().to_vec()));
            }
        }
    }
    for (key, data) in hits {
        let start = key.offset;
        let item_end = start + (data.len() / csum_size) as u64 * ss;
        ed.delete(root, key)?;
        if start < logical {
            let keep = ((logical - start) / ss) as usize * csum_size;
            ed.insert(root, key, data[..keep].to_vec())?;
        }
        if item_end > end {
            let skip = ((end - start) / ss) as usize * csum_size;
            ed.insert(
                root,
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end),
                data[skip..].to_vec(),
            )?;
        }
    }
    Ok(())
}

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

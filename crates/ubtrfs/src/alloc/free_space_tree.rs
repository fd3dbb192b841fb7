//! The free-space tree: per block group, an info item and the free ranges
//! as extent items (or bitmaps, which the kernel may write and we read).

use super::{BlockGroup, RangeSet};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::le;
use crate::tree::{RootPtr, Tree, TreeEditor};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// Flag of a FREE_SPACE_INFO item: the group's free space is in bitmaps.
pub const FREE_SPACE_USING_BITMAPS: u32 = 1;

/// Fill each group's free space from the free-space tree.
pub fn load(
    groups: &mut BTreeMap<u64, BlockGroup>,
    tree: &Tree<'_>,
    sectorsize: u64,
) -> Result<()> {
    for item in tree.range(Key::MIN, Key::MAX)? {
        let item = item?;
        let key = item.key();
        let is_range = matches!(key.item_type, FREE_SPACE_EXTENT_KEY | FREE_SPACE_BITMAP_KEY);
        // The range's end decides its group below: it must exist.
        if is_range && key.objectid.checked_add(key.offset).is_none() {
            return Err(Error::corrupt(format!(
                "free space tree range {}+{} overflows",
                key.objectid, key.offset
            )));
        }
        let ranges: Vec<(u64, u64)> = match key.item_type {
            FREE_SPACE_EXTENT_KEY => vec![(key.objectid, key.offset)],
            FREE_SPACE_BITMAP_KEY => {
                bitmap_ranges(key.objectid, key.offset, item.data(), sectorsize)?
            }
            _ => continue,
        };
        let found = groups
            .range_mut(..=key.objectid)
            .next_back()
            .map(|(_, g)| g)
            .filter(|g| key.objectid.saturating_add(key.offset) <= g.start + g.len);
        // mkfs.btrfs leaves entries of its temporary block groups behind;
        // the kernel ignores them, and so do we.
        let Some(g) = found else { continue };
        for (s, l) in ranges {
            if !g.free.insert(s, l) {
                return Err(Error::corrupt(format!(
                    "free space tree lists {s}+{l} twice"
                )));
            }
        }
    }
    Ok(())
}

/// The free ranges a bitmap item describes: bit i is the sector at
/// `start + i * sectorsize`.
fn bitmap_ranges(start: u64, len: u64, bits: &[u8], sectorsize: u64) -> Result<Vec<(u64, u64)>> {
    let sectors = len / sectorsize;
    if (bits.len() as u64) * 8 < sectors {
        return Err(Error::corrupt(format!(
            "free space bitmap at {start} too short"
        )));
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for i in 0..sectors {
        if bits[(i / 8) as usize] & (1 << (i % 8)) == 0 {
            continue;
        }
        let s = start + i * sectorsize;
        match out.last_mut() {
            Some((ps, pl)) if *ps + *pl == s => *pl += sectorsize,
            _ => out.push((s, sectorsize)),
        }
    }
    Ok(out)
}

/// What the tree must say is free in `g`: free and pinned space (pinned
/// space is free once this commit is on disk).
pub fn on_disk_free(g: &BlockGroup) -> RangeSet {
    let mut all = g.free.clone();
    for (s, l) in g.pinned.iter() {
        all.insert(s, l);
    }
    all
}

/// Rewrite `g`'s entries in the free-space tree as extent items.
///
/// Only the items that change are touched: the commit repeats this until
/// nothing changes, and the tree's own blocks live in the space it
/// describes, so deleting and reinserting everything would free and
/// allocate blocks on every round and never settle.
pub fn rewrite(ed: &mut TreeEditor<'_>, root: &mut RootPtr, g: &BlockGroup) -> Result<()> {
    update(ed, root, g.start, g.len, &on_disk_free(g), None)
}

/// Make the free-space tree say that `free` is free in the group at
/// `start` of `len` bytes, as extent items, touching only the items that
/// change. `written` is what the tree holds for the group, if known (what
/// the last update of it wrote): then the tree is not read at all.
pub fn update(
    ed: &mut TreeEditor<'_>,
    root: &mut RootPtr,
    start: u64,
    len: u64,
    free: &RangeSet,
    written: Option<&RangeSet>,
) -> Result<()> {
    let end = start + len;
    let info_key = Key::new(start, FREE_SPACE_INFO_KEY, len);
    let mut info = Vec::with_capacity(8);
    info.extend_from_slice(&(free.len() as u32).to_le_bytes());
    info.extend_from_slice(&0u32.to_le_bytes());
    if let Some(old) = written {
        // Both sets are in order: walk them together.
        let (mut gone, mut new) = (Vec::new(), Vec::new());
        let (mut a, mut b) = (old.iter().peekable(), free.iter().peekable());
        loop {
            match (a.peek().copied(), b.peek().copied()) {
                (Some(x), Some(y)) if x == y => {
                    a.next();
                    b.next();
                }
                (Some(x), Some(y)) if x.0 < y.0 => {
                    gone.push(x);
                    a.next();
                }
                (Some(x), Some(y)) if x.0 == y.0 => {
                    gone.push(x);
                    new.push(y);
                    a.next();
                    b.next();
                }
                (Some(x), None) => {
                    gone.push(x);
                    a.next();
                }
                (_, Some(y)) => {
                    new.push(y);
                    b.next();
                }
                (None, None) => break,
            }
        }
        for (s, l) in gone {
            ed.delete(root, Key::new(s, FREE_SPACE_EXTENT_KEY, l))?;
        }
        for (s, l) in new {
            ed.insert(root, Key::new(s, FREE_SPACE_EXTENT_KEY, l), Vec::new())?;
        }
        if old.len() != free.len() {
            ed.put(root, info_key, info)?;
        }
        return Ok(());
    }
    let lo = Key::new(start, FREE_SPACE_INFO_KEY, 0);
    let mut old = BTreeMap::new();
    for item in ed
        .reader()
        .tree(*root)
        .range(lo, Key::new(end - 1, u8::MAX, u64::MAX))?
    {
        let item = item?;
        let k = item.key();
        if matches!(
            k.item_type,
            FREE_SPACE_INFO_KEY | FREE_SPACE_EXTENT_KEY | FREE_SPACE_BITMAP_KEY
        ) {
            old.insert(k, item.data().to_vec());
        }
    }
    let mut want = BTreeMap::new();
    want.insert(info_key, info);
    for (s, l) in free.iter() {
        want.insert(Key::new(s, FREE_SPACE_EXTENT_KEY, l), Vec::new());
    }
    for (k, v) in &old {
        if want.get(k) != Some(v) {
            ed.delete(root, *k)?;
        }
    }
    for (k, v) in want {
        if old.get(&k) != Some(&v) {
            ed.insert(root, k, v)?;
        }
    }
    Ok(())
}

/// Decode a FREE_SPACE_INFO item: (extent count, flags).
pub fn parse_info(b: &[u8]) -> Result<(u32, u32)> {
    Ok((le::u32(b, 0)?, le::u32(b, 4)?))
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::format::Key;
    use crate::format::consts::*;
    use crate::format::items::ExtentBody;
    use crate::test_fs::TestFs;

    /// A free range whose end is past the address space would be an
    /// inverted range in the group's free space.
    #[test]
    fn free_range_past_the_address_space_is_corrupt() {
        let mut t = TestFs::new();
        let id = t.file(b"f", &[3u8; 8192]);
        let ExtentBody::Regular { disk_bytenr, .. } = t.extent(id, 0).body else {
            panic!("not a regular extent");
        };
        let key = Key::new(disk_bytenr + 4096, FREE_SPACE_EXTENT_KEY, u64::MAX - 4095);
        t.put(FREE_SPACE_TREE_OBJECTID, key, Vec::new());
        match t.reopen() {
            Err(Error::Corrupt(m)) => assert!(m.contains("overflows"), "{m}"),
            other => panic!("expected a corrupt-metadata error, got {other:?}"),
        }
    }
}

//! The checksum tree: its items do not overlap, every sector they cover is
//! in a data extent, and every data range a file without `nodatasum`
//! references has its checksums. The data itself is read by scrub, not
//! here.

use super::extent_refs::Extents;
use super::fs_tree::CsumNeeds;
use super::{CheckArea, CheckReport};
use crate::Result;
use crate::alloc::RangeSet;
use crate::format::Key;
use crate::format::consts::*;
use crate::fs::Filesystem;

pub(super) fn check(
    fs: &Filesystem,
    ex: &Extents,
    needs: &CsumNeeds,
    report: &mut CheckReport,
) -> Result<()> {
    let sb = fs.superblock();
    let sectorsize = sb.sectorsize as u64;
    let csum_size = fs.tree_reader().csum_type().size() as u64;
    let mut covered = RangeSet::new();
    let mut complete = true;
    match fs.tree_by_id(CSUM_TREE_OBJECTID) {
        Err(e) => {
            report.problem(CheckArea::Checksums, format!("checksum tree: {e}"));
            complete = false;
        }
        Ok(tree) => {
            let iter = tree.range(
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, u64::MAX),
            )?;
            for item in iter {
                let item = match item {
                    Ok(i) => i,
                    Err(e) => {
                        report.problem(CheckArea::TreeBlocks, format!("checksum tree: {e}"));
                        complete = false;
                        break;
                    }
                };
                let start = item.key().offset;
                let n = item.data().len() as u64;
                if n == 0 || !n.is_multiple_of(csum_size) || !start.is_multiple_of(sectorsize) {
                    report.problem(
                        CheckArea::Checksums,
                        format!("checksum item at {start}: {n} bytes, not whole checksums of whole sectors"),
                    );
                    continue;
                }
                let len = n / csum_size * sectorsize;
                if !covered.insert(start, len) {
                    report.problem(
                        CheckArea::Checksums,
                        format!("checksum item {start}+{len} overlaps another"),
                    );
                    continue;
                }
                if ex.complete {
                    orphan_sums(ex, start, len, report);
                }
            }
        }
    }
    if !complete {
        return Ok(());
    }
    for (&start, (len, who)) in needs {
        if !covered.contains(start, *len) {
            let missing = first_gap(&covered, start, *len);
            report.problem(
                CheckArea::Checksums,
                format!(
                    "data {start}+{len} ({who}) has no checksum for {}+{}",
                    missing.0, missing.1
                ),
            );
        }
    }
    Ok(())
}

/// Report the parts of `[start, start + len)` that no data extent holds.
fn orphan_sums(ex: &Extents, start: u64, len: u64, report: &mut CheckReport) {
    let end = start.saturating_add(len);
    let mut at = start;
    while at < end {
        match ex.data_extent_at(at) {
            Some((s, l)) => at = s.saturating_add(l).min(end),
            None => {
                // Up to the next data extent, or the end.
                let next = ex
                    .records
                    .range(at..end)
                    .find(|(_, r)| !r.tree_block && r.refs != u64::MAX)
                    .map_or(end, |(s, _)| *s);
                report.problem(
                    CheckArea::Checksums,
                    format!("checksums for {at}..{next}, where no data extent is"),
                );
                at = next;
            }
        }
    }
}

/// The first run of `[start, start + len)` missing from `set`.
fn first_gap(set: &RangeSet, start: u64, len: u64) -> (u64, u64) {
    let end = start.saturating_add(len);
    let mut at = start;
    for (s, l) in set.iter() {
        if s.saturating_add(l) <= at {
            continue;
        }
        if s > at {
            return (at, s.min(end) - at);
        }
        at = s.saturating_add(l);
        if at >= end {
            break;
        }
    }
    (at, end.saturating_sub(at))
}

//! Scrub: read every copy of every tree block and of every checksummed
//! data sector, verify each, and (when asked) write a good copy over the
//! bad ones, as `btrfs scrub` does on a mounted filesystem.
//!
//! Tree blocks are found through the extent tree (every allocated block
//! has an item there), data through the checksum tree (only checksummed
//! data can be told good or bad). Each copy is read from its own device,
//! bypassing the node cache, so a bad mirror is found even when the good
//! one was read before. A tree block's copy must also have the generation
//! its extent item records (a device that missed writes holds older
//! blocks with good checksums). In RAID5/6 the data is checked as it
//! reads, and a sector that is bad there is rebuilt from parity and
//! written back (data and parity). Then the parity of every RAID5/6
//! row that holds an extent is read and compared with its data's; wrong
//! parity is rewritten from the data once the data is known good (its
//! checksums, its tree blocks). Superblock copies must have the last commit's generation; bad ones are
//! mended by a commit, which writes every copy again.

use crate::Result;
use crate::alloc::extent_tree::tree_block_item;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::node::{Expect, Node};
use crate::format::superblock::Superblock;
use crate::fs::Filesystem;
use crate::transaction::Writer;
use crate::volume::{DevStat, Profile, RowParity, Volume};
use std::collections::BTreeMap;

/// Data sectors read per copy at once.
const DATA_BATCH: usize = 64;

/// Uncorrectable places remembered by name in a report.
const NAMED_MAX: usize = 100;

/// What a scrub found, and what it mended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Tree blocks checked.
    pub tree_blocks: u64,
    /// Bytes of tree blocks checked (one copy counted).
    pub tree_bytes: u64,
    /// Bytes of checksummed data checked (one copy counted).
    pub data_bytes: u64,
    /// Copies of tree blocks that failed verification (checksum, address,
    /// fsid, level, generation).
    pub tree_errors: u64,
    /// Copies of data sectors whose checksum did not match.
    pub csum_errors: u64,
    /// Copies that could not be read at all.
    pub read_errors: u64,
    /// Copies on devices that are missing (not checked).
    pub missing_copies: u64,
    /// Superblock copies that failed verification.
    pub super_errors: u64,
    /// RAID5/6 rows whose parity was not their data's.
    pub parity_errors: u64,
    /// Bytes of RAID5/6 rows whose parity was checked (data stripes).
    pub parity_bytes: u64,
    /// Bad copies written over with a good one.
    pub corrected: u64,
    /// Blocks and sectors with no good copy at all.
    pub uncorrectable: u64,
    /// Where the first of those are: a line each.
    pub uncorrectable_at: Vec<String>,
}

impl ScrubReport {
    /// Whether every copy checked was good.
    pub fn clean(&self) -> bool {
        self.tree_errors
            + self.csum_errors
            + self.read_errors
            + self.super_errors
            + self.parity_errors
            == 0
    }

    /// Add the counts of `other` (a later step) to these.
    pub fn add(&mut self, other: &ScrubReport) {
        self.tree_blocks += other.tree_blocks;
        self.tree_bytes += other.tree_bytes;
        self.data_bytes += other.data_bytes;
        self.tree_errors += other.tree_errors;
        self.csum_errors += other.csum_errors;
        self.read_errors += other.read_errors;
        self.missing_copies += other.missing_copies;
        self.super_errors += other.super_errors;
        self.parity_errors += other.parity_errors;
        self.parity_bytes += other.parity_bytes;
        self.corrected += other.corrected;
        self.uncorrectable += other.uncorrectable;
        for at in &other.uncorrectable_at {
            if self.uncorrectable_at.len() < NAMED_MAX {
                self.uncorrectable_at.push(at.clone());
            }
        }
    }

    fn lost(&mut self, what: String) {
        self.uncorrectable += 1;
        if self.uncorrectable_at.len() < NAMED_MAX {
            self.uncorrectable_at.push(what);
        }
    }
}

/// How far a scrub is: bytes checked, out of the bytes in use.
pub type ScrubProgress<'a> = &'a mut dyn FnMut(u64, u64);

/// Bytes a step of [`Filesystem::scrub`] checks.
const STEP_BYTES: u64 = 16 << 20;

/// The parts of a scrub, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubPhase {
    /// Tree blocks, in the extent tree's order.
    TreeBlocks,
    /// Checksummed data, in the checksum tree's order.
    Data,
    /// The parity of RAID5/6 rows, in address order: after the data, so
    /// that parity is rewritten only from data already mended.
    Parity,
    /// The superblock copies: last, so that a commit mending them comes
    /// after the blocks a device missed are mended.
    Supers,
    /// Nothing left.
    Done,
}

/// Where a scrub goes on from (see [`Filesystem::scrub_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubCursor {
    /// The part under way.
    pub phase: ScrubPhase,
    /// The first key of its tree not checked yet.
    pub next: Key,
}

impl ScrubCursor {
    /// A scrub not started.
    pub fn start() -> Self {
        ScrubCursor {
            phase: ScrubPhase::TreeBlocks,
            next: Key::new(0, 0, 0),
        }
    }

    /// Whether the scrub is over.
    pub fn done(&self) -> bool {
        self.phase == ScrubPhase::Done
    }
}

/// The smallest key after `k` (the last key stays).
fn key_after(k: Key) -> Key {
    if k.offset < u64::MAX {
        Key::new(k.objectid, k.item_type, k.offset + 1)
    } else if k.item_type < u8::MAX {
        Key::new(k.objectid, k.item_type + 1, 0)
    } else if k.objectid < u64::MAX {
        Key::new(k.objectid + 1, 0, 0)
    } else {
        k
    }
}

/// What reading one copy gave.
enum CopyRead {
    Good(Vec<u8>),
    Bad,
    Missing,
}

impl Filesystem {
    /// Check every copy of every tree block, checksummed data sector and
    /// superblock (see the module documentation). With `repair`, a bad
    /// copy that has a good one beside it is written over with it; that
    /// needs the filesystem opened read-write (the running transaction is
    /// committed first, so everything checked is on disk). Errors in the
    /// data found are counted in the report; the call itself fails only
    /// when the trees that say where everything is cannot be read.
    /// `progress` hears of the bytes checked, out of the bytes in use.
    pub fn scrub(&self, repair: bool, progress: ScrubProgress<'_>) -> Result<ScrubReport> {
        if repair {
            self.commit()?;
        }
        let mut report = ScrubReport::default();
        let mut cursor = ScrubCursor::start();
        let total = self.superblock().bytes_used.max(1);
        while !cursor.done() {
            self.scrub_step(&mut cursor, repair, STEP_BYTES, &mut report)?;
            progress((report.tree_bytes + report.data_bytes).min(total), total);
        }
        progress(total, total);
        if repair {
            // What it counted against each device (`device stats`) is
            // kept, as a mount's next commit would keep it.
            self.commit()?;
        }
        Ok(report)
    }

    /// One step of a scrub: from `cursor` on, about `budget` bytes (at
    /// least one block or checksum item), adding to `report` and moving
    /// `cursor`. Changes wait meanwhile (a step holds the transaction), so
    /// nothing it checks is freed or rewritten under it; blocks of the
    /// running transaction, not on disk yet, are passed over. A mounted
    /// filesystem is scrubbed step by step between its other work.
    pub fn scrub_step(
        &self,
        cursor: &mut ScrubCursor,
        repair: bool,
        budget: u64,
        report: &mut ScrubReport,
    ) -> Result<()> {
        if repair && self.writer.is_none() {
            return Err(crate::Error::ReadOnly(
                "a scrub that mends needs the filesystem opened read-write".into(),
            ));
        }
        // A change as any other (its commit, mending superblocks, may fail
        // half-way), taking the transaction after the change gate.
        self.change("scrub", || {
            self.scrub_step_held(cursor, repair, budget, report)
        })
    }

    fn scrub_step_held(
        &self,
        cursor: &mut ScrubCursor,
        repair: bool,
        budget: u64,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let mut held = match &self.writer {
            Some(_) => Some(self.lock_writer()?),
            None => None,
        };
        let before = report.corrected;
        match cursor.phase {
            ScrubPhase::Supers => {
                let w = held.as_deref_mut().filter(|_| repair);
                self.scrub_supers(w, report)?;
                *cursor = ScrubCursor {
                    phase: ScrubPhase::Done,
                    next: Key::new(u64::MAX, u8::MAX, u64::MAX),
                };
            }
            ScrubPhase::TreeBlocks => self.scrub_tree_blocks(cursor, repair, budget, report)?,
            ScrubPhase::Data => self.scrub_data(cursor, repair, budget, report)?,
            ScrubPhase::Parity => self.scrub_parity(cursor, repair, budget, report)?,
            ScrubPhase::Done => {}
        }
        if report.corrected > before {
            for (_, dev) in self.tree_reader().volume().devices.iter() {
                dev.flush()?;
            }
        }
        Ok(())
    }

    /// Every superblock copy of every present device: good if it parses
    /// (checksum, place, magic), names this filesystem and has the last
    /// commit's generation (a device that missed commits has older ones).
    /// With `repair` (and the transaction, `w`), bad copies are mended by
    /// a commit, which writes every copy of every device again.
    fn scrub_supers(&self, w: Option<&mut Writer>, report: &mut ScrubReport) -> Result<()> {
        let bad = self.bad_supers();
        report.super_errors += bad.len() as u64;
        let still = match w {
            Some(w) if !bad.is_empty() => {
                // A commit needs a change: the root tree's root, copied,
                // is one (that root must be as new as the superblocks).
                self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, root| ed.cow_root(root))?;
                self.commit_locked(w)?;
                self.bad_supers()
            }
            _ => return Ok(()),
        };
        report.corrected += bad.len().saturating_sub(still.len()) as u64;
        for what in still {
            report.lost(what);
        }
        Ok(())
    }

    /// The superblock copies that are not as the last commit wrote them
    /// (not counted against their devices: the kernel's scrub does not).
    fn bad_supers(&self) -> Vec<String> {
        let generation = self.committed.load(std::sync::atomic::Ordering::Acquire);
        let fsid = self.superblock().fsid;
        // Superblock writes (an fsync's) wait meanwhile.
        let _supers = self
            .supers_on_disk
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut bad = Vec::new();
        let devices = &self.tree_reader().volume().devices;
        for (devid, dev) in devices.iter() {
            // A seed's superblocks are its own, never written since.
            if devices.seeds.iter().any(|&(d, _)| d == devid) {
                continue;
            }
            // Copies lie only inside the filesystem's part of the device
            // (its device item's size), as commits write them.
            let fs_size = self
                .chunk_tree()
                .get(&Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid))
                .ok()
                .flatten()
                .and_then(|it| u64_at(it.data(), 8))
                .unwrap_or(u64::MAX);
            for (i, &at) in SUPER_OFFSETS.iter().enumerate() {
                if at + SUPER_SIZE as u64 > dev.size().min(fs_size) {
                    break;
                }
                let mut buf = vec![0u8; SUPER_SIZE];
                let good = dev
                    .read_at(at, &mut buf)
                    .and_then(|()| Superblock::parse(&buf, at))
                    .is_ok_and(|sb| sb.fsid == fsid && sb.generation == generation);
                if !good {
                    bad.push(format!(
                        "superblock copy {i} of device {devid} ({})",
                        dev.path().display()
                    ));
                }
            }
        }
        bad
    }

    /// The tree blocks the extent tree lists from `cursor` on.
    fn scrub_tree_blocks(
        &self,
        cursor: &mut ScrubCursor,
        repair: bool,
        budget: u64,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let extents = self.tree_by_id(EXTENT_TREE_OBJECTID)?;
        let nodesize = self.geometry().nodesize as usize;
        let mut spent = 0u64;
        for item in extents.range(cursor.next, Key::new(u64::MAX, u8::MAX, u64::MAX))? {
            if spent >= budget {
                return Ok(());
            }
            let item = item?;
            let key = item.key();
            cursor.next = key_after(key);
            // The generation the block was written in: an older block at
            // the same place, a stale copy, is bad even with a good checksum.
            let Some((level, generation)) = tree_block_item(key, item.data()) else {
                continue;
            };
            let bytenr = key.objectid;
            // Blocks of the running transaction are not on disk yet.
            if self.tree_reader().is_dirty(bytenr) {
                continue;
            }
            let expect = Expect {
                bytenr,
                generation,
                level,
                first_key: None,
            };
            self.scrub_tree_block(&expect, nodesize, repair, report)?;
            report.tree_blocks += 1;
            report.tree_bytes += nodesize as u64;
            spent += nodesize as u64;
        }
        *cursor = ScrubCursor {
            phase: ScrubPhase::Data,
            next: Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
        };
        Ok(())
    }

    fn scrub_tree_block(
        &self,
        expect: &Expect,
        nodesize: usize,
        repair: bool,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let volume = self.tree_reader().volume();
        let reader = self.tree_reader();
        let newest = self.committed.load(std::sync::atomic::Ordering::Acquire);
        let parity = is_parity(volume, expect.bytenr)?;
        let mut reads = Vec::new();
        for mirror in 0..volume.num_copies(expect.bytenr)? {
            // In RAID5/6 the rebuilds from parity are read only to mend a
            // block that reads bad.
            if parity && matches!(reads.first(), Some(CopyRead::Good(_))) {
                break;
            }
            if !volume.copy_present(expect.bytenr, mirror) {
                reads.push(CopyRead::Missing);
                continue;
            }
            let mut buf = vec![0u8; nodesize];
            if volume.read_copy(expect.bytenr, mirror, &mut buf).is_err() {
                report.read_errors += 1;
                reads.push(CopyRead::Bad);
                continue;
            }
            let kept = buf.clone();
            match Node::parse(
                buf.into_boxed_slice(),
                reader.csum_type(),
                reader.fsids(),
                expect,
                newest,
            ) {
                Ok(_) => reads.push(CopyRead::Good(kept)),
                Err(_) => {
                    report.tree_errors += 1;
                    self.count_bad_tree_copy(expect, mirror, &kept);
                    reads.push(CopyRead::Bad);
                }
            }
        }
        self.mend(
            expect.bytenr,
            &reads,
            repair,
            report,
            format!("tree block {}", expect.bytenr),
        )
    }

    /// Count a bad copy of a tree block against its device as the
    /// kernel's scrub does: a stale generation (the checksum good) once;
    /// other damage, a checksum mismatch included, not at all (kernel 6.18
    /// counts only data sectors as corrupt).
    fn count_bad_tree_copy(&self, expect: &Expect, mirror: usize, block: &[u8]) {
        let reader = self.tree_reader();
        let Ok(header) = crate::format::node::Header::parse(block) else {
            return;
        };
        if !reader.csum_type().verify(&block[32..], &header.csum) {
            return;
        }
        // A block of another place or filesystem is misplaced, not stale
        // (the kernel checks these first, and does not count them).
        let in_place = header.bytenr == expect.bytenr && reader.fsids().contains(&header.fsid);
        if in_place && expect.generation.is_some_and(|g| g != header.generation) {
            reader
                .volume()
                .record_copy_error(expect.bytenr, mirror, DevStat::GenerationErrs);
        }
    }

    /// The data sectors the checksum tree has checksums for, from
    /// `cursor` on (whole checksum items).
    fn scrub_data(
        &self,
        cursor: &mut ScrubCursor,
        repair: bool,
        budget: u64,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let finished = ScrubCursor {
            phase: ScrubPhase::Parity,
            next: Key::new(0, 0, 0),
        };
        let Some(root) = self.root_ptr(CSUM_TREE_OBJECTID)? else {
            *cursor = finished;
            return Ok(());
        };
        let csums = self.tree_reader().tree(root);
        let geo = self.geometry();
        let sector = geo.sectorsize as u64;
        let last = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, u64::MAX);
        let mut spent = 0u64;
        for item in csums.range(cursor.next, last)? {
            if spent >= budget {
                return Ok(());
            }
            let item = item?;
            cursor.next = key_after(item.key());
            let start = item.key().offset;
            let sums = item.data();
            let count = sums.len() / geo.csum_size;
            let mut i = 0usize;
            while i < count {
                let logical = start + i as u64 * sector;
                let chunk_end = match self.tree_reader().volume().chunks.lookup(logical) {
                    Ok(c) => c.end(),
                    Err(_) => {
                        // Damage: checksums of data outside every chunk.
                        report.lost(format!(
                            "checksums of data sector {logical}, outside every chunk"
                        ));
                        break;
                    }
                };
                let fit = ((chunk_end - logical) / sector).max(1) as usize;
                let n = DATA_BATCH.min(count - i).min(fit);
                let expected = &sums[i * geo.csum_size..(i + n) * geo.csum_size];
                self.scrub_sectors(logical, n, expected, repair, report)?;
                report.data_bytes += n as u64 * sector;
                spent += n as u64 * sector;
                i += n;
            }
        }
        *cursor = finished;
        Ok(())
    }

    /// `n` data sectors from `logical` (one chunk), against `expected`.
    fn scrub_sectors(
        &self,
        logical: u64,
        n: usize,
        expected: &[u8],
        repair: bool,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let volume = self.tree_reader().volume();
        let csum_type = self.tree_reader().csum_type();
        let csum_size = self.geometry().csum_size;
        let sector = self.geometry().sectorsize as usize;
        let want = |s: usize| &expected[s * csum_size..(s + 1) * csum_size];
        // Per copy: its bytes, and which sectors could not be read.
        type Copy = Option<(Vec<u8>, Vec<bool>)>;
        let good = |c: &Copy, s: usize| {
            c.as_ref().is_some_and(|(b, unread)| {
                !unread[s] && csum_type.verify(&b[s * sector..(s + 1) * sector], want(s))
            })
        };
        let parity = is_parity(volume, logical)?;
        let mut copies: Vec<Copy> = Vec::new();
        for mirror in 0..volume.num_copies(logical)? {
            // In RAID5/6 the rebuilds from parity are read only to mend
            // data that reads bad.
            if parity && mirror > 0 && (0..n).all(|s| good(&copies[0], s)) {
                break;
            }
            if !volume.copy_present(logical, mirror) {
                copies.push(None);
                continue;
            }
            let mut buf = vec![0u8; n * sector];
            let mut unread = vec![false; n];
            if volume.read_copy(logical, mirror, &mut buf).is_err() {
                // Again sector by sector, to find which ones fail.
                for (s, part) in buf.chunks_mut(sector).enumerate() {
                    let at = logical + (s * sector) as u64;
                    unread[s] = volume.read_copy(at, mirror, part).is_err();
                }
            }
            copies.push(Some((buf, unread)));
        }
        for s in 0..n {
            // In RAID5/6 a rebuild of a good sector is not checked: it
            // leans on its row's other sectors, checked on their own.
            let considered = if parity && good(&copies[0], s) {
                &copies[..1]
            } else {
                &copies[..]
            };
            let at = logical + (s * sector) as u64;
            let reads: Vec<CopyRead> = considered
                .iter()
                .enumerate()
                .map(|(mirror, c)| match c {
                    None => CopyRead::Missing,
                    Some((b, _)) if good(c, s) => {
                        CopyRead::Good(b[s * sector..(s + 1) * sector].to_vec())
                    }
                    Some((_, unread)) => {
                        // (A failed read is counted against its device
                        // where it failed.)
                        if unread[s] {
                            report.read_errors += 1;
                        } else {
                            report.csum_errors += 1;
                            volume.record_copy_error(at, mirror, DevStat::CorruptionErrs);
                        }
                        CopyRead::Bad
                    }
                })
                .collect();
            self.mend(at, &reads, repair, report, format!("data sector {at}"))?;
        }
        Ok(())
    }

    /// The parity of the RAID5/6 rows holding an extent, from the row at
    /// `cursor.next.objectid` (a logical address) on.
    fn scrub_parity(
        &self,
        cursor: &mut ScrubCursor,
        repair: bool,
        budget: u64,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let volume = self.tree_reader().volume();
        let sector = self.geometry().sectorsize as usize;
        let mut pos = cursor.next.objectid;
        let mut chunks: Vec<_> = volume
            .chunks
            .all()
            .into_iter()
            .filter(|c| c.profile.parity_stripes() > 0 && c.end() > pos)
            .collect();
        chunks.sort_by_key(|c| c.logical);
        let mut spent = 0u64;
        for c in chunks {
            let data = c.item.stripes.len() as u64 - c.profile.parity_stripes();
            let row_len = data * c.item.stripe_len;
            let rows_end = c.logical + c.item.length / row_len * row_len;
            pos = pos.max(c.logical);
            while pos < rows_end {
                // The rows of about what is left of the budget at a time:
                // finding them reads the extent items of that span only.
                let span = budget
                    .saturating_sub(spent)
                    .max(row_len)
                    .next_multiple_of(row_len);
                let limit = pos.saturating_add(span).min(rows_end);
                for (row, used) in self.rows_in_use(&c, pos, limit, row_len)? {
                    let start = c.logical + row * row_len;
                    if spent >= budget {
                        cursor.next = Key::new(start, 0, 0);
                        return Ok(());
                    }
                    let mut verify = |stripes: &[Vec<u8>]| self.row_data_good(start, stripes);
                    let found =
                        volume.check_row_parity(&c, row, &used, sector, repair, &mut verify)?;
                    match found {
                        RowParity::Good => {}
                        RowParity::Missing => report.missing_copies += 1,
                        RowParity::Unreadable => report.read_errors += 1,
                        RowParity::Bad { mended } => {
                            report.parity_errors += 1;
                            report.corrected += u64::from(mended);
                        }
                        // The data's own errors were counted by the phases
                        // before (and mended there, unless they could not
                        // be): parity is left to match the data once it is
                        // good.
                        RowParity::DataBad => {}
                    }
                    report.parity_bytes += row_len;
                    spent += row_len;
                }
                pos = limit;
            }
        }
        *cursor = ScrubCursor {
            phase: ScrubPhase::Supers,
            next: Key::new(0, 0, 0),
        };
        Ok(())
    }

    /// The rows of RAID5/6 chunk `c` in `[from, limit)` (row boundaries)
    /// that hold some extent, each with the sectors of a stripe where
    /// some data stripe of the row is in use (only there is parity ever
    /// read back, so only there must it match).
    fn rows_in_use(
        &self,
        c: &crate::volume::chunk_map::Chunk,
        from: u64,
        limit: u64,
        row_len: u64,
    ) -> Result<BTreeMap<u64, Vec<bool>>> {
        let extents = self.tree_by_id(EXTENT_TREE_OBJECTID)?;
        let nodesize = self.geometry().nodesize as u64;
        let sector = self.geometry().sectorsize as u64;
        let sl = c.item.stripe_len;
        // Extents do not overlap: only the last one to start before
        // `from` can reach into the span; its items (and any block group
        // item) share its start as objectid.
        let back = extents
            .get_le(&Key::new(from.saturating_sub(1), u8::MAX, u64::MAX))?
            .map_or(c.logical, |i| i.key().objectid)
            .clamp(c.logical, from);
        let mut out: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
        for item in extents.range(Key::new(back, 0, 0), Key::new(limit - 1, u8::MAX, u64::MAX))? {
            let key = item?.key();
            let len = match key.item_type {
                EXTENT_ITEM_KEY => key.offset,
                METADATA_ITEM_KEY => nodesize,
                _ => continue,
            };
            let lo = key.objectid.max(from);
            let hi = key.objectid.saturating_add(len).min(limit);
            let mut at = lo - lo % sector;
            while at < hi {
                let off = at - c.logical;
                let used = out
                    .entry(off / row_len)
                    .or_insert_with(|| vec![false; (sl / sector) as usize]);
                used[((off % sl) / sector) as usize] = true;
                at += sector;
            }
        }
        Ok(out)
    }

    /// Whether the data stripes of the RAID5/6 row at `start` are good:
    /// every sector with a checksum matches it, and every tree block in
    /// the row verifies.
    fn row_data_good(&self, start: u64, stripes: &[Vec<u8>]) -> bool {
        let row: Vec<u8> = stripes.concat();
        let end = start + row.len() as u64;
        let geo = self.geometry();
        let sector = geo.sectorsize as usize;
        let reader = self.tree_reader();
        if let Ok(Some(root)) = self.root_ptr(CSUM_TREE_OBJECTID) {
            let sums = crate::csum_tree::lookup(
                &reader.tree(root),
                start,
                row.len() / sector,
                geo.sectorsize,
                geo.csum_size,
            );
            let Ok(sums) = sums else { return false };
            for (i, sum) in sums.iter().enumerate() {
                if let Some(sum) = sum
                    && !reader
                        .csum_type()
                        .verify(&row[i * sector..(i + 1) * sector], &sum[..geo.csum_size])
                {
                    return false;
                }
            }
        }
        let Ok(extents) = self.tree_by_id(EXTENT_TREE_OBJECTID) else {
            return false;
        };
        let newest = self.committed.load(std::sync::atomic::Ordering::Acquire);
        let nodesize = geo.nodesize as usize;
        let Ok(items) = extents.range(Key::new(start, 0, 0), Key::new(end - 1, u8::MAX, u64::MAX))
        else {
            return false;
        };
        for item in items {
            let Ok(item) = item else { return false };
            let key = item.key();
            let Some((level, generation)) = tree_block_item(key, item.data()) else {
                continue;
            };
            let at = (key.objectid - start) as usize;
            let Some(bytes) = row.get(at..at + nodesize) else {
                continue;
            };
            let expect = Expect {
                bytenr: key.objectid,
                generation,
                level,
                first_key: None,
            };
            if Node::parse(
                bytes.to_vec().into_boxed_slice(),
                reader.csum_type(),
                reader.fsids(),
                &expect,
                newest,
            )
            .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Count what the copies of `logical` were, and with `repair` write a
    /// good one over the bad ones.
    fn mend(
        &self,
        logical: u64,
        reads: &[CopyRead],
        repair: bool,
        report: &mut ScrubReport,
        what: String,
    ) -> Result<()> {
        report.missing_copies += reads
            .iter()
            .filter(|r| matches!(r, CopyRead::Missing))
            .count() as u64;
        let bad: Vec<usize> = (0..reads.len())
            .filter(|&m| matches!(reads[m], CopyRead::Bad))
            .collect();
        if bad.is_empty() {
            return Ok(());
        }
        let Some(good) = reads.iter().find_map(|r| match r {
            CopyRead::Good(b) => Some(b),
            _ => None,
        }) else {
            report.lost(what);
            return Ok(());
        };
        if !repair {
            return Ok(());
        }
        let volume = self.tree_reader().volume();
        // A copy that cannot be written (a device missing, an I/O error)
        // stays bad; the scrub goes on.
        if is_parity(volume, logical)? {
            // The data as read was bad and parity rebuilt it: write it
            // back, with the row's parity.
            match volume.write(logical, good) {
                Ok(()) => report.corrected += 1,
                Err(e) => report.lost(format!("{what}: {e}")),
            }
            return Ok(());
        }
        for mirror in bad {
            match volume.write_copy(logical, mirror, good) {
                Ok(()) => report.corrected += 1,
                Err(e) => report.lost(format!("{what}, copy {mirror}: {e}")),
            }
        }
        Ok(())
    }
}

fn is_parity(volume: &Volume, logical: u64) -> Result<bool> {
    let chunk = volume.chunks.lookup(logical)?;
    Ok(matches!(chunk.profile, Profile::Raid5 | Profile::Raid6))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

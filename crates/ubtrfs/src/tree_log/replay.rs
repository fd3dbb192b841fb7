//! Replaying a subvolume's log into its fs tree, in three passes over the
//! log's items (as the kernel's replay does, so conflicts resolve the same
//! way), then a fixup of the inodes the replay touched.
//!
//! 1. Inodes: each logged inode item replaces the subvolume's; for a
//!    directory, entries in the index ranges the log covers
//!    (DIR_LOG_INDEX / DIR_LOG_ITEM) that the log does not hold are
//!    removed; xattrs the log does not hold are removed; a regular file
//!    loses extents past its logged size.
//! 2. Directory entries: each logged DIR_INDEX entry is linked (with its
//!    index) if the inode it names exists.
//! 3. The rest: xattrs are copied; inode refs make the inode's names in
//!    each logged parent exactly the logged ones; file extents replace the
//!    file's range.
//! 4. Fixup: link counts are recounted from the back references, sizes of
//!    directories and byte counts of files recomputed from their items;
//!    an inode left without a name becomes an orphan (a directory losing
//!    its entries first), which the orphan cleanup at open deletes.

use super::read::{Log, SubvolLog};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, InodeItem, InodeRef};
use crate::fs::Filesystem;
use crate::transaction::Writer;
use crate::tree::{RootPtr, Tree, TreeEditor};
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Subvolumes whose logs were replayed.
    pub subvols: Vec<u64>,
    /// Logged inode items applied.
    pub inodes: usize,
    /// Logged file extent items applied.
    pub extents: usize,
    /// Problems that did not stop the replay.
    pub warnings: Vec<String>,
}

/// The state of one subvolume's replay.
pub(super) struct Replay<'a> {
    pub fs: &'a Filesystem,
    pub w: &'a mut Writer,
    pub subvol: u64,
    pub log: &'a SubvolLog,
    /// Inodes whose link count, size or byte count may have changed.
    pub fixup: BTreeSet<u64>,
    /// Data extents the log uses that the extent tree does not know yet,
    /// set aside (pinned) until a replayed item references them.
    pub claimed: &'a mut BTreeMap<u64, u64>,
    /// The filesystem has the no-holes feature (holes are not items).
    pub no_holes: bool,
    pub warnings: &'a mut Vec<String>,
    /// Inodes logged with no links (O_TMPFILE, or unlinked while open):
    /// the replay leaves them out, as the kernel's does.
    ignored: HashSet<u64>,
}

/// Replay every subvolume log of `log` into the running transaction of
/// `fs`. The caller commits (or, for a read-only open, keeps the result
/// in memory).
pub(crate) fn replay_log(fs: &Filesystem, w: &mut Writer, log: &Log) -> Result<ReplaySummary> {
    let mut summary = ReplaySummary::default();
    let nodesize = fs.geometry().nodesize as u64;
    // Nothing may be allocated over the log's blocks while it is read, nor
    // over the data it logged: both are free in the committed free space.
    // Pinned space becomes free once the replay's commit is on disk.
    for &b in &log.blocks {
        let g = w.blocks.alloc.group_of(b)?;
        if !g.holds(b, nodesize) {
            return Err(Error::corrupt(format!(
                "log tree block {b} reaches past its block group"
            )));
        }
        if !g.free.remove(b, nodesize) {
            return Err(Error::corrupt(format!(
                "log tree block {b} lies in space the filesystem uses"
            )));
        }
        g.pinned.insert(b, nodesize);
        g.dirty_free = true;
    }
    let mut claimed = BTreeMap::new();
    let sectorsize = fs.geometry().sectorsize as u64;
    for (start, len) in log.data_extents(sectorsize)? {
        let g = w.blocks.alloc.group_of(start)?;
        // Free space is kept per group: a range running out of its group
        // would free or pin another group's bytes.
        if !g.holds(start, len) {
            return Err(Error::corrupt(format!(
                "logged data extent {start}+{len} reaches past its block group"
            )));
        }
        if g.free.remove(start, len) {
            g.pinned.insert(start, len);
            g.dirty_free = true;
            claimed.insert(start, len);
        }
    }
    let no_holes = fs.superblock().incompat_flags & INCOMPAT_NO_HOLES != 0;
    for sl in &log.subvols {
        if fs.root_ptr(sl.subvol)?.is_none() {
            summary.warnings.push(format!(
                "the log has changes for subvolume {}, which no longer exists; they are dropped",
                sl.subvol
            ));
            continue;
        }
        let mut r = Replay {
            fs,
            w: &mut *w,
            subvol: sl.subvol,
            log: sl,
            fixup: BTreeSet::new(),
            claimed: &mut claimed,
            no_holes,
            warnings: &mut summary.warnings,
            ignored: HashSet::new(),
        };
        let (inodes, extents) = r.run()?;
        summary.inodes += inodes;
        summary.extents += extents;
        summary.subvols.push(sl.subvol);
    }
    Ok(summary)
}

impl Replay<'_> {
    /// The subvolume's fs tree as the running transaction has it.
    pub(super) fn tree(&self) -> Result<Tree<'_>> {
        self.fs.fs_tree(self.subvol)
    }

    /// Change the subvolume's fs tree.
    pub(super) fn edit<R>(
        &mut self,
        f: impl FnOnce(&mut TreeEditor<'_>, &mut RootPtr) -> Result<R>,
    ) -> Result<R> {
        self.fs.modify_tree(self.w, self.subvol, f)
    }

    /// The inode item of `ino`, if the subvolume has it.
    pub(super) fn inode(&self, ino: u64) -> Result<Option<InodeItem>> {
        self.tree()?
            .get(&Key::new(ino, INODE_ITEM_KEY, 0))?
            .map(|it| InodeItem::parse(it.data()))
            .transpose()
    }

    pub(super) fn warn(&mut self, msg: String) {
        self.warnings
            .push(format!("log replay, subvolume {}: {msg}", self.subvol));
    }

    /// All passes; returns the numbers of inode and extent items applied.
    fn run(&mut self) -> Result<(usize, usize)> {
        let log = self.log;
        let mut inodes = 0;
        for (key, data) in &log.items {
            if key.item_type == INODE_ITEM_KEY
                && key.offset == 0
                && self.replay_inode(key.objectid, data)?
            {
                inodes += 1;
            }
        }
        for (key, data) in &log.items {
            if key.item_type == DIR_INDEX_KEY && !self.ignored.contains(&key.objectid) {
                self.replay_dir_index(key.objectid, key.offset, data)?;
            }
        }
        let mut extents = 0;
        let mut unknown = BTreeSet::new();
        for (key, data) in &log.items {
            if self.ignored.contains(&key.objectid) {
                continue;
            }
            match key.item_type {
                XATTR_ITEM_KEY => {
                    let (k, d) = (*key, data.clone());
                    self.edit(|ed, root| ed.put(root, k, d))?;
                }
                INODE_REF_KEY => {
                    let refs = InodeRef::parse_refs(data, key.offset)?;
                    self.replay_refs(key.objectid, refs, false)?;
                }
                INODE_EXTREF_KEY => {
                    let refs = InodeRef::parse_extrefs(data)?;
                    self.replay_refs(key.objectid, refs, true)?;
                }
                EXTENT_DATA_KEY => {
                    self.replay_extent(key.objectid, key.offset, data)?;
                    extents += 1;
                }
                // Replayed by the first passes or with their extents
                // (checksums); DIR_ITEM entries repeat the DIR_INDEX ones.
                INODE_ITEM_KEY | DIR_INDEX_KEY | DIR_ITEM_KEY | DIR_LOG_INDEX_KEY
                | DIR_LOG_ITEM_KEY | EXTENT_CSUM_KEY => {}
                t => {
                    unknown.insert(t);
                }
            }
        }
        if !unknown.is_empty() {
            self.warn(format!("log items of types {unknown:?} are not replayed"));
        }
        self.run_fixups()?;
        Ok((inodes, extents))
    }

    /// Pass 1 for one logged inode item; false if the inode is left out.
    fn replay_inode(&mut self, ino: u64, data: &[u8]) -> Result<bool> {
        let logged = InodeItem::parse(data)?;
        if logged.nlink == 0 {
            self.ignored.insert(ino);
            return Ok(false);
        }
        let is_dir = logged.mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir {
            self.dir_deletes(ino)?;
        }
        self.xattr_deletes(ino)?;
        // Generation 0 marks an inode logged only to say that it exists
        // (a renamed inode, a new entry of a logged directory): an inode
        // the subvolume has keeps its item, but a file takes a logged
        // non-zero size. The byte count is never logged (the kernel leaves
        // it stale in the log); the fixup recomputes it, and a directory's
        // size, from the items.
        let is_reg = logged.mode & libc::S_IFMT == libc::S_IFREG;
        let item = match (logged.generation, self.inode(ino)?) {
            (0, Some(mut have)) => {
                if is_reg && have.mode & libc::S_IFMT == libc::S_IFREG && logged.size != 0 {
                    have.size = logged.size;
                }
                have
            }
            (0, None) => InodeItem {
                generation: self.w.blocks.transid,
                ..logged
            },
            _ => logged,
        };
        let bytes = item.to_bytes();
        self.edit(|ed, root| ed.put(root, Key::new(ino, INODE_ITEM_KEY, 0), bytes))?;
        if is_reg && item.mode & libc::S_IFMT == libc::S_IFREG {
            let ss = self.fs.geometry().sectorsize as u64;
            // A size in the last sector below 2^64 has no sector end.
            let from = item.size.div_ceil(ss).checked_mul(ss).ok_or_else(|| {
                Error::corrupt(format!("logged size {} of inode {ino}", item.size))
            })?;
            let id = crate::fs::InodeId {
                subvol: self.subvol,
                ino,
            };
            self.fs.drop_range(self.w, id, from, u64::MAX)?;
        }
        self.fixup.insert(ino);
        Ok(true)
    }

    /// Remove the entries of directory `dir` that lie in a range the log
    /// covers but that the log does not hold.
    fn dir_deletes(&mut self, dir: u64) -> Result<()> {
        let log = self.log;
        let mut victims: Vec<Vec<u8>> = Vec::new();
        // (range item type, entry item type) pairs: index ranges over
        // DIR_INDEX entries; older kernels also log name-hash ranges.
        for (range_type, entry_type) in [
            (DIR_LOG_INDEX_KEY, DIR_INDEX_KEY),
            (DIR_LOG_ITEM_KEY, DIR_ITEM_KEY),
        ] {
            for (key, data) in log.items_of(dir, range_type) {
                let end =
                    u64::from_le_bytes(data.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(
                        || Error::corrupt(format!("log range item {key} too short")),
                    )?);
                let tree = self.tree()?;
                for item in tree.range(
                    Key::new(dir, entry_type, key.offset),
                    Key::new(dir, entry_type, end),
                )? {
                    let item = item?;
                    let logged = log.get(&item.key()).map(DirItem::parse_all).transpose()?;
                    for d in DirItem::parse_all(item.data())? {
                        let kept = logged
                            .as_ref()
                            .is_some_and(|l| l.iter().any(|e| e.name == d.name));
                        if !kept && d.location.item_type == INODE_ITEM_KEY {
                            victims.push(d.name);
                        }
                    }
                }
            }
        }
        victims.sort();
        victims.dedup();
        for name in victims {
            self.unlink(dir, &name)?;
        }
        Ok(())
    }

    /// Remove the xattrs of `ino` that the log does not hold.
    fn xattr_deletes(&mut self, ino: u64) -> Result<()> {
        let log = self.log;
        let mut changes: Vec<(Key, Vec<u8>)> = Vec::new();
        for item in self.tree()?.items_of(ino, XATTR_ITEM_KEY)? {
            let item = item?;
            let logged = log.get(&item.key()).map(DirItem::parse_all).transpose()?;
            let all = DirItem::parse_all(item.data())?;
            let mut rest = Vec::new();
            let mut dropped = false;
            for d in all {
                if logged
                    .as_ref()
                    .is_some_and(|l| l.iter().any(|e| e.name == d.name))
                {
                    d.encode(&mut rest);
                } else {
                    dropped = true;
                }
            }
            if dropped {
                changes.push((item.key(), rest));
            }
        }
        for (key, rest) in changes {
            self.edit(|ed, root| {
                if rest.is_empty() {
                    ed.delete(root, key).map(|_| ())
                } else {
                    ed.put(root, key, rest)
                }
            })?;
        }
        Ok(())
    }

    /// Pass 2 for one logged DIR_INDEX item.
    fn replay_dir_index(&mut self, dir: u64, index: u64, data: &[u8]) -> Result<()> {
        if self.inode(dir)?.is_none() {
            return Ok(());
        }
        for d in DirItem::parse_all(data)? {
            if d.location.item_type != INODE_ITEM_KEY {
                // Links to subvolumes are made by transaction commits only.
                continue;
            }
            let target = d.location.objectid;
            if self.inode(target)?.is_none() {
                continue;
            }
            let extended = self.logged_as_extref(target, dir, &d.name);
            self.ensure_link(
                dir,
                &d.name,
                target,
                d.file_type,
                index,
                d.transid,
                extended,
            )?;
        }
        Ok(())
    }

    /// Whether the log records the name (`dir`, `name`) of `ino` in an
    /// INODE_EXTREF item.
    fn logged_as_extref(&self, ino: u64, dir: u64, name: &[u8]) -> bool {
        let key = Key::new(ino, INODE_EXTREF_KEY, super::names::extref_hash(dir, name));
        self.log
            .get(&key)
            .and_then(|d| InodeRef::parse_extrefs(d).ok())
            .is_some_and(|refs| refs.iter().any(|r| r.parent == dir && r.name == name))
    }

    /// The names the log gives inode `ino` in directory `parent`.
    fn logged_names(&self, ino: u64, parent: u64) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        if let Some(d) = self.log.get(&Key::new(ino, INODE_REF_KEY, parent)) {
            out.extend(InodeRef::parse_refs(d, parent)?.into_iter().map(|r| r.name));
        }
        for (_, d) in self.log.items_of(ino, INODE_EXTREF_KEY) {
            out.extend(
                InodeRef::parse_extrefs(d)?
                    .into_iter()
                    .filter(|r| r.parent == parent)
                    .map(|r| r.name),
            );
        }
        Ok(out)
    }

    /// Pass 3 for one logged INODE_REF or INODE_EXTREF item: in each parent
    /// it names, the inode's names become the logged ones.
    fn replay_refs(&mut self, ino: u64, refs: Vec<InodeRef>, extended: bool) -> Result<()> {
        let Some(inode) = self.inode(ino)? else {
            return Ok(());
        };
        let file_type = super::names::file_type_of(inode.mode);
        let transid = self.w.blocks.transid;
        let parents: BTreeSet<u64> = refs.iter().map(|r| r.parent).collect();
        for parent in parents {
            // A subvolume's root directory names itself "..".
            if parent == ino || self.inode(parent)?.is_none() {
                continue;
            }
            let logged = self.logged_names(ino, parent)?;
            for old in self.names_in(ino, parent)? {
                if !logged.contains(&old.name) {
                    self.unlink(parent, &old.name)?;
                }
            }
            for r in refs.iter().filter(|r| r.parent == parent) {
                self.ensure_link(parent, &r.name, ino, file_type, r.index, transid, extended)?;
            }
        }
        self.fixup.insert(ino);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::items::{ExtentBody, FileExtentItem};
    use crate::fs::InodeId;
    use crate::test_fs::TestFs;
    use crate::tree_log::read::SubvolLog;

    /// Replay a log of the top subvolume holding `items` (sorted here).
    fn replay(t: &TestFs, mut items: Vec<(Key, Vec<u8>)>) -> Result<ReplaySummary> {
        items.sort_by_key(|(k, _)| *k);
        let log = Log {
            subvols: vec![SubvolLog {
                subvol: FS_TREE_OBJECTID,
                root: RootPtr {
                    bytenr: 0,
                    level: 0,
                    generation: None,
                },
                items,
            }],
            blocks: Vec::new(),
        };
        let mut w = t.fs().lock_writer()?;
        replay_log(t.fs(), &mut w, &log)
    }

    /// A file of two sectors, and its extent item's disk address.
    fn two_sectors(t: &TestFs) -> (InodeId, FileExtentItem, u64) {
        let id = t.file(b"f", &[5u8; 8192]);
        let fe = t.extent(id, 0);
        let ExtentBody::Regular { disk_bytenr, .. } = fe.body else {
            panic!("not a regular extent: {fe:?}");
        };
        (id, fe, disk_bytenr)
    }

    fn with_body(
        fe: &FileExtentItem,
        disk_bytenr: u64,
        disk_num_bytes: u64,
        num_bytes: u64,
    ) -> Vec<u8> {
        let mut fe = fe.clone();
        fe.body = ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset: 0,
            num_bytes,
        };
        fe.to_bytes()
    }

    fn assert_corrupt(r: Result<ReplaySummary>) {
        match r {
            Err(Error::Corrupt(_)) => {}
            other => panic!("expected a corrupt-metadata error, got {other:?}"),
        }
    }

    #[test]
    fn logged_extent_in_partial_sectors_is_corrupt() {
        let t = TestFs::new();
        let (id, fe, d) = two_sectors(&t);
        let cs = t.fs().geometry().csum_size;
        // Checksums for both sectors, but an extent ending inside the
        // second: the per-sector table must not be indexed past its end.
        let items = vec![
            (
                Key::new(id.ino, EXTENT_DATA_KEY, 0),
                with_body(&fe, d, 8192, 4097),
            ),
            (
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, d),
                vec![0u8; 2 * cs],
            ),
        ];
        assert_corrupt(replay(&t, items));
    }

    #[test]
    fn logged_extent_longer_than_any_is_corrupt() {
        let t = TestFs::new();
        let (id, fe, d) = two_sectors(&t);
        let huge = 1u64 << 50;
        let items = vec![(
            Key::new(id.ino, EXTENT_DATA_KEY, 0),
            with_body(&fe, d, huge, huge),
        )];
        assert_corrupt(replay(&t, items));
    }

    #[test]
    fn logged_extent_past_the_address_space_is_corrupt() {
        let t = TestFs::new();
        let (id, fe, _) = two_sectors(&t);
        let start = u64::MAX / 4096 * 4096;
        let items = vec![(
            Key::new(id.ino, EXTENT_DATA_KEY, 0),
            with_body(&fe, start, 8192, 8192),
        )];
        assert_corrupt(replay(&t, items));
    }

    #[test]
    fn logged_extent_across_its_block_group_end_is_corrupt() {
        let t = TestFs::new();
        let (id, fe, d) = two_sectors(&t);
        let end = {
            let mut w = t.fs().lock_writer().unwrap();
            let g = w.blocks.alloc.group_of(d).unwrap();
            g.start + g.len
        };
        let items = vec![(
            Key::new(id.ino, EXTENT_DATA_KEY, 0),
            with_body(&fe, end - 4096, 8192, 8192),
        )];
        assert_corrupt(replay(&t, items));
    }

    #[test]
    fn logged_size_in_the_last_sector_of_the_address_space_is_corrupt() {
        let t = TestFs::new();
        let (id, _, _) = two_sectors(&t);
        let mut item = t.inode(id);
        item.size = u64::MAX - 10;
        let items = vec![(Key::new(id.ino, INODE_ITEM_KEY, 0), item.to_bytes())];
        assert_corrupt(replay(&t, items));
        // The file kept its data extent.
        assert!(matches!(
            t.extent(id, 0).body,
            ExtentBody::Regular { disk_bytenr, .. } if disk_bytenr != 0
        ));
    }
}

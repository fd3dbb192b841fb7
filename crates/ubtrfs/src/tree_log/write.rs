//! fsync: make one inode's changes durable, through the log tree when it
//! can (DESIGN.md layer 9, seed 000), else by committing.
//!
//! For a regular file: write its dirty data back; log the inode item, its
//! names, all its xattrs, the file extent items that differ from the
//! committed file (all of a new one), a hole item where committed data
//! went, and the checksums of the logged extents. For a directory: its
//! entries that changed since the last commit. Then, for both, whatever
//! names that needs (`dir_log`: the directories a rename or unlink
//! changed, the inodes a directory's new entries name); then write the
//! log's blocks, flush once, and write the superblock with `log_root` by
//! FUA. A replay, the kernel's or ours, then rebuilds the inode from the
//! committed tree and the log.
//!
//! Everything else commits the running transaction, the kernel's own
//! fallback when it cannot log: symlinks and special files, files with
//! extents past their end, unlinked open files, names that reach new
//! subvolume links or directories removed since, more than
//! `dir_log::MAX_LOGGED` inodes to log, and any failure while logging
//! (the commit then drops the half-changed log). A commit always makes at
//! least as much durable as the log would.

use super::dir_log;
use super::log_tree::{ItemMap, LogSync, LogTree, LoggedInode};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem, InodeItem, RootItem, RootRef};
use crate::format::node::Node;
use crate::fs::{Filesystem, InodeId};
use crate::transaction::Writer;
use crate::tree::{ItemRef, RootPtr, Tree};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Checksums of consecutive sectors, `None` where there is none.
type Sums = Vec<Option<Vec<u8>>>;

/// How an fsync made its inode durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// Nothing had changed since the last commit.
    Nothing,
    /// The inode's changes went into the log tree.
    Logged,
    /// The whole running transaction was committed.
    Committed,
}

/// What [`Filesystem::fsync_log`] could do.
pub enum LogOnly<'a> {
    /// The fsync is under way, or had nothing to do: wait for it.
    Started(PendingSync<'a>),
    /// Data to write back, or no room for the log: run
    /// [`Filesystem::fsync_start`] with readers shut out.
    NeedsWriteback,
    /// The inode could not be logged: commit ([`Filesystem::commit`]).
    NeedsCommit,
}

/// An fsync whose log is written: [`PendingSync::wait`] makes it durable.
pub struct PendingSync<'a> {
    fs: &'a Filesystem,
    state: Pending,
    /// The turn of this fsync (see [`Filesystem::fsync_start`]).
    _turn: std::sync::MutexGuard<'a, ()>,
}

enum Pending {
    Done(Synced),
    /// The log to make durable, written in transaction `transid`.
    Log {
        sync: LogSync,
        transid: u64,
    },
}

impl PendingSync<'_> {
    /// Wait until the fsync is durable, holding no lock meanwhile but
    /// this fsync's turn; commit if the log could not be made durable.
    pub fn wait(self) -> Result<Synced> {
        let fs = self.fs;
        match self.wait_for_device()? {
            Some(how) => Ok(how),
            None => {
                fs.commit()?;
                Ok(Synced::Committed)
            }
        }
    }

    /// [`PendingSync::wait`], but `None` where the log could not be made
    /// durable: the caller commits then ([`Filesystem::commit`]), as it
    /// commits otherwise (a server shuts out its readers first).
    pub fn wait_for_device(self) -> Result<Option<Synced>> {
        let fs = self.fs;
        let (sync, transid) = match self.state {
            Pending::Done(how) => return Ok(Some(how)),
            Pending::Log { sync, transid } => (sync, transid),
        };
        let root = sync.root();
        let finished = sync.finish(&fs.supers_on_disk);
        match finished {
            Ok(true) => {
                // The log takes note at its next change (the change lock may
                // be busy now, and nothing waits for it).
                *fs.log_durable.lock().unwrap_or_else(|e| e.into_inner()) = Some(root);
                Ok(Some(Synced::Logged))
            }
            // A commit since then wrote everything.
            Ok(false) if fs.committed.load(std::sync::atomic::Ordering::Acquire) >= transid => {
                Ok(Some(Synced::Logged))
            }
            // A commit since then failed.
            Ok(false) => Ok(None),
            Err(e) => {
                // The log's blocks may be written in part, yet the log
                // takes them as written: no later fsync may build on it
                // (this one still holds the turn), only a commit, which
                // drops it.
                let mut w = fs.lock_writer()?;
                w.log_broken = true;
                if w.log_self_check {
                    return Err(e);
                }
                // A commit makes everything durable; its own failure is
                // the one to report.
                Ok(None)
            }
        }
    }
}

impl Filesystem {
    /// Make every change to inode `id` durable: its data, size, attributes,
    /// xattrs and names, as `fsync(2)` (or `fdatasync(2)` when `datasync`)
    /// promises. When this returns, a crash followed by any mount (the
    /// kernel's or ubtrfs's) shows the inode at least as it was here.
    ///
    /// A regular file or a directory is logged (one cache flush and one
    /// superblock write), with the names a replay needs to show it where
    /// it is; anything else commits the running transaction. `datasync` makes no difference yet. Fails
    /// if `id` does not exist.
    pub fn fsync(&self, id: InodeId, datasync: bool) -> Result<Synced> {
        self.fsync_start(id, datasync)?.wait()
    }

    /// [`Filesystem::fsync`] in two steps. This one writes the inode's
    /// data and the log under the change lock; [`PendingSync::wait`]
    /// waits for the device to make them durable, while other changes go
    /// on. Fsyncs still run one at a time: the next one starts only once
    /// the pending one is dropped.
    pub fn fsync_start(&self, id: InodeId, datasync: bool) -> Result<PendingSync<'_>> {
        let _ = datasync;
        // A missing inode is the caller's error, not something to commit for.
        self.stat(id)?;
        let turn = self.log_sync.lock().unwrap_or_else(|e| e.into_inner());
        // Changes are let in after the turn: a pending fsync that holds
        // the turn may commit.
        self.change("fsync", move || {
            let mut w = self.lock_writer()?;
            let pending = |state, turn| Ok(self.pending_sync(state, turn));
            self.fsync_atime(&mut w, id)?;
            if !w.is_dirty() && !self.delalloc().has(id) {
                drop(w);
                return pending(Pending::Done(Synced::Nothing), turn);
            }
            self.take_durable(&mut w)?;
            let logged = self.writeback(&mut w, id).and_then(|()| {
                // The log copies the file's checksums and needs its data on disk.
                self.finish_in_flight(&mut w, Some(id), true)?;
                if self.may_log(&mut w)? {
                    self.log_inode(&mut w, id)
                } else {
                    Ok(None)
                }
            });
            match logged {
                Ok(Some(sync)) => {
                    // The log's own transaction (making room for it may have
                    // committed the one running before).
                    let transid = w.blocks.transid;
                    drop(w);
                    pending(Pending::Log { sync, transid }, turn)
                }
                Err(e) if w.log_self_check => Err(e),
                // The file's writeback stopped half-way: nothing may commit
                // that (the operation aborts).
                Err(e) if !crate::transaction::abort::is_whole() => Err(e),
                // Whatever stopped the log, the commit drops it and makes
                // everything durable; its own failure is the one to report.
                Ok(None) | Err(_) => {
                    self.commit_locked(&mut w)?;
                    drop(w);
                    pending(Pending::Done(Synced::Committed), turn)
                }
            }
        })
    }

    /// The part of an fsync that changes the trees readers see: write
    /// inode `id`'s dirty data back and make room for the log. Then
    /// [`Filesystem::fsync_log`] may run beside readers.
    pub fn fsync_prepare(&self, id: InodeId) -> Result<()> {
        self.change("fsync", || {
            let mut w = self.lock_writer()?;
            self.fsync_atime(&mut w, id)?;
            self.writeback(&mut w, id)?;
            self.finish_in_flight(&mut w, Some(id), true)?;
            self.reserve_metadata(&mut w, crate::transaction::Reserving::Growing)
        })
    }

    /// [`Filesystem::fsync_start`] for a file [`Filesystem::fsync_prepare`]
    /// wrote back: log it without changing any tree a reader sees, so
    /// readers may run meanwhile (changes must not). Says when it cannot:
    /// the file has data to write back again or the log needs room (run
    /// [`Filesystem::fsync_start`] with readers shut out), or the inode
    /// cannot be logged (commit; until then every fsync commits).
    pub fn fsync_log(&self, id: InodeId, datasync: bool) -> Result<LogOnly<'_>> {
        let _ = datasync;
        self.stat(id)?;
        let turn = self.log_sync.lock().unwrap_or_else(|e| e.into_inner());
        self.change("fsync", move || {
            let mut w = self.lock_writer()?;
            let started = |state, turn| Ok(LogOnly::Started(self.pending_sync(state, turn)));
            let has_data = self.delalloc().has(id) || self.in_flight.has(id);
            if !w.is_dirty() && !has_data {
                drop(w);
                return started(Pending::Done(Synced::Nothing), turn);
            }
            let room = w.blocks.alloc.free_bytes(crate::alloc::SpaceKind::Metadata)
                >= 2 * self.metadata_reserve();
            if has_data || !room {
                return Ok(LogOnly::NeedsWriteback);
            }
            self.take_durable(&mut w)?;
            match self.log_inode(&mut w, id) {
                Ok(Some(sync)) => {
                    let transid = w.blocks.transid;
                    drop(w);
                    started(Pending::Log { sync, transid }, turn)
                }
                Err(e) if w.log_self_check => Err(e),
                // The log may be half changed: only a commit may drop it.
                Ok(None) | Err(_) => {
                    w.log_broken = true;
                    Ok(LogOnly::NeedsCommit)
                }
            }
        })
    }

    /// Put the access time noted for `id` in its item, so that the log
    /// holds it (the kernel logs the inode with it); left to the commit
    /// when metadata is short.
    fn fsync_atime(&self, w: &mut Writer, id: InodeId) -> Result<()> {
        match self.write_pending_atime(w, id) {
            Err(Error::NoSpace(_)) => Ok(()),
            r => r,
        }
    }

    fn pending_sync<'a>(
        &'a self,
        state: Pending,
        turn: std::sync::MutexGuard<'a, ()>,
    ) -> PendingSync<'a> {
        PendingSync {
            fs: self,
            state,
            _turn: turn,
        }
    }

    /// What the last fsync made durable: the blocks its log replaced are
    /// free now.
    fn take_durable(&self, w: &mut Writer) -> Result<()> {
        let durable = self
            .log_durable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(root) = durable {
            let Writer { log, blocks, .. } = w;
            // Gone if a commit came in between: it freed the log then.
            if let Some(log) = log.as_mut() {
                log.synced(root, &mut blocks.alloc)?;
            }
        }
        Ok(())
    }

    /// Whether the log may take more metadata space: the commit that
    /// drops it must still find its reserve. Adds a metadata chunk when
    /// the space runs low, as any change does.
    fn may_log(&self, w: &mut Writer) -> Result<bool> {
        self.reserve_metadata(w, crate::transaction::Reserving::Growing)?;
        Ok(w.blocks.alloc.free_bytes(crate::alloc::SpaceKind::Metadata)
            >= 2 * self.metadata_reserve())
    }

    /// The root of subvolume `subvol` as the last commit left it, if it had
    /// the subvolume.
    fn committed_root(&self, w: &Writer, subvol: u64) -> Result<Option<RootPtr>> {
        let Some(raw) = w.dev_supers.values().next() else {
            return Err(Error::Devices("no device to read the superblock of".into()));
        };
        let le = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().unwrap_or_default());
        let root_tree = RootPtr {
            bytenr: le(0x50),
            level: raw[0xc6],
            generation: Some(le(0x48)),
        };
        let found = self
            .tree_reader()
            .tree(root_tree)
            .get_le(&Key::new(subvol, ROOT_ITEM_KEY, u64::MAX))?
            .filter(|it| it.key().objectid == subvol && it.key().item_type == ROOT_ITEM_KEY);
        let Some(item) = found else {
            return Ok(None);
        };
        let r = RootItem::parse(item.data())?;
        if r.refs == 0 {
            // A subvolume deleted while in use: a log replayed into it
            // after a crash would meet a tree on its way out. Commit.
            return Ok(None);
        }
        Ok(Some(RootPtr {
            bytenr: r.bytenr,
            level: r.level,
            generation: Some(r.generation),
        }))
    }

    /// Log inode `id` (its dirty data already written back) with the
    /// names that must come with it, and write the log. `None` if the
    /// inode cannot be logged: the caller commits.
    fn log_inode(&self, w: &mut Writer, id: InodeId) -> Result<Option<LogSync>> {
        if w.log_broken {
            return Ok(None);
        }
        let Some(old_root) = self.committed_root(w, id.subvol)? else {
            return Ok(None);
        };
        let cur = self.fs_tree(id.subvol)?;
        let old = self.tree_reader().tree(old_root);
        let Some(item) = cur
            .get(&Key::new(id.ino, INODE_ITEM_KEY, 0))?
            .map(|it| InodeItem::parse(it.data()))
            .transpose()?
        else {
            return Ok(None);
        };
        if w.log.is_none() {
            let log = LogTree::new(
                self.tree_reader().volume().clone(),
                self.superblock(),
                w.blocks.transid,
                w.chunk_tree_uuid(),
            );
            w.log = Some(log);
        }
        let is_dir = match item.mode & libc::S_IFMT {
            libc::S_IFREG => {
                if !self.log_file_data(w, id, &cur, &old)? {
                    return Ok(None);
                }
                false
            }
            libc::S_IFDIR => true,
            _ => return Ok(None),
        };
        if !self.log_names(w, id, is_dir)? {
            return Ok(None);
        }
        // A block of the log, or data it names, in a chunk added since
        // the commit: the replay could not find it.
        if !w.new_chunks.is_empty() && w.log.as_ref().is_some_and(|l| l.touches(&w.new_chunks)) {
            return Ok(None);
        }
        let Writer {
            log,
            blocks,
            dev_supers,
            ..
        } = &mut *w;
        let log = log
            .as_mut()
            .ok_or_else(|| Error::corrupt("the log vanished"))?;
        let reader = self.tree_reader();
        let sync = log.sync_start(
            &mut blocks.alloc,
            reader.volume(),
            dev_supers,
            reader.csum_type(),
        )?;
        Ok(Some(sync))
    }

    /// Log the names inode `id` needs (a directory, `is_dir`: its
    /// entries) and everything those need; and again every directory and
    /// inode the log holds that lost a name since the log's names were
    /// last brought up to date. False if that cannot be logged.
    fn log_names(&self, w: &mut Writer, id: InodeId, is_dir: bool) -> Result<bool> {
        if !self.subvolume_in_place(w, id.subvol)? {
            return Ok(false);
        }
        let log = w
            .log
            .as_ref()
            .ok_or_else(|| Error::corrupt("the log vanished"))?;
        // Per subvolume: inodes whose names to log, directories to log.
        let mut todo: BTreeMap<u64, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
        // Per subvolume and directory: the (index, inode) of each entry
        // removed since.
        let mut removed_from: BTreeMap<u64, dir_log::Removed> = BTreeMap::new();
        let start = todo.entry(id.subvol).or_default();
        if is_dir {
            start.1.push(id.ino);
        } else {
            start.0.push(id.ino);
        }
        // Names removed since: the directories and inodes the log holds
        // that lost one are logged again.
        for &(subvol, dir, ino, index) in &w.removed_names {
            let (d, i) = (InodeId { subvol, ino: dir }, InodeId { subvol, ino });
            if log.dirs.contains(&d) {
                todo.entry(subvol).or_default().1.push(dir);
            }
            removed_from
                .entry(subvol)
                .or_default()
                .entry(dir)
                .or_default()
                .push((index, ino));
            if log.named.contains(&i) {
                todo.entry(subvol).or_default().0.push(ino);
            }
        }
        let mut plans = Vec::new();
        for (subvol, (inodes, dirs)) in todo {
            let Some(old_root) = self.committed_root(w, subvol)? else {
                return Ok(false);
            };
            let cur = self.fs_tree(subvol)?;
            let old = self.tree_reader().tree(old_root);
            if subvol == id.subvol && !is_dir && !dir_log::file_in_place(&cur, &old, id.ino)? {
                return Ok(false);
            }
            let none = dir_log::Removed::new();
            let logged = dir_log::Logged {
                subvol,
                items: log.items(subvol),
                named: &log.named,
                gone: &log.gone,
                dir_max: &log.dir_max,
                subdirs: &log.subdirs,
                removed_from: removed_from.get(&subvol).unwrap_or(&none),
            };
            let Some(plan) = dir_log::plan(&cur, &old, &logged, inodes, dirs)? else {
                return Ok(false);
            };
            plans.push((subvol, old_root, plan));
        }
        let Writer {
            log,
            blocks,
            removed_names,
            ..
        } = &mut *w;
        let log = log
            .as_mut()
            .ok_or_else(|| Error::corrupt("the log vanished"))?;
        let mut lookup = self.csum_lookup()?;
        for (subvol, old_root, plan) in &plans {
            let cur = self.fs_tree(*subvol)?;
            let old = self.tree_reader().tree(*old_root);
            for &ino in &plan.gone {
                let id = InodeId {
                    subvol: *subvol,
                    ino,
                };
                log.forget(&mut blocks.alloc, id, &mut lookup)?;
            }
            dir_log::write(log, &mut blocks.alloc, *subvol, &cur, &old, plan)?;
        }
        removed_names.clear();
        Ok(true)
    }

    /// Whether the directories holding subvolume `subvol`'s link, and
    /// those holding its parents' links, have the names the last commit
    /// gave them: else a log of something in `subvol` would show it,
    /// after a replay, below a directory's old place. (The walk up from
    /// an inode stops at its subvolume's root.)
    fn subvolume_in_place(&self, w: &Writer, subvol: u64) -> Result<bool> {
        let mut sv = subvol;
        // Deeper than subvolumes nest in practice: a loop in damaged refs.
        for _ in 0..256 {
            if sv == FS_TREE_OBJECTID {
                return Ok(true);
            }
            let back = self
                .root_tree()
                .items_of(sv, ROOT_BACKREF_KEY)?
                .next()
                .transpose()?;
            let Some(item) = back else {
                return Ok(false);
            };
            let parent = item.key().offset;
            let link = RootRef::parse(item.data())?;
            let Some(old_root) = self.committed_root(w, parent)? else {
                return Ok(false);
            };
            let cur = self.fs_tree(parent)?;
            let old = self.tree_reader().tree(old_root);
            if !dir_log::unmoved(&cur, &old, link.dirid)? {
                return Ok(false);
            }
            sv = parent;
        }
        Ok(false)
    }

    /// Log regular file `id`'s inode item, xattrs, names, and its file
    /// extent items and checksums (its dirty data already written back).
    /// False if the file cannot be logged: the caller commits.
    ///
    /// A file logged before in this transaction is logged again only
    /// where it changed since: the fs tree leaves holding its extents that
    /// are new blocks since then (and its old ones that went) say which
    /// file ranges to look at again, so the cost follows the change, not
    /// the size of the file.
    fn log_file_data(
        &self,
        w: &mut Writer,
        id: InodeId,
        cur: &Tree<'_>,
        old: &Tree<'_>,
    ) -> Result<bool> {
        let (cur, old) = (*cur, *old);
        let Some((head, item)) = inode_head(&cur, id.ino)? else {
            return Ok(false);
        };
        let geo = self.geometry();
        let ss = geo.sectorsize as u64;
        let end = item.size.div_ceil(ss).saturating_mul(ss);
        let transid = w.blocks.transid;
        let leaves = cur.leaves(
            Key::new(id.ino, EXTENT_DATA_KEY, 0),
            Key::new(id.ino, EXTENT_DATA_KEY, u64::MAX),
        )?;
        let Writer {
            log,
            blocks,
            log_self_check,
            ..
        } = &mut *w;
        let log = log
            .as_mut()
            .ok_or_else(|| Error::corrupt("the log vanished"))?;
        let dirty = match log.inode(id) {
            None => vec![(0, u64::MAX)],
            Some(prev) => changed_ranges(prev, &leaves, id.ino, item.size, ss)?,
        };
        let mut lookup = self.csum_lookup()?;
        for (x, y) in dirty {
            let (a, b) = expand(&cur, log.items(id.subvol), id.ino, x, y, ss)?;
            let Some(want) = extent_want(&cur, &old, id.ino, (a, b), end, transid, ss)? else {
                return Ok(false);
            };
            log.set_extents(
                &mut blocks.alloc,
                id.subvol,
                id.ino,
                a,
                b,
                want,
                &mut lookup,
            )?;
        }
        log.set_range(
            &mut blocks.alloc,
            id.subvol,
            Key::new(id.ino, 0, 0),
            Key::new(id.ino, EXTENT_DATA_KEY - 1, u64::MAX),
            head,
        )?;
        log.remember(
            id,
            LoggedInode {
                leaves,
                size: item.size,
            },
        );
        if *log_self_check {
            let full = extent_want(&cur, &old, id.ino, (0, u64::MAX), end, transid, ss)?
                .ok_or_else(|| Error::corrupt("log self-check: the file cannot be logged"))?;
            let lo = Key::new(id.ino, EXTENT_DATA_KEY, 0);
            let hi = Key::new(id.ino, EXTENT_DATA_KEY, u64::MAX);
            let have: ItemMap = log
                .items(id.subvol)
                .map(|m| m.range(lo..=hi).map(|(k, v)| (*k, v.clone())).collect())
                .unwrap_or_default();
            if have != full {
                return Err(Error::corrupt(format!(
                    "log self-check: inode {} logged incrementally as {:?}, from scratch as {:?}",
                    id.ino,
                    have.keys().map(|k| k.offset).collect::<Vec<_>>(),
                    full.keys().map(|k| k.offset).collect::<Vec<_>>()
                )));
            }
        }
        Ok(true)
    }

    /// Look up the checksums of `count` data sectors from `start` in the
    /// checksum tree as it is now (`None` where it has none).
    fn csum_lookup(&self) -> Result<impl FnMut(u64, usize) -> Result<Sums> + use<'_>> {
        let geo = self.geometry();
        let csums = self.csum_tree()?;
        Ok(
            move |start: u64, count: usize| -> Result<Vec<Option<Vec<u8>>>> {
                let Some(t) = &csums else {
                    return Ok(vec![None; count]);
                };
                let sums =
                    crate::csum_tree::lookup(t, start, count, geo.sectorsize, geo.csum_size)?;
                Ok(sums
                    .into_iter()
                    .map(|c| c.map(|c| c[..geo.csum_size].to_vec()))
                    .collect())
            },
        )
    }

    /// Check every incremental log against one made from scratch, failing
    /// the fsync on a difference (for tests; slow on big files).
    #[doc(hidden)]
    pub fn set_log_self_check(&self, on: bool) -> Result<()> {
        self.lock_writer()?.log_self_check = on;
        Ok(())
    }
}

/// The inode item, names and xattrs of regular file `ino` for the log,
/// and its inode item; `None` if it cannot be logged: not a regular
/// file, or unlinked (an open file without names goes with its last
/// close; a commit records that).
fn inode_head(cur: &Tree<'_>, ino: u64) -> Result<Option<(ItemMap, InodeItem)>> {
    let (lo, hi) = (
        Key::new(ino, 0, 0),
        Key::new(ino, EXTENT_DATA_KEY - 1, u64::MAX),
    );
    let c = split(cur.range(lo, hi)?)?;
    let Some(inode) = &c.inode else {
        return Ok(None);
    };
    let item = InodeItem::parse(inode.data())?;
    if item.mode & libc::S_IFMT != libc::S_IFREG || item.nlink == 0 {
        return Ok(None);
    }
    let mut head = ItemMap::new();
    for it in c.names.iter().chain(&c.xattrs) {
        head.insert(it.key(), it.data().to_vec());
    }
    head.insert(inode.key(), inode.data().to_vec());
    Ok(Some((head, item)))
}

/// The file ranges of inode `ino` that may have changed since `prev` was
/// logged: the spans of its extent items that went, came or changed in
/// leaves that went or came, and the range between the old and new size.
/// Items a changed leaf holds as before are left out: a random write
/// into a big file rewrites one leaf of a few hundred items, of which
/// one or two differ.
fn changed_ranges(
    prev: &LoggedInode,
    now: &[Arc<Node>],
    ino: u64,
    size: u64,
    ss: u64,
) -> Result<Vec<(u64, u64)>> {
    let ptrs = |v: &[Arc<Node>]| -> HashSet<*const Node> { v.iter().map(Arc::as_ptr).collect() };
    let (before, after) = (ptrs(&prev.leaves), ptrs(now));
    // Both in key order: the leaves are, and so are their items.
    let went = extent_items(
        prev.leaves
            .iter()
            .filter(|l| !after.contains(&Arc::as_ptr(l))),
        ino,
    );
    let came = extent_items(
        now.iter().filter(|l| !before.contains(&Arc::as_ptr(l))),
        ino,
    );
    let mut d = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < went.len() || j < came.len() {
        let (w, c) = (went.get(i), came.get(j));
        match (w, c) {
            (Some(&(kw, dw)), Some(&(kc, dc))) if kw == kc => {
                if dw != dc {
                    d.push(span(&kw, dw, ss)?);
                    d.push(span(&kc, dc, ss)?);
                }
                i += 1;
                j += 1;
            }
            (Some(&(kw, dw)), c) if c.is_none_or(|&(kc, _)| kw < kc) => {
                d.push(span(&kw, dw, ss)?);
                i += 1;
            }
            (_, Some(&(kc, dc))) => {
                d.push(span(&kc, dc, ss)?);
                j += 1;
            }
            (_, None) => break,
        }
    }
    if prev.size != size {
        let (lo, hi) = (prev.size.min(size), prev.size.max(size));
        d.push((lo / ss * ss, hi.div_ceil(ss) * ss));
    }
    d.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in d {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    Ok(merged)
}

/// The file extent items of inode `ino` in `leaves`, in key order.
fn extent_items<'a>(leaves: impl Iterator<Item = &'a Arc<Node>>, ino: u64) -> Vec<(Key, &'a [u8])> {
    let mut v = Vec::new();
    for leaf in leaves {
        for slot in 0..leaf.nritems() {
            let k = leaf.key(slot);
            if k.objectid == ino && k.item_type == EXTENT_DATA_KEY {
                v.push((k, leaf.item(slot).data));
            }
        }
    }
    v
}

/// Widen `[x, y)` until it starts and ends at the start of an extent item
/// of the file (or at 0 and the end of all offsets) and no logged item
/// reaches across its ends: then what the log holds outside it stays
/// right, and inside it is made anew.
fn expand(
    cur: &Tree<'_>,
    logged: Option<&ItemMap>,
    ino: u64,
    x: u64,
    y: u64,
    ss: u64,
) -> Result<(u64, u64)> {
    let ours = |k: &Key| k.objectid == ino && k.item_type == EXTENT_DATA_KEY;
    let (mut a, mut b) = (x, y);
    loop {
        let (a0, b0) = (a, b);
        a = cur
            .get_le(&Key::new(ino, EXTENT_DATA_KEY, a))?
            .map(|it| it.key())
            .filter(ours)
            .map_or(0, |k| k.offset);
        if b != u64::MAX {
            b = cur
                .range(
                    Key::new(ino, EXTENT_DATA_KEY, b),
                    Key::new(ino, EXTENT_DATA_KEY, u64::MAX),
                )?
                .next()
                .transpose()?
                .map_or(u64::MAX, |it| it.key().offset);
        }
        if let Some(m) = logged {
            let lo = Key::new(ino, EXTENT_DATA_KEY, 0);
            if let Some((k, v)) = m.range(lo..=Key::new(ino, EXTENT_DATA_KEY, a)).next_back()
                && span(k, v, ss)?.1 > a
            {
                a = k.offset;
            }
            if b != u64::MAX
                && let Some((k, v)) = m.range(lo..Key::new(ino, EXTENT_DATA_KEY, b)).next_back()
            {
                b = b.max(span(k, v, ss)?.1);
            }
        }
        if (a, b) == (a0, b0) {
            return Ok((a, b));
        }
    }
}

/// What the log must hold of inode `ino`'s extent items at offsets in
/// `[a, b)` (each end the start of an extent item, or 0 and the end of
/// all offsets), for a file ending at `end` (sector-rounded): the items
/// not in the committed file as they are, and a hole item wherever the
/// committed file had data and the file has none. `None` if an item lies
/// past the end (preallocated space the kernel logs its own way).
fn extent_want(
    cur: &Tree<'_>,
    old: &Tree<'_>,
    ino: u64,
    (a, b): (u64, u64),
    end: u64,
    transid: u64,
    ss: u64,
) -> Result<Option<ItemMap>> {
    let mut want = ItemMap::new();
    let mut pos = a;
    for it in cur.range(
        Key::new(ino, EXTENT_DATA_KEY, a),
        Key::new(ino, EXTENT_DATA_KEY, b.saturating_sub(1)),
    )? {
        let it = it?;
        let (start, stop) = span(&it.key(), it.data(), ss)?;
        if start >= end {
            return Ok(None);
        }
        let same = old.get(&it.key())?.is_some_and(|o| o.data() == it.data());
        if !same {
            want.insert(it.key(), it.data().to_vec());
        }
        if start > pos {
            hole(&mut want, old, ino, pos, start.min(end), transid)?;
        }
        pos = pos.max(stop);
    }
    if pos < b.min(end) {
        hole(&mut want, old, ino, pos, b.min(end), transid)?;
    }
    Ok(Some(want))
}

/// One inode's items, by kind.
#[derive(Default)]
struct Split {
    inode: Option<ItemRef>,
    names: Vec<ItemRef>,
    xattrs: Vec<ItemRef>,
    extents: Vec<ItemRef>,
}

fn split(items: impl Iterator<Item = Result<ItemRef>>) -> Result<Split> {
    let mut s = Split::default();
    for it in items {
        let it = it?;
        match it.key().item_type {
            INODE_ITEM_KEY => s.inode = Some(it),
            INODE_REF_KEY | INODE_EXTREF_KEY => s.names.push(it),
            XATTR_ITEM_KEY => s.xattrs.push(it),
            EXTENT_DATA_KEY => s.extents.push(it),
            _ => {}
        }
    }
    Ok(s)
}

/// The file range extent item `key`/`data` covers; an inline extent
/// fills its sectors (`ss`).
fn span(key: &Key, data: &[u8], ss: u64) -> Result<(u64, u64)> {
    let fe = FileExtentItem::parse(data)?;
    let len = match fe.body {
        ExtentBody::Regular { num_bytes, .. } => num_bytes,
        ExtentBody::Inline(_) => fe.ram_bytes.div_ceil(ss).saturating_mul(ss),
    };
    let end = key.offset.checked_add(len).ok_or_else(|| {
        Error::corrupt(format!(
            "file extent at {} of {len} bytes passes the largest file offset",
            key.offset
        ))
    })?;
    Ok((key.offset, end))
}

/// Log a hole over `[from, to)` if the committed file had data there.
fn hole(
    want: &mut ItemMap,
    old: &Tree<'_>,
    ino: u64,
    from: u64,
    to: u64,
    transid: u64,
) -> Result<()> {
    if from >= to {
        return Ok(());
    }
    // The committed item starting last before `to` is the only one that
    // can reach into the range without starting in it.
    let had = match old
        .get_le(&Key::new(ino, EXTENT_DATA_KEY, to - 1))?
        .filter(|it| it.key().objectid == ino && it.key().item_type == EXTENT_DATA_KEY)
    {
        Some(it) => {
            let (s, e) = span(&it.key(), it.data(), 1)?;
            s >= from || e > from
        }
        None => false,
    };
    if !had {
        return Ok(());
    }
    let fe = FileExtentItem::hole(transid, to - from);
    want.insert(Key::new(ino, EXTENT_DATA_KEY, from), fe.to_bytes());
    Ok(())
}

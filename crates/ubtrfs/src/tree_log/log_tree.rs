//! The log tree written in the running transaction: its blocks, what it
//! holds, and the log sync that makes it durable (DESIGN.md layer 9).
//!
//! The layout is the kernel's (from dumps of its logs): a log root tree
//! whose items, keyed (TREE_LOG, ROOT_ITEM, subvolume), point at one log
//! tree per subvolume; every block is owned by TREE_LOG and carries the
//! running transaction's id; checksums of logged data sit in the
//! subvolume's log tree as EXTENT_CSUM items.
//!
//! Log blocks come from metadata space but get no extent items, as the
//! kernel's do: the committed free-space tree counts them free and a
//! replay sets them aside. A block changed after it was written is copied,
//! as any written block is, and the old copy stays allocated until the next
//! log sync's superblock is on disk (a replay may need any block the durable
//! superblock's log reaches); one freed before it was ever written is free
//! again at once. So a file fsynced over and over between commits keeps
//! only its live log, not every version of it, in metadata space.

use crate::alloc::{Allocator, SpaceKind};
use crate::format::consts::*;
use crate::format::node::Node;
use crate::format::superblock::Superblock;
use crate::format::{CsumType, Key};
use crate::fs::InodeId;
use crate::tree::cow::CowPlan;
use crate::tree::{BlockSource, RootPtr, TreeEditor, TreeReader};
use crate::volume::Volume;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Items of a tree as the log keeps them in memory, by key.
pub(crate) type ItemMap = BTreeMap<Key, Vec<u8>>;

/// The log of the running transaction.
pub(crate) struct LogTree {
    /// Reads log blocks; those not yet written live in its overlay.
    reader: TreeReader,
    transid: u64,
    nodesize: u64,
    chunk_tree_uuid: [u8; 16],
    /// Every block the log holds in this transaction.
    blocks: BTreeSet<u64>,
    /// Written blocks the log no longer uses: free once a newer log root
    /// is durable.
    retired: Vec<u64>,
    subvols: BTreeMap<u64, SubvolLog>,
    /// The log root tree, once written.
    root_tree: Option<RootPtr>,
    /// What the log root tree holds.
    root_items: ItemMap,
    /// The log changed since it last reached the disk.
    pub(crate) changed: bool,
    /// The log root the superblocks on disk point at.
    synced_root: Option<RootPtr>,
    /// What each logged inode looked like when it was last logged.
    inodes: HashMap<InodeId, LoggedInode>,
    sectorsize: u64,
    /// Directories whose entries the log holds.
    pub(crate) dirs: BTreeSet<InodeId>,
    /// Per directory the log holds, the highest entry index it had when
    /// last logged.
    pub(crate) dir_max: HashMap<InodeId, u64>,
    /// Per directory the log holds, the directories new since the commit
    /// it had entries for when logged: a later log of it looks at them
    /// again, as their own new entries belong with it.
    pub(crate) subdirs: HashMap<InodeId, BTreeSet<u64>>,
    /// Inodes whose names (INODE_REF items) the log holds.
    pub(crate) named: BTreeSet<InodeId>,
    /// Inodes gone since the last commit that the log was made to forget.
    pub(crate) gone: BTreeSet<InodeId>,
}

/// An inode as it was when last logged: the fs tree leaves holding its
/// file extent items (a leaf changed since is another block) and its size.
pub(crate) struct LoggedInode {
    pub leaves: Vec<Arc<Node>>,
    pub size: u64,
}

/// One subvolume's log tree.
struct SubvolLog {
    root: RootPtr,
    /// Everything but checksums.
    items: ItemMap,
    /// Checksum items.
    csums: ItemMap,
    /// Data sectors whose checksums the log holds, with how many logged
    /// file extent items need each.
    sectors: BTreeMap<u64, u32>,
    /// Where the data of logged file extents (regular and preallocated)
    /// starts on disk, with how many logged items name each.
    extents: BTreeMap<u64, u32>,
}

/// Checksum items cover at most this many sectors and never cross a
/// multiple of it, so a change rewrites only the items near it.
const CSUM_CHUNK: u64 = 64;

/// Where the log takes its blocks from: the transaction's allocator, with
/// no reference bookkeeping.
struct LogBlocks<'a> {
    alloc: &'a mut Allocator,
    blocks: &'a mut BTreeSet<u64>,
    retired: &'a mut Vec<u64>,
    reader: &'a TreeReader,
    transid: u64,
    nodesize: u64,
}

impl BlockSource for LogBlocks<'_> {
    fn transid(&self) -> u64 {
        self.transid
    }

    fn alloc_tree_block(&mut self, _owner: u64, _level: u8) -> Result<u64> {
        let at = self
            .alloc
            .alloc(SpaceKind::Metadata, self.nodesize, self.nodesize)
            .ok_or_else(|| Error::NoSpace("no metadata space for a log tree block".into()))?;
        self.blocks.insert(at);
        Ok(at)
    }

    fn free_tree_block(&mut self, _owner: u64, node: &Node, _plan: CowPlan) -> Result<bool> {
        let at = node.header.bytenr;
        self.blocks.remove(&at);
        if !self.reader.is_dirty(at) {
            // On disk: the durable log may reach it until the next sync.
            self.retired.push(at);
            return Ok(false);
        }
        self.alloc.release(at, self.nodesize)?;
        Ok(true)
    }
}

/// A log root item as the kernel writes one: only where the tree is and
/// its generation; everything else zero.
fn log_root_item(root: RootPtr, transid: u64) -> Vec<u8> {
    let mut b = vec![0u8; 439];
    b[160..168].copy_from_slice(&transid.to_le_bytes());
    b[176..184].copy_from_slice(&root.bytenr.to_le_bytes());
    b[238] = root.level;
    b[239..247].copy_from_slice(&transid.to_le_bytes());
    b
}

impl LogTree {
    /// An empty log for transaction `transid` of the filesystem on `volume`.
    pub(crate) fn new(
        volume: Arc<Volume>,
        sb: &Superblock,
        transid: u64,
        chunk_tree_uuid: [u8; 16],
    ) -> Self {
        LogTree {
            reader: TreeReader::new(volume, sb),
            transid,
            nodesize: sb.nodesize as u64,
            chunk_tree_uuid,
            blocks: BTreeSet::new(),
            retired: Vec::new(),
            subvols: BTreeMap::new(),
            root_tree: None,
            root_items: ItemMap::new(),
            changed: false,
            synced_root: None,
            inodes: HashMap::new(),
            sectorsize: sb.sectorsize as u64,
            dirs: BTreeSet::new(),
            dir_max: HashMap::new(),
            subdirs: HashMap::new(),
            named: BTreeSet::new(),
            gone: BTreeSet::new(),
        }
    }

    /// Run `f` with an editor of log trees.
    fn edit<R>(
        &mut self,
        alloc: &mut Allocator,
        f: impl FnOnce(&mut TreeEditor<'_>, &mut BTreeMap<u64, SubvolLog>) -> Result<R>,
    ) -> Result<R> {
        let mut src = LogBlocks {
            alloc,
            blocks: &mut self.blocks,
            retired: &mut self.retired,
            reader: &self.reader,
            transid: self.transid,
            nodesize: self.nodesize,
        };
        let mut ed = TreeEditor::new(
            &self.reader,
            &mut src,
            TREE_LOG_OBJECTID,
            self.chunk_tree_uuid,
        );
        f(&mut ed, &mut self.subvols)
    }

    /// Make the log of `subvol` hold exactly `want` among the keys in
    /// `lo..=hi`. Returns what changed: (key, old data, new data).
    pub(crate) fn set_range(
        &mut self,
        alloc: &mut Allocator,
        subvol: u64,
        lo: Key,
        hi: Key,
        want: ItemMap,
    ) -> Result<Vec<Change>> {
        let csums = lo.objectid == EXTENT_CSUM_OBJECTID;
        let changes = self.edit(alloc, |ed, subvols| {
            let log = match subvols.entry(subvol) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let root = ed.new_tree(Vec::new())?;
                    e.insert(SubvolLog {
                        root,
                        items: ItemMap::new(),
                        csums: ItemMap::new(),
                        sectors: BTreeMap::new(),
                        extents: BTreeMap::new(),
                    })
                }
            };
            let have = if csums {
                &mut log.csums
            } else {
                &mut log.items
            };
            let gone: Vec<Key> = have
                .range(lo..=hi)
                .map(|(k, _)| *k)
                .filter(|k| !want.contains_key(k))
                .collect();
            let mut changes = Vec::new();
            for k in gone {
                ed.delete(&mut log.root, k)?;
                changes.push((k, have.remove(&k), None));
            }
            for (k, v) in want {
                if have.get(&k) == Some(&v) {
                    continue;
                }
                ed.put(&mut log.root, k, v.clone())?;
                changes.push((k, have.insert(k, v.clone()), Some(v)));
            }
            for (k, old, new) in &changes {
                if k.item_type != EXTENT_DATA_KEY {
                    continue;
                }
                for (data, d) in [(old, -1i64), (new, 1)] {
                    let Some(at) = data.as_deref().map(extent_start).transpose()?.flatten() else {
                        continue;
                    };
                    let n = log.extents.entry(at).or_insert(0);
                    *n = (*n as i64 + d).max(0) as u32;
                    if *n == 0 {
                        log.extents.remove(&at);
                    }
                }
            }
            Ok(changes)
        })?;
        self.changed |= !changes.is_empty();
        Ok(changes)
    }

    /// Set the file extent items of inode `ino` in `subvol` with offsets in
    /// `[a, b)` to `want`, and the checksum items to what the logged
    /// extents need; `lookup(start, count)` gives the checksums of sectors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn set_extents(
        &mut self,
        alloc: &mut Allocator,
        subvol: u64,
        ino: u64,
        a: u64,
        b: u64,
        want: ItemMap,
        lookup: &mut dyn FnMut(u64, usize) -> Result<Vec<Option<Vec<u8>>>>,
    ) -> Result<()> {
        let lo = Key::new(ino, EXTENT_DATA_KEY, a);
        let hi = Key::new(ino, EXTENT_DATA_KEY, b.saturating_sub(1));
        let changes = self.set_range(alloc, subvol, lo, hi, want)?;
        let ss = self.sectorsize;
        let mut chunks = BTreeSet::new();
        if let Some(log) = self.subvols.get_mut(&subvol) {
            for (_, old, new) in &changes {
                for (data, d) in [(old, -1i64), (new, 1)] {
                    let Some(data) = data else { continue };
                    let Some((s, e)) = csum_range(data, ss)? else {
                        continue;
                    };
                    let mut at = s / ss * ss;
                    while at < e {
                        let n = log.sectors.entry(at).or_insert(0);
                        let was = *n;
                        *n = (*n as i64 + d).max(0) as u32;
                        if (was == 0) != (*n == 0) {
                            chunks.insert(at / ss / CSUM_CHUNK);
                        }
                        if *n == 0 {
                            log.sectors.remove(&at);
                        }
                        at += ss;
                    }
                }
            }
        }
        for c in chunks {
            let (c0, c1) = (c * CSUM_CHUNK * ss, (c + 1) * CSUM_CHUNK * ss);
            let present: Vec<u64> = self
                .subvols
                .get(&subvol)
                .map(|l| l.sectors.range(c0..c1).map(|(&k, _)| k).collect())
                .unwrap_or_default();
            let mut want = ItemMap::new();
            if let (Some(&first), Some(&last)) = (present.first(), present.last()) {
                let sums = lookup(first, ((last - first) / ss + 1) as usize)?;
                let mut run: Option<(u64, Vec<u8>)> = None;
                for (i, sum) in sums.into_iter().enumerate() {
                    let at = first + i as u64 * ss;
                    let needed = present.binary_search(&at).is_ok();
                    match sum.filter(|_| needed) {
                        Some(c) => run.get_or_insert_with(|| (at, Vec::new())).1.extend(c),
                        None => {
                            if let Some((k, v)) = run.take() {
                                want.insert(Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, k), v);
                            }
                        }
                    }
                }
                if let Some((k, v)) = run.take() {
                    want.insert(Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, k), v);
                }
            }
            self.set_range(
                alloc,
                subvol,
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, c0),
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, c1 - 1),
                want,
            )?;
        }
        Ok(())
    }

    /// The items (checksums aside) the log of `subvol` holds.
    pub(crate) fn items(&self, subvol: u64) -> Option<&ItemMap> {
        self.subvols.get(&subvol).map(|l| &l.items)
    }

    /// Whether a block of the log, or data a logged file extent names,
    /// lies in one of `chunks` (logical start, length).
    pub(crate) fn touches(&self, chunks: &[(u64, u64)]) -> bool {
        chunks.iter().any(|&(s, l)| {
            self.blocks.range(s..s.saturating_add(l)).next().is_some()
                || self
                    .subvols
                    .values()
                    .any(|log| log.extents.range(s..s.saturating_add(l)).next().is_some())
        })
    }

    /// Drop everything the log holds of inode `id`.
    pub(crate) fn forget(
        &mut self,
        alloc: &mut Allocator,
        id: InodeId,
        lookup: &mut dyn FnMut(u64, usize) -> Result<Vec<Option<Vec<u8>>>>,
    ) -> Result<()> {
        let held = self.items(id.subvol).is_some_and(|m| {
            m.range(Key::new(id.ino, 0, 0)..=Key::new(id.ino, u8::MAX, u64::MAX))
                .next()
                .is_some()
        });
        if held {
            self.set_extents(
                alloc,
                id.subvol,
                id.ino,
                0,
                u64::MAX,
                ItemMap::new(),
                lookup,
            )?;
            self.set_range(
                alloc,
                id.subvol,
                Key::new(id.ino, 0, 0),
                Key::new(id.ino, u8::MAX, u64::MAX),
                ItemMap::new(),
            )?;
        }
        self.inodes.remove(&id);
        self.named.remove(&id);
        self.dirs.remove(&id);
        self.dir_max.remove(&id);
        self.subdirs.remove(&id);
        self.gone.insert(id);
        Ok(())
    }

    /// Inode `id` as it was when last logged.
    pub(crate) fn inode(&self, id: InodeId) -> Option<&LoggedInode> {
        self.inodes.get(&id)
    }

    /// Remember inode `id` as just logged.
    pub(crate) fn remember(&mut self, id: InodeId, inode: LoggedInode) {
        self.inodes.insert(id, inode);
    }

    /// Seal the log's changed blocks and make ready the superblocks that
    /// point at it; [`LogSync::finish`] then writes the blocks and makes
    /// them durable (one cache flush per device, which also makes the data
    /// the log points at durable, then each device's superblock by FUA if
    /// the log's root moved) without the change lock, and
    /// [`LogTree::synced`] records it.
    pub(crate) fn sync_start(
        &mut self,
        alloc: &mut Allocator,
        volume: &Arc<Volume>,
        supers: &BTreeMap<u64, Box<[u8; SUPER_SIZE]>>,
        csum_type: CsumType,
    ) -> Result<LogSync> {
        if self.changed || self.root_tree.is_none() {
            self.update_root_tree(alloc)?;
        }
        // Written off the change lock by `finish`: a later change copies
        // these blocks, so they stay as the superblocks about to point at
        // them say (and the next log change waits for this fsync's turn).
        let blocks = self.reader.dirty_blocks();
        self.reader.commit_done(self.transid);
        self.changed = false;
        let root = self
            .root_tree
            .ok_or_else(|| Error::corrupt("the log has no root tree"))?;
        let generation = supers.values().next().map_or(0, |raw| {
            u64::from_le_bytes(raw[0x48..0x50].try_into().unwrap_or_default())
        });
        let mut pointing = Vec::new();
        if self.synced_root != Some(root) {
            for (devid, raw) in supers {
                let mut sb = raw.clone();
                let s = &mut sb[..];
                s[0x60..0x68].copy_from_slice(&root.bytenr.to_le_bytes());
                s[0x68..0x70].copy_from_slice(&0u64.to_le_bytes());
                s[0xc8] = root.level;
                s[0x30..0x38].copy_from_slice(&SUPER_OFFSETS[0].to_le_bytes());
                let c = csum_type.compute(&s[CSUM_SIZE_MAX..]);
                s[..CSUM_SIZE_MAX].copy_from_slice(&c);
                pointing.push((*devid, sb));
            }
        }
        Ok(LogSync {
            volume: volume.clone(),
            root,
            generation,
            blocks,
            csum_type,
            supers: pointing,
        })
    }

    /// After [`LogSync::finish`] wrote superblocks pointing at `root`: the
    /// blocks the log replaced before it are free.
    pub(crate) fn synced(&mut self, root: RootPtr, alloc: &mut Allocator) -> Result<()> {
        if self.root_tree != Some(root) || self.synced_root == Some(root) {
            return Ok(());
        }
        self.synced_root = Some(root);
        // No durable superblock reaches the blocks this log replaced.
        for b in std::mem::take(&mut self.retired) {
            alloc.release(b, self.nodesize)?;
        }
        Ok(())
    }

    /// Point the log root tree at every subvolume's log.
    fn update_root_tree(&mut self, alloc: &mut Allocator) -> Result<()> {
        let want: ItemMap = self
            .subvols
            .iter()
            .map(|(&id, l)| {
                (
                    Key::new(TREE_LOG_OBJECTID, ROOT_ITEM_KEY, id),
                    log_root_item(l.root, self.transid),
                )
            })
            .collect();
        let mut root = self.root_tree;
        let have = std::mem::take(&mut self.root_items);
        self.edit(alloc, |ed, _| {
            let mut r = match root {
                Some(r) => r,
                None => ed.new_tree(Vec::new())?,
            };
            for (k, v) in &want {
                if have.get(k) != Some(v) {
                    ed.put(&mut r, *k, v.clone())?;
                }
            }
            root = Some(r);
            Ok(())
        })?;
        self.root_items = want;
        self.root_tree = root;
        Ok(())
    }

    /// Drop the log at a commit: its blocks become free once the commit,
    /// whose superblock has no log, is on disk.
    pub(crate) fn discard(self, alloc: &mut Allocator) -> Result<()> {
        for &b in self.blocks.iter().chain(&self.retired) {
            alloc.pin(b, self.nodesize)?;
        }
        Ok(())
    }
}

/// A log written but not yet durable: see [`LogTree::sync_start`].
pub(crate) struct LogSync {
    volume: Arc<Volume>,
    root: RootPtr,
    /// The generation of the superblocks on disk when the log was
    /// written, which `supers` repeat.
    generation: u64,
    /// The log's blocks changed since its last sync, to write.
    blocks: Vec<Arc<Node>>,
    csum_type: CsumType,
    /// Each device's superblock pointing at `root` (none if the ones on
    /// disk already do).
    supers: Vec<(u64, Box<[u8; SUPER_SIZE]>)>,
}

impl LogSync {
    /// The log's root tree.
    pub(crate) fn root(&self) -> RootPtr {
        self.root
    }

    /// Write the log's blocks, flush every device, then write the
    /// superblocks pointing at the log; all unless a commit wrote newer
    /// superblocks since (`on_disk` holds the generation of the
    /// superblocks on disk, and is held while these are written). True if
    /// the superblocks on disk now point at the log.
    pub(crate) fn finish(self, on_disk: &std::sync::Mutex<u64>) -> Result<bool> {
        if !self.blocks.is_empty() {
            let written = on_disk.lock().unwrap_or_else(|e| e.into_inner());
            // A commit since dropped the log, and freed its blocks for the
            // transactions after it: writing them now could overwrite what
            // those wrote there.
            if *written != self.generation {
                return Ok(false);
            }
            let mut buf = Vec::new();
            for node in &self.blocks {
                buf.clear();
                node.seal_into(self.csum_type, &mut buf);
                self.volume.write(node.header.bytenr, &buf)?;
            }
        }
        for (_, dev) in self.volume.devices.iter() {
            dev.flush()?;
        }
        if self.supers.is_empty() {
            return Ok(true);
        }
        let written = on_disk.lock().unwrap_or_else(|e| e.into_inner());
        // A commit since: its superblocks make all of this durable, and
        // ours, older, must not replace them.
        if *written != self.generation {
            return Ok(false);
        }
        for (devid, sb) in &self.supers {
            let dev = self
                .volume
                .devices
                .get(*devid)
                .ok_or_else(|| Error::Devices(format!("device {devid} vanished")))?;
            dev.write_fua(SUPER_OFFSETS[0], &sb[..])?;
        }
        drop(written);
        Ok(true)
    }
}

/// What changed in a log: key, old data, new data.
pub(crate) type Change = (Key, Option<Vec<u8>>, Option<Vec<u8>>);

/// Where the data a file extent item names starts on disk (regular and
/// preallocated extents; holes and inline data have none).
fn extent_start(data: &[u8]) -> Result<Option<u64>> {
    use crate::format::items::{ExtentBody, FileExtentItem};
    Ok(match FileExtentItem::parse(data)?.body {
        ExtentBody::Regular { disk_bytenr, .. } if disk_bytenr != 0 => Some(disk_bytenr),
        _ => None,
    })
}

/// The disk range whose checksums a replay of file extent item `data`
/// looks up: the referenced part of a plain extent, all of a compressed
/// one; none for holes, inline and preallocated extents.
fn csum_range(data: &[u8], sectorsize: u64) -> Result<Option<(u64, u64)>> {
    use crate::format::items::{ExtentBody, FileExtentItem};
    let fe = FileExtentItem::parse(data)?;
    // The caller walks the range sector by sector: it must be bounded.
    fe.check_disk_extent(sectorsize)?;
    if fe.extent_type != FILE_EXTENT_REG {
        return Ok(None);
    }
    Ok(match fe.body {
        ExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } if disk_bytenr != 0 => Some(if fe.compression != 0 {
            (disk_bytenr, disk_bytenr + disk_num_bytes)
        } else {
            (disk_bytenr + offset, disk_bytenr + offset + num_bytes)
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::items::{ExtentBody, FileExtentItem};

    fn plain(disk_num_bytes: u64, offset: u64, num_bytes: u64) -> Vec<u8> {
        FileExtentItem {
            generation: 1,
            ram_bytes: disk_num_bytes,
            compression: 0,
            encryption: 0,
            other_encoding: 0,
            extent_type: FILE_EXTENT_REG,
            body: ExtentBody::Regular {
                disk_bytenr: 1 << 30,
                disk_num_bytes,
                offset,
                num_bytes,
            },
        }
        .to_bytes()
    }

    /// The range is walked sector by sector: a damaged length must not
    /// make that walk endless.
    #[test]
    fn csum_range_refuses_damaged_extents() {
        assert_eq!(
            csum_range(&plain(8192, 4096, 4096), 4096).unwrap(),
            Some(((1 << 30) + 4096, (1 << 30) + 8192))
        );
        let huge = crate::format::items::LONGEST_PLAIN_EXTENT + 4096;
        assert!(matches!(
            csum_range(&plain(huge, 0, huge), 4096),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            csum_range(&plain(8192, 4096, 8192), 4096),
            Err(Error::Corrupt(_))
        ));
    }
}

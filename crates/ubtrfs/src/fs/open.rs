//! Opening a filesystem from its devices: superblock, chunk map, root tree.

use super::inode::{InodeId, Stat};
use crate::format::consts::*;
use crate::format::items::{ChunkItem, DevItem, InodeItem, RootItem};
use crate::format::superblock::Superblock;
use crate::format::{Key, uuid_string};
use crate::tree::{RootPtr, Tree, TreeReader};
use crate::volume::{ChunkMap, DeviceSet, Profile, Volume};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Per-filesystem constants, decoded once at open (seed 000: hot paths
/// never re-read them from on-disk fields).
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Data sector size.
    pub sectorsize: u32,
    /// Tree block size.
    pub nodesize: u32,
    /// Bytes of one data checksum.
    pub csum_size: usize,
}

/// Space figures for `statfs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Fundamental block size.
    pub block_size: u32,
    /// Size of all devices, in the data profile's share (half for two
    /// copies), as the kernel's statfs counts.
    pub total_bytes: u64,
    /// Bytes free for file data (an estimate; on a writable filesystem,
    /// unallocated device space counts by the data profile's share).
    pub free_bytes: u64,
    /// Bytes not in use (`df`'s size less its used, the kernel's
    /// `f_bfree`): on a writable filesystem, `total_bytes` less what data
    /// and metadata take on the devices (in the data profile's share) and
    /// the metadata reserve; space in block groups that nothing uses yet
    /// counts as unused.
    pub unused_bytes: u64,
    /// Inodes in use, as far as known (0 if unknown).
    pub files: u64,
    /// Longest name.
    pub name_max: u32,
}

/// An open btrfs filesystem (read-only for now). Safe to share between threads.
pub struct Filesystem {
    pub(crate) sb: Superblock,
    /// The filesystem's size on its devices: the superblock's, until a
    /// resize changes it ([`Filesystem::total_bytes`]).
    pub(crate) total_bytes: std::sync::atomic::AtomicU64,
    pub(crate) geo: Geometry,
    pub(crate) trees: TreeReader,
    pub(crate) default_subvol: u64,
    /// Current root of every tree looked at so far (the root and chunk
    /// trees always); a transaction changes them here first.
    pub(crate) roots: RwLock<HashMap<u64, RootPtr>>,
    /// Write state, when opened read-write.
    pub(crate) writer: Option<std::sync::Mutex<crate::transaction::Writer>>,
    pub(crate) warnings: Vec<String>,
    /// Inodes in use by open files.
    pub(crate) open_inodes: std::sync::Mutex<OpenInodes>,
    /// Written data not yet in extents.
    pub(crate) delalloc: std::sync::Mutex<crate::data::delalloc::Delalloc>,
    /// Extents whose data the writeback thread is writing.
    pub(crate) in_flight: crate::data::in_flight::InFlight,
    /// Dirty data being compressed off the change lock.
    pub(crate) compress_jobs: crate::data::compress_jobs::CompressJobs,
    /// Bytes of small writes let past a full backlog since a write last
    /// found room ([`Filesystem::throttle_writes`]).
    pub(crate) small_write_slack: std::sync::atomic::AtomicU64,
    /// When the filesystem was opened (times of synthesized inodes).
    pub(crate) opened_at: crate::format::items::Timespec,
    /// Held by an fsync from its log's writing until it is durable: one
    /// log sync at a time.
    pub(crate) log_sync: std::sync::Mutex<()>,
    /// Generation of the superblocks on disk; held while any are written.
    pub(crate) supers_on_disk: std::sync::Mutex<u64>,
    /// The last transaction committed.
    pub(crate) committed: std::sync::atomic::AtomicU64,
    /// The log root the superblocks on disk point at, once an fsync made
    /// them so, until the next change to the log takes note of it.
    pub(crate) log_durable: std::sync::Mutex<Option<crate::tree::RootPtr>>,
    /// See [`Filesystem::set_before_long_work`].
    pub(crate) before_long_work: std::sync::OnceLock<fn()>,
    /// Why changes stopped, once one failed half-way (see
    /// [`Filesystem::aborted`]).
    pub(crate) aborted: std::sync::OnceLock<String>,
    /// Held by a changing operation from its start until it is judged
    /// whole or half done (see [`Filesystem::aborted`]).
    pub(crate) change_gate: std::sync::Mutex<()>,
    /// Access times noted and not yet written (see `fs::access_time`).
    pub(crate) pending_atimes: super::PendingAtimes,
    /// Whether a subvolume was deleted while in use since the open: until
    /// then no directory can be in a dead subvolume, and lookups skip the
    /// root-tree search that tells (see `Filesystem::check_live_dir`).
    pub(crate) subvol_died_in_use: std::sync::atomic::AtomicBool,
}

impl Filesystem {
    /// Open the filesystem on `devices` (all of its devices, any order).
    pub fn open<P: AsRef<Path>>(devices: &[P]) -> Result<Self> {
        Self::from_device_set(DeviceSet::open(devices)?)
    }

    /// Open a filesystem from an already assembled device set. A log the
    /// kernel left (changes fsync'd after its last commit) is replayed in
    /// memory, as the kernel's mount would replay it; the devices are not
    /// written.
    pub fn from_device_set(set: DeviceSet) -> Result<Self> {
        if set.superblock.log_root != 0 {
            return crate::tree_log::open_replayed_in_memory(set);
        }
        Self::open_unreplayed(set)
    }

    /// Open the filesystem on `devices` read-only as its last commit left
    /// it, without replaying a log tree (the kernel's `nologreplay`, for a
    /// log that will not replay): what was fsync'd after that commit is
    /// not shown, and a warning says so.
    pub fn open_without_log_replay<P: AsRef<Path>>(devices: &[P]) -> Result<Self> {
        let set = DeviceSet::open(devices)?;
        let logged = set.superblock.log_root != 0;
        let mut fs = Self::open_unreplayed(set)?;
        if logged {
            fs.warnings.push(
                "the log tree is not replayed (nologreplay): what was fsync'd after the last commit is not shown"
                    .into(),
            );
        }
        Ok(fs)
    }

    /// Open the filesystem as it is on disk, ignoring any log tree.
    pub(crate) fn open_unreplayed(set: DeviceSet) -> Result<Self> {
        let sb = set.superblock.clone();
        let mut warnings = set.warnings.clone();
        let unknown = sb.incompat_flags & !INCOMPAT_SUPPORTED;
        if unknown != 0 {
            return Err(Error::Unsupported(format!(
                "incompatible feature flags {unknown:#x}"
            )));
        }
        if sb.incompat_flags & INCOMPAT_EXTENT_TREE_V2 != 0 {
            return Err(Error::Unsupported("extent tree v2".into()));
        }
        let geo = Geometry {
            sectorsize: sb.sectorsize,
            nodesize: sb.nodesize,
            csum_size: sb.csum_type.size(),
        };

        // The system chunks are enough to read the chunk tree.
        let boot_map = ChunkMap::default();
        for (key, chunk) in &sb.sys_chunks {
            boot_map.insert(key.offset, chunk.clone())?;
        }
        let boot = TreeReader::new(Arc::new(Volume::new(set.clone(), boot_map)), &sb);
        let chunk_root = RootPtr {
            bytenr: sb.chunk_root,
            level: sb.chunk_root_level,
            generation: Some(sb.chunk_root_generation),
        };
        let chunks = ChunkMap::default();
        let mut dev_items = Vec::new();
        for item in boot.tree(chunk_root).range(Key::MIN, Key::MAX)? {
            let item = item?;
            let key = item.key();
            match key.item_type {
                CHUNK_ITEM_KEY => chunks.insert(key.offset, ChunkItem::parse(item.data())?)?,
                DEV_ITEM_KEY => dev_items.push(DevItem::parse(item.data())?),
                _ => {}
            }
        }
        check_devices(&set, &chunks, &dev_items, &mut warnings)?;
        let volume = Arc::new(Volume::new(set, chunks));
        let trees = TreeReader::new(volume, &sb).with_read_ahead();
        let mut roots = HashMap::new();
        roots.insert(
            ROOT_TREE_OBJECTID,
            RootPtr {
                bytenr: sb.root,
                level: sb.root_level,
                generation: Some(sb.generation),
            },
        );
        roots.insert(CHUNK_TREE_OBJECTID, chunk_root);
        let on_disk = sb.generation;
        let mut fs = Filesystem {
            geo,
            trees,
            default_subvol: FS_TREE_OBJECTID,
            roots: RwLock::new(roots),
            writer: None,
            warnings,
            total_bytes: sb.total_bytes.into(),
            sb,
            opened_at: now(),
            delalloc: std::sync::Mutex::new(Default::default()),
            in_flight: Default::default(),
            compress_jobs: Default::default(),
            small_write_slack: Default::default(),
            open_inodes: std::sync::Mutex::new(OpenInodes::default()),
            log_sync: std::sync::Mutex::new(()),
            supers_on_disk: std::sync::Mutex::new(on_disk),
            committed: std::sync::atomic::AtomicU64::new(on_disk),
            log_durable: std::sync::Mutex::new(None),
            before_long_work: std::sync::OnceLock::new(),
            aborted: std::sync::OnceLock::new(),
            change_gate: std::sync::Mutex::new(()),
            pending_atimes: Default::default(),
            subvol_died_in_use: Default::default(),
        };
        fs.default_subvol = fs.find_default_subvol()?;
        if let Err(e) = fs.load_device_stats() {
            fs.warnings
                .push(format!("the device statistics could not be read: {e}"));
        }
        Ok(fs)
    }

    /// Have `f` called, on the calling thread, before work that may hold
    /// the change lock long: a commit, freeing a file's extents, a
    /// truncate. A server that serves short requests at a low CPU priority
    /// returns to its normal one there. Only the first call counts.
    pub fn set_before_long_work(&self, f: fn()) {
        let _ = self.before_long_work.set(f);
    }

    /// Work that may run long follows (see
    /// [`Filesystem::set_before_long_work`]).
    pub(crate) fn long_work_ahead(&self) {
        if let Some(f) = self.before_long_work.get() {
            f();
        }
    }

    /// Inodes held open.
    pub(crate) fn open_inodes(&self) -> std::sync::MutexGuard<'_, OpenInodes> {
        self.open_inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The dirty data held for writeback.
    pub(crate) fn delalloc(&self) -> std::sync::MutexGuard<'_, crate::data::delalloc::Delalloc> {
        self.delalloc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Problems met while opening that did not stop it (bad superblock
    /// copies, missing mirrored devices), and notes on a log replay.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// The superblock in use (the newest valid copy).
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Sector size, node size and checksum size.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The tree-block reader (for inspection tools).
    pub fn tree_reader(&self) -> &TreeReader {
        &self.trees
    }

    /// The root tree.
    pub fn root_tree(&self) -> Tree<'_> {
        self.trees.tree(self.known_root(ROOT_TREE_OBJECTID))
    }

    fn known_root(&self, id: u64) -> RootPtr {
        // The root and chunk trees are entered at open and never removed.
        self.roots
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .copied()
            .unwrap_or(RootPtr {
                bytenr: 0,
                level: 0,
                generation: None,
            })
    }

    /// The current root of tree `id`, if the filesystem has that tree.
    pub(crate) fn root_ptr(&self, id: u64) -> Result<Option<RootPtr>> {
        if let Some(p) = self
            .roots
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
        {
            return Ok(Some(*p));
        }
        let Some((ptr, _)) = self.find_root(id)? else {
            return Ok(None);
        };
        self.roots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_insert(ptr);
        Ok(Some(ptr))
    }

    /// Record a tree's new root (from a transaction).
    pub(crate) fn set_root(&self, id: u64, ptr: RootPtr) {
        self.roots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, ptr);
    }

    /// The chunk tree.
    pub fn chunk_tree(&self) -> Tree<'_> {
        self.trees.tree(self.known_root(CHUNK_TREE_OBJECTID))
    }

    /// The tree with id `tree_id`, from its root item.
    pub fn tree_by_id(&self, tree_id: u64) -> Result<Tree<'_>> {
        match tree_id {
            ROOT_TREE_OBJECTID => Ok(self.root_tree()),
            CHUNK_TREE_OBJECTID => Ok(self.chunk_tree()),
            _ => self
                .root_ptr(tree_id)?
                .map(|p| self.trees.tree(p))
                .ok_or_else(|| Error::NotFound(format!("tree {tree_id}"))),
        }
    }

    /// The root item of tree `tree_id` (newest one for snapshots' keys).
    pub(crate) fn find_root(&self, tree_id: u64) -> Result<Option<(RootPtr, RootItem)>> {
        let found = self
            .root_tree()
            .get_le(&Key::new(tree_id, ROOT_ITEM_KEY, u64::MAX))?;
        let Some(item) = found else { return Ok(None) };
        let key = item.key();
        if key.objectid != tree_id || key.item_type != ROOT_ITEM_KEY {
            return Ok(None);
        }
        let root = RootItem::parse(item.data())?;
        let ptr = RootPtr {
            bytenr: root.bytenr,
            level: root.level,
            generation: Some(root.generation),
        };
        Ok(Some((ptr, root)))
    }

    /// The fs tree of subvolume `subvol`.
    pub(crate) fn fs_tree(&self, subvol: u64) -> Result<Tree<'_>> {
        if subvol != FS_TREE_OBJECTID && !(FIRST_FREE_OBJECTID..=u64::MAX - 256).contains(&subvol) {
            return Err(Error::NotFound(format!("subvolume {subvol}")));
        }
        let ptr = self
            .root_ptr(subvol)?
            .ok_or_else(|| Error::NotFound(format!("subvolume {subvol}")))?;
        Ok(self.trees.tree(ptr))
    }

    /// The checksum tree, if the filesystem has one.
    pub(crate) fn csum_tree(&self) -> Result<Option<Tree<'_>>> {
        Ok(self
            .root_ptr(CSUM_TREE_OBJECTID)?
            .map(|p| self.trees.tree(p)))
    }

    /// The inode item of `id`.
    pub(crate) fn inode_item(&self, id: InodeId) -> Result<InodeItem> {
        let tree = self.fs_tree(id.subvol)?;
        let item = tree
            .get(&Key::new(id.ino, INODE_ITEM_KEY, 0))?
            .ok_or_else(|| {
                Error::NotFound(format!("inode {} in subvolume {}", id.ino, id.subvol))
            })?;
        let mut inode = InodeItem::parse(item.data())?;
        self.pending_atimes.apply(id, &mut inode);
        Ok(inode)
    }

    /// [`Filesystem::inode_item`] of a file whose data is to be changed
    /// or cloned: Linux sizes files in a signed 64-bit offset, and a size
    /// beyond it (damage) would overflow the sector arithmetic of writes,
    /// truncates and clones. Such a file is still listed, read and deleted.
    pub(crate) fn inode_item_for_data(&self, id: InodeId) -> Result<InodeItem> {
        let inode = self.inode_item(id)?;
        if inode.size > i64::MAX as u64 {
            return Err(Error::corrupt(format!(
                "inode {} in subvolume {} has size {}, past the largest file size",
                id.ino, id.subvol, inode.size
            )));
        }
        Ok(inode)
    }

    /// [`Filesystem::inode_item_for_data`] of a file whose data is to be
    /// changed (`what`: written, truncated, cloned into), as far as its
    /// flags allow (see [`Filesystem::check_fixed`]): the kernel never
    /// changes an fs-verity file's data either, as its Merkle tree (VERITY
    /// items) would no longer match and reads would fail.
    pub(crate) fn inode_item_to_change(
        &self,
        id: InodeId,
        allowed: super::Allowed,
        what: &str,
    ) -> Result<InodeItem> {
        let inode = self.inode_item_for_data(id)?;
        self.check_fixed(id, &inode, allowed, what)?;
        check_not_verity(id, &inode)?;
        Ok(inode)
    }

    /// Attributes of an inode.
    pub fn stat(&self, id: InodeId) -> Result<Stat> {
        if id.is_placeholder() {
            return Ok(super::dir::empty_subvol_dir_stat(id, self.opened_at));
        }
        let item = self.inode_item(id)?;
        Stat::from_item(id, &item).ok_or_else(|| {
            Error::corrupt(format!(
                "inode {} in subvolume {} has mode {:#o}",
                id.ino, id.subvol, item.mode
            ))
        })
    }

    /// The root directory of the default subvolume.
    pub fn root(&self) -> InodeId {
        InodeId {
            subvol: self.default_subvol,
            ino: FIRST_INODE,
        }
    }

    /// The filesystem's size on its devices (the sum of their sizes it
    /// uses): the superblock's `total_bytes`, as resizes leave it.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Space figures.
    pub fn statfs(&self) -> StatFs {
        let sb = &self.sb;
        let unused = self.total_bytes().saturating_sub(sb.bytes_used);
        // Outside the writer's lock: it reads the root tree.
        let reserve = self
            .global_reserve()
            .unwrap_or_else(|_| self.metadata_reserve());
        let (total_bytes, free_bytes, unused_bytes) = self
            .writable_space(reserve)
            .or_else(|| self.read_only_space(reserve))
            .unwrap_or((self.total_bytes(), unused, unused));
        StatFs {
            block_size: self.geo.sectorsize,
            total_bytes,
            free_bytes,
            unused_bytes,
            files: 0,
            name_max: 255,
        }
    }

    /// For a read-only filesystem, [`StatFs`]'s total, free and unused
    /// bytes from the block group items (one lookup per chunk) and the
    /// device items, counted as for a writable one.
    fn read_only_space(&self, reserve: u64) -> Option<(u64, u64, u64)> {
        let items = self.block_group_items().ok()?;
        // Not a sprout's seed groups: nothing is written there.
        let volume = self.tree_reader().volume();
        let data_free = items
            .iter()
            .filter(|g| g.flags & BLOCK_GROUP_DATA != 0 && !volume.on_seed(g.logical))
            .fold(0u64, |a, g| {
                a.saturating_add(g.length.saturating_sub(g.used))
            });
        let groups: Vec<(u64, u64)> = items.iter().map(|g| (g.flags, g.used)).collect();
        self.space_figures(&groups, data_free, reserve)
    }

    /// The data space writes may still take, as [`StatFs::free_bytes`]
    /// counts it, or `None` while another thread holds the writer (a
    /// commit) or the filesystem is read-only: for callers that must not
    /// wait, such as a FUSE open deciding how to cache.
    pub fn data_free_if_idle(&self) -> Option<u64> {
        let w = match self.writer.as_ref()?.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        self.writable_space_of(w, 0).map(|(_, free, _)| free)
    }

    /// For a writable filesystem: the total, free and unused bytes of
    /// [`StatFs`], the dirty data waiting for space counted as taken.
    fn writable_space(&self, reserve: u64) -> Option<(u64, u64, u64)> {
        let w = self
            .writer
            .as_ref()?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.writable_space_of(w, reserve)
    }

    /// [`Self::writable_space`] with the writer held.
    fn writable_space_of(
        &self,
        w: std::sync::MutexGuard<'_, crate::transaction::Writer>,
        reserve: u64,
    ) -> Option<(u64, u64, u64)> {
        // With mixed groups, less what metadata will need of them.
        let data_free = self.space_free(&w, crate::alloc::SpaceKind::Data);
        let groups: Vec<(u64, u64)> = w
            .blocks
            .alloc
            .groups
            .values()
            .map(|g| (g.flags, g.used))
            .collect();
        drop(w);
        let data_free = data_free.saturating_sub(self.delalloc().reserved_bytes());
        self.space_figures(&groups, data_free, reserve)
    }

    /// [`StatFs`]'s total, free and unused bytes, as the kernel's statfs
    /// counts them, from the block groups' (flags, used bytes), the free
    /// space in data block groups, and the device items. Total: the size
    /// in the data profile's share. Unused: that less what the groups use
    /// on the devices (each copy) and `reserve`, the global reserve the
    /// kernel counts as used ([`Filesystem::global_reserve`]). Free: the data
    /// groups' free space, plus what the data profile can still place on
    /// the devices' unallocated space ([`stripe_room`]; for RAID5/6 the
    /// share past parity).
    fn space_figures(
        &self,
        groups: &[(u64, u64)],
        data_free: u64,
        reserve: u64,
    ) -> Option<(u64, u64, u64)> {
        let profile = groups
            .iter()
            .find(|(flags, _)| flags & BLOCK_GROUP_DATA != 0)
            .and_then(|(flags, _)| Profile::from_flags(*flags).ok());
        let on_devices: u64 = groups
            .iter()
            .map(|(flags, used)| {
                let copies = Profile::from_flags(*flags).map_or(1, copies_of);
                used.saturating_mul(copies)
            })
            .fold(0, u64::saturating_add);
        let factor = profile.map_or(1, copies_of).max(1);
        let total = self.total_bytes() / factor;
        let unused = total
            .saturating_sub(on_devices / factor)
            .saturating_sub(reserve);
        // Each device's unallocated space that chunks can take (the kernel
        // counts the superblock copies' MiB too, never the first).
        let room = self.device_room().ok()?;
        let devices = room.len() as u64;
        let unallocated: u64 = room.iter().fold(0, |a, &r| a.saturating_add(r));
        let share = |kept: u64, of: u64| {
            (u128::from(unallocated) * u128::from(kept) / u128::from(of.max(1))) as u64
        };
        let usable = match profile {
            Some(Profile::Dup) => share(1, 2),
            Some(Profile::Raid1) => stripe_room(&room, 2, 2) / 2,
            Some(Profile::Raid10) => stripe_room(&room, 4, 2) / 2,
            Some(Profile::Raid1c3) => stripe_room(&room, 3, 3) / 3,
            Some(Profile::Raid1c4) => stripe_room(&room, 4, 4) / 4,
            Some(Profile::Raid5) => share(devices.saturating_sub(1), devices),
            Some(Profile::Raid6) => share(devices.saturating_sub(2), devices),
            _ => unallocated,
        };
        Some((total, data_free.saturating_add(usable), unused))
    }
}

/// The device space a profile writing `stripes` devices at a time (at
/// least `devs_min`) can still allocate from `room` (each device's
/// unallocated bytes), counted as the kernel's statfs counts it: devices
/// largest first; from the smallest up, each takes all of its room in
/// chunks with the `stripes - 1` devices next above it. (Not the most
/// that fits: the kernel says less than that on three or more devices.)
fn stripe_room(room: &[u64], stripes: usize, devs_min: usize) -> u64 {
    let mut r = room.to_vec();
    r.sort_unstable_by(|a, b| b.cmp(a));
    let mut placed = 0u128;
    let mut left = r.len();
    while left > 0 && left >= devs_min {
        let i = left - 1;
        let n = stripes.min(left).max(1);
        let take = r[i];
        if take >= STRIPE_LEN {
            placed += u128::from(take) * n as u128;
            for d in &mut r[i + 1 - n..=i] {
                *d -= take;
            }
        }
        left -= 1;
    }
    u64::try_from(placed).unwrap_or(u64::MAX)
}

/// Refuse (`NotPermitted`) changing the data of `id`, an fs-verity file.
pub(crate) fn check_not_verity(id: InodeId, item: &InodeItem) -> Result<()> {
    if item.flags & INODE_RO_VERITY != 0 {
        return Err(Error::NotPermitted(format!(
            "inode {} in subvolume {} is an fs-verity file: its data never changes",
            id.ino, id.subvol
        )));
    }
    Ok(())
}

/// How many copies of each byte `profile` keeps (the kernel's statfs
/// factor: parity profiles count once).
fn copies_of(profile: crate::volume::Profile) -> u64 {
    use crate::volume::Profile;
    match profile {
        Profile::Dup | Profile::Raid1 | Profile::Raid10 => 2,
        Profile::Raid1c3 => 3,
        Profile::Raid1c4 => 4,
        _ => 1,
    }
}

/// Check that every chunk can be read with the devices present; warn for
/// missing devices whose chunks have copies elsewhere.
fn check_devices(
    set: &DeviceSet,
    chunks: &ChunkMap,
    dev_items: &[DevItem],
    warnings: &mut Vec<String>,
) -> Result<()> {
    // A seed given must be one this filesystem was sprouted from.
    for &(devid, fsid) in &set.seeds {
        if !dev_items.iter().any(|d| d.devid == devid && d.fsid == fsid) {
            let path = set.get(devid).map(|d| d.path().display().to_string());
            return Err(Error::Devices(format!(
                "{} is a seed device of filesystem {}, which filesystem {} was not sprouted from",
                path.unwrap_or_default(),
                uuid_string(&fsid),
                uuid_string(&set.superblock.fsid)
            )));
        }
    }
    let missing: Vec<&DevItem> = dev_items
        .iter()
        .filter(|d| set.get(d.devid).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    for chunk in chunks.all() {
        let gone = chunk
            .item
            .stripes
            .iter()
            .filter(|s| set.get(s.devid).is_none())
            .count();
        // Parity rebuilds as many lost stripes of a row as it has parities.
        let parity = match chunk.profile.parity_stripes() {
            0 => None,
            p => Some(p as usize),
        };
        let readable = parity.map_or_else(
            || {
                (0..chunk.num_copies()).any(|mirror| {
                    // A copy is readable if every stripe it uses is present; a
                    // chunk spans at most all its stripes, so test each stripe row.
                    let step = chunk.item.stripe_len.max(1);
                    let rows = chunk.item.stripes.len() as u64 * 2;
                    (0..rows).all(|r| {
                        let pos = chunk.logical + (r * step).min(chunk.item.length - 1);
                        chunk
                            .map(pos, 1, mirror)
                            .map(|p| set.get(p.devid).is_some())
                            .unwrap_or(false)
                    })
                })
            },
            |parity| gone <= parity,
        );
        if !readable {
            let gone: Vec<String> = chunk
                .item
                .stripes
                .iter()
                .filter(|s| set.get(s.devid).is_none())
                .map(|s| {
                    // A seed's device item keeps the seed's filesystem id.
                    let seed = missing
                        .iter()
                        .find(|d| d.devid == s.devid && d.fsid != set.superblock.tree_fsid())
                        .map(|d| format!(", a seed device of filesystem {}", uuid_string(&d.fsid)))
                        .unwrap_or_default();
                    format!("{} (uuid {}{seed})", s.devid, uuid_string(&s.dev_uuid))
                })
                .collect();
            // A device holding two stripes (DUP) is named once.
            let mut gone = gone;
            gone.dedup();
            return Err(Error::Devices(format!(
                "device {} is missing and the {} chunk at logical {} has no complete copy without it; give every device of the filesystem",
                gone.join(", "),
                chunk.profile.name(),
                chunk.logical
            )));
        }
    }
    for d in missing {
        warnings.push(format!(
            "device {} (uuid {}) is missing; reading degraded from the remaining copies",
            d.devid,
            uuid_string(&d.uuid)
        ));
    }
    Ok(())
}

fn now() -> crate::format::items::Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    crate::format::items::Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// Inodes in use by open files, with their use counts, and those of them
/// that lost their last name while in use (orphans, deleted at the last
/// close): the last close knows without reading a tree. Likewise whole
/// subvolumes: holds on them, and those deleted while in use.
#[derive(Default)]
pub(crate) struct OpenInodes {
    pub users: HashMap<InodeId, u32>,
    pub orphaned: std::collections::HashSet<InodeId>,
    /// Holds on whole subvolumes (see [`Filesystem::hold_subvolume`]).
    pub subvol_holds: HashMap<u64, u64>,
    /// Subvolumes deleted while in use: dead (no refs, an orphan item in
    /// the root tree), their trees dropped when the last use ends.
    pub deleted_in_use: std::collections::HashSet<u64>,
}

impl OpenInodes {
    /// Whether anything holds subvolume `id` or an inode in it.
    pub fn subvol_in_use(&self, id: u64) -> bool {
        self.subvol_holds.get(&id).is_some_and(|&n| n > 0)
            || self.users.keys().any(|i| i.subvol == id)
    }

    /// Whether subvolume `id` was deleted while in use and is used no more.
    pub fn deleted_and_unused(&self, id: u64) -> bool {
        self.deleted_in_use.contains(&id) && !self.subvol_in_use(id)
    }
}

#[cfg(test)]
mod tests {
    use super::stripe_room;

    #[test]
    fn stripe_room_counts_as_the_kernel() {
        const G: u64 = 1 << 30;
        // RAID1 on two devices: the smaller one, twice.
        assert_eq!(stripe_room(&[G, 3 * G], 2, 2), 2 * G);
        // Three or more: less than fits (the kernel's figures).
        assert_eq!(stripe_room(&[G, G, G], 2, 2), 2 * G);
        assert_eq!(stripe_room(&[5 * G, G, G, G], 2, 2), 4 * G);
        assert_eq!(stripe_room(&[2 * G, G, G], 3, 3), 3 * G);
        assert_eq!(stripe_room(&[G], 2, 2), 0);
        assert_eq!(stripe_room(&[], 2, 2), 0);
        // All devices at once: everything.
        assert_eq!(stripe_room(&[G, 2 * G, 3 * G], 3, 1), 6 * G);
        assert_eq!(stripe_room(&[u64::MAX, u64::MAX], 2, 2), u64::MAX);
    }
}

//! Transactions: everything one generation changes, and the commit that
//! makes it durable.
//!
//! The commit order follows seed 004: write every dirty tree block, one
//! cache flush per device, the primary superblock with FUA, then the
//! superblock mirrors (made durable by the next commit's flush).

use crate::alloc::delayed_ref::BlockRef;
use crate::alloc::extent_tree::{self, ChildRef, ExtentCtx, Holder, SpaceOp, child_refs};
use crate::alloc::{Allocator, DelayedRefs, SpaceKind, block_group, free_space_tree};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::RootItem;
use crate::format::node::{Body, Node};
use crate::fs::Filesystem;
use crate::tree::cow::CowPlan;
use crate::tree::{BlockSource, RootPtr, TreeEditor, TreeReader};
use crate::volume::{DeviceSet, scan_device};
use crate::{Error, Result, csum_tree};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

pub mod abort;
pub mod quota;

/// The transaction's source of tree blocks: the allocator and the
/// reference changes it owes the extent tree.
pub struct TxnBlocks {
    /// Id of the running transaction.
    pub transid: u64,
    /// Block groups and free space.
    pub alloc: Allocator,
    /// Reference changes not yet in the extent tree.
    pub refs: DelayedRefs,
    nodesize: u64,
    /// `last_snapshot` of each subvolume: blocks not newer may be shared.
    pub(crate) last_snapshot: HashMap<u64, u64>,
    /// Read-only subvolumes (snapshots made with `-r`).
    pub(crate) readonly: HashSet<u64>,
    /// Whether tree block items are METADATA_ITEMs (skinny metadata).
    skinny: bool,
    /// The extent tree's root, for looking up whether a block is shared.
    pub(crate) extent_root: Option<RootPtr>,
    /// Per tree, bytes of tree blocks allocated minus freed in this
    /// transaction: the kernel keeps root items' `bytes_used` as the size
    /// of the tree and sizes its global reserve from it.
    pub(crate) used_delta: HashMap<u64, i64>,
}

/// What an operation's metadata reservation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reserving {
    /// It may take new space: refused when only the reserve is left.
    Growing,
    /// It frees space and may use the reserve; it commits first when the
    /// reserve runs low and a commit would take enough back.
    Freeing,
    /// As `Freeing`, never committing.
    FreeingInPlace,
}

/// Header flag of blocks written by relocation: they may be shared.
const HEADER_FLAG_RELOC: u64 = 1 << 1;

/// Whether tree `id` is a subvolume (its blocks may be shared with snapshots).
pub(crate) fn is_subvol_tree(id: u64) -> bool {
    id == FS_TREE_OBJECTID || (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&id)
}

/// Highest id a subvolume may have.
pub(crate) const LAST_FREE_OBJECTID: u64 = u64::MAX - 255;

impl TxnBlocks {
    /// References held by `node` (a tree block) on its children, for the
    /// holder `by`, change by `d`: tree blocks for a node, data extents of
    /// file extent items for a leaf.
    fn ref_children(&mut self, node: &Node, by: Holder, d: i64) -> Result<()> {
        for c in child_refs(node, by) {
            match c.map_err(|(_, e)| e)? {
                ChildRef::Block { bytenr, level, r } => self.refs.change_tree(bytenr, level, r, d),
                ChildRef::Data { bytenr, len, r, .. } => {
                    self.refs.change_data_ref(bytenr, len, r, d)
                }
            }
        }
        Ok(())
    }
}

impl TxnBlocks {
    /// References and extent flags of tree block `bytenr`, pending
    /// changes included.
    pub(crate) fn block_info(
        &self,
        reader: &TreeReader,
        tree_id: u64,
        bytenr: u64,
        level: u8,
    ) -> Result<(i64, u64)> {
        let extent = self
            .extent_root
            .ok_or_else(|| Error::corrupt("no extent tree to drop a subvolume from"))?;
        let on_disk =
            extent_tree::tree_block_info(&reader.tree(extent), bytenr, level, self.nodesize)?;
        let (pending, pending_flags) = self.refs.tree_pending(bytenr);
        match on_disk {
            Some((r, f)) => Ok((r as i64 + pending, f | pending_flags)),
            None => Err(Error::corrupt(format!(
                "tree block {bytenr} of tree {tree_id} has no extent item"
            ))),
        }
    }

    /// A block of dying tree `tree_id` that other trees keep: it and every
    /// block below it the tree owns stop naming the tree in their
    /// children's references (those become references by address, the
    /// blocks FULL_BACKREF), so no reference outlives the tree it names.
    fn disown(
        &mut self,
        reader: &TreeReader,
        tree_id: u64,
        node: &Node,
        full_backref: bool,
    ) -> Result<()> {
        if node.header.owner != tree_id {
            return Ok(());
        }
        let (bytenr, level) = (node.header.bytenr, node.header.level);
        if !full_backref {
            self.ref_children(node, Holder::Parent, 1)?;
            self.ref_children(node, Holder::Root(tree_id), -1)?;
            self.refs
                .set_tree_flags(bytenr, level, BLOCK_FLAG_FULL_BACKREF);
        }
        if let Body::Internal(ptrs) = node.body() {
            for p in ptrs {
                let child = reader.read_node(&p.expect(level))?;
                if child.header.owner != tree_id {
                    continue;
                }
                let (_, flags) = self.block_info(reader, tree_id, p.blockptr, level - 1)?;
                self.disown(
                    reader,
                    tree_id,
                    &child,
                    flags & BLOCK_FLAG_FULL_BACKREF != 0,
                )?;
            }
        }
        Ok(())
    }

    /// Tree `tree_id`, being deleted, gives up the block `expect` names,
    /// which it held by `held`: a block others share just loses this
    /// reference, a block the tree alone holds goes, with everything under
    /// it. Each block is read once; the walk is as deep as the tree.
    pub(crate) fn drop_subtree(
        &mut self,
        reader: &TreeReader,
        tree_id: u64,
        expect: &crate::format::node::Expect,
        held: BlockRef,
    ) -> Result<()> {
        let node = reader.read_node(expect)?;
        let (bytenr, level) = (node.header.bytenr, node.header.level);
        let (refs, flags) = self.block_info(reader, tree_id, bytenr, level)?;
        let full_backref = flags & BLOCK_FLAG_FULL_BACKREF != 0;
        if refs > 1 {
            self.disown(reader, tree_id, &node, full_backref)?;
            self.refs.change_tree(bytenr, level, held, -1);
            return Ok(());
        }
        if refs < 1 {
            return Err(Error::corrupt(format!(
                "tree block {bytenr} is reached from tree {tree_id} but has {refs} references"
            )));
        }
        let holder = if full_backref {
            Holder::Parent
        } else {
            Holder::Root(tree_id)
        };
        match node.body() {
            Body::Internal(ptrs) => {
                let by = match holder {
                    Holder::Parent => BlockRef::Parent(bytenr),
                    Holder::Root(r) => BlockRef::Root(r),
                };
                for p in ptrs {
                    let child = p.expect(level);
                    self.drop_subtree(reader, tree_id, &child, by)?;
                }
            }
            Body::Leaf(_) => self.ref_children(&node, holder, -1)?,
        }
        self.refs.change_tree(bytenr, level, held, -1);
        Ok(())
    }

    /// The path a drop the kernel left part done was on: from the root
    /// down to `drop_level`, each node with the slot of `progress` in it.
    /// Everything left of that path is dropped already (those blocks may
    /// be reused); the path's own blocks are still this tree's alone.
    /// None if the path is not like that, so it is left to the kernel.
    fn drop_path(
        &self,
        reader: &TreeReader,
        tree_id: u64,
        root: &crate::format::node::Expect,
        progress: &Key,
        drop_level: u8,
    ) -> Result<Option<DropPath>> {
        let mut path = Vec::new();
        let mut node = reader.read_node(root)?;
        loop {
            let level = node.header.level;
            // The kernel's drop stops between the children of a node,
            // never inside a leaf.
            if level < drop_level || drop_level == 0 || node.nritems() == 0 {
                return Ok(None);
            }
            let (refs, _) = self.block_info(reader, tree_id, node.header.bytenr, level)?;
            if refs != 1 {
                return Ok(None);
            }
            let slot = node.slot_le(progress).unwrap_or(0);
            path.push((node.clone(), slot));
            if level == drop_level {
                // The progress key is the key of the next child to drop.
                return Ok((node.key(slot) == *progress).then_some(path));
            }
            let p = node.key_ptr(slot);
            node = reader.read_node(&p.expect(level))?;
        }
    }

    /// Finish a drop along `path` (from [`TxnBlocks::drop_path`]): in each
    /// node, the child on the path is finished, the children right of it
    /// are dropped whole, and then the node itself, held by `held`.
    /// `restarted` is true until a child is met that still has this tree's
    /// reference (call with true).
    fn drop_resumed(
        &mut self,
        reader: &TreeReader,
        tree_id: u64,
        path: &[(Arc<Node>, usize)],
        held: BlockRef,
        restarted: &mut bool,
    ) -> Result<()> {
        let Some(((node, slot), below)) = path.split_first() else {
            return Ok(());
        };
        let (bytenr, level) = (node.header.bytenr, node.header.level);
        let (_, flags) = self.block_info(reader, tree_id, bytenr, level)?;
        let by = if flags & BLOCK_FLAG_FULL_BACKREF != 0 {
            BlockRef::Parent(bytenr)
        } else {
            BlockRef::Root(tree_id)
        };
        let mut next = *slot;
        if !below.is_empty() {
            self.drop_resumed(reader, tree_id, below, by, restarted)?;
            next += 1;
        }
        for s in next..node.nritems() {
            let p = node.key_ptr(s);
            // The kernel saves its progress only between some steps: the
            // children right of the key it saved may have lost this tree's
            // reference already. Those are skipped, up to the first child
            // that still has it; from there on everything is as saved.
            if *restarted {
                let extent = self
                    .extent_root
                    .ok_or_else(|| Error::corrupt("no extent tree to drop a subvolume from"))?;
                if !extent_tree::tree_block_has_ref(
                    &reader.tree(extent),
                    p.blockptr,
                    level - 1,
                    self.nodesize,
                    by,
                )? {
                    continue;
                }
                *restarted = false;
            }
            let child = p.expect(level);
            self.drop_subtree(reader, tree_id, &child, by)?;
        }
        self.refs.change_tree(bytenr, level, held, -1);
        Ok(())
    }
}

/// The nodes from a tree's root down to where a drop stopped, each with
/// the slot of the child the drop was in.
type DropPath = Vec<(Arc<Node>, usize)>;

impl BlockSource for TxnBlocks {
    fn transid(&self) -> u64 {
        self.transid
    }

    fn alloc_tree_block(&mut self, owner: u64, level: u8) -> Result<u64> {
        let kind = SpaceKind::for_tree(owner);
        let at = self
            .alloc
            .alloc(kind, self.nodesize, self.nodesize)
            .ok_or_else(|| {
                Error::NoSpace(format!(
                    "no {kind:?} space for a tree block of tree {owner}"
                ))
            })?;
        self.refs.add_tree(at, level, owner);
        *self.used_delta.entry(owner).or_default() += self.nodesize as i64;
        Ok(at)
    }

    fn plan_cow(
        &mut self,
        reader: &TreeReader,
        owner: u64,
        node: &Node,
        parent_shared: bool,
    ) -> Result<CowPlan> {
        let h = &node.header;
        if !is_subvol_tree(owner) {
            return Ok(CowPlan::default());
        }
        // Blocks newer than the last snapshot, of this tree, reached
        // through unshared parents are this tree's alone.
        let last = self.last_snapshot.get(&owner).copied().unwrap_or(0);
        let may_share = parent_shared
            || h.owner != owner
            || h.generation <= last
            || h.flags & HEADER_FLAG_RELOC != 0;
        if !may_share {
            return Ok(CowPlan::default());
        }
        if h.flags >> 56 < MIXED_BACKREF_REV {
            return Err(Error::Unsupported(format!(
                "tree block {} has the old back reference format",
                h.bytenr
            )));
        }
        let extent = self
            .extent_root
            .ok_or_else(|| Error::corrupt("no extent tree to look shared blocks up in"))?;
        let on_disk =
            extent_tree::tree_block_info(&reader.tree(extent), h.bytenr, h.level, self.nodesize)?;
        let (pending, pending_flags) = self.refs.tree_pending(h.bytenr);
        let (refs, flags) = match on_disk {
            Some((r, f)) => (r as i64 + pending, f | pending_flags),
            None if self.refs.tree.get(&h.bytenr).is_some_and(|e| e.new) => {
                (pending, pending_flags)
            }
            None => {
                return Err(Error::corrupt(format!(
                    "tree block {} of tree {} has no extent item",
                    h.bytenr, h.owner
                )));
            }
        };
        let refs = refs + parent_shared as i64;
        if refs < 1 {
            return Err(Error::corrupt(format!(
                "tree block {} is reached from tree {owner} but has {refs} references",
                h.bytenr
            )));
        }
        Ok(CowPlan {
            shared: refs > 1,
            full_backref: flags & BLOCK_FLAG_FULL_BACKREF != 0,
        })
    }

    fn free_tree_block(&mut self, owner: u64, node: &Node, plan: CowPlan) -> Result<bool> {
        let (bytenr, level) = (node.header.bytenr, node.header.level);
        if plan.shared {
            if node.header.owner == owner && !plan.full_backref {
                // The block stays in other trees: it now references its
                // children by address, and this tree's copy takes over
                // the tree's references.
                self.ref_children(node, Holder::Parent, 1)?;
                self.refs
                    .set_tree_flags(bytenr, level, BLOCK_FLAG_FULL_BACKREF);
            } else {
                self.ref_children(node, Holder::Root(owner), 1)?;
            }
        } else if plan.full_backref {
            // The last user of a block that referenced its children by
            // address: the copy references them as this tree.
            self.ref_children(node, Holder::Root(owner), 1)?;
            self.ref_children(node, Holder::Parent, -1)?;
        }
        *self.used_delta.entry(owner).or_default() -= self.nodesize as i64;
        let released = self.refs.drop_tree(bytenr, level, owner);
        if released {
            // Allocated and freed in this transaction, never on disk.
            self.alloc.release(bytenr, self.nodesize)?;
        }
        Ok(released)
    }

    fn share_root(&mut self, owner: u64, node: &Node) -> Result<()> {
        self.ref_children(node, Holder::Root(owner), 1)
    }

    fn edited(&mut self) {
        abort::note_edit();
    }
}

/// Write state of a filesystem opened read-write.
pub struct Writer {
    /// Blocks and references of the running transaction.
    pub blocks: TxnBlocks,
    /// Trees whose root changed in the running transaction.
    dirty_roots: BTreeSet<u64>,
    chunk_tree_uuid: [u8; 16],
    /// Each device's superblock bytes, by devid, as last written by a commit.
    pub(crate) dev_supers: BTreeMap<u64, Box<[u8; SUPER_SIZE]>>,
    /// The tree holding block group items (extent tree or block group tree).
    bg_tree: u64,
    /// Whether the filesystem keeps a free-space tree.
    has_fst: bool,
    /// Number of the backup root slot written last.
    backup_slot: usize,
    /// Compression of new extents (the `compress` mount option).
    pub(crate) compress: Option<(crate::data::compression::Compression, Option<i32>)>,
    /// Try to compress every extent, even data that looks incompressible
    /// (`compress-force`).
    pub(crate) compress_force: bool,
    /// Flags every new regular file gets (the mount options `nodatacow`,
    /// `nodatasum`).
    pub(crate) new_file_flags: u64,
    /// Whole dirty runs are lent to compression jobs, not copied (off
    /// only in tests of the copying path).
    pub(crate) lend_runs: bool,
    /// How data checksums are computed.
    pub(crate) csum_mode: crate::data::ordered::CsumMode,
    /// Measured costs that steer the `auto` checksum mode.
    pub(crate) csum_stats: crate::data::ordered::CsumStats,
    /// Next free inode number per subvolume, once looked up.
    pub(crate) next_ino: HashMap<u64, u64>,
    /// Next directory index per (subvolume, directory), once looked up.
    pub(crate) next_index: HashMap<(u64, u64), u64>,
    /// Per block group, the free space its free-space tree items say, as
    /// the last commit wrote them (a group is read from the tree once).
    fst_written: HashMap<u64, crate::alloc::RangeSet>,
    /// Subvolumes whose root changed in this transaction without their
    /// content changing (a snapshot's source): their ctransid stays.
    pub(crate) keep_ctransid: HashSet<u64>,
    /// The log tree fsyncs wrote in this transaction, if any.
    pub(crate) log: Option<crate::tree_log::LogTree>,
    /// Check each incremental log against one made from scratch (tests).
    pub(crate) log_self_check: bool,
    /// Logging failed beside readers, where the half-changed log could
    /// not be dropped: every fsync commits until a commit drops it.
    pub(crate) log_broken: bool,
    /// Metadata the dirty data will take when it is written back (inline
    /// extents of small files, extent items, checksums), estimated as it
    /// comes: space is refused before a commit would run out of it.
    pub(crate) delalloc_metadata: u64,
    /// Names removed (renames, unlinks) since the log's names were last
    /// brought up to date: (subvolume, directory, inode it named, entry
    /// index). The
    /// log holds names as of one moment only if the directories and
    /// inodes among these that it holds are logged again.
    pub(crate) removed_names: Vec<(u64, u64, u64, u64)>,
    /// Chunks added in the running transaction (logical start, length).
    /// A log replay finds chunks in the committed chunk tree only, so a
    /// log naming a block in one (its own, or logged data) could not be
    /// replayed: such an fsync commits instead.
    pub(crate) new_chunks: Vec<(u64, u64)>,
    /// The qgroup counts this transaction writes are exact (a quota
    /// rescan's): its commit does not mark them inconsistent.
    pub(crate) qgroups_counted: bool,
}

impl Writer {
    /// Add incompatible feature flags `bits` to the superblocks the next
    /// commit or log sync writes (the trees now hold what needs them).
    pub(crate) fn add_incompat(&mut self, bits: u64) {
        for raw in self.dev_supers.values_mut() {
            let sb = &mut raw[..];
            let flags = u64::from_le_bytes(sb[0xbc..0xc4].try_into().unwrap_or_default());
            if flags & bits != bits {
                sb[0xbc..0xc4].copy_from_slice(&(flags | bits).to_le_bytes());
            }
        }
    }

    /// From now on the filesystem keeps a free-space tree: the next
    /// commit writes every changed group's entries, and the superblocks
    /// it writes say so (and that the v1 cache is gone: its generation 0).
    pub(crate) fn start_free_space_tree(&mut self) {
        self.has_fst = true;
        self.dirty_roots.insert(FREE_SPACE_TREE_OBJECTID);
        let bits = COMPAT_RO_FREE_SPACE_TREE | COMPAT_RO_FREE_SPACE_TREE_VALID;
        for raw in self.dev_supers.values_mut() {
            let sb = &mut raw[..];
            let flags = u64::from_le_bytes(sb[0xb4..0xbc].try_into().unwrap_or_default());
            sb[0xb4..0xbc].copy_from_slice(&(flags | bits).to_le_bytes());
            sb[0x22b..0x233].copy_from_slice(&0u64.to_le_bytes());
        }
    }

    /// The chunk tree UUID stamped in tree blocks.
    pub fn chunk_tree_uuid(&self) -> [u8; 16] {
        self.chunk_tree_uuid
    }

    /// The tree holding block group items.
    pub fn bg_tree(&self) -> u64 {
        self.bg_tree
    }

    /// Whether the filesystem keeps a free-space tree.
    pub(crate) fn has_free_space_tree(&self) -> bool {
        self.has_fst
    }

    /// Forget what the free-space tree was last written to hold for the
    /// group at `start` (it is gone, or its entries were rewritten).
    pub(crate) fn forget_free_space_written(&mut self, start: u64) {
        self.fst_written.remove(&start);
    }

    /// Fails for a read-only snapshot: nothing in it may change.
    pub(crate) fn check_writable(&self, subvol: u64) -> Result<()> {
        if self.blocks.readonly.contains(&subvol) {
            return Err(Error::ReadOnly(format!(
                "subvolume {subvol} is a read-only snapshot"
            )));
        }
        Ok(())
    }

    /// Whether the running transaction changed anything.
    pub fn is_dirty(&self) -> bool {
        !self.dirty_roots.is_empty() || !self.blocks.refs.is_empty() || self.log.is_some()
    }
}

impl Filesystem {
    /// Open the filesystem on `devices` for reading and writing.
    pub fn open_read_write<P: AsRef<Path>>(devices: &[P]) -> Result<Self> {
        Self::open_devices_read_write(DeviceSet::open_read_write(devices)?)
    }

    /// Open an assembled set of writable devices for reading and writing.
    pub fn open_devices_read_write(set: DeviceSet) -> Result<Self> {
        let mut fs = Self::open_with_writer(set)?;
        // Changes the kernel fsync'd after its last commit, as its next mount would.
        crate::tree_log::replay_at_open(&mut fs)?;
        // Inodes a crash left unlinked but open go now, as in the kernel
        // (which leaves read-only snapshots as they are).
        let subvols: Vec<u64> = {
            let w = fs.writer_deleting_uncommitted()?;
            w.blocks
                .last_snapshot
                .keys()
                .copied()
                .filter(|id| !w.blocks.readonly.contains(id))
                .collect()
        };
        for subvol in subvols {
            // A deleted subvolume (no refs) is the drop's: its tree may be
            // half dropped, with freed blocks left of where the drop stopped.
            if fs.find_root(subvol)?.is_none_or(|(_, item)| item.refs == 0) {
                continue;
            }
            let mut w = fs.writer_deleting()?;
            fs.clean_orphans(&mut w, subvol)?;
        }
        // Subvolumes the kernel deleted but had not dropped yet.
        fs.finish_dead_subvolumes()?;
        Ok(fs)
    }

    /// The filesystem on `set` with its write state, as found: the log is
    /// not replayed, orphans are not cleaned.
    pub(crate) fn open_with_writer(set: DeviceSet) -> Result<Self> {
        let mut dev_supers = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        for (devid, dev) in set.iter() {
            let (sb, _) = scan_device(dev.as_ref())?;
            // The seeds of a sprouted filesystem are read, never written:
            // no superblocks, no chunks, their block groups read-only.
            if set.is_seed(devid) {
                sizes.insert(devid, (dev.path().to_path_buf(), dev.size()));
                continue;
            }
            if sb.is_seed() {
                return Err(Error::ReadOnly(format!(
                    "{} is a seed device: it is only read, as the kernel only reads it (filesystems sprouted from it hold its blocks)",
                    dev.path().display()
                )));
            }
            dev_supers.insert(devid, sb.raw.clone());
            sizes.insert(devid, (dev.path().to_path_buf(), dev.size()));
        }
        let mut fs = Filesystem::open_unreplayed(set)?;
        fs.tree_reader().want_mends();
        let sb = fs.superblock().clone();
        // Without one (the v1 cache, or none), the first commit makes the
        // free-space tree, as the kernel's space_cache=v2 mount does.
        let has_fst = sb.compat_ro_flags & COMPAT_RO_FREE_SPACE_TREE != 0;
        // A tree the kernel was building when it stopped: it rebuilds it
        // at its next mount; ubtrfs would allocate from it as it is.
        if has_fst && sb.compat_ro_flags & COMPAT_RO_FREE_SPACE_TREE_VALID == 0 {
            return Err(Error::Unsupported(
                "writing a filesystem whose free-space tree is marked not valid (a mount by the kernel rebuilds it)".into(),
            ));
        }
        let unknown_ro = sb.compat_ro_flags & !COMPAT_RO_SUPPORTED;
        if unknown_ro != 0 {
            return Err(Error::Unsupported(format!(
                "writing a filesystem with read-only-compatible feature flags {unknown_ro:#x}"
            )));
        }
        // Simple quotas count through owner references on new extents,
        // which ubtrfs does not write.
        if sb.incompat_flags & INCOMPAT_SIMPLE_QUOTA != 0 {
            return Err(Error::Unsupported(
                "writing a filesystem with simple quotas (squota)".into(),
            ));
        }
        let missing = fs.warnings().iter().any(|w| w.contains("is missing"));
        if missing {
            return Err(Error::Devices(
                "a device is missing: writing needs every device".into(),
            ));
        }
        // A device smaller than the filesystem says it is (a truncated
        // image, the wrong device) would have chunks placed past its end.
        for item in fs.chunk_tree().items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)? {
            let d = crate::format::items::DevItem::parse(item?.data())?;
            if let Some((path, size)) = sizes.get(&d.devid)
                && d.total_bytes > *size
            {
                return Err(Error::Devices(format!(
                    "{}: device {} holds {size} bytes, but the filesystem says it holds {}: a truncated image or the wrong device (it can still be opened read-only)",
                    path.display(),
                    d.devid,
                    d.total_bytes
                )));
            }
        }
        let mut groups = block_group::load_groups(&fs.tree_by_id(sb.block_group_tree())?)?;
        groups.sort_by_key(|g| g.start);
        let mut alloc = Allocator::new(groups);
        if has_fst {
            free_space_tree::load(
                &mut alloc.groups,
                &fs.tree_by_id(FREE_SPACE_TREE_OBJECTID)?,
                sb.sectorsize as u64,
            )?;
        } else {
            crate::alloc::free_from_extent_tree(
                &mut alloc.groups,
                &fs.tree_by_id(EXTENT_TREE_OBJECTID)?,
                sb.nodesize as u64,
            )?;
        }
        let mut chunks = Vec::new();
        for item in fs
            .chunk_tree()
            .items_of(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY)?
        {
            let item = item?;
            chunks.push((
                item.key().offset,
                crate::format::items::ChunkItem::parse(item.data())?,
            ));
        }
        block_group::exclude_super_copies(&mut alloc.groups, &chunks)?;
        alloc.settle();
        let seeds = &fs.tree_reader().volume().devices;
        for (logical, chunk) in &chunks {
            if chunk.stripes.iter().any(|s| seeds.is_seed(s.devid))
                && let Some(g) = alloc.groups.get_mut(logical)
            {
                g.read_only = true;
            }
        }
        let mut last_snapshot = HashMap::new();
        let mut readonly = HashSet::new();
        for item in fs.root_tree().range(Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.item_type == ROOT_ITEM_KEY && is_subvol_tree(k.objectid) {
                let r = RootItem::parse(item.data())?;
                last_snapshot.insert(k.objectid, r.last_snapshot);
                if r.flags & ROOT_SUBVOL_RDONLY != 0 {
                    readonly.insert(k.objectid);
                }
            }
        }
        let root_node = fs.tree_reader().read_node(&crate::format::node::Expect {
            bytenr: sb.root,
            generation: Some(sb.generation),
            level: Some(sb.root_level),
            first_key: None,
        })?;
        let backup_slot = sb
            .backup_roots
            .iter()
            .enumerate()
            .max_by_key(|(_, b)| b.tree_root_gen)
            .map_or(0, |(i, _)| i);
        fs.writer = Some(std::sync::Mutex::new(Writer {
            blocks: TxnBlocks {
                transid: sb.generation + 1,
                alloc,
                refs: DelayedRefs::default(),
                nodesize: sb.nodesize as u64,
                last_snapshot,
                readonly,
                skinny: sb.incompat_flags & INCOMPAT_SKINNY_METADATA != 0,
                extent_root: None,
                used_delta: HashMap::new(),
            },
            dirty_roots: BTreeSet::new(),
            keep_ctransid: HashSet::new(),
            chunk_tree_uuid: root_node.header.chunk_tree_uuid,
            dev_supers,
            bg_tree: sb.block_group_tree(),
            has_fst,
            backup_slot,
            next_ino: HashMap::new(),
            next_index: HashMap::new(),
            fst_written: HashMap::new(),
            compress: None,
            compress_force: false,
            new_file_flags: 0,
            lend_runs: true,
            csum_mode: Default::default(),
            csum_stats: Default::default(),
            log: None,
            log_self_check: false,
            log_broken: false,
            delalloc_metadata: 0,
            removed_names: Vec::new(),
            new_chunks: Vec::new(),
            qgroups_counted: false,
        }));
        Ok(fs)
    }

    pub(crate) fn lock_writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        self.check_not_aborted()?;
        self.writer
            .as_ref()
            .ok_or_else(|| Error::ReadOnly("the filesystem was opened read-only".into()))
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The write state for an operation that may need new space: fails
    /// with ENOSPC when only the metadata reserve is left.
    pub(crate) fn writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        let mut w = self.lock_writer()?;
        self.reserve_metadata(&mut w, Reserving::Growing)?;
        Ok(w)
    }

    /// The write state for an operation that frees space (unlink, rmdir,
    /// truncate): it may use the metadata reserve, so a full filesystem
    /// can still be emptied. Its copied blocks stay pinned until a commit:
    /// when the reserve runs low it commits first, to take them back.
    pub(crate) fn writer_deleting(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        let mut w = self.lock_writer()?;
        self.reserve_metadata(&mut w, Reserving::Freeing)?;
        Ok(w)
    }

    /// [`Self::writer_deleting`] for work that must not commit (replaying
    /// a log, whose superblock still names it; cleaning up at open).
    pub(crate) fn writer_deleting_uncommitted(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        let mut w = self.lock_writer()?;
        self.reserve_metadata(&mut w, Reserving::FreeingInPlace)?;
        Ok(w)
    }

    /// Metadata kept free for commits and deletions.
    pub(crate) fn metadata_reserve(&self) -> u64 {
        (2u64 << 20).max(128 * self.geometry().nodesize as u64)
    }

    /// Whether data and metadata share block groups (`mkfs --mixed`).
    pub(crate) fn mixed_groups(&self) -> bool {
        self.superblock().incompat_flags & INCOMPAT_MIXED_GROUPS != 0
    }

    /// Free bytes for `kind` in its block groups. With mixed groups both
    /// draw on one pool: what is free for data leaves out what the dirty
    /// data's metadata and the metadata reserves will take, and what is
    /// free for metadata leaves out the dirty data.
    pub(crate) fn space_free(&self, w: &Writer, kind: SpaceKind) -> u64 {
        let free = w.blocks.alloc.free_bytes(kind);
        if !self.mixed_groups() {
            return free;
        }
        match kind {
            SpaceKind::Data => free
                .saturating_sub(w.delalloc_metadata)
                .saturating_sub(4 * self.metadata_reserve()),
            SpaceKind::Metadata => free.saturating_sub(self.delalloc().reserved_bytes()),
            SpaceKind::System => free,
        }
    }

    /// Keep twice the reserve free, adding a metadata chunk when needed.
    pub(crate) fn reserve_metadata(&self, w: &mut Writer, how: Reserving) -> Result<()> {
        let deleting = how != Reserving::Growing;
        let reserve = self.metadata_reserve();
        let low = |w: &Writer| self.space_free(w, SpaceKind::Metadata) < 2 * reserve;
        // Space the log and this transaction's freed blocks hold comes
        // back with a commit: take that before a new chunk, as the kernel
        // commits before it grows or says ENOSPC. Removals that dig into
        // the reserve take it back the same way, once half of it is
        // pinned.
        // Blocks copied from the last commit come back with the next too.
        let back = || {
            w.blocks.alloc.pinned_bytes(SpaceKind::Metadata)
                + w.blocks.refs.tree_blocks_dropping() * u64::from(self.geometry().nodesize)
        };
        // Counting what comes back walks the delayed refs: only when low.
        let worth = || match how {
            Reserving::Growing => w.log.is_some() || back() >= reserve,
            Reserving::Freeing => w.log.is_some() || back() >= reserve / 2,
            Reserving::FreeingInPlace => false,
        };
        if low(w) && worth() {
            self.commit_locked(w)?;
            // A commit that brought little back would come again a few
            // changes later (every fsync's log makes the next one likely):
            // grow now instead, as the kernel grows before metadata is full.
            if self.space_free(w, SpaceKind::Metadata) < 3 * reserve {
                match self.alloc_chunk(w, SpaceKind::Metadata) {
                    Ok(()) | Err(Error::NoSpace(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if low(w) {
            match self.alloc_chunk(w, SpaceKind::Metadata) {
                Ok(()) | Err(Error::NoSpace(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if !deleting && self.space_free(w, SpaceKind::Metadata) < reserve {
            return Err(Error::NoSpace(
                "metadata space is down to its reserve".into(),
            ));
        }
        Ok(())
    }

    /// Allocate data space, adding a data chunk when none is left.
    pub(crate) fn alloc_data_space(&self, w: &mut Writer, len: u64) -> Result<(u64, u64)> {
        let ss = self.geometry().sectorsize as u64;
        if let Some(r) = w.blocks.alloc.alloc_data(len, ss, ss) {
            return Ok(r);
        }
        self.alloc_chunk(w, SpaceKind::Data)?;
        w.blocks
            .alloc
            .alloc_data(len, ss, ss)
            .ok_or_else(|| Error::NoSpace(format!("no data space for {len} bytes")))
    }

    /// Change tree `tree_id` in the running transaction.
    pub(crate) fn modify_tree<R>(
        &self,
        w: &mut Writer,
        tree_id: u64,
        f: impl FnOnce(&mut TreeEditor<'_>, &mut RootPtr) -> Result<R>,
    ) -> Result<R> {
        #[cfg(test)]
        abort::injected_fault()?;
        let mut root = self
            .root_ptr(tree_id)?
            .ok_or_else(|| Error::NotFound(format!("tree {tree_id}")))?;
        let before = root;
        let uuid = w.chunk_tree_uuid;
        w.check_writable(tree_id)?;
        if is_subvol_tree(tree_id) {
            w.blocks.extent_root = self.root_ptr(EXTENT_TREE_OBJECTID)?;
        }
        let r = {
            let mut ed = TreeEditor::new(self.tree_reader(), &mut w.blocks, tree_id, uuid);
            f(&mut ed, &mut root)
        };
        // Even a failed edit may have copied blocks: keep the root it left.
        if root != before {
            self.set_root(tree_id, root);
            w.dirty_roots.insert(tree_id);
        }
        r
    }

    /// Drop subvolume tree `id`, already unlinked: every block it reaches
    /// loses this tree's reference (blocks only it held are freed at
    /// commit, with their data references), and its root item goes.
    ///
    /// `resume` is where a drop the kernel left part done stopped (the root
    /// item's drop progress key and level): only what lies at or after it
    /// is dropped. A path to it that is not as the kernel leaves one is
    /// not touched, and false is returned: the kernel will finish it.
    pub(crate) fn drop_subvol_tree(
        &self,
        w: &mut Writer,
        id: u64,
        resume: Option<(Key, u8)>,
    ) -> Result<bool> {
        let (ptr, _) = self
            .find_root(id)?
            .ok_or_else(|| Error::NotFound(format!("subvolume {id}")))?;
        w.blocks.extent_root = self.root_ptr(EXTENT_TREE_OBJECTID)?;
        let root = crate::format::node::Expect {
            bytenr: ptr.bytenr,
            generation: ptr.generation,
            level: Some(ptr.level),
            first_key: None,
        };
        let reader = self.tree_reader();
        match resume {
            None => w
                .blocks
                .drop_subtree(reader, id, &root, BlockRef::Root(id))?,
            Some((progress, level)) => {
                let Some(path) = w.blocks.drop_path(reader, id, &root, &progress, level)? else {
                    return Ok(false);
                };
                w.blocks
                    .drop_resumed(reader, id, &path, BlockRef::Root(id), &mut true)?;
            }
        }
        let key = self
            .root_tree()
            .get_le(&Key::new(id, ROOT_ITEM_KEY, u64::MAX))?
            .map(|it| it.key())
            .filter(|k| k.objectid == id && k.item_type == ROOT_ITEM_KEY)
            .ok_or_else(|| Error::corrupt(format!("subvolume {id} has no root item")))?;
        self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, r| ed.delete(r, key))?;
        self.remove_qgroup(w, id)?;
        w.dirty_roots.remove(&id);
        w.blocks.used_delta.remove(&id);
        w.blocks.last_snapshot.remove(&id);
        w.blocks.readonly.remove(&id);
        w.next_ino.remove(&id);
        w.next_index.retain(|(s, _), _| *s != id);
        self.roots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        Ok(true)
    }

    /// Commit the running transaction, if it changed anything.
    pub fn commit(&self) -> Result<()> {
        self.change("commit", || {
            let mut w = self.lock_writer()?;
            self.commit_locked(&mut w)
        })
    }

    /// [`Filesystem::commit`] inside the caller's hold on the transaction.
    pub(crate) fn commit_locked(&self, w: &mut Writer) -> Result<()> {
        self.long_work_ahead();
        // A commit may use the reserve (that is what it is for): a new
        // chunk only below it. Taking one whenever space is merely low
        // would grow metadata at every commit meant to free pinned space.
        if self.space_free(w, SpaceKind::Metadata) < self.metadata_reserve() {
            match self.alloc_chunk(w, SpaceKind::Metadata) {
                Ok(()) | Err(Error::NoSpace(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.write_pending_atimes(w)?;
        self.writeback_all(w)?;
        // The dirty data's metadata is in the trees now.
        w.delalloc_metadata = 0;
        // Nothing names data that is not on disk.
        self.finish_in_flight(w, None, true)?;
        // Tree blocks reads found bad copies of (and a good one).
        self.mend_tree_copies(w);
        // Errors counted since the last commit (a commit with nothing
        // else to write still writes these, as the kernel's does).
        self.write_device_stats(w)?;
        // Block groups emptied by an earlier commit go in this one, even
        // when nothing else changed.
        let unused = self.unused_groups(w);
        // Without a log there is nothing half changed; with one, it goes below.
        w.log_broken = false;
        if !w.is_dirty() && unused.is_empty() {
            abort::whole();
            return Ok(());
        }
        // A filesystem opened without a free-space tree gets one with its
        // first commit: after a log's replay, which sets the log's blocks
        // aside (they are free in the extent tree), and before anything is
        // written that a stale v1 cache would not know of.
        if !w.has_fst {
            self.start_free_space_tree(w)?;
        }
        // The log's blocks are free in what this commit writes (the
        // kernel's are too) and reusable once it is on disk.
        w.removed_names.clear();
        w.new_chunks.clear();
        if let Some(log) = w.log.take() {
            log.discard(&mut w.blocks.alloc)?;
        }
        self.remove_groups(w, &unused)?;
        self.mark_qgroups_inconsistent(w)?;
        self.settle(w)?;
        self.delalloc().drop_spares();
        self.write_out(w)?;
        // What is on disk now is whole (a commit never runs half way
        // through an operation).
        abort::whole();
        Ok(())
    }

    /// Bring the extent, free-space and root trees up to date with every
    /// other change; each step may cause more, so repeat until none is left.
    fn settle(&self, w: &mut Writer) -> Result<()> {
        for _ in 0..64 {
            self.run_delayed_refs(w)?;
            let mut changed = false;
            let bg_tree = w.bg_tree;
            let used = dirty_groups(w, |g| g.dirty_used);
            for start in used {
                let g = w
                    .blocks
                    .alloc
                    .groups
                    .get_mut(&start)
                    .ok_or_else(|| Error::corrupt("group vanished"))?;
                g.dirty_used = false;
                let (key, bytes) = (g.key(), g.item_bytes());
                self.modify_tree(w, bg_tree, |ed, root| {
                    ed.update(root, key, |d| {
                        *d = bytes;
                        Ok(())
                    })?
                    .ok_or_else(|| Error::corrupt(format!("block group item {key} missing")))
                })?;
                changed = true;
            }
            if w.has_fst {
                let free = dirty_groups(w, |g| g.dirty_free);
                for start in free {
                    let g = w
                        .blocks
                        .alloc
                        .groups
                        .get_mut(&start)
                        .ok_or_else(|| Error::corrupt("group vanished"))?;
                    g.dirty_free = false;
                    let (gstart, glen) = (g.start, g.len);
                    let free = free_space_tree::on_disk_free(g);
                    // Diffed against what the last commit wrote, the
                    // update costs what changed, not the tree's size.
                    let written = w.fst_written.remove(&start);
                    self.modify_tree(w, FREE_SPACE_TREE_OBJECTID, |ed, root| {
                        free_space_tree::update(ed, root, gstart, glen, &free, written.as_ref())
                    })?;
                    w.fst_written.insert(start, free);
                    changed = true;
                }
            }
            changed |= self.update_root_items(w)?;
            if !changed && w.blocks.refs.is_empty() {
                return Ok(());
            }
        }
        Err(Error::corrupt("commit did not settle after 64 rounds"))
    }

    fn run_delayed_refs(&self, w: &mut Writer) -> Result<()> {
        let ctx = ExtentCtx {
            transid: w.blocks.transid,
            nodesize: w.blocks.nodesize,
            skinny: w.blocks.skinny,
        };
        while !w.blocks.refs.is_empty() {
            let refs = std::mem::take(&mut w.blocks.refs);
            let mut ops = Vec::new();
            for (bytenr, r) in refs.tree {
                // A new block's first key goes into a non-skinny item.
                let first_key = || {
                    self.tree_reader()
                        .read_node(&crate::format::node::Expect {
                            bytenr,
                            generation: None,
                            level: Some(r.level),
                            first_key: None,
                        })
                        .ok()
                        .filter(|n| n.nritems() > 0)
                        .map_or(Key::default(), |n| n.key(0))
                };
                ops.extend(self.modify_tree(w, EXTENT_TREE_OBJECTID, |ed, root| {
                    extent_tree::run_tree_refs(ed, root, bytenr, &r, ctx, first_key)
                })?);
            }
            for (bytenr, d) in refs.data {
                ops.extend(self.modify_tree(w, EXTENT_TREE_OBJECTID, |ed, root| {
                    extent_tree::run_data_refs(ed, root, bytenr, &d, ctx)
                })?);
            }
            for op in ops {
                match op {
                    SpaceOp::Used { bytenr, delta } => {
                        let g = w.blocks.alloc.group_of(bytenr)?;
                        g.used = g
                            .used
                            .checked_add_signed(delta)
                            .filter(|&u| u <= g.len)
                            .ok_or_else(|| {
                                Error::corrupt(format!(
                                    "block group {} usage out of range",
                                    g.start
                                ))
                            })?;
                        g.dirty_used = true;
                    }
                    SpaceOp::Pin { bytenr, len } => w.blocks.alloc.pin(bytenr, len)?,
                    SpaceOp::DropCsums { bytenr, len } => {
                        let geo = self.geometry();
                        self.modify_tree(w, CSUM_TREE_OBJECTID, |ed, root| {
                            csum_tree::delete_range(
                                ed,
                                root,
                                bytenr,
                                len,
                                geo.sectorsize,
                                geo.csum_size,
                            )
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Point each changed tree's root item at its new root; true if any changed.
    fn update_root_items(&self, w: &mut Writer) -> Result<bool> {
        let transid = w.blocks.transid;
        let mut changed = false;
        let ids: Vec<u64> = w.dirty_roots.iter().copied().collect();
        for id in ids {
            if id == ROOT_TREE_OBJECTID || id == CHUNK_TREE_OBJECTID {
                continue;
            }
            let ptr = self
                .root_ptr(id)?
                .ok_or_else(|| Error::NotFound(format!("tree {id}")))?;
            let found = self
                .root_tree()
                .get_le(&Key::new(id, ROOT_ITEM_KEY, u64::MAX))?;
            let item = found
                .filter(|it| it.key().objectid == id && it.key().item_type == ROOT_ITEM_KEY)
                .ok_or_else(|| Error::corrupt(format!("tree {id} has no root item")))?;
            let key = item.key();
            let mut data = item.data().to_vec();
            let cur = RootItem::parse(&data)?;
            let delta = w.blocks.used_delta.remove(&id).unwrap_or(0);
            if delta == 0
                && cur.bytenr == ptr.bytenr
                && cur.level == ptr.level
                && cur.generation == transid
            {
                continue;
            }
            let used = cur.bytes_used.saturating_add_signed(delta);
            data[192..200].copy_from_slice(&used.to_le_bytes());
            data[160..168].copy_from_slice(&transid.to_le_bytes());
            data[176..184].copy_from_slice(&ptr.bytenr.to_le_bytes());
            data[238] = ptr.level;
            if data.len() >= 247 {
                data[239..247].copy_from_slice(&transid.to_le_bytes());
            }
            if data.len() >= 303
                && (id == FS_TREE_OBJECTID || id >= FIRST_FREE_OBJECTID)
                && !w.keep_ctransid.contains(&id)
            {
                // The subvolume's content changed in this transaction.
                data[295..303].copy_from_slice(&transid.to_le_bytes());
            }
            self.modify_tree(w, ROOT_TREE_OBJECTID, |ed, root| ed.put(root, key, data))?;
            changed = true;
        }
        Ok(changed)
    }

    /// Write the dirty blocks, flush, and write the superblocks.
    fn write_out(&self, w: &mut Writer) -> Result<()> {
        let reader = self.tree_reader();
        let volume = reader.volume();
        let csum_type = reader.csum_type();
        // Blocks come sorted by address: neighbours in one chunk go out
        // in one write.
        let mut buf: Vec<u8> = Vec::new();
        let (mut start, mut chunk_end) = (0u64, 0u64);
        for node in reader.dirty_blocks() {
            let at = node.header.bytenr;
            let joins = !buf.is_empty()
                && start + buf.len() as u64 == at
                && at + node.bytes().len() as u64 <= chunk_end
                && buf.len() < WRITE_OUT_MAX;
            if !joins {
                if !buf.is_empty() {
                    volume.write(start, &buf)?;
                    buf.clear();
                }
                let chunk = volume.chunks.lookup(at)?;
                (start, chunk_end) = (at, chunk.logical + chunk.item.length);
            }
            node.seal_into(csum_type, &mut buf);
        }
        if !buf.is_empty() {
            volume.write(start, &buf)?;
        }
        for (_, dev) in volume.devices.iter() {
            dev.flush()?;
        }
        let transid = w.blocks.transid;
        let root = self
            .root_ptr(ROOT_TREE_OBJECTID)?
            .ok_or_else(|| Error::corrupt("no root tree"))?;
        let chunk = self
            .root_ptr(CHUNK_TREE_OBJECTID)?
            .ok_or_else(|| Error::corrupt("no chunk tree"))?;
        let bytes_used = w.blocks.alloc.bytes_used();
        let slot = (w.backup_slot + 1) % 4;
        let backup = self.backup_root(transid, root, chunk, bytes_used)?;
        // An fsync finishing off the change lock must not write its older
        // superblocks over these.
        let mut on_disk = self
            .supers_on_disk
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Set first: were a write below to fail, newer superblocks may be
        // on some device already.
        *on_disk = transid;
        for (devid, raw) in w.dev_supers.iter_mut() {
            let sb = &mut raw[..];
            // A UUID tree the last commit vouched for stays vouched for (we
            // keep it current): else the kernel rescans it at mount.
            if sb[0x233..0x23b] == sb[0x48..0x50] {
                put64(sb, 0x233, transid);
            }
            put64(sb, 0x48, transid);
            put64(sb, 0x50, root.bytenr);
            put64(sb, 0x58, chunk.bytenr);
            put64(sb, 0x60, 0);
            put64(sb, 0x70, self.total_bytes());
            put64(sb, 0x78, bytes_used);
            if w.dirty_roots.contains(&CHUNK_TREE_OBJECTID) {
                put64(sb, 0xa4, transid);
            }
            sb[0xc6] = root.level;
            sb[0xc7] = chunk.level;
            sb[0xc8] = 0;
            let b = 0xb2b + slot * 168;
            sb[b..b + 168].copy_from_slice(&backup);
            // The device's own item, as the chunk tree now records it.
            if let Some(item) =
                self.chunk_tree()
                    .get(&Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, *devid))?
            {
                let n = crate::format::items::DevItem::SIZE;
                sb[0xc9..0xc9 + n].copy_from_slice(&item.data()[..n]);
            }
            let dev = volume
                .devices
                .get(*devid)
                .ok_or_else(|| Error::Devices(format!("device {devid} vanished")))?;
            for (i, &off) in SUPER_OFFSETS.iter().enumerate() {
                // Copies exist only inside the filesystem's part of the device.
                let fs_size =
                    u64::from_le_bytes(sb[0xc9 + 8..0xc9 + 16].try_into().unwrap_or_default());
                if off + SUPER_SIZE as u64 > dev.size().min(fs_size) {
                    break;
                }
                put64(sb, 0x30, off);
                let c = csum_type.compute(&sb[CSUM_SIZE_MAX..]);
                sb[..CSUM_SIZE_MAX].copy_from_slice(&c);
                if i == 0 {
                    dev.write_fua(off, sb)?;
                } else {
                    dev.write_at(off, sb)?;
                }
            }
            put64(sb, 0x30, SUPER_OFFSETS[0]);
        }
        // Before the lock goes: an fsync that finds these superblocks must
        // also find them committed.
        self.committed
            .store(transid, std::sync::atomic::Ordering::Release);
        drop(on_disk);
        w.backup_slot = slot;
        reader.commit_done(transid);
        w.blocks.alloc.unpin_all();
        w.blocks.transid = transid + 1;
        w.dirty_roots.clear();
        w.keep_ctransid.clear();
        Ok(())
    }

    /// The backup root record for this commit.
    fn backup_root(
        &self,
        transid: u64,
        root: RootPtr,
        chunk: RootPtr,
        bytes_used: u64,
    ) -> Result<[u8; 168]> {
        let mut b = [0u8; 168];
        let mut put = |i: usize, v: u64| b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        let gen_of = |p: Option<RootPtr>| p.and_then(|p| p.generation).unwrap_or(0);
        let extent = self.root_ptr(EXTENT_TREE_OBJECTID)?;
        let fs = self.root_ptr(FS_TREE_OBJECTID)?;
        let dev = self.root_ptr(DEV_TREE_OBJECTID)?;
        let csum = self.root_ptr(CSUM_TREE_OBJECTID)?;
        put(0, root.bytenr);
        put(1, transid);
        put(2, chunk.bytenr);
        put(3, gen_of(Some(chunk)));
        put(4, extent.map_or(0, |p| p.bytenr));
        put(5, gen_of(extent));
        put(6, fs.map_or(0, |p| p.bytenr));
        put(7, gen_of(fs));
        put(8, dev.map_or(0, |p| p.bytenr));
        put(9, gen_of(dev));
        put(10, csum.map_or(0, |p| p.bytenr));
        put(11, gen_of(csum));
        put(12, self.total_bytes());
        put(13, bytes_used);
        put(14, self.superblock().num_devices);
        let levels = [Some(root), Some(chunk), extent, fs, dev, csum];
        for (i, p) in levels.iter().enumerate() {
            b[152 + i] = p.map_or(0, |p| p.level);
        }
        Ok(b)
    }
}

/// Starts of the block groups `pick` selects.
fn dirty_groups(w: &Writer, pick: impl Fn(&crate::alloc::BlockGroup) -> bool) -> Vec<u64> {
    w.blocks
        .alloc
        .groups
        .values()
        .filter(|g| pick(g))
        .map(|g| g.start)
        .collect()
}

/// Largest single write of tree blocks at commit.
const WRITE_OUT_MAX: usize = 4 << 20;

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

//! Space by kind and profile (`btrfs filesystem df`): what the block
//! groups of each type and profile hold, and how much of it is used.

use super::open::Filesystem;
use crate::Result;
use crate::format::Key;
use crate::format::consts::*;

/// The block groups of one type and profile, added up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceInfo {
    /// Block group flags: the type (`BLOCK_GROUP_DATA`, `_SYSTEM`,
    /// `_METADATA`) and the profile bits.
    pub flags: u64,
    /// Logical bytes of the block groups.
    pub total: u64,
    /// Logical bytes used in them.
    pub used: u64,
}

/// The flag of the global reserve's entry in [`Filesystem::space_info`]
/// (`BTRFS_SPACE_INFO_GLOBAL_RSV` of the kernel's space ioctl).
pub const SPACE_INFO_GLOBAL_RSV: u64 = 1 << 49;

/// The kernel's global reserve never grows past this.
const GLOBAL_RESERVE_MAX: u64 = 512 << 20;

impl Filesystem {
    /// The size of the kernel's global block reserve, the metadata space it
    /// holds back so that a commit and an unlink can always go through, as
    /// it sizes it when it mounts this filesystem: the bytes of the extent,
    /// checksum, free-space and block group trees (their root items'
    /// `bytes_used`), but at least room to change the root tree and each
    /// of those trees, and to unlink (6 items) with the unlink's delayed
    /// references (6 more, twice as many with the free-space tree), each
    /// item taking 16 nodes (8 levels, copied and split); at most 512 MiB.
    /// (Found by mounting filesystems of each node size, with and without
    /// the free-space tree, and large ones.) `btrfs filesystem df` shows
    /// it as GlobalReserve, and statfs counts it as used.
    pub fn global_reserve(&self) -> Result<u64> {
        let sb = self.superblock();
        let fst = sb.compat_ro_flags & COMPAT_RO_FREE_SPACE_TREE != 0;
        let mut trees = vec![EXTENT_TREE_OBJECTID, CSUM_TREE_OBJECTID];
        if fst {
            trees.push(FREE_SPACE_TREE_OBJECTID);
        }
        if sb.compat_ro_flags & COMPAT_RO_BLOCK_GROUP_TREE != 0 {
            trees.push(BLOCK_GROUP_TREE_OBJECTID);
        }
        let mut used = 0u64;
        for &id in &trees {
            let (_, item) = self.root_item_bytes(id)?;
            let item = crate::format::items::RootItem::parse(&item)?;
            used = used.saturating_add(item.bytes_used);
        }
        let unlink = 6u64;
        let items = 1 + trees.len() as u64 + unlink + if fst { 2 * unlink } else { unlink };
        let floor = u64::from(sb.nodesize) * 16 * items;
        Ok(used.max(floor).min(GLOBAL_RESERVE_MAX))
    }

    /// The space of each type and profile, in the kernel's order: data,
    /// system, metadata (mixed groups last), each profile once; then the
    /// global reserve ([`SPACE_INFO_GLOBAL_RSV`], none of it in use), as
    /// the kernel's space ioctl lists it.
    pub fn space_info(&self) -> Result<Vec<SpaceInfo>> {
        let reserve = self.global_reserve()?;
        let mut out = self.group_space_info()?;
        out.push(SpaceInfo {
            flags: SPACE_INFO_GLOBAL_RSV,
            total: reserve,
            used: 0,
        });
        Ok(out)
    }

    /// [`Self::space_info`] of the block groups alone.
    fn group_space_info(&self) -> Result<Vec<SpaceInfo>> {
        let groups = self.block_group_usage()?;
        let mut out: Vec<SpaceInfo> = Vec::new();
        for (flags, len, used) in groups {
            match out.iter_mut().find(|s| s.flags == flags) {
                Some(s) => {
                    s.total += len;
                    s.used += used;
                }
                None => out.push(SpaceInfo {
                    flags,
                    total: len,
                    used,
                }),
            }
        }
        let kind = |f: u64| match f & (BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA)
        {
            BLOCK_GROUP_DATA => 0,
            BLOCK_GROUP_SYSTEM => 1,
            BLOCK_GROUP_METADATA => 2,
            _ => 3,
        };
        out.sort_by_key(|s| (kind(s.flags), s.flags));
        Ok(out)
    }

    /// (flags, length, used) of every block group: as the running
    /// transaction has them when writable, else from the block group
    /// items.
    fn block_group_usage(&self) -> Result<Vec<(u64, u64, u64)>> {
        if let Some(w) = &self.writer {
            let w = w.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(w
                .blocks
                .alloc
                .groups
                .values()
                .map(|g| (g.flags, g.len, g.live_used()))
                .collect());
        }
        Ok(self
            .block_group_items()?
            .into_iter()
            .map(|g| (g.flags, g.length, g.used))
            .collect())
    }

    /// Every chunk's block group item as committed (one lookup per chunk).
    pub(crate) fn block_group_items(&self) -> Result<Vec<BlockGroupFigures>> {
        let tree = self.tree_by_id(self.superblock().block_group_tree())?;
        let mut out = Vec::new();
        for c in self.tree_reader().volume().chunks.all() {
            let key = Key::new(c.logical, BLOCK_GROUP_ITEM_KEY, c.item.length);
            let item = tree.get(&key)?.ok_or_else(|| {
                crate::Error::corrupt(format!("chunk {} has no block group item", c.logical))
            })?;
            let used = item
                .data()
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| {
                    crate::Error::corrupt(format!("block group {} is short", c.logical))
                })?;
            out.push(BlockGroupFigures {
                logical: c.logical,
                flags: c.item.chunk_type,
                length: c.item.length,
                used,
            });
        }
        Ok(out)
    }
}

/// One block group's figures from its committed item.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockGroupFigures {
    pub logical: u64,
    pub flags: u64,
    pub length: u64,
    pub used: u64,
}

/// One device's part in [`Usage`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceUsage {
    pub devid: u64,
    /// Where it was opened from; `None` if it is missing.
    pub path: Option<std::path::PathBuf>,
    /// The size the filesystem uses of it (its device item).
    pub total_bytes: u64,
    /// The size of the device or image itself (0 if missing): past
    /// `total_bytes` is slack.
    pub device_size: u64,
    /// Bytes of it in chunks, per block group flags (type and profile).
    pub allocated: Vec<(u64, u64)>,
    /// A seed of this sprouted filesystem: its chunks count as
    /// allocated, but `btrfs filesystem usage` shows neither it nor its
    /// size (the kernel lists only the filesystem's own devices).
    pub seed: bool,
}

/// Everything `btrfs filesystem usage` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// As [`Filesystem::space_info`], the global reserve last.
    pub spaces: Vec<SpaceInfo>,
    /// By device id.
    pub devices: Vec<DeviceUsage>,
    /// What statfs says is available ([`super::StatFs::free_bytes`]).
    pub statfs_free: u64,
}

impl Filesystem {
    /// The space of each kind and profile, and of each device: its size,
    /// what its chunks take of it by kind and profile, and what is left.
    pub fn usage(&self) -> Result<Usage> {
        let spaces = self.space_info()?;
        let statfs_free = self.statfs().free_bytes;
        let mut devices = Vec::new();
        for item in self
            .chunk_tree()
            .items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)?
        {
            let item = crate::format::items::DevItem::parse(item?.data())?;
            let dev = self.tree_reader().volume().devices.get(item.devid);
            devices.push(DeviceUsage {
                devid: item.devid,
                path: dev.map(|d| d.path().to_path_buf()),
                total_bytes: item.total_bytes,
                device_size: dev.map_or(0, |d| d.size()),
                allocated: Vec::new(),
                seed: self.tree_reader().volume().devices.is_seed(item.devid),
            });
        }
        devices.sort_by_key(|d| d.devid);
        for c in self.tree_reader().volume().chunks.all() {
            let n = c.item.stripes.len() as u64;
            let span =
                crate::volume::chunk_map::Chunk::stripe_span(c.profile, &c.item, n).unwrap_or(0);
            for s in &c.item.stripes {
                let Some(d) = devices.iter_mut().find(|d| d.devid == s.devid) else {
                    continue;
                };
                match d
                    .allocated
                    .iter_mut()
                    .find(|(f, _)| *f == c.item.chunk_type)
                {
                    Some((_, b)) => *b += span,
                    None => d.allocated.push((c.item.chunk_type, span)),
                }
            }
        }
        Ok(Usage {
            spaces,
            devices,
            statfs_free,
        })
    }
}

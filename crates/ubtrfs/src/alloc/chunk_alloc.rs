//! New chunks: when a kind of space runs out, carve device ranges (dev
//! extents) for a new chunk in the filesystem's profile, and record it in
//! the chunk tree, the dev tree and a new block group.

use super::{BlockGroup, RangeSet, SpaceKind};
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{ChunkItem, DevExtent, DevItem, Stripe};
use crate::fs::Filesystem;
use crate::transaction::Writer;
use crate::volume::Profile;
use crate::{Error, Result};

/// Device space below this offset is never used for chunks.
const DEV_RESERVED: u64 = 1 << 20;
/// Chunk sizes are multiples of this.
const CHUNK_ALIGN: u64 = 1 << 20;

/// Free ranges of one device.
struct DevSpace {
    item: DevItem,
    free: RangeSet,
}

impl Filesystem {
    /// The profile flags the filesystem uses for `kind`.
    fn profile_of(&self, w: &Writer, kind: SpaceKind) -> Result<u64> {
        let flag = match kind {
            SpaceKind::Data => BLOCK_GROUP_DATA,
            SpaceKind::Metadata => BLOCK_GROUP_METADATA,
            SpaceKind::System => BLOCK_GROUP_SYSTEM,
        };
        w.blocks
            .alloc
            .groups
            .values()
            .filter(|g| g.flags & flag != 0)
            .map(|g| g.flags & (BLOCK_GROUP_PROFILE_MASK | flag))
            .max_by_key(|f| f & BLOCK_GROUP_PROFILE_MASK != 0)
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "no existing {kind:?} block group to copy the profile of"
                ))
            })
    }

    fn device_space(&self) -> Result<Vec<DevSpace>> {
        let mut devs = Vec::new();
        for item in self
            .chunk_tree()
            .items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)?
        {
            let item = DevItem::parse(item?.data())?;
            let mut free = RangeSet::new();
            if item.total_bytes > DEV_RESERVED {
                free.insert(DEV_RESERVED, item.total_bytes - DEV_RESERVED);
            }
            // Keep chunks off the superblock copies.
            for &off in &SUPER_OFFSETS {
                let lo = off / CHUNK_ALIGN * CHUNK_ALIGN;
                let hi = (lo + CHUNK_ALIGN).min(item.total_bytes);
                for (s, l) in free.clone().iter() {
                    let (a, b) = (s.max(lo), (s + l).min(hi));
                    if a < b {
                        free.remove(a, b - a);
                    }
                }
            }
            devs.push(DevSpace { item, free });
        }
        for it in self
            .tree_by_id(DEV_TREE_OBJECTID)?
            .range(Key::MIN, Key::MAX)?
        {
            let it = it?;
            let k = it.key();
            if k.item_type != DEV_EXTENT_KEY {
                continue;
            }
            let de = DevExtent::parse(it.data())?;
            if let Some(d) = devs.iter_mut().find(|d| d.item.devid == k.objectid) {
                // Remove whatever part of the extent is still listed as free.
                for (s, l) in d.free.clone().iter() {
                    let (a, b) = (s.max(k.offset), (s + l).min(k.offset + de.length));
                    if a < b {
                        d.free.remove(a, b - a);
                    }
                }
            }
        }
        Ok(devs)
    }

    /// Add a chunk for `kind` in the filesystem's profile for it.
    pub(crate) fn alloc_chunk(&self, w: &mut Writer, kind: SpaceKind) -> Result<()> {
        // A chunk added is whole in itself, inside any operation.
        crate::transaction::abort::unit(|| {
            if kind == SpaceKind::System {
                return Err(Error::NoSpace("the system chunk is full".into()));
            }
            tracing::debug!(
                ?kind,
                free = w.blocks.alloc.free_bytes(kind),
                pinned = w.blocks.alloc.pinned_bytes(kind),
                "new chunk"
            );
            let flags = self.profile_of(w, kind)?;
            let profile = Profile::from_flags(flags)?;
            let total = self.superblock().total_bytes;
            let cap = if kind == SpaceKind::Data {
                1 << 30
            } else {
                256 << 20
            };
            let mut size = (total / 10).clamp(8 << 20, cap) / CHUNK_ALIGN * CHUNK_ALIGN;
            let mut devs = self.device_space()?;
            let (stripes, sub_stripes, data_stripes) = loop {
                if let Some(plan) = plan_stripes(&mut devs, profile, size) {
                    break plan;
                }
                size /= 2;
                if size < CHUNK_ALIGN {
                    return Err(Error::NoSpace(format!(
                        "no device space for a new {kind:?} chunk ({})",
                        profile.name()
                    )));
                }
                devs = self.device_space()?;
            };
            // What plan_stripes took of each device: whole stripe_len units,
            // so a row of a striped chunk never ends inside a stripe.
            let stripe_size = (size / data_stripes) / STRIPE_LEN * STRIPE_LEN;
            let logical = self
                .tree_reader()
                .volume()
                .chunks
                .end()
                .div_ceil(CHUNK_ALIGN)
                * CHUNK_ALIGN;
            let chunk = ChunkItem {
                length: stripe_size * data_stripes,
                owner: EXTENT_TREE_OBJECTID,
                stripe_len: STRIPE_LEN,
                chunk_type: flags,
                io_align: STRIPE_LEN as u32,
                io_width: STRIPE_LEN as u32,
                sector_size: self.geometry().sectorsize,
                sub_stripes,
                stripes: stripes
                    .iter()
                    .map(|&(devid, offset, uuid)| Stripe {
                        devid,
                        offset,
                        dev_uuid: uuid,
                    })
                    .collect(),
            };
            let length = chunk.length;
            let chunk_bytes = chunk.to_bytes();
            self.modify_tree(w, CHUNK_TREE_OBJECTID, |ed, root| {
                ed.insert(
                    root,
                    Key::new(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, logical),
                    chunk_bytes,
                )?;
                for &(devid, _, _) in &stripes {
                    ed.update(
                        root,
                        Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid),
                        |d| {
                            let mut item = DevItem::parse(d)?;
                            item.bytes_used += stripe_size;
                            *d = item.to_bytes();
                            Ok(())
                        },
                    )?
                    .ok_or_else(|| Error::corrupt(format!("device {devid} has no dev item")))?;
                }
                Ok(())
            })?;
            let uuid = w.chunk_tree_uuid();
            self.modify_tree(w, DEV_TREE_OBJECTID, |ed, root| {
                for &(devid, offset, _) in &stripes {
                    let de = DevExtent {
                        chunk_tree: CHUNK_TREE_OBJECTID,
                        chunk_objectid: FIRST_CHUNK_TREE_OBJECTID,
                        chunk_offset: logical,
                        length: stripe_size,
                        chunk_tree_uuid: uuid,
                    };
                    ed.insert(root, Key::new(devid, DEV_EXTENT_KEY, offset), de.to_bytes())?;
                }
                Ok(())
            })?;
            w.new_chunks.push((logical, length));
            self.tree_reader().volume().chunks.insert(logical, chunk)?;
            let mut group = BlockGroup {
                start: logical,
                len: length,
                flags,
                used: 0,
                chunk_objectid: FIRST_CHUNK_TREE_OBJECTID,
                free: RangeSet::new(),
                pinned: RangeSet::new(),
                dirty_used: false,
                dirty_free: true,
                read_only: false,
            };
            group.free.insert(logical, length);
            let (key, bytes) = (group.key(), group.item_bytes());
            let bg_tree = w.bg_tree();
            self.modify_tree(w, bg_tree, |ed, root| ed.insert(root, key, bytes))?;
            w.blocks.alloc.groups.insert(logical, group);
            Ok(())
        })
    }
}

/// Where one stripe of a new chunk goes: devid, physical offset, device uuid.
type StripePlace = (u64, u64, [u8; 16]);

/// Choose device ranges for a chunk of `size` bytes of `profile`: returns
/// the stripes, sub_stripes, and how many stripes hold distinct data.
/// Takes the chosen space out of `devs`.
fn plan_stripes(
    devs: &mut [DevSpace],
    profile: Profile,
    size: u64,
) -> Option<(Vec<StripePlace>, u16, u64)> {
    // Devices with the most free space first, as the kernel prefers.
    devs.sort_by_key(|d| std::cmp::Reverse(d.free.largest().map_or(0, |(_, l)| l)));
    let with_room = |devs: &[DevSpace], need: u64| {
        devs.iter()
            .filter(|d| d.free.largest().is_some_and(|(_, l)| l >= need))
            .count()
    };
    let (copies_per_dev, ndev, sub, data) = match profile {
        Profile::Single => (1, 1, 1, 1),
        Profile::Dup => (2, 1, 1, 1),
        Profile::Raid1 => (1, 2, 1, 1),
        Profile::Raid1c3 => (1, 3, 1, 1),
        Profile::Raid1c4 => (1, 4, 1, 1),
        Profile::Raid0 => {
            let n =
                with_room(devs, (size / devs.len().max(1) as u64).max(STRIPE_LEN)).max(1) as u64;
            (1, n, 1, n)
        }
        Profile::Raid10 => {
            let n = (with_room(devs, size / 2) / 2 * 2) as u64;
            if n < 2 {
                return None;
            }
            (1, n, 2, n / 2)
        }
        Profile::Raid5 | Profile::Raid6 => {
            // Over every device with room, as the kernel spreads them; one
            // stripe of each row (two in RAID6) holds parity.
            let parity = profile.parity_stripes();
            let data = (devs.len() as u64).saturating_sub(parity).max(1);
            let n = with_room(devs, (size / data).max(STRIPE_LEN)) as u64;
            if n <= parity {
                return None;
            }
            (1, n, 1, n - parity)
        }
    };
    let stripe = (size / data) / STRIPE_LEN * STRIPE_LEN;
    if stripe == 0 || (devs.len() as u64) < ndev {
        return None;
    }
    let mut out = Vec::new();
    for d in devs.iter_mut().take(ndev as usize) {
        for _ in 0..copies_per_dev {
            let at = d.free.find(stripe, CHUNK_ALIGN.min(stripe), 0)?;
            d.free.remove(at, stripe);
            out.push((d.item.devid, at, d.item.uuid));
        }
    }
    Some((out, sub, data))
}

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

/// A device's id and its unallocated ranges (start, length).
pub(crate) type DeviceHoles = (u64, Vec<(u64, u64)>);

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
        // Mixed groups hold both kinds: a new one for either is mixed too.
        let kept = if self.mixed_groups() && kind != SpaceKind::System {
            BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA
        } else {
            flag
        };
        // Groups that take allocations first: a sprout's seeds keep
        // their own profiles, which its own devices may not hold.
        let pick = |writable_only: bool| {
            w.blocks
                .alloc
                .groups
                .values()
                .filter(|g| g.flags & flag != 0 && !(writable_only && g.read_only))
                .map(|g| g.flags & (BLOCK_GROUP_PROFILE_MASK | kept))
                .max_by_key(|f| f & BLOCK_GROUP_PROFILE_MASK != 0)
        };
        let flags = pick(true).or_else(|| pick(false)).ok_or_else(|| {
            Error::Unsupported(format!(
                "no existing {kind:?} block group to copy the profile of"
            ))
        })?;
        // As the kernel reduces a profile to what the writable devices can
        // hold: one that needs more of them falls back to single.
        let writable = self
            .chunk_tree()
            .items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)?
            .filter(|it| {
                it.as_ref()
                    .is_ok_and(|it| !self.tree_reader().volume().devices.is_seed(it.key().offset))
            })
            .count();
        if layout(Profile::from_flags(flags)?).devs_min > writable {
            return Ok(flags & !BLOCK_GROUP_PROFILE_MASK);
        }
        Ok(flags)
    }

    fn device_space(&self) -> Result<Vec<DevSpace>> {
        let mut devs = Vec::new();
        for item in self
            .chunk_tree()
            .items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)?
        {
            let item = DevItem::parse(item?.data())?;
            let mut free = RangeSet::new();
            // A seed of a sprouted filesystem takes no chunks.
            let seed = self.tree_reader().volume().devices.is_seed(item.devid);
            if item.total_bytes > DEV_RESERVED && !seed {
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

    /// Each device's unallocated ranges (start, length) that chunks can
    /// use, by device id.
    pub(crate) fn device_holes(&self) -> Result<Vec<DeviceHoles>> {
        Ok(self
            .device_space()?
            .iter()
            .map(|d| (d.item.devid, d.free.iter().collect()))
            .collect())
    }

    /// Each device's unallocated space that chunks can use: its holes
    /// in whole stripe units (not the first MiB, nor the superblock copies).
    pub(crate) fn device_room(&self) -> Result<Vec<u64>> {
        Ok(self
            .device_space()?
            .iter()
            .map(|d| d.free.iter().map(hole_room).sum())
            .collect())
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
            let total = self.total_bytes();
            let cap = if kind == SpaceKind::Data {
                1 << 30
            } else {
                256 << 20
            };
            let max_size = (total / 10).clamp(8 << 20, cap) / CHUNK_ALIGN * CHUNK_ALIGN;
            let mut devs = self.device_space()?;
            let (stripes, stripe_size, sub_stripes, data_stripes) =
                plan_stripes(&mut devs, profile, max_size).ok_or_else(|| {
                    Error::NoSpace(format!(
                        "no device space for a new {kind:?} chunk ({})",
                        profile.name()
                    ))
                })?;
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
                settled_free: length,
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

/// How a profile lays a chunk on devices: stripes per device, devices at
/// most (0: as many as have room) and at least, the step the device count
/// goes in, copies of each byte, and parity stripes per row.
struct Layout {
    dev_stripes: u64,
    devs_max: usize,
    devs_min: usize,
    devs_increment: usize,
    copies: u64,
    parity: u64,
    sub_stripes: u16,
}

fn layout(profile: Profile) -> Layout {
    let l = |dev_stripes, devs_max, devs_min, devs_increment, copies, parity, sub_stripes| Layout {
        dev_stripes,
        devs_max,
        devs_min,
        devs_increment,
        copies,
        parity,
        sub_stripes,
    };
    match profile {
        Profile::Single => l(1, 1, 1, 1, 1, 0, 1),
        Profile::Dup => l(2, 1, 1, 1, 2, 0, 1),
        Profile::Raid0 => l(1, 0, 1, 1, 1, 0, 1),
        Profile::Raid1 => l(1, 2, 2, 1, 2, 0, 1),
        Profile::Raid1c3 => l(1, 3, 3, 1, 3, 0, 1),
        Profile::Raid1c4 => l(1, 4, 4, 1, 4, 0, 1),
        Profile::Raid10 => l(1, 0, 2, 2, 2, 0, 2),
        Profile::Raid5 => l(1, 0, 2, 1, 1, 1, 1),
        Profile::Raid6 => l(1, 0, 3, 1, 1, 2, 1),
    }
}

/// The longest run of whole stripe units in `free`, placed on a stripe
/// unit boundary.
fn largest_hole(free: &RangeSet) -> u64 {
    free.iter().map(hole_room).max().unwrap_or(0)
}

/// The whole stripe units of free range (start, len), placed on a stripe
/// unit boundary.
fn hole_room((s, l): (u64, u64)) -> u64 {
    let a = s.div_ceil(STRIPE_LEN) * STRIPE_LEN;
    (s + l).saturating_sub(a) / STRIPE_LEN * STRIPE_LEN
}

/// Choose device ranges for a chunk of `profile` of at most `max_size`
/// bytes, as the kernel sizes one: the devices with room, most room
/// first; each stripe as long as the smallest chosen device's largest
/// hole allows, so the last chunks take whatever room is left. Returns the
/// stripes, the stripe length, sub_stripes, and how many stripes of a row
/// hold distinct data. Takes the chosen space out of `devs`.
fn plan_stripes(
    devs: &mut [DevSpace],
    profile: Profile,
    max_size: u64,
) -> Option<(Vec<StripePlace>, u64, u16, u64)> {
    let lay = layout(profile);
    let want = max_size.max(STRIPE_LEN) * lay.dev_stripes;
    // Each device's room for this chunk: a hole of `want`, or its largest;
    // most room first and, as the kernel breaks ties, most free space in
    // all (else the devices first listed fill while the largest waits).
    let mut avail: Vec<(u64, usize)> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (largest_hole(&d.free).min(want), i))
        .filter(|&(a, _)| a >= STRIPE_LEN * lay.dev_stripes)
        .collect();
    avail.sort_by_key(|&(a, i)| (std::cmp::Reverse((a, devs[i].free.total())), i));
    let mut ndevs = avail.len() / lay.devs_increment * lay.devs_increment;
    if lay.devs_max > 0 {
        ndevs = ndevs.min(lay.devs_max);
    }
    if ndevs < lay.devs_min || ndevs == 0 {
        return None;
    }
    let data_stripes = (ndevs as u64 * lay.dev_stripes).checked_sub(lay.parity)? / lay.copies;
    if data_stripes == 0 {
        return None;
    }
    let mut stripe = avail[ndevs - 1].0 / lay.dev_stripes;
    stripe = stripe.min(max_size / data_stripes);
    stripe = stripe / STRIPE_LEN * STRIPE_LEN;
    if stripe == 0 {
        return None;
    }
    let mut out = Vec::new();
    for &(_, i) in &avail[..ndevs] {
        let d = &mut devs[i];
        let at = d.free.find(stripe * lay.dev_stripes, STRIPE_LEN, 0)?;
        for k in 0..lay.dev_stripes {
            d.free.remove(at + k * stripe, stripe);
            out.push((d.item.devid, at + k * stripe, d.item.uuid));
        }
    }
    Some((out, stripe, lay.sub_stripes, data_stripes))
}

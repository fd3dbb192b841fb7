//! The chunk map: logical ranges to stripes on devices, for every profile.

use crate::format::consts::*;
use crate::format::items::ChunkItem;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// How a chunk spreads its bytes over its stripes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Single,
    Dup,
    Raid0,
    Raid1,
    Raid1c3,
    Raid1c4,
    Raid10,
    Raid5,
    Raid6,
}

impl Profile {
    /// The profile encoded in chunk type flags.
    pub fn from_flags(flags: u64) -> Result<Self> {
        Ok(match flags & BLOCK_GROUP_PROFILE_MASK {
            0 => Profile::Single,
            BLOCK_GROUP_DUP => Profile::Dup,
            BLOCK_GROUP_RAID0 => Profile::Raid0,
            BLOCK_GROUP_RAID1 => Profile::Raid1,
            BLOCK_GROUP_RAID1C3 => Profile::Raid1c3,
            BLOCK_GROUP_RAID1C4 => Profile::Raid1c4,
            BLOCK_GROUP_RAID10 => Profile::Raid10,
            BLOCK_GROUP_RAID5 => Profile::Raid5,
            BLOCK_GROUP_RAID6 => Profile::Raid6,
            other => return Err(Error::corrupt(format!("chunk profile bits {other:#x}"))),
        })
    }

    /// Stripes of each row that hold parity: 1 in RAID5, 2 in RAID6, 0
    /// in every other profile.
    pub fn parity_stripes(self) -> u64 {
        match self {
            Profile::Raid5 => 1,
            Profile::Raid6 => 2,
            _ => 0,
        }
    }

    /// The name btrfs-progs uses.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "DUP",
            Profile::Raid0 => "RAID0",
            Profile::Raid1 => "RAID1",
            Profile::Raid1c3 => "RAID1C3",
            Profile::Raid1c4 => "RAID1C4",
            Profile::Raid10 => "RAID10",
            Profile::Raid5 => "RAID5",
            Profile::Raid6 => "RAID6",
        }
    }
}

/// One mapped chunk.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// First logical address.
    pub logical: u64,
    /// The chunk item.
    pub item: ChunkItem,
    /// Decoded profile.
    pub profile: Profile,
}

/// A contiguous piece of a logical range on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub devid: u64,
    pub physical: u64,
    pub len: usize,
}

impl Chunk {
    fn new(logical: u64, item: ChunkItem) -> Result<Self> {
        let profile = Profile::from_flags(item.chunk_type)?;
        let n = item.stripes.len();
        let bad = |why: &str| {
            Error::corrupt(format!(
                "chunk at logical {logical} ({}, {n} stripes): {why}",
                profile.name()
            ))
        };
        if item.length == 0 {
            return Err(bad("zero length"));
        }
        let min = match profile {
            Profile::Single | Profile::Raid0 => 1,
            Profile::Dup | Profile::Raid1 | Profile::Raid5 => 2,
            Profile::Raid1c3 | Profile::Raid6 => 3,
            Profile::Raid1c4 => 4,
            // Two devices are enough for RAID10 (one stripe pair).
            Profile::Raid10 => 2,
        };
        if n < min {
            return Err(bad("too few stripes"));
        }
        // The kernel writes and accepts 64 KiB only; a huge one would
        // overflow the row arithmetic of striped profiles.
        if item.stripe_len != STRIPE_LEN {
            return Err(bad("bad stripe length (not 64 KiB)"));
        }
        // RAID6's Q weighs data stripe i by 2^i in GF(2^8): beyond 255
        // data stripes two would share a weight and could not be told apart.
        if profile == Profile::Raid6 && n > 257 {
            return Err(bad("more than 255 data stripes"));
        }
        if profile == Profile::Raid10
            && (item.sub_stripes < 2 || !n.is_multiple_of(item.sub_stripes as usize))
        {
            return Err(bad("bad sub-stripe count"));
        }
        // Mapping adds offsets to the chunk's start and to each stripe's:
        // every address the chunk maps to must exist.
        if logical.checked_add(item.length).is_none() {
            return Err(bad("length runs past the end of the address space"));
        }
        let span = Self::stripe_span(profile, &item, n as u64).ok_or_else(|| bad("too long"))?;
        if item
            .stripes
            .iter()
            .any(|s| s.offset.checked_add(span).is_none())
        {
            return Err(bad("stripe runs past the end of the address space"));
        }
        Ok(Chunk {
            logical,
            item,
            profile,
        })
    }

    /// Bytes each stripe of a chunk spans on its device (an upper bound for
    /// striped profiles: whole stripe rows).
    pub(crate) fn stripe_span(profile: Profile, item: &ChunkItem, n: u64) -> Option<u64> {
        let data = match profile {
            Profile::Single
            | Profile::Dup
            | Profile::Raid1
            | Profile::Raid1c3
            | Profile::Raid1c4 => return Some(item.length),
            Profile::Raid0 => n,
            Profile::Raid10 => n / item.sub_stripes as u64,
            Profile::Raid5 => n - 1,
            Profile::Raid6 => n - 2,
        };
        let sl = item.stripe_len;
        item.length.div_ceil(sl).div_ceil(data).checked_mul(sl)
    }

    /// Copies of every byte this chunk keeps (parity profiles count as 1
    /// here: a parity rebuild is not a plain re-read).
    pub fn num_copies(&self) -> usize {
        match self.profile {
            Profile::Single | Profile::Raid0 | Profile::Raid5 | Profile::Raid6 => 1,
            Profile::Dup | Profile::Raid1 => 2,
            Profile::Raid1c3 => 3,
            Profile::Raid1c4 => 4,
            Profile::Raid10 => self.item.sub_stripes as usize,
        }
    }

    /// Last logical address + 1.
    pub fn end(&self) -> u64 {
        self.logical + self.item.length
    }

    /// Map up to `len` bytes at `logical` (inside this chunk) for copy
    /// `mirror`; the piece returned stops at a stripe boundary.
    pub fn map(&self, logical: u64, len: usize, mirror: usize) -> Result<Piece> {
        if logical < self.logical || logical >= self.end() {
            return Err(Error::Unmapped(logical));
        }
        if mirror >= self.num_copies() {
            return Err(Error::Invalid(format!(
                "copy {mirror} of logical {logical}"
            )));
        }
        let off = logical - self.logical;
        let left_in_chunk = (self.end() - logical).min(len as u64);
        let stripes = &self.item.stripes;
        let n = stripes.len() as u64;
        let sl = self.item.stripe_len;
        let (idx, physical_off, room) = match self.profile {
            Profile::Single
            | Profile::Dup
            | Profile::Raid1
            | Profile::Raid1c3
            | Profile::Raid1c4 => (mirror as u64, off, u64::MAX),
            Profile::Raid0 => {
                let nr = off / sl;
                (nr % n, (nr / n) * sl + off % sl, sl - off % sl)
            }
            Profile::Raid10 => {
                let sub = self.item.sub_stripes as u64;
                let groups = n / sub;
                let nr = off / sl;
                (
                    (nr % groups) * sub + mirror as u64,
                    (nr / groups) * sl + off % sl,
                    sl - off % sl,
                )
            }
            Profile::Raid5 | Profile::Raid6 => {
                let parity = if self.profile == Profile::Raid5 { 1 } else { 2 };
                let data = n - parity;
                let nr = off / sl;
                let row = nr / data;
                // Data stripes rotate by one device per full stripe row.
                ((nr % data + row) % n, row * sl + off % sl, sl - off % sl)
            }
        };
        let stripe = &stripes[idx as usize];
        Ok(Piece {
            devid: stripe.devid,
            physical: stripe.offset + physical_off,
            len: left_in_chunk.min(room) as usize,
        })
    }
}

/// Every chunk of the filesystem, by logical start. Chunks can be added
/// while readers use the map (a transaction allocating a new chunk).
#[derive(Debug, Default)]
pub struct ChunkMap {
    chunks: RwLock<BTreeMap<u64, Arc<Chunk>>>,
}

impl Clone for ChunkMap {
    fn clone(&self) -> Self {
        ChunkMap {
            chunks: RwLock::new(self.read().clone()),
        }
    }
}

impl ChunkMap {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Arc<Chunk>>> {
        self.chunks.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Add the chunk `item` starting at `logical`; rejects overlaps.
    pub fn insert(&self, logical: u64, item: ChunkItem) -> Result<()> {
        let chunk = Chunk::new(logical, item)?;
        let mut map = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, prev)) = map.range(..=logical).next_back()
            && prev.end() > logical
            && prev.logical != logical
        {
            return Err(Error::corrupt(format!(
                "chunks at {} and {logical} overlap",
                prev.logical
            )));
        }
        if let Some((&next, _)) = map.range(logical + 1..).next()
            && next < chunk.end()
        {
            return Err(Error::corrupt(format!(
                "chunks at {logical} and {next} overlap"
            )));
        }
        map.insert(logical, Arc::new(chunk));
        Ok(())
    }

    /// Drop the chunk starting at `logical` (a removed, empty chunk).
    pub fn remove(&self, logical: u64) -> Result<()> {
        let mut map = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        map.remove(&logical)
            .map(|_| ())
            .ok_or(Error::Unmapped(logical))
    }

    /// The chunk holding `logical`.
    pub fn lookup(&self, logical: u64) -> Result<Arc<Chunk>> {
        self.read()
            .range(..=logical)
            .next_back()
            .map(|(_, c)| c)
            .filter(|c| logical < c.end())
            .cloned()
            .ok_or(Error::Unmapped(logical))
    }

    /// All chunks in logical order.
    pub fn all(&self) -> Vec<Arc<Chunk>> {
        self.read().values().cloned().collect()
    }

    /// First logical address after every chunk.
    pub fn end(&self) -> u64 {
        self.read().values().next_back().map_or(0, |c| c.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::items::Stripe;

    fn item(flags: u64, devs: &[(u64, u64)], sub: u16) -> ChunkItem {
        ChunkItem {
            length: 1 << 30,
            owner: 2,
            stripe_len: STRIPE_LEN,
            chunk_type: flags,
            io_align: 65536,
            io_width: 65536,
            sector_size: 4096,
            sub_stripes: sub,
            stripes: devs
                .iter()
                .map(|&(devid, offset)| Stripe {
                    devid,
                    offset,
                    dev_uuid: [0; 16],
                })
                .collect(),
        }
    }

    #[test]
    fn a_stripe_length_other_than_64_kib_is_refused() {
        for (flags, devs) in [
            (BLOCK_GROUP_DATA, &[(1u64, 1u64 << 20)][..]),
            (
                BLOCK_GROUP_DATA | BLOCK_GROUP_RAID5,
                &[(1, 1 << 20), (2, 1 << 20), (3, 1 << 20)][..],
            ),
        ] {
            for stripe_len in [0, 4096, 1 << 17, 1 << 63] {
                let mut it = item(flags, devs, 0);
                it.stripe_len = stripe_len;
                let e = Chunk::new(1 << 20, it).unwrap_err();
                assert!(e.to_string().contains("stripe length"), "{e}");
            }
        }
    }

    #[test]
    fn raid0_stripes_rotate() {
        let c = Chunk::new(
            1 << 20,
            item(
                BLOCK_GROUP_DATA | BLOCK_GROUP_RAID0,
                &[(1, 1000), (2, 2000)],
                1,
            ),
        )
        .unwrap();
        let p = c.map((1 << 20) + 65536 + 10, 1 << 20, 0).unwrap();
        assert_eq!(
            p,
            Piece {
                devid: 2,
                physical: 2010,
                len: 65536 - 10
            }
        );
        let p = c.map((1 << 20) + 2 * 65536, 100, 0).unwrap();
        assert_eq!(
            p,
            Piece {
                devid: 1,
                physical: 1000 + 65536,
                len: 100
            }
        );
    }

    #[test]
    fn raid10_mirrors_pair_up() {
        let devs = [(1, 0), (2, 0), (3, 0), (4, 0)];
        let c = Chunk::new(0, item(BLOCK_GROUP_RAID10, &devs, 2)).unwrap();
        assert_eq!(c.num_copies(), 2);
        assert_eq!(c.map(65536, 1, 0).unwrap().devid, 3);
        assert_eq!(c.map(65536, 1, 1).unwrap().devid, 4);
        assert_eq!(
            c.map(2 * 65536, 1, 1).unwrap(),
            Piece {
                devid: 2,
                physical: 65536,
                len: 1
            }
        );
    }

    #[test]
    fn dup_copies_and_overlap() {
        let m = ChunkMap::default();
        m.insert(0, item(BLOCK_GROUP_DUP, &[(1, 100), (1, 5000)], 0))
            .unwrap();
        let c = m.lookup(7).unwrap();
        assert_eq!(c.map(7, 10, 1).unwrap().physical, 5007);
        assert!(c.map(7, 10, 2).is_err());
        assert!(m.insert(4096, item(0, &[(1, 0)], 0)).is_err());
        assert!(m.lookup(1 << 30).is_err());
    }

    /// Every address a chunk maps must exist, logical and physical.
    #[test]
    fn chunks_past_the_address_space_are_corrupt() {
        let corrupt = |r: Result<Chunk>| matches!(r, Err(Error::Corrupt(_)));
        let top = u64::MAX / 4096 * 4096;
        assert!(corrupt(Chunk::new(top, item(0, &[(1, 0)], 0))));
        assert!(corrupt(Chunk::new(0, item(0, &[(1, top)], 0))));
        let dup = item(BLOCK_GROUP_DUP, &[(1, 0), (1, top)], 0);
        assert!(corrupt(Chunk::new(0, dup)));
        // A RAID0 stripe holds half the chunk: this one just fits.
        let half = u64::MAX - (1 << 29);
        let r0 = |off| item(BLOCK_GROUP_RAID0, &[(1, 0), (2, off)], 1);
        assert!(Chunk::new(0, r0(half)).is_ok());
        assert!(corrupt(Chunk::new(0, r0(half + 1))));
        let m = ChunkMap::default();
        assert!(m.insert(top, item(0, &[(1, 0)], 0)).is_err());
    }
}

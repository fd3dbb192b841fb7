//! Delayed allocation: written data held in memory per inode, by sector,
//! until writeback turns contiguous runs of it into ordered extents.

use crate::fs::InodeId;
use std::collections::BTreeMap;

/// Dirty sectors of every inode.
#[derive(Debug, Default)]
pub struct Delalloc {
    files: BTreeMap<InodeId, BTreeMap<u64, Box<[u8]>>>,
    bytes: u64,
}

/// A run of contiguous dirty sectors of one inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyRun {
    /// File offset of the first byte (sector-aligned).
    pub offset: u64,
    /// The bytes, a whole number of sectors.
    pub data: Vec<u8>,
}

impl Delalloc {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `id` has dirty data.
    pub fn has(&self, id: InodeId) -> bool {
        self.files.contains_key(&id)
    }

    /// Inodes with dirty data.
    pub fn inodes(&self) -> Vec<InodeId> {
        self.files.keys().copied().collect()
    }

    /// The dirty sector `index` of `id`, if any.
    pub fn sector(&self, id: InodeId, index: u64) -> Option<&[u8]> {
        self.files
            .get(&id)
            .and_then(|f| f.get(&index))
            .map(|b| &b[..])
    }

    /// Store sector `index` of `id`.
    pub fn put(&mut self, id: InodeId, index: u64, data: Box<[u8]>) {
        let len = data.len() as u64;
        if self
            .files
            .entry(id)
            .or_default()
            .insert(index, data)
            .is_none()
        {
            self.bytes += len;
        }
    }

    /// Copy the dirty bytes of `id` overlapping `[offset, offset + out.len())`
    /// over `out`.
    pub fn overlay(&self, id: InodeId, offset: u64, out: &mut [u8], sectorsize: u64) {
        let Some(f) = self.files.get(&id) else { return };
        let end = offset + out.len() as u64;
        for (&idx, data) in f.range(offset / sectorsize..end.div_ceil(sectorsize)) {
            let s = idx * sectorsize;
            let lo = s.max(offset);
            let hi = (s + sectorsize).min(end);
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&data[(lo - s) as usize..(hi - s) as usize]);
            }
        }
    }

    /// The runs of `id`, each at most `max` bytes.
    pub fn runs(&self, id: InodeId, sectorsize: u64, max: u64) -> Vec<DirtyRun> {
        let mut out: Vec<DirtyRun> = Vec::new();
        let Some(f) = self.files.get(&id) else {
            return out;
        };
        for (&idx, data) in f {
            let at = idx * sectorsize;
            match out.last_mut() {
                Some(r) if r.offset + r.data.len() as u64 == at && (r.data.len() as u64) < max => {
                    r.data.extend_from_slice(data)
                }
                _ => out.push(DirtyRun {
                    offset: at,
                    data: data.to_vec(),
                }),
            }
        }
        out
    }

    /// Forget the dirty data of `id` from sector `from_index` on.
    pub fn discard_from(&mut self, id: InodeId, from_index: u64) {
        if let Some(f) = self.files.get_mut(&id) {
            let gone = f.split_off(&from_index);
            self.bytes -= gone.values().map(|b| b.len() as u64).sum::<u64>();
            if f.is_empty() {
                self.files.remove(&id);
            }
        }
    }

    /// Forget all dirty data of `id`.
    pub fn discard(&mut self, id: InodeId) {
        self.discard_from(id, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_overlay_and_discard() {
        let id = InodeId {
            subvol: 5,
            ino: 257,
        };
        let mut d = Delalloc::default();
        for i in [0u64, 1, 2, 5, 6] {
            d.put(id, i, vec![i as u8; 4].into_boxed_slice());
        }
        assert_eq!(d.bytes(), 20);
        let runs = d.runs(id, 4, 8);
        assert_eq!(
            runs.iter()
                .map(|r| (r.offset, r.data.len()))
                .collect::<Vec<_>>(),
            vec![(0, 8), (8, 4), (20, 8)]
        );
        let mut out = vec![9u8; 10];
        d.overlay(id, 6, &mut out, 4);
        assert_eq!(out, vec![1, 1, 2, 2, 2, 2, 9, 9, 9, 9]);
        d.discard_from(id, 2);
        assert_eq!(d.bytes(), 8);
        d.discard(id);
        assert!(!d.has(id));
    }
}

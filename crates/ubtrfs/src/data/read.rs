//! The read path: file extents to bytes, every sector checked against the
//! checksum tree, other copies tried on a mismatch.

use super::compression::{Compression, decompress};
use crate::csum_tree;
use crate::format::consts::*;
use crate::format::items::{ExtentBody, FileExtentItem};
use crate::fs::read_repair::BadDataCopies;
use crate::fs::{FileKind, Filesystem, InodeId};
use crate::{Error, Result};

/// Where a data read lands in a file, for error messages.
struct Origin {
    id: InodeId,
    /// File offset of the first byte of the on-disk range.
    file_offset: u64,
    /// Whether the inode keeps no checksums.
    nodatasum: bool,
}

impl Filesystem {
    /// Up to `len` bytes of file `id` from `offset`; short at end of file.
    /// Data written but not yet written back is included.
    pub fn read(&self, id: InodeId, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = self.read_stored(id, offset, len)?;
        let d = self.delalloc();
        if d.has(id) {
            d.overlay(id, offset, &mut out, self.geo.sectorsize as u64);
        }
        Ok(out)
    }

    /// Like [`Filesystem::read`], from the extents only.
    pub(crate) fn read_stored(&self, id: InodeId, offset: u64, len: usize) -> Result<Vec<u8>> {
        let inode = self.inode_item(id)?;
        match FileKind::from_mode(inode.mode) {
            Some(FileKind::Dir) => {
                return Err(Error::IsDir(format!(
                    "inode {} in subvolume {}",
                    id.ino, id.subvol
                )));
            }
            Some(FileKind::File) | Some(FileKind::Symlink) => {}
            _ => return Ok(Vec::new()),
        }
        if offset >= inode.size || len == 0 {
            return Ok(Vec::new());
        }
        let end = offset.saturating_add(len as u64).min(inode.size);
        // The size comes from disk: an absurd one is an error, not an abort.
        let n = (end - offset) as usize;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            Error::Invalid(format!(
                "inode {} in subvolume {}: {n} bytes do not fit in memory",
                id.ino, id.subvol
            ))
        })?;
        out.resize(n, 0);
        let nodatasum = inode.flags & INODE_NODATASUM != 0;
        for item in self.file_extents_overlapping(id, offset, end)? {
            let (ext_start, fe) = item?;
            let ext_end = ext_start.saturating_add(fe.len());
            let (lo, hi) = (ext_start.max(offset), ext_end.min(end));
            if lo >= hi {
                continue;
            }
            let dst = &mut out[(lo - offset) as usize..(hi - offset) as usize];
            let origin = Origin {
                id,
                file_offset: ext_start,
                nodatasum,
            };
            self.fill_from_extent(&fe, lo - ext_start, dst, origin)?;
        }
        Ok(out)
    }

    /// Copy the bytes at `skip` into the extent `fe` into `dst`.
    fn fill_from_extent(
        &self,
        fe: &FileExtentItem,
        skip: u64,
        dst: &mut [u8],
        origin: Origin,
    ) -> Result<()> {
        let kind = Compression::from_disk(fe.compression)?;
        // The bytes read must be this extent's, not a neighbour's.
        fe.check_disk_extent(self.geo.sectorsize as u64)?;
        if fe.encryption != 0 || fe.other_encoding != 0 {
            return Err(Error::Unsupported(format!(
                "encrypted or encoded extent in inode {} of subvolume {}",
                origin.id.ino, origin.id.subvol
            )));
        }
        match &fe.body {
            ExtentBody::Inline(data) => {
                let plain;
                let bytes: &[u8] = if kind == Compression::None {
                    data
                } else {
                    plain = decompress(kind, data, fe.ram_bytes as usize, self.geo.sectorsize)?;
                    &plain
                };
                copy_at(bytes, skip, dst);
            }
            ExtentBody::Regular { disk_bytenr, .. } if *disk_bytenr == 0 => {} // hole
            ExtentBody::Regular { .. } if fe.extent_type == FILE_EXTENT_PREALLOC => {}
            ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                ..
            } => {
                if kind == Compression::None {
                    let logical = disk_bytenr + offset + skip;
                    let file_offset = origin.file_offset + skip;
                    let bytes = self.read_data(
                        logical,
                        dst.len(),
                        &Origin {
                            file_offset,
                            ..origin
                        },
                    )?;
                    dst.copy_from_slice(&bytes);
                } else {
                    if fe.ram_bytes > MAX_COMPRESSED_RAM * 2
                        || *disk_num_bytes > MAX_COMPRESSED_RAM * 2
                    {
                        return Err(Error::corrupt(format!(
                            "compressed extent at {disk_bytenr} of {disk_num_bytes} bytes for {} bytes",
                            fe.ram_bytes
                        )));
                    }
                    let raw = self.read_data(*disk_bytenr, *disk_num_bytes as usize, &origin)?;
                    let plain = decompress(kind, &raw, fe.ram_bytes as usize, self.geo.sectorsize)?;
                    copy_at(&plain, offset + skip, dst);
                }
            }
        }
        Ok(())
    }

    /// Read `len` bytes of data at `logical`, verified sector by sector.
    fn read_data(&self, logical: u64, len: usize, origin: &Origin) -> Result<Vec<u8>> {
        let ss = self.geo.sectorsize as u64;
        let start = logical - logical % ss;
        let end = (logical + len as u64).div_ceil(ss) * ss;
        let mut buf = vec![0u8; (end - start) as usize];
        if self.in_flight.read(start, &mut buf) {
            // Still on its way to the device (and checksummed from this).
            let skip = (logical - start) as usize;
            buf.drain(..skip);
            buf.truncate(len);
            return Ok(buf);
        }
        let volume = self.trees.volume();
        let copies = volume.num_copies(start)?;
        let mut first_err = None;
        let mut used = None;
        for mirror in 0..copies {
            match volume.read_copy(start, mirror, &mut buf) {
                Ok(()) => {
                    used = Some(mirror);
                    break;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let Some(used) = used else {
            return Err(first_err.unwrap_or(Error::Unmapped(start)));
        };
        let sums_tree = if origin.nodatasum {
            None
        } else {
            self.csum_tree()?
        };
        if let Some(tree) = sums_tree {
            let csum_type = self.sb.csum_type;
            let sectors = buf.len() / ss as usize;
            let sums = csum_tree::lookup(
                &tree,
                start,
                sectors,
                self.geo.sectorsize,
                self.geo.csum_size,
            )?;
            let mut to_mend = Vec::new();
            for (i, sum) in sums.iter().enumerate() {
                let Some(sum) = sum else { continue };
                let range = i * ss as usize..(i + 1) * ss as usize;
                if csum_type.verify(&buf[range.clone()], sum) {
                    continue;
                }
                let sector_logical = start + i as u64 * ss;
                // Counted against the device that gave the bad copy, as
                // the kernel counts a read's checksum failure.
                volume.record_bad_read(sector_logical, used);
                let mut repaired = false;
                let mut bad = vec![used];
                let mut sector = vec![0u8; ss as usize];
                for mirror in (0..copies).filter(|&m| m != used) {
                    if volume
                        .read_copy(sector_logical, mirror, &mut sector)
                        .is_err()
                    {
                        continue;
                    }
                    if csum_type.verify(&sector, sum) {
                        buf[range.clone()].copy_from_slice(&sector);
                        repaired = true;
                        break;
                    }
                    volume.record_bad_read(sector_logical, mirror);
                    bad.push(mirror);
                }
                if repaired {
                    to_mend.push(BadDataCopies {
                        logical: sector_logical,
                        mirrors: bad,
                        good: sector,
                        sum: *sum,
                    });
                }
                if !repaired {
                    return Err(Error::DataChecksum {
                        subvol: origin.id.subvol,
                        ino: origin.id.ino,
                        file_offset: (origin.file_offset + sector_logical).saturating_sub(logical),
                        logical: sector_logical,
                    });
                }
            }
            self.mend_read_copies(&to_mend);
        }
        let skip = (logical - start) as usize;
        buf.drain(..skip);
        buf.truncate(len);
        Ok(buf)
    }

    /// The whole content of file `id`.
    pub fn read_all(&self, id: InodeId) -> Result<Vec<u8>> {
        let size = self.inode_item(id)?.size;
        let len =
            usize::try_from(size).map_err(|_| Error::Invalid(format!("file of {size} bytes")))?;
        self.read(id, 0, len)
    }

    /// The target of symlink `id`.
    pub fn read_link(&self, id: InodeId) -> Result<Vec<u8>> {
        let st = self.stat(id)?;
        if st.kind != FileKind::Symlink {
            return Err(Error::Invalid(format!(
                "inode {} in subvolume {} is not a symlink",
                id.ino, id.subvol
            )));
        }
        // A target is inline data, shorter than a sector (and PATH_MAX): a
        // larger size is damage, not a reason to allocate that much.
        if st.size >= u64::from(self.geo.sectorsize) {
            return Err(Error::corrupt(format!(
                "symlink inode {} in subvolume {} has size {}",
                id.ino, id.subvol, st.size
            )));
        }
        self.read(id, 0, st.size as usize)
    }
}

/// Copy `src[skip..]` into `dst`, leaving zeros where `src` is short.
fn copy_at(src: &[u8], skip: u64, dst: &mut [u8]) {
    let skip = usize::try_from(skip).unwrap_or(usize::MAX);
    if let Some(s) = src.get(skip..) {
        let n = s.len().min(dst.len());
        dst[..n].copy_from_slice(&s[..n]);
    }
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::test_fs::TestFs;

    #[test]
    fn extent_reaching_past_its_disk_extent_is_corrupt() {
        let t = TestFs::new();
        let id = t.file(b"f", &[7u8; 12288]);
        t.skew_extent(id, 0, 8192);
        match t.fs().read_all(id) {
            Err(Error::Corrupt(_)) => {}
            other => panic!("expected a corrupt-metadata error, got {other:?}"),
        }
    }
}

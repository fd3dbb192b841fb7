//! RAID5 and RAID6 parity: writes bring a row's parity up to date with
//! their data, and reads rebuild data from it when a device is missing or
//! a copy read directly fails its checksum.
//!
//! A row (full stripe) is `data` stripes of `stripe_len` bytes, one per
//! device, plus P (RAID5, RAID6) and Q (RAID6), rotating by one device per
//! row: in row `r` of an `n`-device chunk, data stripe `i` is on device
//! `(i + r) % n`, P on `(data + r) % n`, Q on `(data + 1 + r) % n`. P is the
//! XOR of the data stripes; Q is the sum of `2^i * D_i` in GF(2^8) with the
//! polynomial 0x11d (the Linux RAID6 syndrome). Each parity byte depends
//! only on the data bytes at the same offset in their stripes, so a write
//! reads the rest of the data of the columns it changes (what it does not
//! overwrite), and rewrites those columns of P and Q.

use super::Volume;
use super::chunk_map::{Chunk, Profile};
use crate::device::Device;
use crate::{Error, Result};
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};

/// The rows being read and rewritten, by chunk start and row number: a
/// row's read-modify-write must not interleave with another of the same
/// row, while writes to other rows go on.
#[derive(Default)]
pub(super) struct RowLocks {
    busy: Mutex<HashSet<(u64, u64)>>,
    freed: Condvar,
}

/// A row held; let go when dropped.
pub(super) struct RowHeld<'a> {
    locks: &'a RowLocks,
    row: (u64, u64),
}

impl RowLocks {
    /// Wait until `row` of the chunk at `chunk` is free, and hold it.
    fn hold(&self, chunk: u64, row: u64) -> RowHeld<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while busy.contains(&(chunk, row)) {
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        busy.insert((chunk, row));
        RowHeld {
            locks: self,
            row: (chunk, row),
        }
    }
}

impl Drop for RowHeld<'_> {
    fn drop(&mut self) {
        let mut busy = self.locks.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.remove(&self.row);
        self.locks.freed.notify_all();
    }
}

/// A RAID5/6 row as read: its data stripes, the parity they make (P,
/// Q), and whether the parity on disk is that where data is in use.
type RowRead = (Vec<Vec<u8>>, Vec<u8>, Vec<u8>, bool);

/// What [`Volume::check_row_parity`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowParity {
    /// P (and Q) are the data's.
    Good,
    /// A device of the row is missing: not checked.
    Missing,
    /// A stripe of the row could not be read.
    Unreadable,
    /// P or Q is not the data's; `mended` if it was rewritten.
    Bad { mended: bool },
    /// P or Q is not the data's, and the data itself is bad: the parity
    /// was left as it is.
    DataBad,
}

/// Multiply every byte of `x` by 2 in GF(2^8) (polynomial 0x11d), eight
/// bytes at a time.
fn mul2_lanes(x: u64) -> u64 {
    let high = x & 0x8080_8080_8080_8080;
    ((x << 1) & 0xfefe_fefe_fefe_fefe) ^ ((high >> 7) * 0x1d)
}

/// GF(2^8) arithmetic with the RAID6 polynomial 0x11d, by tables.
struct Gf {
    exp: [u8; 512],
    log: [u8; 256],
}

impl Gf {
    fn new() -> Self {
        let mut gf = Gf {
            exp: [0; 512],
            log: [0; 256],
        };
        let mut x = 1u16;
        for i in 0..255 {
            gf.exp[i] = x as u8;
            gf.exp[i + 255] = x as u8;
            gf.log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
        }
        gf
    }

    fn mul(&self, a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            return 0;
        }
        self.exp[self.log[a as usize] as usize + self.log[b as usize] as usize]
    }

    /// 2^k.
    fn pow2(&self, k: usize) -> u8 {
        self.exp[k % 255]
    }

    /// 1 / a, for a != 0.
    fn inv(&self, a: u8) -> u8 {
        self.exp[255 - self.log[a as usize] as usize]
    }
}

/// Rebuild the data stripes `lost` (indexes into `data`, at most two;
/// their contents on entry are ignored) from the others and the parity
/// that is there (`p`, `q`: None when lost or not kept). Fails when the
/// lost stripes outnumber the parity left.
pub(crate) fn rebuild(
    data: &mut [Vec<u8>],
    lost: &[usize],
    p: Option<&[u8]>,
    q: Option<&[u8]>,
) -> Result<()> {
    let too_many =
        || Error::Devices("more RAID5/6 stripes are lost than parity can rebuild".into());
    for &x in lost {
        data[x].iter_mut().for_each(|b| *b = 0);
    }
    // The syndromes of what is left: the lost stripes count as zeros.
    let (p_rest, q_rest) = syndromes(data, q.is_some());
    let gf = Gf::new();
    match (lost, p, q) {
        ([], _, _) => {}
        (&[x], Some(p), _) => {
            for (d, (a, b)) in data[x].iter_mut().zip(p.iter().zip(&p_rest)) {
                *d = a ^ b;
            }
        }
        (&[x], None, Some(q)) => {
            let scale = gf.inv(gf.pow2(x));
            for (d, (a, b)) in data[x].iter_mut().zip(q.iter().zip(&q_rest)) {
                *d = gf.mul(a ^ b, scale);
            }
        }
        (&[x, y], Some(p), Some(q)) if x != y => {
            // D_x ^ D_y = Pxy and 2^x D_x ^ 2^y D_y = Qxy, solved for D_x.
            let (gx, gy) = (gf.pow2(x), gf.pow2(y));
            let denom = gf.inv(gx ^ gy);
            let (to_x_from_p, to_x_from_q) = (gf.mul(gy, denom), denom);
            for at in 0..data[x].len() {
                let pxy = p[at] ^ p_rest[at];
                let qxy = q[at] ^ q_rest[at];
                let dx = gf.mul(to_x_from_p, pxy) ^ gf.mul(to_x_from_q, qxy);
                data[x][at] = dx;
                data[y][at] = pxy ^ dx;
            }
        }
        _ => return Err(too_many()),
    }
    Ok(())
}

/// P and Q of equally long data stripes (Q empty unless `raid6`).
pub(crate) fn syndromes(data: &[Vec<u8>], raid6: bool) -> (Vec<u8>, Vec<u8>) {
    let len = data.first().map_or(0, Vec::len);
    let mut p = vec![0u8; len];
    let mut q = if raid6 { vec![0u8; len] } else { Vec::new() };
    let lanes = len / 8 * 8;
    // Horner's rule from the last stripe down: q = q * 2 + D_i.
    for d in data.iter().rev() {
        for at in (0..lanes).step_by(8) {
            let v = u64::from_le_bytes(d[at..at + 8].try_into().unwrap_or_default());
            let pv = u64::from_le_bytes(p[at..at + 8].try_into().unwrap_or_default()) ^ v;
            p[at..at + 8].copy_from_slice(&pv.to_le_bytes());
            if raid6 {
                let qv = u64::from_le_bytes(q[at..at + 8].try_into().unwrap_or_default());
                q[at..at + 8].copy_from_slice(&(mul2_lanes(qv) ^ v).to_le_bytes());
            }
        }
        for at in lanes..len {
            p[at] ^= d[at];
            if raid6 {
                q[at] = (mul2_lanes(u64::from(q[at])) as u8) ^ d[at];
            }
        }
    }
    (p, q)
}

/// The part of one RAID5/6 row a write from chunk offset `pos` to `end`
/// covers: the row, where it starts, the written bytes' offsets in it
/// (`first..last`), and the columns of each stripe they change (`c0..c1`:
/// part of one stripe, or all).
struct RowSpan {
    row: u64,
    row_start: u64,
    first: u64,
    last: u64,
    c0: u64,
    c1: u64,
}

impl RowSpan {
    fn at(pos: u64, end: u64, row_len: u64, stripe_len: u64) -> RowSpan {
        let sl = stripe_len;
        let row = pos / row_len;
        let row_start = row * row_len;
        let (first, last) = (pos - row_start, end.min(row_start + row_len) - row_start);
        let (c0, c1) = if first / sl == (last - 1) / sl {
            (first % sl, (last - 1) % sl + 1)
        } else {
            (0, sl)
        };
        RowSpan {
            row,
            row_start,
            first,
            last,
            c0,
            c1,
        }
    }
}

impl Volume {
    /// Write `buf` at `logical` in RAID5/6 chunk `chunk`, keeping each
    /// row's parity right. Each row is held while it is read and
    /// rewritten.
    pub(super) fn write_parity(&self, chunk: &Chunk, logical: u64, buf: &[u8]) -> Result<()> {
        let n = chunk.item.stripes.len() as u64;
        let raid6 = chunk.profile == Profile::Raid6;
        let data = n - chunk.profile.parity_stripes();
        let sl = chunk.item.stripe_len;
        let row_len = data * sl;
        let start = logical - chunk.logical;
        let end = start + buf.len() as u64;
        if logical
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > chunk.end())
        {
            return Err(Error::Invalid(format!(
                "write of {} bytes at {logical} runs past its chunk",
                buf.len()
            )));
        }
        let mut pos = start;
        while pos < end {
            let RowSpan {
                row,
                row_start,
                first,
                last,
                c0,
                c1,
            } = RowSpan::at(pos, end, row_len, sl);
            let _held = self.rows.hold(chunk.logical, row);
            let width = (c1 - c0) as usize;
            if row_start + row_len > chunk.item.length {
                return Err(Error::corrupt(format!(
                    "the {} chunk at {} ends inside a row",
                    chunk.profile.name(),
                    chunk.logical
                )));
            }
            let device = |idx: u64| -> Result<(&Arc<dyn Device>, u64)> {
                let s = &chunk.item.stripes[((idx + row) % n) as usize];
                let dev = self.devices.get(s.devid).ok_or_else(|| {
                    Error::Devices(format!(
                        "device {} of the RAID5/6 chunk at {} is missing; cannot write",
                        s.devid, chunk.logical
                    ))
                })?;
                Ok((dev, s.offset + row * sl + c0))
            };
            // Every device of the row first: a missing one fails the write
            // before anything is written.
            let p_at = device(data)?;
            let q_at = if raid6 { Some(device(data + 1)?) } else { None };
            let mut columns = Vec::with_capacity(data as usize);
            let mut writes = Vec::new();
            for i in 0..data {
                let (lo, hi) = (i * sl + c0, i * sl + c1);
                let (new_lo, new_hi) = (lo.max(first), hi.min(last));
                let (dev, at) = device(i)?;
                let mut col = vec![0u8; width];
                if new_lo >= new_hi || new_lo > lo || new_hi < hi {
                    dev.read_at(at, &mut col)?;
                }
                if new_lo < new_hi {
                    let from = (row_start + new_lo - start) as usize;
                    let part = &buf[from..from + (new_hi - new_lo) as usize];
                    let skip = (new_lo - lo) as usize;
                    col[skip..skip + part.len()].copy_from_slice(part);
                    writes.push((dev, at + skip as u64, part));
                }
                columns.push(col);
            }
            let (p, q) = syndromes(&columns, raid6);
            for (dev, at, part) in writes {
                dev.write_at(at, part)?;
            }
            p_at.0.write_at(p_at.1, &p)?;
            if let Some((dev, at)) = q_at {
                dev.write_at(at, &q)?;
            }
            pos = row_start + last;
        }
        Ok(())
    }

    /// [`Device::write_behind`] for what [`Volume::write_parity`] wrote of
    /// `len` bytes at `logical`: the data in each stripe, and in each row
    /// the parity columns the write changed. Missing devices are skipped
    /// (a hint, as for the other profiles).
    pub(super) fn parity_write_behind(
        &self,
        chunk: &Chunk,
        logical: u64,
        len: usize,
        wait: bool,
    ) -> Result<()> {
        let n = chunk.item.stripes.len() as u64;
        let data = n - chunk.profile.parity_stripes();
        let sl = chunk.item.stripe_len;
        let row_len = data * sl;
        let start = logical.saturating_sub(chunk.logical);
        let end = (start + len as u64).min(chunk.item.length);
        let behind = |idx: u64, row: u64, col: u64, len: u64| -> Result<()> {
            let s = &chunk.item.stripes[((idx + row) % n) as usize];
            match self.devices.get(s.devid) {
                Some(dev) => dev.write_behind(s.offset + row * sl + col, len, wait),
                None => Ok(()),
            }
        };
        let mut pos = start;
        while pos < end {
            let RowSpan {
                row,
                row_start,
                first,
                last,
                c0,
                c1,
            } = RowSpan::at(pos, end, row_len, sl);
            for i in 0..data {
                let (lo, hi) = ((i * sl).max(first), ((i + 1) * sl).min(last));
                if lo < hi {
                    behind(i, row, lo - i * sl, hi - lo)?;
                }
            }
            for p in data..n {
                behind(p, row, c0, c1 - c0)?;
            }
            pos = row_start + last;
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `logical` in RAID5/6 chunk `chunk` without
    /// trusting the stripes that hold them: each is rebuilt from the rest
    /// of its row, with P (`use_q` false) or, in RAID6, with Q in place of
    /// P. Stripes on missing devices are rebuilt too, as long as no more
    /// are lost than the parity used can cover.
    pub(super) fn read_rebuilt(
        &self,
        chunk: &Chunk,
        logical: u64,
        buf: &mut [u8],
        use_q: bool,
    ) -> Result<()> {
        let n = chunk.item.stripes.len() as u64;
        let raid6 = chunk.profile == Profile::Raid6;
        let data = n - chunk.profile.parity_stripes();
        let sl = chunk.item.stripe_len;
        let start = logical - chunk.logical;
        let mut done = 0usize;
        while done < buf.len() {
            let off = start + done as u64;
            let nr = off / sl;
            let (row, target) = (nr / data, (nr % data) as usize);
            // Not in the middle of a write of the same row.
            let _held = self.rows.hold(chunk.logical, row);
            let c0 = off % sl;
            let width = ((sl - c0) as usize).min(buf.len() - done);
            // A stripe of the row at these columns; None: its device is
            // missing or fails the read (it then counts as lost).
            let read = |idx: u64| -> Option<Vec<u8>> {
                let s = &chunk.item.stripes[((idx + row) % n) as usize];
                let dev = self.devices.get(s.devid)?;
                let mut col = vec![0u8; width];
                dev.read_at(s.offset + row * sl + c0, &mut col).ok()?;
                Some(col)
            };
            let mut columns = Vec::with_capacity(data as usize);
            let mut lost = vec![target];
            for i in 0..data {
                if i as usize == target {
                    columns.push(vec![0u8; width]);
                    continue;
                }
                match read(i) {
                    Some(col) => columns.push(col),
                    None => {
                        lost.push(i as usize);
                        columns.push(vec![0u8; width]);
                    }
                }
            }
            lost.sort_unstable();
            let p = if use_q { None } else { read(data) };
            // With P at hand, Q is needed only for a second lost stripe.
            let q = if raid6 && (p.is_none() || lost.len() > 1) {
                read(data + 1)
            } else {
                None
            };
            match rebuild(&mut columns, &lost, p.as_deref(), q.as_deref()) {
                Ok(()) => buf[done..done + width].copy_from_slice(&columns[target]),
                // Too much of the row is gone to rebuild this stripe, but it
                // is there itself (the piece lost is another's, or parity).
                Err(e) => match read(target as u64) {
                    Some(col) => buf[done..done + width].copy_from_slice(&col),
                    None => return Err(e),
                },
            }
            done += width;
        }
        Ok(())
    }

    /// Check the parity of row `row` of RAID5/6 chunk `chunk` where it
    /// covers data in use: `used` holds, per run of `unit` bytes across the
    /// stripes (a sector), whether any data stripe has a sector in use
    /// there; parity elsewhere is never read back and may be stale, as
    /// the kernel leaves it. Parity that does not match is rewritten from
    /// the data there when `mend` and `verify` (given the data stripes)
    /// finds the data good. `verify` runs with the row let go (it may read
    /// trees, whose blocks may lie in this very row); the row is then read
    /// again under its lock, and mended only if its data is what was
    /// verified.
    pub(crate) fn check_row_parity(
        &self,
        chunk: &Chunk,
        row: u64,
        used: &[bool],
        unit: usize,
        mend: bool,
        verify: &mut dyn FnMut(&[Vec<u8>]) -> bool,
    ) -> Result<RowParity> {
        let n = chunk.item.stripes.len() as u64;
        let raid6 = chunk.profile == Profile::Raid6;
        let data = n - chunk.profile.parity_stripes();
        let sl = chunk.item.stripe_len;
        if (row + 1) * data * sl > chunk.item.length {
            return Err(Error::Invalid(format!(
                "row {row} is past the end of the chunk at {}",
                chunk.logical
            )));
        }
        let place = |idx: u64| {
            let s = &chunk.item.stripes[((idx + row) % n) as usize];
            (self.devices.get(s.devid), s.offset + row * sl)
        };
        // The row's stripes (data, P, Q) and whether its parity is its
        // data's where data is in use.
        let read = || -> Option<RowRead> {
            let mut stripes = Vec::with_capacity(n as usize);
            for idx in 0..n {
                let (dev, at) = place(idx);
                let mut buf = vec![0u8; sl as usize];
                dev?.read_at(at, &mut buf).ok()?;
                stripes.push(buf);
            }
            let q_disk = if raid6 { stripes.pop() } else { None };
            let p_disk = stripes.pop().unwrap_or_default();
            let (p, q) = syndromes(&stripes, raid6);
            let same = used.iter().enumerate().filter(|(_, u)| **u).all(|(i, _)| {
                let r = i * unit..((i + 1) * unit).min(p.len());
                p[r.clone()] == p_disk[r.clone()]
                    && q_disk.as_ref().is_none_or(|qd| qd[r.clone()] == q[r])
            });
            Some((stripes, p, q, same))
        };
        let missing = (0..n).any(|idx| place(idx).0.is_none());
        let first = {
            let _held = self.rows.hold(chunk.logical, row);
            read()
        };
        let Some((stripes, _, _, same)) = first else {
            return Ok(if missing {
                RowParity::Missing
            } else {
                RowParity::Unreadable
            });
        };
        if same {
            return Ok(RowParity::Good);
        }
        if !verify(&stripes) {
            return Ok(RowParity::DataBad);
        }
        if !mend {
            return Ok(RowParity::Bad { mended: false });
        }
        let _held = self.rows.hold(chunk.logical, row);
        let Some((now, p, q, same)) = read() else {
            return Ok(RowParity::Unreadable);
        };
        if same {
            // A write brought the parity up to date meanwhile.
            return Ok(RowParity::Bad { mended: true });
        }
        if now != stripes {
            // Written meanwhile: what was verified is gone; the next
            // scrub looks again.
            return Ok(RowParity::Bad { mended: false });
        }
        let mut parity = vec![(data, p)];
        if raid6 {
            parity.push((data + 1, q));
        }
        for (idx, bytes) in parity {
            let (Some(dev), at) = place(idx) else {
                return Ok(RowParity::Missing);
            };
            for (i, _) in used.iter().enumerate().filter(|(_, u)| **u) {
                let r = i * unit..((i + 1) * unit).min(bytes.len());
                dev.write_at(at + r.start as u64, &bytes[r])?;
            }
        }
        Ok(RowParity::Bad { mended: true })
    }

    /// Whether a rebuild of RAID5/6 chunk `chunk` (with P for `mirror` 1,
    /// with Q for 2) has the devices it needs.
    pub(super) fn can_rebuild(&self, chunk: &Chunk, mirror: usize) -> bool {
        let missing = chunk
            .item
            .stripes
            .iter()
            .filter(|s| self.devices.get(s.devid).is_none())
            .count();
        let parity = chunk.profile.parity_stripes() as usize;
        // The stripe rebuilt counts as lost; so does P when Q is used.
        missing + usize::from(mirror == 2) <= parity && mirror <= parity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GF(2^8) product, bit by bit: the reference for the lane version.
    pub(super) fn gf_mul(mut a: u8, mut b: u8) -> u8 {
        let mut r = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                r ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= 0x1d;
            }
            b >>= 1;
        }
        r
    }

    #[test]
    fn parity_is_xor_and_the_raid6_syndrome() {
        let mut seed = 7u32;
        let data: Vec<Vec<u8>> = (0..5)
            .map(|_| {
                (0..37)
                    .map(|_| {
                        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                        (seed >> 16) as u8
                    })
                    .collect()
            })
            .collect();
        let (p, q) = syndromes(&data, true);
        for at in 0..37 {
            let mut want_p = 0u8;
            let mut want_q = 0u8;
            let mut g = 1u8;
            for d in &data {
                want_p ^= d[at];
                want_q ^= gf_mul(g, d[at]);
                g = gf_mul(g, 2);
            }
            assert_eq!(p[at], want_p, "P at {at}");
            assert_eq!(q[at], want_q, "Q at {at}");
        }
        // 2^8 = 0x1d under 0x11d: the polynomial is the one the kernel uses.
        assert_eq!(gf_mul(0x80, 2), 0x1d);
        let (p5, q5) = syndromes(&data, false);
        assert_eq!(p5, p);
        assert!(q5.is_empty());
    }
}

/// Writes and rebuilt reads against a model, on devices in memory that
/// start full of random bytes, with stripes at different offsets.
#[cfg(test)]
mod random_tests {
    use super::tests::gf_mul;
    use super::*;
    use crate::device::MemDevice;
    use crate::format::CsumType;
    use crate::format::consts::*;
    use crate::format::items::{ChunkItem, Stripe};
    use crate::format::superblock::Superblock;
    use crate::volume::{ChunkMap, DeviceSet};

    fn superblock() -> Superblock {
        let mut raw = vec![0u8; 4096];
        raw[0x40..0x48].copy_from_slice(&BTRFS_MAGIC.to_le_bytes());
        raw[0x30..0x38].copy_from_slice(&0x10000u64.to_le_bytes());
        raw[0x48..0x50].copy_from_slice(&1u64.to_le_bytes());
        raw[0x90..0x94].copy_from_slice(&4096u32.to_le_bytes());
        raw[0x94..0x98].copy_from_slice(&16384u32.to_le_bytes());
        let c = CsumType::Crc32c.compute(&raw[32..]);
        raw[..32].copy_from_slice(&c);
        Superblock::parse(&raw, 0x10000).unwrap()
    }

    /// A RAID5 (or RAID6) data chunk of `rows` rows over devices 1..=n,
    /// its stripes at `offs`.
    fn chunk_item(raid6: bool, rows: u64, offs: &[u64]) -> ChunkItem {
        let n = offs.len() as u64;
        let data = n - if raid6 { 2 } else { 1 };
        let flag = if raid6 {
            BLOCK_GROUP_RAID6
        } else {
            BLOCK_GROUP_RAID5
        };
        ChunkItem {
            length: rows * data * STRIPE_LEN,
            owner: 2,
            stripe_len: STRIPE_LEN,
            chunk_type: BLOCK_GROUP_DATA | flag,
            io_align: 65536,
            io_width: 65536,
            sector_size: 4096,
            sub_stripes: 1,
            stripes: offs
                .iter()
                .enumerate()
                .map(|(i, &offset)| Stripe {
                    devid: i as u64 + 1,
                    offset,
                    dev_uuid: [0; 16],
                })
                .collect(),
        }
    }

    /// The volume of `mems` but those in `gone`, with `item` at `base`.
    fn volume(mems: &[Arc<MemDevice>], gone: &[usize], base: u64, item: &ChunkItem) -> Volume {
        let devs = mems
            .iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i))
            .map(|(i, m)| (i as u64 + 1, m.clone() as Arc<dyn Device>))
            .collect();
        let chunks = ChunkMap::default();
        chunks.insert(base, item.clone()).unwrap();
        Volume::new(DeviceSet::with_superblock(devs, superblock()), chunks)
    }

    fn run(n: usize, raid6: bool, rows: u64, seed: u64) {
        let sl = STRIPE_LEN;
        let data = n as u64 - if raid6 { 2 } else { 1 };
        let mut seed = seed | 1;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let offs: Vec<u64> = (0..n).map(|i| (i as u64 + 1) * 3 * sl).collect();
        let size = (offs[n - 1] + rows * sl + 4 * sl) as usize;
        let mems: Vec<Arc<MemDevice>> = (0..n)
            .map(|i| {
                let junk: Vec<u8> = (0..size).map(|_| rnd() as u8).collect();
                Arc::new(MemDevice::new(format!("d{i}"), junk))
            })
            .collect();
        let base = 1u64 << 30;
        let item = chunk_item(raid6, rows, &offs);
        let volume = |gone: &[usize]| volume(&mems, gone, base, &item);
        let vol = volume(&[]);
        let total = rows * data * sl;
        let mut model = vec![0u8; total as usize];
        vol.read_copy(base, 0, &mut model).unwrap();
        // Unaligned, single bytes, sectors, stripes, rows, up to three rows.
        for it in 0..300 {
            let start = match it % 4 {
                0 => rnd() % total,
                1 => (rnd() % total) / 4096 * 4096,
                2 => (rnd() % (rows * data)) * sl,
                _ => (rnd() % rows) * data * sl,
            };
            let most = (total - start).min(if it % 3 == 0 { 3 * data * sl } else { 2 * sl });
            let len = match it % 5 {
                0 => most,
                1 => 1,
                _ => 1 + rnd() % most,
            };
            let buf: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            vol.write(base + start, &buf).unwrap();
            model[start as usize..(start + len) as usize].copy_from_slice(&buf);
        }
        assert!(vol.write(base + total - 10, &[0u8; 11]).is_err());
        let mut back = vec![0u8; total as usize];
        vol.read_copy(base, 0, &mut back).unwrap();
        assert!(back == model, "read back");
        // Every row's parity, computed bit by bit where the kernel puts it.
        let disks: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
        for r in 0..rows {
            for col in 0..sl {
                let (mut p, mut q, mut g) = (0u8, 0u8, 1u8);
                for i in 0..data {
                    let d = model[(r * data * sl + i * sl + col) as usize];
                    p ^= d;
                    q ^= gf_mul(g, d);
                    g = gf_mul(g, 2);
                }
                let pd = ((data + r) % n as u64) as usize;
                assert_eq!(
                    disks[pd][(offs[pd] + r * sl + col) as usize],
                    p,
                    "P row {r}"
                );
                if raid6 {
                    let qd = ((data + 1 + r) % n as u64) as usize;
                    assert_eq!(
                        disks[qd][(offs[qd] + r * sl + col) as usize],
                        q,
                        "Q row {r}"
                    );
                }
            }
        }
        // Rebuilt reads: with P, with Q, and with any one (RAID6: any two)
        // devices gone, from random unaligned starts.
        let mut losses: Vec<Vec<usize>> = vec![vec![]];
        losses.extend((0..n).map(|a| vec![a]));
        if raid6 {
            losses.extend((0..n).flat_map(|a| (a + 1..n).map(move |b| vec![a, b])));
        }
        for gone in &losses {
            let vol = volume(gone);
            let ways = if raid6 {
                [1, 2].as_slice()
            } else {
                [1].as_slice()
            };
            for &mirror in ways {
                if !vol.can_rebuild(&vol.chunks.lookup(base).unwrap(), mirror) {
                    continue;
                }
                let start = rnd() % (total / 2);
                let mut got = vec![0u8; (total / 2) as usize];
                vol.read_copy(base + start, mirror, &mut got).unwrap();
                assert!(
                    got[..] == model[start as usize..(start + total / 2) as usize],
                    "copy {mirror} with devices {gone:?} gone"
                );
            }
        }
        // No copy reads past the chunk's end.
        for mirror in 0..=usize::from(raid6) + 1 {
            let mut two = vec![0u8; 8192];
            assert!(
                vol.read_copy(base + total - 4096, mirror, &mut two)
                    .is_err()
            );
        }
        // With device 0 gone and row 0's P garbage, copy 0 still reads the
        // stripes that are there directly (only device 0's is rebuilt).
        let p_dev = (data % n as u64) as usize;
        mems[p_dev]
            .write_at(offs[p_dev], &vec![0x5a; sl as usize])
            .unwrap();
        let vol = volume(&[0]);
        let mut row = vec![0u8; (data * sl) as usize];
        vol.read_copy(base, 0, &mut row).unwrap();
        for i in 1..data as usize {
            let at = i * sl as usize..(i + 1) * sl as usize;
            assert!(
                row[at.clone()] == model[at],
                "stripe {i} of row 0 not read directly"
            );
        }
    }

    /// Four threads write the stripes of the same rows at once, round
    /// after round: each row's read-modify-write must see the others'
    /// finished writes, or parity goes stale. Parity is checked after every
    /// round.
    /// Writes are paced ([`Device::write_behind`]) where they land: the
    /// data in its stripes and the parity columns the write changed.
    #[test]
    fn write_behind_covers_the_parity_written_too() {
        let sl = STRIPE_LEN;
        let base = 1u64 << 30;
        for raid6 in [false, true] {
            let n = if raid6 { 4usize } else { 3 };
            let data = n as u64 - if raid6 { 2 } else { 1 };
            let rows = 4;
            let offs: Vec<u64> = (0..n).map(|i| (i as u64 + 1) * 3 * sl).collect();
            let size = (offs[n - 1] + rows * sl + 4 * sl) as usize;
            let mems: Vec<Arc<MemDevice>> = (0..n)
                .map(|i| Arc::new(MemDevice::new(format!("d{i}"), vec![0; size])))
                .collect();
            let vol = volume(&mems, &[], base, &chunk_item(raid6, rows, &offs));
            let taken = || -> Vec<(usize, u64, u64)> {
                let mut v: Vec<_> = mems
                    .iter()
                    .enumerate()
                    .flat_map(|(d, m)| {
                        m.take_written_behind()
                            .into_iter()
                            .map(move |(o, l)| (d, o, l))
                    })
                    .collect();
                v.sort_unstable();
                v
            };
            // Stripe `idx` of row `row` is on device (idx + row) % n.
            let at = |idx: u64, row: u64, col: u64, len: u64| {
                let d = ((idx + row) % n as u64) as usize;
                (d, offs[d] + row * sl + col, len)
            };
            // Row 1 whole: every stripe of it, parity included.
            vol.write_behind(base + data * sl, (data * sl) as usize, false)
                .unwrap();
            let mut want: Vec<_> = (0..n as u64).map(|i| at(i, 1, 0, sl)).collect();
            want.sort_unstable();
            assert_eq!(taken(), want, "raid6 {raid6}: a whole row");
            // 100 bytes inside the second data stripe of row 2: those, and
            // the same columns of the parity.
            vol.write_behind(base + 2 * data * sl + sl + 10, 100, false)
                .unwrap();
            let mut want: Vec<_> = std::iter::once(at(1, 2, 10, 100))
                .chain((data..n as u64).map(|p| at(p, 2, 10, 100)))
                .collect();
            want.sort_unstable();
            assert_eq!(taken(), want, "raid6 {raid6}: part of a stripe");
        }
    }

    #[test]
    fn concurrent_writes_to_shared_rows_keep_parity() {
        let (n, sl, rows) = (4usize, STRIPE_LEN, 4u64);
        let data = n as u64 - 1;
        let mems: Vec<Arc<MemDevice>> = (0..n)
            .map(|i| {
                Arc::new(MemDevice::new(
                    format!("d{i}"),
                    vec![0u8; (rows * sl) as usize],
                ))
            })
            .collect();
        let base = 1u64 << 30;
        let vol = volume(&mems, &[], base, &chunk_item(false, rows, &[0; 4]));
        let parity_right = || {
            let disks: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
            (0..rows).all(|r| {
                (0..sl).step_by(256).all(|col| {
                    let p = (0..data).fold(0u8, |p, i| {
                        p ^ disks[((i + r) % n as u64) as usize][(r * sl + col) as usize]
                    });
                    disks[((data + r) % n as u64) as usize][(r * sl + col) as usize] == p
                })
            })
        };
        let per_stripe = sl / 4096;
        let sectors = rows * data * per_stripe;
        let together = std::sync::Barrier::new(4);
        let stale = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (vol, together, stale, parity_right) = (&vol, &together, &stale, &parity_right);
                s.spawn(move || {
                    for round in 0..=255u8 {
                        together.wait();
                        // Thread t owns every 4th stripe: the same columns of
                        // a row belong to different threads.
                        for k in (0..sectors).filter(|k| (k / per_stripe) % 4 == t) {
                            let fill = ((t as u8 + 1) * 16).wrapping_add(round);
                            vol.write(base + k * 4096, &[fill; 4096]).unwrap();
                        }
                        together.wait();
                        if t == 0 && !parity_right() {
                            stale.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(stale.into_inner(), 0, "rounds that left parity stale");
    }

    #[test]
    fn random_writes_keep_parity_and_rebuilt_reads_match() {
        for (n, raid6) in [
            (2, false),
            (3, false),
            (5, false),
            (3, true),
            (4, true),
            (6, true),
        ] {
            for s in 1..3 {
                run(n, raid6, 5, s * 77 + n as u64);
            }
        }
    }
}

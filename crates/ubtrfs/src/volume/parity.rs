//! Writes to RAID5 and RAID6 chunks: the data goes to its stripes and the
//! row's parity is brought up to date with it.
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
use std::sync::Arc;

/// Multiply every byte of `x` by 2 in GF(2^8) (polynomial 0x11d), eight
/// bytes at a time.
fn mul2_lanes(x: u64) -> u64 {
    let high = x & 0x8080_8080_8080_8080;
    ((x << 1) & 0xfefe_fefe_fefe_fefe) ^ ((high >> 7) * 0x1d)
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

impl Volume {
    /// Write `buf` at `logical` in RAID5/6 chunk `chunk`, keeping each
    /// row's parity right. Writes take turns (the read-modify-write of a
    /// row must not interleave with another of the same row).
    pub(super) fn write_parity(&self, chunk: &Chunk, logical: u64, buf: &[u8]) -> Result<()> {
        let _turn = self.parity_turn.lock().unwrap_or_else(|e| e.into_inner());
        let n = chunk.item.stripes.len() as u64;
        let raid6 = chunk.profile == Profile::Raid6;
        let data = n - if raid6 { 2 } else { 1 };
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
            let row = pos / row_len;
            let row_start = row * row_len;
            let (first, last) = (pos - row_start, end.min(row_start + row_len) - row_start);
            // The columns the write changes: part of one stripe, or all.
            let (c0, c1) = if first / sl == (last - 1) / sl {
                (first % sl, (last - 1) % sl + 1)
            } else {
                (0, sl)
            };
            let width = (c1 - c0) as usize;
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
            let (dev, at) = device(data)?;
            dev.write_at(at, &p)?;
            if raid6 {
                let (dev, at) = device(data + 1)?;
                dev.write_at(at, &q)?;
            }
            pos = row_start + last;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GF(2^8) product, bit by bit: the reference for the lane version.
    fn gf_mul(mut a: u8, mut b: u8) -> u8 {
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

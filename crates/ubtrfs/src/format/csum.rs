//! The four checksum algorithms of btrfs.

use crate::{Error, Result};
use blake2::Digest as _;

/// Checksum algorithm of a filesystem (superblock field `csum_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsumType {
    /// CRC32C (Castagnoli), 4 bytes.
    Crc32c,
    /// xxHash64 with seed 0, 8 bytes.
    Xxhash64,
    /// SHA-256, 32 bytes.
    Sha256,
    /// BLAKE2b with a 256-bit digest, 32 bytes.
    Blake2b,
}

impl CsumType {
    /// Decode the on-disk `csum_type`.
    pub fn from_disk(v: u16) -> Result<Self> {
        Ok(match v {
            0 => CsumType::Crc32c,
            1 => CsumType::Xxhash64,
            2 => CsumType::Sha256,
            3 => CsumType::Blake2b,
            _ => return Err(Error::Unsupported(format!("checksum type {v}"))),
        })
    }

    /// The on-disk value.
    pub fn to_disk(self) -> u16 {
        match self {
            CsumType::Crc32c => 0,
            CsumType::Xxhash64 => 1,
            CsumType::Sha256 => 2,
            CsumType::Blake2b => 3,
        }
    }

    /// Bytes of one checksum.
    pub fn size(self) -> usize {
        match self {
            CsumType::Crc32c => 4,
            CsumType::Xxhash64 => 8,
            CsumType::Sha256 | CsumType::Blake2b => 32,
        }
    }

    /// The name btrfs-progs uses.
    pub fn name(self) -> &'static str {
        match self {
            CsumType::Crc32c => "crc32c",
            CsumType::Xxhash64 => "xxhash64",
            CsumType::Sha256 => "sha256",
            CsumType::Blake2b => "blake2",
        }
    }

    /// Checksum `data` into `out` (the first [`CsumType::size`] bytes; the rest zero).
    pub fn compute(self, data: &[u8]) -> [u8; 32] {
        let mut out = [0u8; 32];
        match self {
            CsumType::Crc32c => out[..4].copy_from_slice(&crc32c::crc32c(data).to_le_bytes()),
            CsumType::Xxhash64 => {
                out[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, 0).to_le_bytes())
            }
            CsumType::Sha256 => out.copy_from_slice(&sha2::Sha256::digest(data)),
            CsumType::Blake2b => out.copy_from_slice(
                &blake2::Blake2b::<blake2::digest::consts::U32>::digest(data),
            ),
        }
        out
    }

    /// Whether `expected` (at least [`CsumType::size`] bytes) is the checksum of `data`.
    pub fn verify(self, data: &[u8], expected: &[u8]) -> bool {
        let n = self.size();
        expected.len() >= n && self.compute(data)[..n] == expected[..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // CRC32C check value of "123456789" is 0xe3069283.
        let c = CsumType::Crc32c.compute(b"123456789");
        assert_eq!(&c[..4], &0xe306_9283u32.to_le_bytes());
        // xxh64 of the empty input with seed 0.
        let x = CsumType::Xxhash64.compute(b"");
        assert_eq!(&x[..8], &0xef46_db37_51d8_e999u64.to_le_bytes());
        let s = CsumType::Sha256.compute(b"abc");
        assert_eq!(s[0..4], [0xba, 0x78, 0x16, 0xbf]);
        assert!(CsumType::Blake2b.verify(b"x", &CsumType::Blake2b.compute(b"x")));
        assert!(!CsumType::Blake2b.verify(b"y", &CsumType::Blake2b.compute(b"x")));
        assert!(CsumType::from_disk(9).is_err());
    }
}

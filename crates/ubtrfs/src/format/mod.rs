//! On-disk structures of btrfs: keys, the superblock, tree nodes, items and
//! checksums. Pure functions over byte slices: no I/O, safe on any input.

pub mod consts;
pub mod csum;
pub mod describe;
pub mod items;
pub mod key;
pub mod node;
pub mod superblock;

pub use csum::CsumType;
pub use key::Key;

/// Little-endian field readers that fail instead of panicking on short input.
pub(crate) mod le {
    use crate::{Error, Result};

    fn take<const N: usize>(b: &[u8], off: usize) -> Result<[u8; N]> {
        b.get(off..off + N)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| {
                Error::corrupt(format!("field at {off}+{N} past end of {} bytes", b.len()))
            })
    }
    pub fn u8(b: &[u8], off: usize) -> Result<u8> {
        Ok(take::<1>(b, off)?[0])
    }
    pub fn u16(b: &[u8], off: usize) -> Result<u16> {
        Ok(u16::from_le_bytes(take(b, off)?))
    }
    pub fn u32(b: &[u8], off: usize) -> Result<u32> {
        Ok(u32::from_le_bytes(take(b, off)?))
    }
    pub fn u64(b: &[u8], off: usize) -> Result<u64> {
        Ok(u64::from_le_bytes(take(b, off)?))
    }
    pub fn uuid(b: &[u8], off: usize) -> Result<[u8; 16]> {
        take(b, off)
    }
    pub fn bytes(b: &[u8], off: usize, len: usize) -> Result<&[u8]> {
        b.get(off..off.saturating_add(len)).ok_or_else(|| {
            Error::corrupt(format!(
                "{len} bytes at {off} past end of {} bytes",
                b.len()
            ))
        })
    }
}

/// Formats a UUID the way btrfs-progs prints it.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

//! Temporary stand-in until compression.rs lands.
use crate::{Error, Result};
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Compression {
    None,
    Zlib,
    Lzo,
    Zstd,
}
impl Compression {
    pub fn from_disk(v: u8) -> Result<Self> {
        Ok(match v {
            0 => Self::None,
            1 => Self::Zlib,
            2 => Self::Lzo,
            3 => Self::Zstd,
            _ => return Err(Error::Unsupported(format!("compression {v}"))),
        })
    }
}
pub fn decompress(_k: Compression, _i: &[u8], _n: usize, _s: u32) -> Result<Vec<u8>> {
    Err(Error::Unsupported("compression pending".into()))
}

//! The data layer: file contents. Reads assemble extents, decompress, and
//! verify every sector against the checksum tree.

pub mod compression;
pub mod delalloc;
pub mod ordered;
mod read;
pub mod write;

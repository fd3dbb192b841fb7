//! The data layer: file contents. Reads assemble extents, decompress, and
//! verify every sector against the checksum tree.

pub mod compression;
pub mod delalloc;
mod nocow;
pub mod ordered;
mod read;
mod truncate;
pub mod write;

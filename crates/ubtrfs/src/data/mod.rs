//! The data layer: file contents. Reads assemble extents, decompress, and
//! verify every sector against the checksum tree.

pub mod compression;
mod read;
pub mod write;

//! The data layer: file contents. Reads assemble extents, decompress, and
//! verify every sector against the checksum tree.

mod clone;
pub mod compress_heuristic;
pub(crate) mod compress_jobs;
pub mod compression;
mod csum_pool;
pub mod delalloc;
mod extent_lookup;
pub(crate) mod in_flight;
mod nocow;
pub mod ordered;
mod read;
pub mod seek;
mod truncate;
pub mod write;

pub use truncate::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};

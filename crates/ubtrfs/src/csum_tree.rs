//! The checksum tree: per-sector data checksums keyed by logical address.

//! Compressed extents: zlib, lzo (with btrfs's segment framing), zstd.

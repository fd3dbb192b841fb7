//! Test support for ubtrfs: corpus images, loop mounts, tree comparison.

//! Opening a filesystem from its devices.

/// An open btrfs filesystem.
pub struct Filesystem {}

//! fsync: the entry point that makes one inode's changes durable.
//!
//! The fast path of DESIGN.md layer 9 (log the inode's items into the
//! kernel-format log tree, one flush, then the superblock with `log_root`
//! by FUA) is not written yet. Until it is, every fsync takes the path the
//! kernel itself falls back to when it cannot log: a full transaction
//! commit, which is always correct (it makes more durable, never less).
//! Callers use [`Filesystem::fsync`] so that the log path can replace the
//! fallback without changing them.

use crate::Result;
use crate::fs::{Filesystem, InodeId};

impl Filesystem {
    /// Make every change to inode `id` durable: its data, size, attributes,
    /// xattrs and names, as `fsync(2)` (or `fdatasync(2)` when `datasync`)
    /// promises. When this returns, a crash followed by any mount (the
    /// kernel's or ubtrfs's) shows the inode at least as it was here.
    ///
    /// Today this commits the whole running transaction (the kernel's
    /// fallback when an inode cannot be logged); `datasync` therefore makes
    /// no difference yet. Fails if `id` does not exist.
    pub fn fsync(&self, id: InodeId, datasync: bool) -> Result<()> {
        let _ = datasync;
        // A missing inode is the caller's error, not something to commit for.
        self.stat(id)?;
        self.commit()
    }
}

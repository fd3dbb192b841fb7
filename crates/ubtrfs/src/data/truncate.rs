//! Changing a file's size and its allocation: truncate and fallocate.

use crate::format::items::Timespec;
use crate::fs::{Filesystem, InodeId};
use crate::transaction::Writer;
use crate::{Error, Result};

impl Filesystem {
    /// Set the size of `id` inside the caller's hold on the transaction.
    pub(crate) fn truncate_locked(
        &self,
        _w: &mut Writer,
        _id: InodeId,
        _new_size: u64,
        _now: Timespec,
    ) -> Result<()> {
        Err(Error::Unsupported("truncate is being written".into()))
    }
}

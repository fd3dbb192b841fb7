//! Finding the file extent items of a byte range of a file, for the read,
//! write, seek, clone and no-COW paths.

use crate::Result;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::FileExtentItem;
use crate::fs::{Filesystem, InodeId};

impl Filesystem {
    /// The file extent items of `id` that may reach into `[start, end)`, as
    /// (file offset, item), in order. The first one may start before
    /// `start` and may also end at or before it: callers clip each item to
    /// the range themselves (an inline extent covers its whole sector for
    /// some of them). Empty when `start >= end`.
    pub(crate) fn file_extents_overlapping(
        &self,
        id: InodeId,
        start: u64,
        end: u64,
    ) -> Result<impl Iterator<Item = Result<(u64, FileExtentItem)>> + '_> {
        let items = if start < end {
            let tree = self.fs_tree(id.subvol)?;
            // Extents do not overlap: only the last one starting at or
            // before `start` can reach into the range from the left, so
            // the cost follows the range, not the size of the file.
            let first = tree
                .get_le(&Key::new(id.ino, EXTENT_DATA_KEY, start))?
                .map(|it| it.key())
                .filter(|k| k.objectid == id.ino && k.item_type == EXTENT_DATA_KEY)
                .map_or(start, |k| k.offset);
            Some(tree.range(
                Key::new(id.ino, EXTENT_DATA_KEY, first),
                Key::new(id.ino, EXTENT_DATA_KEY, end - 1),
            )?)
        } else {
            None
        };
        Ok(items.into_iter().flatten().map(|item| {
            let item = item?;
            Ok((item.key().offset, FileExtentItem::parse(item.data())?))
        }))
    }
}

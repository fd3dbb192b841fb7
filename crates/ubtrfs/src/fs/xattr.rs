//! Extended attributes: XATTR_ITEM entries keyed by the name hash.

use super::dir::name_hash;
use super::inode::InodeId;
use super::open::Filesystem;
use crate::Result;
use crate::format::Key;
use crate::format::consts::XATTR_ITEM_KEY;
use crate::format::items::DirItem;

impl Filesystem {
    /// Every xattr of `id` as (name, value), in key order.
    pub fn xattrs(&self, id: InodeId) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if id.is_placeholder() {
            return Ok(Vec::new());
        }
        let tree = self.fs_tree(id.subvol)?;
        let mut out = Vec::new();
        for item in tree.items_of(id.ino, XATTR_ITEM_KEY)? {
            for d in DirItem::parse_all(item?.data())? {
                out.push((d.name, d.data));
            }
        }
        Ok(out)
    }

    /// Names of the xattrs of `id`.
    pub fn list_xattrs(&self, id: InodeId) -> Result<Vec<Vec<u8>>> {
        Ok(self.xattrs(id)?.into_iter().map(|(n, _)| n).collect())
    }

    /// The value of xattr `name` of `id`.
    pub fn get_xattr(&self, id: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>> {
        if id.is_placeholder() {
            return Ok(None);
        }
        let tree = self.fs_tree(id.subvol)?;
        let Some(item) = tree.get(&Key::new(id.ino, XATTR_ITEM_KEY, name_hash(name)))? else {
            return Ok(None);
        };
        Ok(DirItem::parse_all(item.data())?
            .into_iter()
            .find(|d| d.name == name)
            .map(|d| d.data))
    }
}

//! Properties: `btrfs.` xattrs whose setting changes the inode, as
//! `btrfs property set` and `setfattr` make them on the kernel's btrfs.
//! There is one for inodes, `btrfs.compression`:
//!
//! - a value starting `zlib`, `lzo` or `zstd` (`zstd:3` is kept as it
//!   is, the level is not used) sets the compress flag, clears
//!   no-compress, and new extents of the file are compressed with that
//!   algorithm, whatever the mount's own;
//! - `no` or `none` sets no-compress instead;
//! - an empty value, or removing the xattr, clears both flags and the
//!   xattr;
//! - anything else, another `btrfs.` name, or a no-COW or no-checksum
//!   inode is refused (EINVAL);
//! - new files and directories inherit the directory's value (not
//!   symbolic links or special files, whose data is never compressed).

use super::inode::{FileKind, InodeId};
use super::open::Filesystem;
use crate::data::compression::Compression;
use crate::format::consts::*;
use crate::format::items::InodeItem;
use crate::transaction::Writer;
use crate::{Error, Result};

/// The compression property's xattr name.
pub const COMPRESSION_PROP: &[u8] = b"btrfs.compression";

/// What a value of [`COMPRESSION_PROP`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompressionProp {
    /// Neither flag: the mount decides.
    Reset,
    /// Never compress.
    Never,
    /// Compress with this algorithm.
    With(Compression),
}

impl CompressionProp {
    /// Parse a value; `None` if the kernel would refuse it.
    pub(crate) fn parse(value: &[u8]) -> Option<Self> {
        if value.is_empty() {
            return Some(CompressionProp::Reset);
        }
        if value == b"no" || value == b"none" {
            return Some(CompressionProp::Never);
        }
        [
            (&b"zlib"[..], Compression::Zlib),
            (b"lzo", Compression::Lzo),
            (b"zstd", Compression::Zstd),
        ]
        .into_iter()
        .find(|(name, _)| value.starts_with(name))
        .map(|(_, c)| CompressionProp::With(c))
    }

    /// The inode flags with this value applied.
    fn apply(self, flags: u64) -> u64 {
        let flags = flags & !(INODE_COMPRESS | INODE_NOCOMPRESS);
        match self {
            CompressionProp::Reset => flags,
            CompressionProp::Never => flags | INODE_NOCOMPRESS,
            CompressionProp::With(_) => flags | INODE_COMPRESS,
        }
    }
}

/// Whether xattr `name` is a property (the `btrfs.` namespace).
pub(crate) fn is_property(name: &[u8]) -> bool {
    name.starts_with(b"btrfs.")
}

/// The value of property `name` is refused.
fn invalid(name: &[u8], why: &str) -> Error {
    Error::Invalid(format!("property {}: {why}", String::from_utf8_lossy(name)))
}

impl Filesystem {
    /// Set (`Some`) or remove (`None`) property `name` of `id`, whose
    /// item is `item`, with its effect on the inode's flags; `flags` are
    /// the xattr's create/replace flags. The caller updates ctime.
    pub(crate) fn set_property(
        &self,
        w: &mut Writer,
        id: InodeId,
        item: &InodeItem,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
    ) -> Result<()> {
        if name != COMPRESSION_PROP {
            return Err(invalid(name, "not a property btrfs knows"));
        }
        let prop = match value {
            None => CompressionProp::Reset,
            Some(v) => CompressionProp::parse(v)
                .ok_or_else(|| invalid(name, "not zlib, lzo, zstd, no, none or empty"))?,
        };
        if prop != CompressionProp::Reset && item.flags & (INODE_NODATACOW | INODE_NODATASUM) != 0 {
            return Err(invalid(name, "the inode is no-COW or has no checksums"));
        }
        // Only files and directories keep it; the kernel takes it from
        // anything else and stores nothing.
        if !matches!(
            FileKind::from_mode(item.mode),
            Some(FileKind::File | FileKind::Dir)
        ) {
            return Ok(());
        }
        let missing = || Error::NotFound(format!("xattr {}", String::from_utf8_lossy(name)));
        match value {
            // A reset: the xattr goes (removing one that is not there, or
            // replacing it, says so).
            None => {
                if !self.delete_xattr(w, id, name)? {
                    return Err(missing());
                }
            }
            Some(_) if prop == CompressionProp::Reset => {
                if !self.delete_xattr(w, id, name)? && flags & super::XATTR_REPLACE != 0 {
                    return Err(missing());
                }
            }
            Some(v) => self.put_xattr(w, id, name, v, flags)?,
        }
        if let CompressionProp::With(Compression::Lzo) = prop {
            w.add_incompat(INCOMPAT_COMPRESS_LZO);
        }
        if let CompressionProp::With(Compression::Zstd) = prop {
            w.add_incompat(INCOMPAT_COMPRESS_ZSTD);
        }
        self.change_inode(w, id, |i| i.flags = prop.apply(i.flags))?;
        Ok(())
    }

    /// The algorithm `id`'s compression property names, if it has one.
    pub(crate) fn compression_prop(&self, id: InodeId) -> Result<Option<Compression>> {
        Ok(match self.get_xattr(id, COMPRESSION_PROP)? {
            Some(v) => match CompressionProp::parse(&v) {
                Some(CompressionProp::With(c)) => Some(c),
                _ => None,
            },
            None => None,
        })
    }

    /// For a new inode `id` of `kind` with flags `flags` in directory
    /// `dir` (whose flags are `dir_flags`): give it the directory's
    /// compression property, as the kernel's inodes inherit it.
    pub(crate) fn inherit_properties(
        &self,
        w: &mut Writer,
        dir: InodeId,
        dir_flags: u64,
        id: InodeId,
        kind: FileKind,
        flags: u64,
    ) -> Result<()> {
        // The property always sets one of these flags.
        if dir_flags & (INODE_COMPRESS | INODE_NOCOMPRESS) == 0
            || !matches!(kind, FileKind::File | FileKind::Dir)
            || flags & (INODE_NODATACOW | INODE_NODATASUM) != 0
        {
            return Ok(());
        }
        let Some(value) = self.get_xattr(dir, COMPRESSION_PROP)? else {
            return Ok(());
        };
        // The kernel gives the algorithm's name alone ("zstd" for
        // "zstd:5"); "no" and "none" come as the flag only.
        let Some(CompressionProp::With(kind)) = CompressionProp::parse(&value) else {
            return Ok(());
        };
        self.put_xattr(w, id, COMPRESSION_PROP, kind.name().as_bytes(), 0)?;
        self.change_inode(w, id, |i| {
            i.flags = CompressionProp::With(kind).apply(i.flags)
        })?;
        Ok(())
    }
}

//! Growing and shrinking the part of a device the filesystem uses
//! (`btrfs filesystem resize`): its device item's size and the
//! superblock's total, committed. A device grows up to its own size (an
//! image file made larger first); it shrinks only down to the end of its
//! last chunk, since moving chunks (the kernel's relocation) is not done.

use super::open::Filesystem;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DevExtent, DevItem};
use crate::{Error, Result};

/// The smallest device the kernel resizes to.
pub const MIN_DEVICE_SIZE: u64 = 256 << 20;

/// The size asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewSize {
    /// All of the device.
    Max,
    /// This many bytes.
    Bytes(u64),
    /// This many bytes more.
    Grow(u64),
    /// This many bytes less.
    Shrink(u64),
}

/// A resize as `btrfs filesystem resize` and `BTRFS_IOC_RESIZE` take it:
/// `[DEVID:]max` or `[DEVID:][+|-]SIZE[kmgtpe]` (binary units).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizeRequest {
    /// The device (1 when not given).
    pub devid: u64,
    pub size: NewSize,
}

impl ResizeRequest {
    /// Parse `text`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::Invalid(format!(
                "resize: {text:?} is not [DEVID:]max or [DEVID:][+|-]SIZE[kmgtpe]"
            ))
        };
        let (devid, rest) = match text.split_once(':') {
            Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
            None => (1, text),
        };
        if rest == "max" {
            return Ok(ResizeRequest {
                devid,
                size: NewSize::Max,
            });
        }
        let (sign, digits) = match rest.as_bytes().first() {
            Some(b'+') => (1, &rest[1..]),
            Some(b'-') => (-1, &rest[1..]),
            _ => (0, rest),
        };
        // Digits first: `parse_size` would take a sign or space too.
        if !digits.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(bad());
        }
        let bytes = crate::mkfs::parse_size(digits).ok_or_else(bad)?;
        if sign != 0 && bytes == 0 {
            return Err(bad());
        }
        let size = match sign {
            1 => NewSize::Grow(bytes),
            -1 => NewSize::Shrink(bytes),
            _ => NewSize::Bytes(bytes),
        };
        Ok(ResizeRequest { devid, size })
    }
}

/// What a resize did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resized {
    pub devid: u64,
    /// The device's path.
    pub path: std::path::PathBuf,
    /// Its size in the filesystem before and after.
    pub old: u64,
    pub new: u64,
}

impl Filesystem {
    /// Resize a device as `req` says, and commit. Refused: a device that
    /// is not there, a size past the device's end or below
    /// [`MIN_DEVICE_SIZE`], and a shrink below the end of the device's
    /// last chunk.
    pub fn resize_device(&self, req: &ResizeRequest) -> Result<Resized> {
        self.change("resizing a device", || {
            let mut w = self.writer()?;
            let devid = req.devid;
            if self.tree_reader().volume().devices.is_seed(devid) {
                return Err(Error::ReadOnly(format!(
                    "resize: device {devid} is a seed device: it is only read"
                )));
            }
            let dev = self
                .tree_reader()
                .volume()
                .devices
                .get(devid)
                .cloned()
                .ok_or_else(|| Error::NoDevice(format!("resize: no device {devid}")))?;
            let key = Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid);
            let item = self
                .chunk_tree()
                .get(&key)?
                .ok_or_else(|| Error::corrupt(format!("device {devid} has no device item")))?;
            let old = DevItem::parse(item.data())?.total_bytes;
            let actual = dev.refresh_size()?;
            let ss = u64::from(self.geometry().sectorsize);
            let wanted = match req.size {
                NewSize::Max => Some(actual),
                NewSize::Bytes(b) => Some(b),
                NewSize::Grow(b) => old.checked_add(b),
                NewSize::Shrink(b) => old.checked_sub(b),
            }
            .ok_or_else(|| Error::Invalid(format!("resize: device {devid} cannot be {:?} of {old} bytes", req.size)))?;
            let new = wanted / ss * ss;
            let path = dev.path().to_path_buf();
            if new > actual {
                return Err(Error::Invalid(format!(
                    "resize: {} (device {devid}) holds {actual} bytes, less than {new}",
                    path.display()
                )));
            }
            if new < MIN_DEVICE_SIZE {
                return Err(Error::Invalid(format!(
                    "resize: {new} bytes is less than the smallest device size, {MIN_DEVICE_SIZE}"
                )));
            }
            if new < old {
                let end = self.last_chunk_end(devid)?;
                if end > new {
                    return Err(Error::Unsupported(format!(
                        "resize: device {devid} has chunks up to byte {end}; shrinking it to {new} would move them, which ubtrfs does not do"
                    )));
                }
            }
            if new != old {
                self.modify_tree(&mut w, CHUNK_TREE_OBJECTID, |ed, root| {
                    ed.update(root, key, |d| {
                        let mut item = DevItem::parse(d)?;
                        item.total_bytes = new;
                        *d = item.to_bytes();
                        Ok(())
                    })?
                    .ok_or_else(|| Error::corrupt(format!("device {devid} has no device item")))
                })?;
                let total = self.total_bytes() - old + new;
                self.total_bytes
                    .store(total, std::sync::atomic::Ordering::Relaxed);
                self.commit_locked(&mut w)?;
            }
            Ok(Resized {
                devid,
                path,
                old,
                new,
            })
        })
    }

    /// Where the last device extent of device `devid` ends (0: none).
    fn last_chunk_end(&self, devid: u64) -> Result<u64> {
        let tree = self.tree_by_id(DEV_TREE_OBJECTID)?;
        let mut end = 0;
        for it in tree.range(
            Key::new(devid, DEV_EXTENT_KEY, 0),
            Key::new(devid, DEV_EXTENT_KEY, u64::MAX),
        )? {
            let it = it?;
            let k = it.key();
            if k.objectid != devid || k.item_type != DEV_EXTENT_KEY {
                continue;
            }
            let de = DevExtent::parse(it.data())?;
            end = end.max(k.offset.saturating_add(de.length));
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_as_btrfs_takes_them() {
        let p = |s: &str| ResizeRequest::parse(s).unwrap();
        assert_eq!(p("max").size, NewSize::Max);
        assert_eq!(
            p("2:max"),
            ResizeRequest {
                devid: 2,
                size: NewSize::Max
            }
        );
        assert_eq!(p("+1g").size, NewSize::Grow(1 << 30));
        assert_eq!(p("-512M").size, NewSize::Shrink(512 << 20));
        assert_eq!(p("3:1073741824").size, NewSize::Bytes(1 << 30));
        assert_eq!(p("3:1073741824").devid, 3);
        for bad in [
            "",
            "x",
            "1:",
            ":max",
            "+",
            "+0",
            "-0",
            "10q",
            "1:2:max",
            "16e",
            "99999999999999999999",
        ] {
            assert!(ResizeRequest::parse(bad).is_err(), "{bad:?}");
        }
    }
}

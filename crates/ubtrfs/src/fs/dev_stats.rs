//! The device statistics of a filesystem (`btrfs device stats`): read
//! from the device tree at open, shown, reset, and written back by the
//! commit after they change (see [`crate::volume::dev_stats`]).

use super::Filesystem;
use crate::format::consts::{
    DEV_ITEM_KEY, DEV_ITEMS_OBJECTID, DEV_STATS_OBJECTID, DEV_TREE_OBJECTID, PERSISTENT_ITEM_KEY,
};
use crate::format::items::DevItem;
use crate::format::key::Key;
use crate::transaction::Writer;
use crate::volume::dev_stats::{DevStatValues, item_bytes, parse_item};
use crate::{Error, Result};
use std::path::PathBuf;

/// One device's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceStatsEntry {
    pub devid: u64,
    /// Where it was opened from; `None` if it is missing.
    pub path: Option<PathBuf>,
    /// Write, read and flush errors, corrupt and stale copies (in the
    /// order of [`crate::volume::dev_stats::DEV_STAT_NAMES`]).
    pub values: DevStatValues,
}

impl Filesystem {
    /// Add the counters the device tree holds to the devices' (once per
    /// device set).
    pub(crate) fn load_device_stats(&self) -> Result<()> {
        let stats = &self.tree_reader().volume().devices.stats;
        if stats.loaded() {
            return Ok(());
        }
        let tree = self.tree_by_id(DEV_TREE_OBJECTID)?;
        let mut stored = Vec::new();
        for item in tree.items_of(DEV_STATS_OBJECTID, PERSISTENT_ITEM_KEY)? {
            let item = item?;
            stored.push((item.key().offset, parse_item(item.data())));
        }
        stats.load(stored);
        Ok(())
    }

    /// The counters of every device of the filesystem, the seeds it was
    /// sprouted from included (as the kernel lists them; their counters
    /// are never written: a seed is only read), by devid.
    pub fn device_stats(&self) -> Result<Vec<DeviceStatsEntry>> {
        let volume = self.tree_reader().volume();
        let mut out = Vec::new();
        for item in self
            .chunk_tree()
            .items_of(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY)?
        {
            let devid = DevItem::parse(item?.data())?.devid;
            out.push(DeviceStatsEntry {
                devid,
                path: volume.devices.get(devid).map(|d| d.path().to_path_buf()),
                values: volume.devices.stats.values(devid),
            });
        }
        out.sort_by_key(|e| e.devid);
        Ok(out)
    }

    /// Set the counters of device `devid` (every device: `None`) to zero,
    /// kept by the next commit of a writable filesystem (in memory only
    /// otherwise, as on the kernel's read-only mount); returns them as
    /// they were. An unknown devid is an error and resets nothing.
    pub fn reset_device_stats(&self, devid: Option<u64>) -> Result<Vec<DeviceStatsEntry>> {
        let mut out = self.device_stats()?;
        if let Some(d) = devid {
            out.retain(|e| e.devid == d);
            if out.is_empty() {
                return Err(Error::NotFound(format!("device {d}")));
            }
        }
        let stats = &self.tree_reader().volume().devices.stats;
        for e in &mut out {
            e.values = stats.reset(e.devid);
        }
        Ok(out)
    }

    /// Write the counters that changed since the last commit into the
    /// device tree, an item per device (made when missing, rewritten at
    /// the kernel's size when another size).
    pub(crate) fn write_device_stats(&self, w: &mut Writer) -> Result<()> {
        let stats = self.tree_reader().volume().devices.stats.clone();
        if !stats.loaded() {
            // Counted before the device tree was read: written over what
            // it holds they would lose its counts.
            return Ok(());
        }
        let volume = self.tree_reader().volume();
        let dirty: Vec<_> = stats
            .take_dirty()
            .into_iter()
            .filter(|(devid, _)| !volume.devices.is_seed(*devid))
            .collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let devids: Vec<u64> = dirty.iter().map(|(d, _)| *d).collect();
        let r = self.modify_tree(w, DEV_TREE_OBJECTID, |ed, root| {
            for (devid, values) in &dirty {
                let key = Key::new(DEV_STATS_OBJECTID, PERSISTENT_ITEM_KEY, *devid);
                ed.put(root, key, item_bytes(values))?;
            }
            Ok(())
        });
        if r.is_err() {
            stats.mark_dirty(devids);
        }
        r
    }
}

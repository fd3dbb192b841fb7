//! Device statistics: per device, how many writes, reads and flushes
//! failed and how many bad or stale copies were read from it, as the
//! kernel counts them (`btrfs device stats`). They live in memory while
//! the filesystem is open and are kept in the device tree, one
//! `(DEV_STATS, PERSISTENT_ITEM, devid)` item per device, written by the
//! commit after they change.

use crate::Result;
use crate::device::{Counters, Device};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The counters, in the order of the on-disk item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevStat {
    /// A write (or FUA write) the device failed.
    WriteErrs = 0,
    /// A read the device failed.
    ReadErrs = 1,
    /// A cache flush the device failed.
    FlushErrs = 2,
    /// A copy read from the device whose checksum did not match.
    CorruptionErrs = 3,
    /// A tree block read from the device older than its parent says.
    GenerationErrs = 4,
}

/// How many counters there are.
pub const DEV_STAT_COUNT: usize = 5;

/// The counters' names as `btrfs device stats` prints them.
pub const DEV_STAT_NAMES: [&str; DEV_STAT_COUNT] = [
    "write_io_errs",
    "read_io_errs",
    "flush_io_errs",
    "corruption_errs",
    "generation_errs",
];

/// One device's counters.
pub type DevStatValues = [u64; DEV_STAT_COUNT];

/// The counters of every device of a filesystem.
#[derive(Debug, Default)]
pub struct DeviceStats {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    values: BTreeMap<u64, DevStatValues>,
    /// Devices whose counters changed since the last commit wrote them.
    dirty: BTreeSet<u64>,
    /// Whether the device tree's counters were added (once, however many
    /// times the devices' filesystem is opened).
    loaded: bool,
    /// Bad data copies reads counted, by (devid, logical address): a read
    /// counts a bad copy once, as the kernel's does (it mends the copy
    /// at once; where ubtrfs cannot, the next read would count it again).
    read_bad: BTreeSet<(u64, u64)>,
}

/// At most this many bad copies are remembered as counted.
const MAX_READ_BAD: usize = 65_536;

impl DeviceStats {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count one `stat` against device `devid`.
    pub fn record(&self, devid: u64, stat: DevStat) {
        let mut i = self.inner();
        i.values.entry(devid).or_default()[stat as usize] += 1;
        i.dirty.insert(devid);
    }

    /// Count a bad data copy a read found at `logical` of device `devid`,
    /// unless a read counted it already since it was last mended.
    pub fn record_bad_read(&self, devid: u64, logical: u64) {
        let mut i = self.inner();
        if i.read_bad.contains(&(devid, logical)) {
            return;
        }
        if i.read_bad.len() < MAX_READ_BAD {
            i.read_bad.insert((devid, logical));
        }
        i.values.entry(devid).or_default()[DevStat::CorruptionErrs as usize] += 1;
        i.dirty.insert(devid);
    }

    /// The copy at `logical` of device `devid` was written over with a
    /// good one: a read that finds it bad again counts again.
    pub fn mended(&self, devid: u64, logical: u64) {
        self.inner().read_bad.remove(&(devid, logical));
    }

    /// Whether the device tree's counters were loaded.
    pub(crate) fn loaded(&self) -> bool {
        self.inner().loaded
    }

    /// Add what the device tree holds (read at open) to what was counted
    /// before it was read; only the first call counts.
    pub(crate) fn load(&self, stored: impl IntoIterator<Item = (u64, DevStatValues)>) {
        let mut i = self.inner();
        if std::mem::replace(&mut i.loaded, true) {
            return;
        }
        for (devid, values) in stored {
            let v = i.values.entry(devid).or_default();
            for (n, s) in v.iter_mut().zip(values) {
                *n = n.saturating_add(s);
            }
        }
    }

    /// The counters of `devid` (zeros if nothing was ever counted).
    pub fn values(&self, devid: u64) -> DevStatValues {
        self.inner().values.get(&devid).copied().unwrap_or_default()
    }

    /// Set the counters of `devid` to zero; returns what they were.
    pub(crate) fn reset(&self, devid: u64) -> DevStatValues {
        let mut i = self.inner();
        let old = i.values.insert(devid, DevStatValues::default());
        i.dirty.insert(devid);
        old.unwrap_or_default()
    }

    /// The devices whose counters changed since the last call, with their
    /// counters now (for the commit to write).
    pub(crate) fn take_dirty(&self) -> Vec<(u64, DevStatValues)> {
        let mut i = self.inner();
        let dirty = std::mem::take(&mut i.dirty);
        dirty
            .into_iter()
            .map(|d| (d, i.values.get(&d).copied().unwrap_or_default()))
            .collect()
    }

    /// Have the next commit write `devids` again (this one failed).
    pub(crate) fn mark_dirty(&self, devids: impl IntoIterator<Item = u64>) {
        self.inner().dirty.extend(devids);
    }
}

/// The counters of a device-stats item; a shorter item (an older kernel's)
/// leaves the rest zero, a longer one's extra counters are not ours.
pub fn parse_item(b: &[u8]) -> DevStatValues {
    let mut v = DevStatValues::default();
    for (n, c) in v.iter_mut().zip(b.chunks_exact(8)) {
        *n = u64::from_le_bytes(c.try_into().unwrap_or_default());
    }
    v
}

/// The bytes of a device-stats item holding `v`.
pub fn item_bytes(v: &DevStatValues) -> Vec<u8> {
    v.iter().flat_map(|n| n.to_le_bytes()).collect()
}

/// A device of a filesystem whose failed writes, reads and flushes are
/// counted against its devid.
pub struct ErrorCounting {
    inner: Arc<dyn Device>,
    devid: u64,
    stats: Arc<DeviceStats>,
}

impl ErrorCounting {
    /// Wrap `inner`, device `devid`, counting into `stats`.
    pub fn new(inner: Arc<dyn Device>, devid: u64, stats: Arc<DeviceStats>) -> Self {
        ErrorCounting {
            inner,
            devid,
            stats,
        }
    }

    fn count<T>(&self, r: Result<T>, stat: DevStat) -> Result<T> {
        if r.is_err() {
            self.stats.record(self.devid, stat);
        }
        r
    }
}

impl Device for ErrorCounting {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn refresh_size(&self) -> Result<u64> {
        self.inner.refresh_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.count(self.inner.read_at(offset, buf), DevStat::ReadErrs)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.count(self.inner.write_at(offset, buf), DevStat::WriteErrs)
    }
    fn flush(&self) -> Result<()> {
        self.count(self.inner.flush(), DevStat::FlushErrs)
    }
    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.count(self.inner.write_fua(offset, buf), DevStat::WriteErrs)
    }
    fn counters(&self) -> &Counters {
        self.inner.counters()
    }
    fn write_behind(&self, offset: u64, len: u64, wait: bool) -> Result<()> {
        self.count(
            self.inner.write_behind(offset, len, wait),
            DevStat::WriteErrs,
        )
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        self.inner.discard(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_and_short_items_read_as_zeros() {
        let v = [1, 2, 3, 4, 5];
        assert_eq!(parse_item(&item_bytes(&v)), v);
        assert_eq!(parse_item(&item_bytes(&v)[..16]), [1, 2, 0, 0, 0]);
        let mut long = item_bytes(&v);
        long.extend(9u64.to_le_bytes());
        assert_eq!(parse_item(&long), v);
    }

    #[test]
    fn counts_are_added_to_what_was_stored_and_written_once() {
        let s = DeviceStats::default();
        s.record(2, DevStat::CorruptionErrs);
        s.load([(2, [0, 1, 0, 4, 0]), (1, [7, 0, 0, 0, 0])]);
        // A second open of the same devices adds nothing.
        s.load([(1, [7, 0, 0, 0, 0])]);
        assert_eq!(s.values(2), [0, 1, 0, 5, 0]);
        assert_eq!(s.values(1), [7, 0, 0, 0, 0]);
        assert_eq!(s.values(3), [0; 5]);
        // Only the device counted since is written.
        assert_eq!(s.take_dirty(), vec![(2, [0, 1, 0, 5, 0])]);
        assert!(s.take_dirty().is_empty());
        assert_eq!(s.reset(1), [7, 0, 0, 0, 0]);
        assert_eq!(s.take_dirty(), vec![(1, [0; 5])]);
        // A bad copy reads find counts once until it is mended.
        s.record_bad_read(1, 4096);
        s.record_bad_read(1, 4096);
        s.record_bad_read(1, 8192);
        assert_eq!(s.values(1), [0, 0, 0, 2, 0]);
        s.mended(1, 4096);
        s.record_bad_read(1, 4096);
        assert_eq!(s.values(1), [0, 0, 0, 3, 0]);
    }
}

//! Finding a filesystem's devices and their superblocks.

use super::dev_stats::{DeviceStats, ErrorCounting};
use crate::device::{Device, FileDevice, SeedDevice};
use crate::format::consts::{SUPER_OFFSETS, SUPER_SIZE};
use crate::format::superblock::Superblock;
use crate::format::uuid_string;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Read every superblock copy that fits on `dev` and return the valid one
/// with the highest generation, plus a warning for each bad copy before it.
pub fn scan_device(dev: &dyn Device) -> Result<(Superblock, Vec<String>)> {
    let mut best: Option<Superblock> = None;
    let mut problems = Vec::new();
    for (i, &off) in SUPER_OFFSETS.iter().enumerate() {
        if off + SUPER_SIZE as u64 > dev.size() {
            break;
        }
        let mut buf = vec![0u8; SUPER_SIZE];
        let parsed = dev
            .read_at(off, &mut buf)
            .and_then(|_| Superblock::parse(&buf, off));
        match parsed {
            Ok(sb) => {
                // A valid primary wins, as in the kernel; mirrors stand in
                // only for a bad primary (a stale mirror of an older,
                // larger filesystem must not win on generation).
                if i == 0 {
                    return Ok((sb, Vec::new()));
                }
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Err(e) => problems.push(format!("copy {i} at {off}: {e}")),
        }
    }
    match best {
        Some(sb) => {
            let warnings = problems
                .iter()
                .map(|p| {
                    format!(
                        "{}: superblock {p}; using the copy of generation {}",
                        dev.path().display(),
                        sb.generation
                    )
                })
                .collect();
            Ok((sb, warnings))
        }
        None => Err(Error::NoSuperblock {
            path: dev.path().to_path_buf(),
            why: if problems.is_empty() {
                format!("device of {} bytes is too small to hold one", dev.size())
            } else {
                problems.join("; ")
            },
        }),
    }
}

/// The present devices of one filesystem, by devid.
#[derive(Clone)]
pub struct DeviceSet {
    devices: BTreeMap<u64, Arc<dyn Device>>,
    /// The newest superblock among the devices.
    pub superblock: Superblock,
    /// Problems found while opening (bad superblock copies).
    pub warnings: Vec<String>,
    /// The seed devices among them when the filesystem was sprouted from
    /// seeds: (devid, the seed's filesystem id, which tree blocks written
    /// before the sprout carry).
    pub seeds: Vec<(u64, [u8; 16])>,
    /// Errors counted per device (`btrfs device stats`); every device of
    /// the set counts its failed I/O here.
    pub stats: Arc<DeviceStats>,
}

impl DeviceSet {
    /// Open `paths` read-only and check that they belong to one filesystem.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Self> {
        let mut devs: Vec<Arc<dyn Device>> = Vec::new();
        for p in paths {
            devs.push(Arc::new(FileDevice::open_read_only(p)?));
        }
        Self::from_devices(devs)
    }

    /// Open `paths` for reading and writing.
    pub fn open_read_write<P: AsRef<Path>>(paths: &[P]) -> Result<Self> {
        let mut devs: Vec<Arc<dyn Device>> = Vec::new();
        for p in paths {
            devs.push(Arc::new(FileDevice::open_read_write(p)?));
        }
        Self::from_devices(devs)
    }

    /// Group already-open devices by devid, checking fsids agree. Seed
    /// devices (their superblock says so) of another filesystem id may
    /// come with the devices of a filesystem sprouted from them.
    pub fn from_devices(devs: Vec<Arc<dyn Device>>) -> Result<Self> {
        if devs.is_empty() {
            return Err(Error::Devices("no device given".into()));
        }
        let mut scanned = Vec::new();
        for dev in devs {
            let (sb, w) = scan_device(dev.as_ref())?;
            scanned.push((dev, sb, w));
        }
        // The filesystem is the one of the devices that are not seeds;
        // given only seeds, the newest (a sprout made a seed in turn is
        // newer than the seed under it). Seeds of other ids are its seeds
        // (the chunk tree then says whether it was sprouted from them).
        let main_fsid = scanned
            .iter()
            .find(|(_, sb, _)| !sb.is_seed())
            .or_else(|| scanned.iter().max_by_key(|(_, sb, _)| sb.generation))
            .map(|(_, sb, _)| sb.fsid)
            .unwrap_or_default();
        let mut devices = BTreeMap::new();
        let mut warnings = Vec::new();
        let mut newest: Option<Superblock> = None;
        let mut seeds = Vec::new();
        let stats = Arc::new(DeviceStats::default());
        let insert = |devices: &mut BTreeMap<u64, Arc<dyn Device>>,
                      devid,
                      dev: Arc<dyn Device>,
                      seed: bool| {
            if let Some(other) = devices.get(&devid) {
                return Err(Error::Devices(format!(
                    "{} and {} are both device {devid}{}",
                    other.path().display(),
                    dev.path().display(),
                    if seed {
                        ": give only the seed devices this filesystem was sprouted from"
                    } else {
                        ""
                    }
                )));
            }
            devices.insert(
                devid,
                Arc::new(ErrorCounting::new(dev, devid, stats.clone())),
            );
            Ok(())
        };
        for (dev, sb, w) in scanned {
            warnings.extend(w);
            // A seed of a filesystem sprouted from it: the sprout's chunk
            // tree names it, its blocks carry its own id, and the sprout's
            // superblock is the one used.
            if sb.is_seed() && sb.fsid != main_fsid {
                seeds.push((sb.dev_item.devid, sb.fsid));
                let seed: Arc<dyn Device> = Arc::new(SeedDevice::new(dev));
                insert(&mut devices, sb.dev_item.devid, seed, true)?;
                continue;
            }
            if sb.fsid != main_fsid {
                return Err(Error::Devices(format!(
                    "{} belongs to filesystem {}, not {}",
                    dev.path().display(),
                    uuid_string(&sb.fsid),
                    uuid_string(&main_fsid)
                )));
            }
            insert(&mut devices, sb.dev_item.devid, dev, false)?;
            if newest.as_ref().is_none_or(|n| sb.generation > n.generation) {
                newest = Some(sb);
            }
        }
        let superblock = newest.ok_or_else(|| Error::Devices("no device given".into()))?;
        Ok(DeviceSet {
            devices,
            superblock,
            warnings,
            seeds,
            stats,
        })
    }

    /// A set from devices whose ids and superblock are already known
    /// (memory-backed filesystems, tests, mkfs).
    pub fn with_superblock(devices: Vec<(u64, Arc<dyn Device>)>, superblock: Superblock) -> Self {
        let stats = Arc::new(DeviceStats::default());
        DeviceSet {
            devices: devices
                .into_iter()
                .map(|(devid, dev)| {
                    let counted: Arc<dyn Device> =
                        Arc::new(ErrorCounting::new(dev, devid, stats.clone()));
                    (devid, counted)
                })
                .collect(),
            superblock,
            warnings: Vec::new(),
            seeds: Vec::new(),
            stats,
        }
    }

    /// The filesystem ids tree blocks may carry: the filesystem's own,
    /// then its seeds'.
    pub fn tree_fsids(&self) -> Vec<[u8; 16]> {
        let mut ids = vec![self.superblock.tree_fsid()];
        for (_, f) in &self.seeds {
            if !ids.contains(f) {
                ids.push(*f);
            }
        }
        ids
    }

    /// Whether device `devid` is a seed of this (sprouted) filesystem.
    pub fn is_seed(&self, devid: u64) -> bool {
        self.seeds.iter().any(|&(d, _)| d == devid)
    }

    /// The device with `devid`, if it was given.
    pub fn get(&self, devid: u64) -> Option<&Arc<dyn Device>> {
        self.devices.get(&devid)
    }

    /// Every present device.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Arc<dyn Device>)> {
        self.devices.iter().map(|(&id, d)| (id, d))
    }
}

//! The btrfs ioctls about what a subvolume is, in their binary layout:
//! `BTRFS_IOC_GET_SUBVOL_INFO` (what `btrfs subvolume show` and `btrfs
//! property` read, any user may) and `BTRFS_IOC_SET_RECEIVED_SUBVOL`
//! (what `btrfs receive` records at its end, and `btrfs property set -f`
//! clears).

use ubtrfs::format::items::{RootItem, Timespec};
use ubtrfs::fs::SubvolInfo;

/// `_IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args)`, 504 bytes.
pub const BTRFS_IOC_GET_SUBVOL_INFO: u32 = 0x81f8_943c;
/// `_IOWR(0x94, 37, struct btrfs_ioctl_received_subvol_args)`, 200 bytes.
pub const BTRFS_IOC_SET_RECEIVED_SUBVOL: u32 = 0xc0c8_9425;
/// Bytes of `struct btrfs_ioctl_get_subvol_info_args`.
pub const SUBVOL_INFO_SIZE: usize = 504;
/// Bytes of `struct btrfs_ioctl_received_subvol_args`.
pub const RECEIVED_ARGS_SIZE: usize = 200;

// Offsets in the info: the tree id, a 256-byte name, then u64s, the three
// UUIDs, four transids and four times (a u64 of seconds, a u32 of
// nanoseconds, padded to 16 bytes).
const NAME: usize = 8;
const PARENT_ID: usize = 264;
const DIRID: usize = 272;
const GENERATION: usize = 280;
const FLAGS: usize = 288;
const UUID: usize = 296;
const PARENT_UUID: usize = 312;
const RECEIVED_UUID: usize = 328;
const CTRANSID: usize = 344;
const CTIME: usize = 376;

/// The answer to `BTRFS_IOC_GET_SUBVOL_INFO`.
pub struct GetSubvolInfo([u8; SUBVOL_INFO_SIZE]);

impl GetSubvolInfo {
    /// All zero, for the kernel to fill.
    pub fn zeroed() -> Self {
        GetSubvolInfo([0; SUBVOL_INFO_SIZE])
    }

    /// The info of subvolume `id`, from its root item and its link (none
    /// for the top level).
    pub fn of(id: u64, item: &RootItem, link: Option<&SubvolInfo>) -> Self {
        let mut b = [0u8; SUBVOL_INFO_SIZE];
        let put = |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut b, 0, id);
        if let Some(l) = link {
            put(&mut b, PARENT_ID, l.parent);
            put(&mut b, DIRID, l.dirid);
        }
        put(&mut b, GENERATION, item.generation);
        put(&mut b, FLAGS, item.flags);
        for (i, t) in [item.ctransid, item.otransid, item.stransid, item.rtransid]
            .into_iter()
            .enumerate()
        {
            put(&mut b, CTRANSID + 8 * i, t);
        }
        for (i, t) in [item.ctime, item.otime, item.stime, item.rtime]
            .into_iter()
            .enumerate()
        {
            let at = CTIME + 16 * i;
            put(&mut b, at, t.sec as u64);
            b[at + 8..at + 12].copy_from_slice(&t.nsec.to_le_bytes());
        }
        if let Some(l) = link {
            // NUL-terminated in 256 bytes; names are at most 255.
            let n = l.name.len().min(255);
            b[NAME..NAME + n].copy_from_slice(&l.name[..n]);
        }
        b[UUID..UUID + 16].copy_from_slice(&item.uuid);
        b[PARENT_UUID..PARENT_UUID + 16].copy_from_slice(&item.parent_uuid);
        b[RECEIVED_UUID..RECEIVED_UUID + 16].copy_from_slice(&item.received_uuid);
        GetSubvolInfo(b)
    }

    /// The bytes, as the ioctl passes them.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, for the ioctl to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }

    /// The UUID the subvolume was received from, if it was.
    pub fn received_uuid(&self) -> Option<[u8; 16]> {
        let u: [u8; 16] = self.0[RECEIVED_UUID..RECEIVED_UUID + 16]
            .try_into()
            .unwrap_or_default();
        Some(u).filter(|u| *u != [0; 16])
    }
}

/// What `BTRFS_IOC_SET_RECEIVED_SUBVOL` asks for: the sent subvolume's
/// UUID, its transid and time when sent.
#[derive(Debug, PartialEq, Eq)]
pub struct SetReceived {
    pub uuid: [u8; 16],
    pub stransid: u64,
    pub stime: Timespec,
}

// Offsets in the received args: UUID, stransid, rtransid, stime, rtime,
// flags, then reserved.
const R_STRANSID: usize = 16;
const R_RTRANSID: usize = 24;
const R_STIME: usize = 32;
const R_RTIME: usize = 48;

impl SetReceived {
    /// The request in `b` (`None` if it is too short).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b = b.get(..RECEIVED_ARGS_SIZE)?;
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        Some(SetReceived {
            uuid: b[..16].try_into().unwrap_or_default(),
            stransid: u64_at(R_STRANSID),
            stime: Timespec {
                sec: u64_at(R_STIME) as i64,
                nsec: u32::from_le_bytes(
                    b[R_STIME + 8..R_STIME + 12].try_into().unwrap_or_default(),
                ),
            },
        })
    }

    /// The reply: the request with the receive transid and time filled in,
    /// as the kernel hands them back.
    pub fn reply(request: &[u8], rtransid: u64, rtime: Timespec) -> Vec<u8> {
        let mut b = request
            .get(..RECEIVED_ARGS_SIZE)
            .unwrap_or_default()
            .to_vec();
        b.resize(RECEIVED_ARGS_SIZE, 0);
        b[R_RTRANSID..R_RTRANSID + 8].copy_from_slice(&rtransid.to_le_bytes());
        b[R_RTIME..R_RTIME + 8].copy_from_slice(&(rtime.sec as u64).to_le_bytes());
        b[R_RTIME + 8..R_RTIME + 12].copy_from_slice(&rtime.nsec.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ioctl numbers carry the sizes of the structures.
    #[test]
    fn numbers_encode_the_sizes() {
        assert_eq!(
            (BTRFS_IOC_GET_SUBVOL_INFO >> 16) & 0x3fff,
            SUBVOL_INFO_SIZE as u32
        );
        assert_eq!(
            (BTRFS_IOC_SET_RECEIVED_SUBVOL >> 16) & 0x3fff,
            RECEIVED_ARGS_SIZE as u32
        );
        assert_eq!(BTRFS_IOC_GET_SUBVOL_INFO & 0xff, 60);
        assert_eq!(BTRFS_IOC_SET_RECEIVED_SUBVOL & 0xff, 37);
    }

    #[test]
    fn received_requests_round_trip() {
        let mut b = [0u8; RECEIVED_ARGS_SIZE];
        b[..16].copy_from_slice(&[7; 16]);
        b[R_STRANSID..R_STRANSID + 8].copy_from_slice(&42u64.to_le_bytes());
        b[R_STIME..R_STIME + 8].copy_from_slice(&1000u64.to_le_bytes());
        b[R_STIME + 8..R_STIME + 12].copy_from_slice(&5u32.to_le_bytes());
        let r = SetReceived::decode(&b).unwrap();
        assert_eq!(
            r,
            SetReceived {
                uuid: [7; 16],
                stransid: 42,
                stime: Timespec { sec: 1000, nsec: 5 }
            }
        );
        let out = SetReceived::reply(&b, 9, Timespec { sec: 2000, nsec: 3 });
        assert_eq!(&out[..R_RTRANSID], &b[..R_RTRANSID]);
        assert_eq!(
            u64::from_le_bytes(out[R_RTRANSID..R_RTRANSID + 8].try_into().unwrap()),
            9
        );
        assert_eq!(
            u64::from_le_bytes(out[R_RTIME..R_RTIME + 8].try_into().unwrap()),
            2000
        );
        assert!(SetReceived::decode(&b[..100]).is_none());
    }
}

//! The btrfs ioctls that create, snapshot and delete subvolumes, answered
//! by the mount: `BTRFS_IOC_SUBVOL_CREATE`, `BTRFS_IOC_SNAP_CREATE(_V2)`
//! and `BTRFS_IOC_SNAP_DESTROY`, with the argument layouts of the kernel's
//! (`struct btrfs_ioctl_vol_args` and `_v2`, 4,096 bytes each, so FUSE
//! passes them as restricted ioctls). `ubtrfs subvolume` uses them on a
//! mount; btrfs-progs refuses a FUSE mount before it gets this far (it
//! checks the filesystem type `statfs` reports).
//!
//! A snapshot's source comes as a descriptor in the caller's process.
//! The mount takes that very file (`caller_access::pin`: `/proc/PID/fd`
//! reopened with `O_PATH`, checked against `/proc/PID/fdinfo` and the
//! caller's `mountinfo`), never a path: a lookup through the mount from a
//! thread serving it could wait for itself, and a path may lead elsewhere
//! by the time it is used.
//!
//! Who may send them is as in the kernel: anyone who may add a name to a
//! directory creates a subvolume there, a source's owner snapshots it
//! (checked by the kernel itself, see `caller_access`), and only root
//! deletes. Each is served on a thread of its own, which answers
//! after the kernel has dropped what it cached of the name: the kernel
//! takes the directory's lock for that, and a thread serving requests
//! must never wait for it (the lock's holder may be waiting for one).

use fuser::Errno;
use std::path::Path;

/// `_IOW(0x94, 1, struct btrfs_ioctl_vol_args)`.
pub const BTRFS_IOC_SNAP_CREATE: u32 = 0x5000_9401;
/// `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`.
pub const BTRFS_IOC_SUBVOL_CREATE: u32 = 0x5000_940e;
/// `_IOW(0x94, 15, struct btrfs_ioctl_vol_args)`.
pub const BTRFS_IOC_SNAP_DESTROY: u32 = 0x5000_940f;
/// `_IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)`.
pub const BTRFS_IOC_SNAP_CREATE_V2: u32 = 0x5000_9417;

/// Size of both argument structures.
pub const VOL_ARGS_SIZE: usize = 4096;
/// Where the name starts: after the descriptor (`vol_args`), or after the
/// descriptor, transid, flags and four reserved words (`vol_args_v2`).
const NAME_AT: usize = 8;
const NAME_AT_V2: usize = 56;
/// `BTRFS_SUBVOL_RDONLY` in `vol_args_v2.flags`.
pub const SUBVOL_RDONLY: u64 = 1 << 1;
/// Longest name in a directory.
const NAME_MAX: usize = 255;

/// A request decoded from its arguments.
#[derive(Debug, PartialEq, Eq)]
pub enum SubvolRequest {
    /// A new empty subvolume `name` in the directory.
    Create { name: Vec<u8> },
    /// A snapshot of the subvolume open as `fd` in the caller, as `name`.
    Snapshot {
        fd: i64,
        name: Vec<u8>,
        readonly: bool,
    },
    /// Delete the subvolume `name` in the directory.
    Destroy { name: Vec<u8> },
}

impl SubvolRequest {
    /// The name in the directory.
    pub fn name(&self) -> &[u8] {
        match self {
            SubvolRequest::Create { name }
            | SubvolRequest::Snapshot { name, .. }
            | SubvolRequest::Destroy { name } => name,
        }
    }
}

/// Decode `cmd`'s arguments; `None` if `cmd` is none of these ioctls.
pub fn decode(cmd: u32, args: &[u8]) -> Option<Result<SubvolRequest, Errno>> {
    let v2 = cmd == BTRFS_IOC_SNAP_CREATE_V2;
    if !matches!(
        cmd,
        BTRFS_IOC_SNAP_CREATE
            | BTRFS_IOC_SUBVOL_CREATE
            | BTRFS_IOC_SNAP_DESTROY
            | BTRFS_IOC_SNAP_CREATE_V2
    ) {
        return None;
    }
    Some((|| {
        if args.len() < VOL_ARGS_SIZE {
            return Err(Errno::EINVAL);
        }
        let word = |at: usize| u64::from_le_bytes(args[at..at + 8].try_into().unwrap_or_default());
        let name =
            name(&args[if v2 { NAME_AT_V2 } else { NAME_AT }..VOL_ARGS_SIZE]).map(<[u8]>::to_vec);
        let name = match name {
            // "." and ".." exist (a create's answer), but are no
            // subvolume to delete.
            Err(Errno::EEXIST) if cmd == BTRFS_IOC_SNAP_DESTROY => return Err(Errno::EINVAL),
            other => other?,
        };
        Ok(match cmd {
            BTRFS_IOC_SUBVOL_CREATE => SubvolRequest::Create { name },
            BTRFS_IOC_SNAP_DESTROY => SubvolRequest::Destroy { name },
            _ => {
                let flags = if v2 { word(16) } else { 0 };
                // Quota group inheritance and the rest are not kept here.
                if flags & !SUBVOL_RDONLY != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                SubvolRequest::Snapshot {
                    fd: word(0) as i64,
                    name,
                    readonly: flags & SUBVOL_RDONLY != 0,
                }
            }
        })
    })())
}

/// The NUL-terminated name of a `vol_args`: one path component.
fn name(field: &[u8]) -> Result<&[u8], Errno> {
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(Errno::ENAMETOOLONG)?;
    let name = &field[..end];
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name == b"." || name == b".." {
        return Err(Errno::EEXIST);
    }
    if name.is_empty() || name.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(name)
}

/// The arguments of a request, as a caller passes them.
pub fn encode(req: &SubvolRequest) -> Vec<u8> {
    let mut args = vec![0u8; VOL_ARGS_SIZE];
    let (at, name) = match req {
        SubvolRequest::Create { name } | SubvolRequest::Destroy { name } => (NAME_AT, name),
        SubvolRequest::Snapshot { fd, name, readonly } => {
            args[..8].copy_from_slice(&fd.to_le_bytes());
            if *readonly {
                args[16..24].copy_from_slice(&SUBVOL_RDONLY.to_le_bytes());
            }
            (NAME_AT_V2, name)
        }
    };
    let n = name.len().min(VOL_ARGS_SIZE - at - 1);
    args[at..at + n].copy_from_slice(&name[..n]);
    args
}

/// The ioctl number for a request ([`BTRFS_IOC_SNAP_CREATE_V2`] for
/// snapshots).
pub fn command(req: &SubvolRequest) -> u32 {
    match req {
        SubvolRequest::Create { .. } => BTRFS_IOC_SUBVOL_CREATE,
        SubvolRequest::Snapshot { .. } => BTRFS_IOC_SNAP_CREATE_V2,
        SubvolRequest::Destroy { .. } => BTRFS_IOC_SNAP_DESTROY,
    }
}

/// The device of the mount at `mountpoint` in this process's view (the
/// last one mounted there).
pub fn mount_device(mountpoint: &Path) -> Option<(u32, u32)> {
    crate::mountinfo::mount_at(mountpoint).ok()?.map(|m| m.dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_through_their_arguments() {
        for req in [
            SubvolRequest::Create {
                name: b"vol".to_vec(),
            },
            SubvolRequest::Destroy {
                name: b"old snap".to_vec(),
            },
            SubvolRequest::Snapshot {
                fd: 7,
                name: b"s".to_vec(),
                readonly: true,
            },
            SubvolRequest::Snapshot {
                fd: 3,
                name: b"t".to_vec(),
                readonly: false,
            },
        ] {
            let args = encode(&req);
            assert_eq!(args.len(), VOL_ARGS_SIZE);
            assert_eq!(decode(command(&req), &args), Some(Ok(req)));
        }
        assert_eq!(decode(0x9408, &[0; VOL_ARGS_SIZE]), None);
    }

    #[test]
    fn bad_names_and_flags_are_refused() {
        let with = |cmd: u32, at: usize, name: &[u8]| {
            let mut a = vec![0u8; VOL_ARGS_SIZE];
            a[at..at + name.len()].copy_from_slice(name);
            decode(cmd, &a).unwrap().map(|_| ())
        };
        for bad in [&b""[..], b"a/b"] {
            assert_eq!(
                with(BTRFS_IOC_SUBVOL_CREATE, NAME_AT, bad),
                Err(Errno::EINVAL)
            );
        }
        // As the kernel answers: those names exist, but are no subvolume.
        for bad in [&b"."[..], b".."] {
            assert_eq!(
                with(BTRFS_IOC_SUBVOL_CREATE, NAME_AT, bad),
                Err(Errno::EEXIST)
            );
            assert_eq!(
                with(BTRFS_IOC_SNAP_DESTROY, NAME_AT, bad),
                Err(Errno::EINVAL)
            );
        }
        assert_eq!(
            with(BTRFS_IOC_SUBVOL_CREATE, NAME_AT, &[b'x'; 256]),
            Err(Errno::ENAMETOOLONG)
        );
        // No NUL anywhere in the name field.
        let full = vec![b'x'; VOL_ARGS_SIZE];
        assert_eq!(
            decode(BTRFS_IOC_SNAP_DESTROY, &full),
            Some(Err(Errno::ENAMETOOLONG))
        );
        assert_eq!(
            decode(BTRFS_IOC_SNAP_DESTROY, &[0; 100]),
            Some(Err(Errno::EINVAL))
        );
        // Quota group inheritance (flag 1 << 2) is not supported.
        let mut a = encode(&SubvolRequest::Snapshot {
            fd: 1,
            name: b"s".to_vec(),
            readonly: false,
        });
        a[16] = 4;
        assert_eq!(
            decode(BTRFS_IOC_SNAP_CREATE_V2, &a),
            Some(Err(Errno::EOPNOTSUPP))
        );
    }
}

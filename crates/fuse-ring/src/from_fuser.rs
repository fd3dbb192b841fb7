//! Wire forms of `fuser`'s types, so one filesystem can answer both
//! through `fuser` and through the ring.

use crate::abi::{Attr, Time};
use fuser::{FileAttr, FileType};
use std::time::{SystemTime, UNIX_EPOCH};

/// The `S_IFMT` bits of a file type.
pub fn mode_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// The `d_type` of a directory entry (`S_IFMT` bits shifted down).
pub fn dirent_type(kind: FileType) -> u32 {
    mode_bits(kind) >> 12
}

/// A time as seconds and nanoseconds since the epoch.
pub fn time(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        },
        Err(e) => {
            // Before 1970: whole seconds down, nanoseconds up.
            let d = e.duration();
            let (secs, nanos) = (d.as_secs() as i64, d.subsec_nanos());
            if nanos == 0 {
                Time {
                    secs: -secs,
                    nanos: 0,
                }
            } else {
                Time {
                    secs: -secs - 1,
                    nanos: 1_000_000_000 - nanos,
                }
            }
        }
    }
}

/// `fuse_attr` of a `fuser` attribute set.
pub fn attr(a: &FileAttr) -> Attr {
    Attr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        btime: time(a.crtime),
        mode: mode_bits(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        // fuser's `flags` are BSD file flags (macOS); on Linux the wire
        // field means FUSE_ATTR_SUBMOUNT / DAX, which fuser leaves 0.
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_before_and_after_the_epoch() {
        let after = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(time(after), Time { secs: 5, nanos: 7 });
        let before = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(
            time(before),
            Time {
                secs: -2,
                nanos: 750_000_000
            }
        );
        assert_eq!(
            time(UNIX_EPOCH - Duration::from_secs(3)),
            Time { secs: -3, nanos: 0 }
        );
    }

    #[test]
    fn modes() {
        assert_eq!(mode_bits(FileType::Directory) | 0o755, 0o040755);
        assert_eq!(dirent_type(FileType::RegularFile), 8);
        assert_eq!(dirent_type(FileType::Directory), 4);
    }
}

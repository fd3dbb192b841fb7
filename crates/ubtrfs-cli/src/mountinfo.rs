//! The mount table of a process (`/proc/PID/mountinfo`), read as bytes: a
//! mount point need not be UTF-8, and one that is not must not hide the
//! others.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of a mountinfo file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount's id (`mnt_id` in `/proc/PID/fdinfo`).
    pub id: u64,
    /// Device number of the mounted filesystem (`major`, `minor`).
    pub dev: (u32, u32),
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type, such as `fuse.ubtrfs`.
    pub fstype: String,
}

/// The mounts listed in `file` (a mountinfo file), in mount order.
pub fn read(file: &Path) -> std::io::Result<Vec<MountEntry>> {
    let text = std::fs::read(file)?;
    Ok(text.split(|&b| b == b'\n').filter_map(parse_line).collect())
}

/// The mounts of this process's namespace, in mount order.
pub fn mounts() -> anyhow::Result<Vec<MountEntry>> {
    use anyhow::Context;
    read(Path::new("/proc/self/mountinfo")).context("cannot read /proc/self/mountinfo")
}

/// The newest mount on `mp` (the one a path lookup reaches), if any.
pub fn mount_at(mp: &Path) -> anyhow::Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == mp))
}

fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let sep = line.windows(3).position(|w| w == b" - ")?;
    let (before, after) = (&line[..sep], &line[sep + 3..]);
    let f: Vec<&[u8]> = before.split(|&b| b == b' ').collect();
    let text = |b: &[u8]| std::str::from_utf8(b).ok().map(str::to_owned);
    let dev = text(f.get(2)?)?;
    let (major, minor) = dev.split_once(':')?;
    Some(MountEntry {
        id: text(f.first()?)?.parse().ok()?,
        dev: (major.parse().ok()?, minor.parse().ok()?),
        mount_point: PathBuf::from(OsStr::from_bytes(&unescape(f.get(4)?))),
        fstype: text(after.split(|&b| b == b' ').next()?)?,
    })
}

/// A mountinfo path: space, tab, newline and backslash come as `\ooo`.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let l = b"36 35 0:52 / /mnt/with\\040space rw,nosuid,nodev shared:1 - fuse.ubtrfs /dev/loop0 rw,user_id=0";
        let m = parse_line(l).unwrap();
        assert_eq!(m.id, 36);
        assert_eq!(m.dev, (0, 52));
        assert_eq!(m.mount_point, Path::new("/mnt/with space"));
        assert_eq!(m.fstype, "fuse.ubtrfs");
        assert!(parse_line(b"garbage").is_none());
        assert_eq!(unescape(b"a\\134b\\011"), b"a\\b\t");
        assert_eq!(unescape(b"end\\01"), b"end\\01");
        // A mount point that is not UTF-8, beside one that is.
        let two = b"40 1 0:60 / /t\xff rw - tmpfs tmpfs rw\n41 1 0:61 / /u rw - fuse.ubtrfs x rw\n";
        let all: Vec<_> = two.split(|&b| b == b'\n').filter_map(parse_line).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].mount_point.as_os_str().as_bytes(), b"/t\xff");
        assert_eq!(all[1].dev, (0, 61));
    }
}

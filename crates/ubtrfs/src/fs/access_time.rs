//! Access times: when a read or a listing moves an inode's atime (the
//! `relatime`, `strictatime` and `noatime` mount options), and the moves
//! waiting for the next commit.
//!
//! An access only notes the new time in memory; reading the inode shows
//! it, and the next commit writes it. The kernel's btrfs does the same in
//! effect: an atime update dirties the in-memory inode, written at the
//! commit. Writing the item at every first read of a file would take the
//! change lock (and copy a leaf) on a path that otherwise only reads.

use super::inode::{InodeId, Stat};
use super::open::Filesystem;
use crate::format::consts::INODE_NOATIME;
use crate::format::items::{InodeItem, Timespec};
use crate::transaction::Writer;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// When an access (a read, a listing) moves an inode's access time: the
/// kernel's mount options for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeUpdate {
    /// `relatime`, the default: only when the access time is not after
    /// the last change of data or attributes, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: on every access.
    Always,
    /// `noatime`: never.
    Never,
}

impl AtimeUpdate {
    /// Whether an access now to an inode with attributes `st` moves its
    /// access time under this rule (never with the no-atime flag): what
    /// [`Filesystem::access_moves_atime`] says, from attributes at hand.
    pub fn moves(self, st: &Stat) -> bool {
        self.moves_times(st.flags, st.atime, st.mtime, st.ctime)
    }

    /// [`Self::moves`] from an inode's flags and times.
    fn moves_times(self, flags: u64, atime: Timespec, mtime: Timespec, ctime: Timespec) -> bool {
        flags & INODE_NOATIME == 0 && atime_moves(self, atime, mtime, ctime, Timespec::now())
    }
}

/// Whether an access at `now` moves access time `atime` of an inode last
/// modified at `mtime` and changed at `ctime`, under `rule`.
fn atime_moves(
    rule: AtimeUpdate,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    now: Timespec,
) -> bool {
    let key = |t: Timespec| (t.sec, t.nsec);
    let due = match rule {
        AtimeUpdate::Never => false,
        AtimeUpdate::Always => true,
        AtimeUpdate::Relative => {
            key(mtime) >= key(atime)
                || key(ctime) >= key(atime)
                || now.sec.saturating_sub(atime.sec) >= 24 * 60 * 60
        }
    };
    due && key(atime) != key(now)
}

/// Access times noted since the last commit, not yet in the inode items.
#[derive(Default)]
pub(crate) struct PendingAtimes {
    /// Whether `times` may hold anything: reading an inode, which happens
    /// far more often than an access time moves, looks no further when not.
    any: AtomicBool,
    times: Mutex<HashMap<InodeId, Timespec>>,
}

impl PendingAtimes {
    fn times(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, Timespec>> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self, id: InodeId, at: Timespec) {
        let mut times = self.times();
        times.insert(id, at);
        self.any.store(true, Ordering::Release);
    }

    /// Show the access time noted for `id`, if any, in its item `item`.
    pub(crate) fn apply(&self, id: InodeId, item: &mut InodeItem) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        if let Some(&at) = self.times().get(&id) {
            item.atime = at;
        }
    }

    /// The item of `id` was written (with any noted time shown in it, as
    /// every write starts from [`Filesystem::inode_item`]) or deleted.
    pub(crate) fn forget(&self, id: InodeId) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut times = self.times();
        times.remove(&id);
        if times.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    fn has(&self, id: InodeId) -> bool {
        self.any.load(Ordering::Acquire) && self.times().contains_key(&id)
    }

    fn noted(&self) -> Vec<InodeId> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut ids: Vec<InodeId> = self.times().keys().copied().collect();
        // In key order: neighbouring inodes share leaves.
        ids.sort_unstable();
        ids
    }
}

impl Filesystem {
    /// Inode `id` was read (or listed): move its access time as `rule`
    /// says, unless the filesystem or the subvolume is read-only or the
    /// inode has the no-atime flag (`chattr +A`). Returns whether it
    /// moved. The new time shows at once and is written at the next
    /// commit. The kernel does this on each read; a FUSE mount, which does
    /// not see reads the page cache answers, does it when a file is opened
    /// for reading.
    ///
    /// Takes no change lock. A change of the same inode at the same time
    /// from another thread may lose the new access time (never anything
    /// else); the mount runs changes apart from reads.
    pub fn note_access(&self, id: InodeId, rule: AtimeUpdate) -> Result<bool> {
        if !self.access_moves_atime(id, rule)? || self.subvolume_readonly(id.subvol)? {
            return Ok(false);
        }
        self.pending_atimes.note(id, Timespec::now());
        Ok(true)
    }

    /// Whether an access to `id` now would move its access time
    /// ([`Filesystem::note_access`]); changes nothing.
    pub fn access_moves_atime(&self, id: InodeId, rule: AtimeUpdate) -> Result<bool> {
        if rule == AtimeUpdate::Never || self.writer.is_none() || id.is_placeholder() {
            return Ok(false);
        }
        let item = self.inode_item(id)?;
        Ok(rule.moves_times(item.flags, item.atime, item.mtime, item.ctime))
    }

    /// Write the access times noted since the last commit into their
    /// inode items (the commit calls this first). Inodes deleted since,
    /// and subvolumes deleted or made read-only since, are passed over.
    /// Out of metadata space, the times not written yet are dropped: an
    /// access time is never worth failing a commit (the kernel skips an
    /// update it has no room for too).
    pub(crate) fn write_pending_atimes(&self, w: &mut Writer) -> Result<()> {
        let noted = self.pending_atimes.noted();
        let written = noted
            .iter()
            .try_for_each(|&id| self.write_pending_atime(w, id));
        match written {
            Err(Error::NoSpace(_)) => {
                for &id in noted.iter() {
                    self.pending_atimes.forget(id);
                }
                Ok(())
            }
            r => r,
        }
    }

    /// Write the access time noted for `id`, if any, into its item: what
    /// an fsync of it logs then, as the kernel's does. `NoSpace` when
    /// metadata is down to twice the reserve, which the rest of a commit
    /// may need (nor is an access time worth it).
    pub(crate) fn write_pending_atime(&self, w: &mut Writer, id: InodeId) -> Result<()> {
        if !self.pending_atimes.has(id) {
            return Ok(());
        }
        if w.blocks.alloc.free_bytes(crate::alloc::SpaceKind::Metadata)
            < 2 * self.metadata_reserve()
        {
            return Err(Error::NoSpace("metadata reserve".into()));
        }
        let item = match self.inode_item(id) {
            Ok(item) => item,
            Err(Error::NotFound(_)) => {
                self.pending_atimes.forget(id);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if w.check_writable(id.subvol).is_err() {
            self.pending_atimes.forget(id);
            return Ok(());
        }
        // An access is no new version of the inode (its sequence stays).
        let item = InodeItem {
            transid: w.blocks.transid,
            ..item
        };
        self.put_inode(w, id, &item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fs::TestFs;

    fn ts(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    #[test]
    fn relatime_moves_only_behind_a_change_or_a_day_old() {
        let r = AtimeUpdate::Relative;
        let now = ts(1_000);
        // Read after a write: moves.
        assert!(atime_moves(r, ts(10), ts(20), ts(20), now));
        // Read again: not.
        assert!(!atime_moves(r, ts(30), ts(20), ts(20), now));
        // A day later: moves.
        assert!(atime_moves(r, ts(30), ts(20), ts(20), ts(30 + 86_400)));
        assert!(!atime_moves(
            AtimeUpdate::Never,
            ts(10),
            ts(20),
            ts(20),
            now
        ));
        assert!(atime_moves(
            AtimeUpdate::Always,
            ts(30),
            ts(20),
            ts(20),
            now
        ));
        // Never to the time it already has.
        assert!(!atime_moves(AtimeUpdate::Always, now, ts(20), ts(20), now));
    }

    /// An fsync logs a noted access time, as the kernel logs the inode
    /// with it: after a crash (no commit) the log's replay brings it back.
    #[test]
    fn fsync_logs_a_noted_access_time() {
        let mut t = TestFs::new();
        let f = t.file(b"f", b"data");
        t.fs().commit().unwrap();
        let before = t.fs().stat(f).unwrap().atime;
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(t.fs().note_access(f, AtimeUpdate::Always).unwrap());
        let noted = t.fs().stat(f).unwrap().atime;
        assert_ne!(noted, before);
        t.fs().fsync(f, false).unwrap();
        t.reopen_uncommitted().unwrap();
        assert_eq!(t.fs().stat(f).unwrap().atime, noted);
    }

    /// A noted access time shows at once, is written by the next commit
    /// (reopening finds it), and never outlives an explicit change.
    #[test]
    fn noted_access_times_show_at_once_and_reach_the_disk_at_commit() {
        let mut t = TestFs::new();
        let (f, g) = (t.file(b"f", b"data"), t.file(b"g", b"data"));
        let fs = t.fs();
        fs.commit().unwrap();
        let before = fs.stat(f).unwrap().atime;
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(fs.note_access(f, AtimeUpdate::Always).unwrap());
        let noted = fs.stat(f).unwrap().atime;
        assert!((noted.sec, noted.nsec) > (before.sec, before.nsec));
        // Nothing is dirty but the noted time, and the commit writes it.
        fs.commit().unwrap();
        assert_eq!(fs.stat(f).unwrap().atime, noted);
        t.reopen().unwrap();
        let fs = t.fs();
        assert_eq!(fs.stat(f).unwrap().atime, noted);

        // An explicit time set after the access wins over the noted one.
        assert!(fs.note_access(g, AtimeUpdate::Always).unwrap());
        let set = ts(12345);
        fs.setattr(
            g,
            crate::fs::SetAttr {
                atime: Some(set),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(fs.stat(g).unwrap().atime, set);
        fs.commit().unwrap();
        assert_eq!(fs.stat(g).unwrap().atime, set);
        t.reopen().unwrap();
        assert_eq!(t.fs().stat(g).unwrap().atime, set);

        // A snapshot takes a noted time with it (its commit writes it);
        // nothing moves in a read-only snapshot.
        let fs = t.fs();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(fs.note_access(f, AtimeUpdate::Always).unwrap());
        let noted = fs.stat(f).unwrap().atime;
        let snap = fs
            .create_snapshot(f.subvol, fs.root(), b"snap", true)
            .unwrap();
        let in_snap = InodeId {
            subvol: snap.subvol,
            ino: f.ino,
        };
        assert_eq!(fs.stat(in_snap).unwrap().atime, noted);
        assert!(!fs.note_access(in_snap, AtimeUpdate::Always).unwrap());
        assert_eq!(fs.stat(in_snap).unwrap().atime, noted);
    }
}

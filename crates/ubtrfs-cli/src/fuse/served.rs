//! The filesystem being served, shared by the FUSE handlers, the commit
//! timer and the mount command: one lock that keeps readers out of a
//! running change, the transaction commits (periodic, on fsync, and the
//! last one at unmount), what happens when a commit fails, and the
//! notifications that tell the kernel what changed behind its cache.

use fuser::{Errno, INodeNo, Notifier};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use ubtrfs::fs::{Filesystem, InodeId};
use ubtrfs::tree_log::{LogOnly, Synced};

/// A [`Filesystem`] and the state around it while it is mounted.
pub struct Served {
    fs: Filesystem,
    /// Read handlers hold it shared, write handlers and commits exclusive:
    /// the library's readers must not see a change half made, inside the
    /// running transaction.
    lock: RwLock<()>,
    /// Opened read-write (else every change is refused with `EROFS`).
    writable: bool,
    /// No more changes are taken: the last commit ran, or a commit failed.
    /// Only changed under the exclusive lock.
    closed: AtomicBool,
    /// Why a commit failed, once one has. Like the kernel's btrfs after an
    /// aborted transaction, the filesystem then refuses every change: what
    /// the failed transaction held is lost, what was committed before is
    /// intact on disk.
    failure: Mutex<Option<String>>,
    /// Set, with the condition variable notified, to stop the commit timer.
    stop: (Mutex<bool>, Condvar),
    timer: Mutex<Option<JoinHandle<()>>>,
    /// The outcome of the last commit, made once by [`Served::finish`].
    last: OnceLock<Result<(), String>>,
    /// Where the kernel is told of changes it did not make itself; set
    /// once the session is up.
    notifier: OnceLock<Notifier>,
    /// Files whose data changed since the last commit: their byte counts
    /// settle when the commit writes their data back.
    touched: Mutex<HashSet<u64>>,
    /// Held by an fsync from start to end (see `fsync`).
    fsync_turn: Mutex<()>,
}

impl Served {
    /// Serve `fs`, opened read-write if `writable`.
    pub fn new(fs: Filesystem, writable: bool) -> Self {
        Served {
            fs,
            lock: RwLock::new(()),
            writable,
            closed: AtomicBool::new(false),
            failure: Mutex::new(None),
            stop: (Mutex::new(false), Condvar::new()),
            timer: Mutex::new(None),
            last: OnceLock::new(),
            notifier: OnceLock::new(),
            touched: Mutex::new(HashSet::new()),
            fsync_turn: Mutex::new(()),
        }
    }

    /// Start telling the kernel about changes through `n`.
    pub fn set_notifier(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// Record that the data of FUSE inode `ino` changed: the next commit
    /// drops the kernel's cached attributes of it.
    pub fn note_changed(&self, ino: INodeNo) {
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino.0);
    }

    /// Make the kernel forget the attributes it caches for `ino` (not its
    /// pages). Never waits for a request the caller might be serving.
    pub fn invalidate_attrs(&self, ino: INodeNo) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        // ENOENT: the kernel holds nothing of it any more.
        if let Err(e) = n.inval_inode(ino, -1, 0) {
            tracing::trace!("invalidating inode {}: {e}", ino.0);
        }
    }

    /// Make the kernel drop its cached pages of `len` bytes at `offset` of
    /// `ino` (and their mappings). It waits for those pages' writeback:
    /// never from a thread that serves requests.
    pub fn invalidate_pages(&self, ino: INodeNo, offset: u64, len: u64) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        let (off, len) = (offset.min(i64::MAX as u64), len.min(i64::MAX as u64));
        if let Err(e) = n.inval_inode(ino, off as i64, len as i64) {
            tracing::trace!("invalidating pages of inode {}: {e}", ino.0);
        }
    }

    /// Make the kernel forget what it caches of `name` in directory `dir`
    /// (a dentry, or its absence). Never waits for a request the caller
    /// might be serving.
    pub fn invalidate_entry(&self, dir: INodeNo, name: &[u8]) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        use std::os::unix::ffi::OsStrExt;
        if let Err(e) = n.inval_entry(dir, std::ffi::OsStr::from_bytes(name)) {
            tracing::trace!("invalidating entry in {}: {e}", dir.0);
        }
    }

    /// The filesystem, without the lock: only for what never changes
    /// (the superblock, the geometry, the root's identity), for waits
    /// that must not hold it (write throttling), and for the counts of
    /// open files, which have a lock of their own.
    pub fn fs_unlocked(&self) -> &Filesystem {
        &self.fs
    }

    /// Whether changes are accepted at all (a read-write mount).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Whether changes are still taken: writable, and neither unmounted
    /// (the last commit ran) nor closed by a failed commit.
    pub fn takes_changes(&self) -> bool {
        self.writable && !self.closed.load(Ordering::Acquire)
    }

    /// Run a reading operation, shut out of any running change.
    pub fn read<T>(&self, f: impl FnOnce(&Filesystem) -> T) -> T {
        let _shared = self.lock.read().unwrap_or_else(|e| e.into_inner());
        f(&self.fs)
    }

    /// Run a changing operation alone. `EROFS` on a read-only mount, after
    /// the last commit, and after a failed commit.
    pub fn write<T>(&self, f: impl FnOnce(&Filesystem) -> Result<T, Errno>) -> Result<T, Errno> {
        if !self.writable {
            return Err(Errno::EROFS);
        }
        let _alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return Err(Errno::EROFS);
        }
        let r = f(&self.fs);
        if r.is_err() {
            self.close_if_aborted();
        }
        r
    }

    /// A change that failed half-way stopped the library taking changes
    /// ([`Filesystem::aborted`]): log it once and close the filesystem to
    /// changes, as a failed commit does. Called under the exclusive lock.
    fn close_if_aborted(&self) {
        if let Some(why) = self.fs.aborted()
            && !self.closed.load(Ordering::Acquire)
        {
            tracing::error!(
                "{why}: the filesystem takes no more changes, and those since the last commit are lost"
            );
            self.fail(why.to_string());
        }
    }

    /// [`Served::write`] for a change the library commits itself (a
    /// snapshot, a subvolume's deletion): an error the library marks as
    /// met after the change began ([`ubtrfs::Error::AfterChange`]) may
    /// have stopped it, or its commit, half-way, and closes the filesystem
    /// to changes as a failed [`Served::commit`] does; any other is a
    /// refusal (a name that exists, no space left before anything
    /// changed, ...).
    pub fn write_committing<T>(
        &self,
        why: &str,
        f: impl FnOnce(&Filesystem) -> Result<T, ubtrfs::Error>,
    ) -> Result<T, Errno> {
        if !self.writable {
            return Err(Errno::EROFS);
        }
        let alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
        if let Some(answer) = self.closed_answer() {
            return answer.and(Err(Errno::EROFS));
        }
        let done = f(&self.fs).map_err(|e| {
            if e.is_after_change() {
                // Stopped in its changes or in a commit, as a failed
                // `commit` would have.
                self.failed(why, &e)
            } else {
                // Refused before anything changed.
                super::errno(e)
            }
        })?;
        self.committed(alone);
        Ok(done)
    }

    /// fsync of inode `id` (FUSE inode `ino`): logged when the library
    /// can, else the running transaction is committed. A failure is
    /// handled as a failed commit. Readers are shut out only while the
    /// file's data is written back; they go on while the log is written
    /// (changes wait), and every change goes on while the device makes
    /// it durable.
    pub fn fsync(&self, id: InodeId, ino: INodeNo, datasync: bool) -> Result<(), Errno> {
        if !self.writable {
            return Ok(());
        }
        // The previous fsync's turn is waited for here, not with every
        // other change shut out.
        let _turn = self.fsync_turn.lock().unwrap_or_else(|e| e.into_inner());
        let (before, taken) = {
            let alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
            if let Some(answer) = self.closed_answer() {
                return answer;
            }
            let before = self.fs.stat(id).map(|s| s.nbytes).ok();
            match self.fs.fsync_prepare(id) {
                Ok(()) => {}
                Err(ubtrfs::Error::NotFound(_)) => return Err(Errno::ENOENT),
                // Out of metadata space, say: the whole fsync, which
                // commits when it cannot log, decides.
                Err(_) => {
                    drop(alone);
                    return self.fsync_alone(id, ino, datasync, before);
                }
            }
            // This file's data is written back now; what is written from
            // here on is not, and stays noted for the next commit.
            let taken = self.touched().take(&ino.0);
            drop(alone);
            (before, taken)
        };
        let shared = self.lock.read().unwrap_or_else(|e| e.into_inner());
        if let Some(answer) = self.closed_answer() {
            return answer;
        }
        let attempt = self.fs.fsync_log(id, datasync);
        let after = self.fs.stat(id).map(|s| s.nbytes).ok();
        drop(shared);
        match attempt {
            Ok(LogOnly::Started(pending)) => self.fsync_wait(pending, before == after, taken),
            // A change came in between: do it all with readers shut out.
            Ok(LogOnly::NeedsWriteback) => {
                self.touched().extend(taken);
                self.fsync_alone(id, ino, datasync, before)
            }
            Ok(LogOnly::NeedsCommit) => {
                self.touched().extend(taken);
                self.commit("fsync")
            }
            Err(ubtrfs::Error::NotFound(_)) => Err(Errno::ENOENT),
            Err(e) => {
                let _alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
                Err(self.failed("fsync", &e))
            }
        }
    }

    /// [`Served::fsync`] with readers shut out until the log is written;
    /// the caller holds the fsync turn. `before`: the file's byte count
    /// when the fsync began.
    fn fsync_alone(
        &self,
        id: InodeId,
        ino: INodeNo,
        datasync: bool,
        before: Option<u64>,
    ) -> Result<(), Errno> {
        let alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
        if let Some(answer) = self.closed_answer() {
            return answer;
        }
        let started = (|| {
            let pending = self.fs.fsync_start(id, datasync)?;
            let after = self.fs.stat(id).map(|s| s.nbytes).ok();
            Ok((pending, before == after))
        })();
        let (pending, same_size) = match started {
            Ok(p) => p,
            Err(ubtrfs::Error::NotFound(_)) => return Err(Errno::ENOENT),
            Err(e) => return Err(self.failed("fsync", &e)),
        };
        let taken = self.touched().take(&ino.0);
        drop(alone);
        self.fsync_wait(pending, same_size, taken)
    }

    /// Wait for the device to make a started fsync durable, then drop
    /// what the kernel caches of the files whose data went to disk
    /// (`taken`: this file, if its data changed since the last commit).
    fn fsync_wait(
        &self,
        pending: ubtrfs::tree_log::PendingSync<'_>,
        same_size: bool,
        taken: Option<u64>,
    ) -> Result<(), Errno> {
        let how = match pending.wait_for_device() {
            // The kernel's cached attributes of the file go stale only if
            // writing its data back changed its byte count (an overwrite in
            // place does not): else keep them, and spare the next write a
            // GETATTR and a GETXATTR.
            Ok(Some(Synced::Logged)) if same_size => Synced::Nothing,
            Ok(Some(how)) => how,
            // The log could not be made durable: a commit does it all,
            // alone like any other.
            Ok(None) => {
                self.touched().extend(taken);
                return self.commit("fsync");
            }
            Err(e) => {
                let _alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
                return Err(self.failed("fsync", &e));
            }
        };
        tracing::debug!("fsync: {how:?}");
        let stale: Vec<u64> = match how {
            Synced::Logged => taken.into_iter().collect(),
            Synced::Nothing => {
                self.touched().extend(taken);
                Vec::new()
            }
            Synced::Committed => {
                let mut t = self.touched();
                t.extend(taken);
                std::mem::take(&mut *t).into_iter().collect()
            }
        };
        for ino in stale {
            self.invalidate_attrs(INodeNo(ino));
        }
        Ok(())
    }

    /// What a commit or fsync answers once the filesystem takes no more
    /// changes: nothing to do after the last commit, `EIO` after a failed
    /// one. `None` while it is open.
    fn closed_answer(&self) -> Option<Result<(), Errno>> {
        if !self.closed.load(Ordering::Acquire) {
            return None;
        }
        Some(match self.failure() {
            Some(_) => Err(Errno::EIO),
            None => Ok(()),
        })
    }

    fn touched(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.touched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Log a failed commit or fsync and close the filesystem to changes;
    /// called under the exclusive lock.
    fn failed(&self, why: &str, e: &ubtrfs::Error) -> Errno {
        let msg = e.with_causes();
        tracing::error!(
            "{why} failed: {msg}; the filesystem takes no more changes, and those since the last commit are lost"
        );
        self.fail(msg);
        Errno::EIO
    }

    /// Commit the running transaction (`why` is for the log). A read-only
    /// mount has nothing to commit. A failure is logged, closes the
    /// filesystem to changes and answers `EIO`. Afterwards the kernel's
    /// cached attributes of the files whose data went to disk are dropped.
    pub fn commit(&self, why: &str) -> Result<(), Errno> {
        if !self.writable {
            return Ok(());
        }
        let alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
        if let Some(answer) = self.closed_answer() {
            return answer;
        }
        if let Err(e) = self.fs.commit() {
            return Err(self.failed(&format!("{why} commit"), &e));
        }
        tracing::debug!("{why} commit");
        self.committed(alone);
        Ok(())
    }

    /// After a commit, with the exclusive lock `alone`: the kernel's
    /// cached attributes of the files whose data went to disk are dropped
    /// (once the lock is let go).
    fn committed(&self, alone: std::sync::RwLockWriteGuard<'_, ()>) {
        let touched: Vec<u64> = std::mem::take(&mut *self.touched()).into_iter().collect();
        drop(alone);
        for ino in touched {
            self.invalidate_attrs(INodeNo(ino));
        }
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record a failed commit; called under the exclusive lock.
    fn fail(&self, msg: String) {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(msg);
        self.closed.store(true, Ordering::Release);
    }

    /// Commit every `interval` from a thread of its own, until
    /// [`Served::finish`]. Nothing to do on a read-only mount.
    pub fn start_commit_timer(self: &Arc<Self>, interval: Duration) -> std::io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        let me = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("commit".into())
            .spawn(move || me.commit_loop(interval))?;
        *self.timer.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(())
    }

    fn commit_loop(&self, interval: Duration) {
        let (stopped, wake) = &self.stop;
        let mut stop = stopped.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            stop = wake
                .wait_timeout_while(stop, interval, |s| !*s)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if *stop {
                return;
            }
            drop(stop);
            // A failure is logged and closes the filesystem; the timer goes
            // on (its commits then answer at once).
            let _ = self.commit("periodic");
            stop = stopped.lock().unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The last commit: stop the timer, commit what is left and take no
    /// more changes. Runs once; later calls (from the FUSE `destroy` and
    /// from the mount command after the session ends, or a second signal)
    /// wait for that one and return its outcome. An error names what
    /// failed; the changes since the last successful commit are then lost.
    pub fn finish(&self) -> Result<(), String> {
        self.last
            .get_or_init(|| {
                {
                    let (stopped, wake) = &self.stop;
                    *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
                    wake.notify_all();
                }
                let timer = self.timer.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(t) = timer
                    && t.join().is_err()
                {
                    tracing::error!("the commit timer thread panicked");
                }
                if !self.writable {
                    return Ok(());
                }
                let _alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
                if let Some(why) = self.failure() {
                    return Err(format!(
                        "an earlier commit failed ({why}); changes made after the last successful commit are lost"
                    ));
                }
                self.closed.store(true, Ordering::Release);
                match self.fs.commit() {
                    Ok(()) => {
                        tracing::debug!("committed (unmount)");
                        Ok(())
                    }
                    Err(e) => {
                        let msg = e.with_causes();
                        self.fail(msg.clone());
                        Err(format!(
                            "the final commit failed: {msg}; changes made after the last successful commit are lost"
                        ))
                    }
                }
            })
            .clone()
    }
}

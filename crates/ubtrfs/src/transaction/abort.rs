//! Transaction abort: a change that fails half-way stops the filesystem
//! taking changes, as the kernel's transaction abort turns it read-only.
//!
//! The running transaction lives in memory until a commit writes it. An
//! operation that fails before it changed anything (a name that exists, no
//! space at its start) leaves it whole, and the filesystem goes on. One
//! that fails after changing some trees and not others (an inode item
//! without its name; a commit stopped between trees) leaves it half
//! changed: committing that would write a broken filesystem, and going on
//! would meet items that are not where they should be. Then nothing more
//! is taken, ever, by this open filesystem: what the last commit wrote is
//! what is on disk, and opening it again starts from there.
//!
//! Whole and half are told apart by counting edits (leaf changes and
//! reference changes, see [`note_edit`]) on the thread doing the change:
//! an operation that fails with no edit since the state was last whole
//! changed nothing.

use crate::fs::Filesystem;
use crate::{Error, Result};
use std::cell::Cell;

thread_local! {
    /// Edits this thread made to the running transaction.
    static EDITS: Cell<u64> = const { Cell::new(0) };
    /// [`EDITS`] when this thread last left the transaction whole.
    static WHOLE_AT: Cell<u64> = const { Cell::new(0) };
    /// How many [`Filesystem::change`]s this thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Tests: fail the first tree change after this many more edits.
    #[cfg(test)]
    static FAIL_AFTER: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The running transaction was changed (a leaf's items, a reference).
pub(crate) fn note_edit() {
    EDITS.with(|e| e.set(e.get() + 1));
}

/// Whether this thread's edits since the state was last whole are none.
pub(crate) fn is_whole() -> bool {
    EDITS.with(|e| e.get()) == WHOLE_AT.with(|w| w.get())
}

/// The running transaction is whole again: a commit wrote it, or an
/// operation finished.
pub(crate) fn whole() {
    WHOLE_AT.with(|w| w.set(EDITS.with(|e| e.get())));
}

/// The operation running on this thread is whole at this point; what it
/// does next is work that may fail on its own (a write's data taken and
/// its size set, before it hands dirty data on). Only for the outermost
/// operation: inside another, that one's state is not known here.
pub(crate) fn op_whole() {
    if DEPTH.with(|d| d.get()) == 1 {
        whole();
    }
}

/// Run `f`, a change complete in itself (a chunk added, a file's dirty
/// data written back): if the transaction was whole before it, it is
/// whole again once `f` succeeds, even inside a larger operation. If `f`
/// fails after changing something, its error is marked
/// [`Error::AfterChange`], so no caller takes it for a plain refusal
/// (say, an ENOSPC it would go on after). One that fails before it
/// changed anything, or after a commit wrote all it changed, is a plain
/// refusal, whatever came before it.
pub(crate) fn unit<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let was_whole = is_whole();
    let before = EDITS.with(|e| e.get());
    match f() {
        Ok(v) => {
            if was_whole {
                whole();
            }
            Ok(v)
        }
        // Changed by `f` and not committed since (a commit inside `f`
        // leaves the state whole).
        Err(e) if !is_whole() && EDITS.with(|e| e.get()) != before => Err(e.after_change()),
        Err(e) => Err(e),
    }
}

/// Tests: the first tree change after `edits` more edits fails, as a read
/// error in the middle of an operation would.
#[cfg(test)]
pub(crate) fn fail_after(edits: u64) {
    FAIL_AFTER.with(|f| f.set(Some(EDITS.with(|e| e.get()) + edits)));
}

/// Tests: the fault [`fail_after`] armed, when its time has come.
#[cfg(test)]
pub(crate) fn injected_fault() -> Result<()> {
    let due = FAIL_AFTER.with(|f| f.get());
    match due {
        Some(at) if EDITS.with(|e| e.get()) >= at => {
            FAIL_AFTER.with(|f| f.set(None));
            Err(Error::Io {
                path: "injected".into(),
                source: std::io::Error::other("injected fault"),
            })
        }
        _ => Ok(()),
    }
}

/// The depth of [`Filesystem::change`]s a thread is in, put back however
/// the change ends. A panic (which a server may catch and survive) in
/// the middle of an operation's changes aborts, as a failure would.
struct Depth<'a> {
    fs: &'a Filesystem,
    what: &'a str,
    depth: u32,
}

impl Drop for Depth<'_> {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(self.depth));
        if self.depth == 0 && std::thread::panicking() && !is_whole() {
            self.fs.abort_because(self.what, "it panicked".into());
            whole();
        }
    }
}

impl Filesystem {
    /// Run `f`, an operation that changes the filesystem (`what` names it
    /// for the message). If it fails after it began changing the running
    /// transaction, the filesystem takes no more changes
    /// ([`Filesystem::aborted`]) and the error comes back marked
    /// [`Error::AfterChange`].
    pub(crate) fn change<R>(&self, what: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let depth = DEPTH.with(|d| d.get());
        // One operation at a time, from before its first change until it
        // is judged: no other may build on what a failed one left.
        let _alone =
            (depth == 0).then(|| self.change_gate.lock().unwrap_or_else(|e| e.into_inner()));
        if depth == 0 {
            // Between operations the transaction is whole.
            whole();
        }
        let _depth = Depth {
            fs: self,
            what,
            depth,
        };
        DEPTH.with(|d| d.set(depth + 1));
        let r = f();
        drop(_depth);
        if depth > 0 {
            // The outermost operation judges: it may still handle this.
            return r;
        }
        match r {
            Ok(v) => {
                whole();
                Ok(v)
            }
            Err(e) if e.is_after_change() || !is_whole() => {
                self.abort(what, &e);
                whole();
                Err(e.after_change())
            }
            Err(e) => Err(e),
        }
    }

    /// Stop taking changes, for good: `what` failed half-way with `e`.
    fn abort(&self, what: &str, e: &Error) {
        self.abort_because(what, e.with_causes());
    }

    fn abort_because(&self, what: &str, why: String) {
        let _ = self.aborted.set(format!("{what} failed half-way ({why})"));
    }

    /// Why the filesystem takes no more changes, if an operation or a
    /// commit failed half-way: the running transaction is not whole and
    /// is never committed. What the last commit wrote stays on disk;
    /// opening the filesystem again starts from it.
    pub fn aborted(&self) -> Option<&str> {
        self.aborted.get().map(String::as_str)
    }

    /// The error every change meets once the filesystem was aborted.
    pub(crate) fn check_not_aborted(&self) -> Result<()> {
        match self.aborted() {
            Some(why) => Err(Error::Aborted(format!(
                "{why}; changes since the last commit are lost, reopen the filesystem to go on"
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::NewInode;
    use crate::test_fs::TestFs;

    fn file() -> NewInode {
        NewInode {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        }
    }

    fn check(t: &TestFs, when: &str) {
        if let Err(e) = testkit::btrfs_check_file(t.image(), &[]) {
            panic!("{when}: {e:#}");
        }
    }

    /// Every change the filesystem is asked for after an abort is refused
    /// with EROFS, naming what failed; reading goes on.
    fn assert_takes_no_changes(fs: &Filesystem, kept: crate::fs::InodeId, what: &str) {
        let root = fs.root();
        for (op, r) in [
            ("create", fs.create(root, b"later", file()).map(drop)),
            ("write", fs.write(kept, 0, b"later").map(drop)),
            ("unlink", fs.unlink(root, b"kept")),
            ("commit", fs.commit()),
        ] {
            let e = r.expect_err(op);
            assert!(matches!(e, Error::Aborted(_)), "{op}: {e:?}");
            assert_eq!(e.errno(), libc::EROFS, "{op}");
            assert!(e.to_string().contains(what), "{op}: {e}");
        }
        assert_eq!(fs.read_all(kept).unwrap(), b"kept data");
    }

    #[test]
    fn an_operation_stopped_half_way_stops_all_changes() {
        let mut t = TestFs::new();
        let kept = t.file(b"kept", b"kept data");
        let fs = t.fs();
        let root = fs.root();
        fs.create(root, b"uncommitted", file()).unwrap();
        // The create's inode item goes in; its name does not.
        fail_after(1);
        let e = fs.create(root, b"half", file()).unwrap_err();
        assert!(e.is_after_change(), "{e:?}");
        let why = fs.aborted().expect("the filesystem was aborted");
        assert!(why.starts_with("create failed half-way"), "{why}");
        assert!(why.contains("injected fault"), "{why}");
        assert_takes_no_changes(fs, kept, "create failed half-way");
        // Opened again: the last commit, whole.
        t.reopen_uncommitted().unwrap();
        let fs = t.fs();
        assert!(fs.aborted().is_none());
        assert_eq!(fs.read_all(kept).unwrap(), b"kept data");
        for gone in [&b"half"[..], b"uncommitted"] {
            assert!(fs.lookup(fs.root(), gone).is_err());
        }
        fs.create(fs.root(), b"after", file()).unwrap();
        fs.commit().unwrap();
        check(&t, "after the reopen");
    }

    #[test]
    fn an_operation_refused_before_it_changed_anything_goes_on() {
        let t = TestFs::new();
        let kept = t.file(b"kept", b"kept data");
        let fs = t.fs();
        let root = fs.root();
        // The first tree change fails: nothing was changed yet.
        fail_after(0);
        let e = fs.create(root, b"refused", file()).unwrap_err();
        assert!(!e.is_after_change(), "{e:?}");
        // As is a name that exists.
        let e = fs.create(root, b"kept", file()).unwrap_err();
        assert!(matches!(e, Error::Exists(_)), "{e:?}");
        assert!(fs.aborted().is_none());
        fs.create(root, b"next", file()).unwrap();
        fs.write(kept, 0, b"KEPT").unwrap();
        fs.commit().unwrap();
        assert!(fs.lookup(root, b"next").is_ok());
        assert!(fs.lookup(root, b"refused").is_err());
        check(&t, "after a refusal");
    }

    #[test]
    fn a_commit_stopped_half_way_stops_all_changes() {
        let mut t = TestFs::new();
        let kept = t.file(b"kept", b"kept data");
        let fs = t.fs();
        let more = fs.create(fs.root(), b"more", file()).unwrap().id;
        fs.write(more, 0, &vec![5u8; 256 << 10]).unwrap();
        // The data goes in as extents, then the extent and free-space
        // trees are brought up to date: stop among them.
        fail_after(4);
        let e = fs.commit().unwrap_err();
        assert!(e.is_after_change(), "{e:?}");
        let why = fs.aborted().expect("the filesystem was aborted");
        assert!(why.starts_with("commit failed half-way"), "{why}");
        assert_takes_no_changes(fs, kept, "commit failed half-way");
        t.reopen_uncommitted().unwrap();
        let fs = t.fs();
        assert_eq!(fs.read_all(kept).unwrap(), b"kept data");
        assert!(fs.lookup(fs.root(), b"more").is_err());
        check(&t, "after the reopen");
    }

    #[test]
    fn a_panic_in_the_middle_of_changes_aborts() {
        let t = TestFs::new();
        let kept = t.file(b"kept", b"kept data");
        let fs = t.fs();
        let root = fs.root();
        // A panic before any change (a server survives it): nothing to abort,
        // and the next operation is judged as usual.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fs.change("early", || -> Result<()> { panic!("before any change") })
        }));
        assert!(caught.is_err());
        assert!(fs.aborted().is_none());
        fail_after(1);
        assert!(fs.create(root, b"half", file()).is_err());
        assert!(fs.aborted().unwrap().starts_with("create failed half-way"));

        let mut t = t;
        t.reopen_uncommitted().unwrap();
        let fs = t.fs();
        let root = fs.root();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fs.change("making a file", || -> Result<()> {
                fs.create(root, b"new", file())?;
                panic!("after a change")
            })
        }));
        assert!(caught.is_err());
        let why = fs.aborted().expect("the panic aborted");
        assert!(
            why.contains("making a file") && why.contains("panicked"),
            "{why}"
        );
        assert_takes_no_changes(fs, kept, "panicked");
    }

    /// A clone refused after it grew its destination (an extent it cannot
    /// share, here one with an encoding the format reserves) leaves the
    /// longer file, which is whole: the filesystem goes on.
    #[test]
    fn a_clone_refused_after_growing_its_destination_goes_on() {
        use crate::format::Key;
        use crate::format::consts::EXTENT_DATA_KEY;
        let t = TestFs::new();
        let src = t.file(b"src", &vec![7u8; 64 << 10]);
        let dst = t.file(b"dst", b"x");
        let mut fe = t.extent(src, 0);
        fe.other_encoding = 1;
        t.put(
            src.subvol,
            Key::new(src.ino, EXTENT_DATA_KEY, 0),
            fe.to_bytes(),
        );
        let fs = t.fs();
        fs.commit().unwrap();
        let e = fs.clone_range(src, 0, dst, 1 << 20, 4096).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        assert!(fs.aborted().is_none(), "{:?}", fs.aborted());
        assert_eq!(fs.stat(dst).unwrap().size, 1 << 20);
        fs.write(dst, 0, b"y").unwrap();
        fs.commit().unwrap();
    }
}

//! The FUSE adapter: serves a [`ubtrfs::fs::Filesystem`] to the kernel.
//! `fuser` mounts (pure Rust, through `fusermount3`, no libfuse) and
//! negotiates the connection (INIT, below); the requests are then ours:
//! read from `/dev/fuse` (`dev.rs`) or taken over io_uring (`ring.rs`),
//! decoded in `wire.rs`, served by the `on_*` handlers here and in
//! `write.rs`.
//!
//! Read-write or read-only. On a read-only mount every operation that
//! would change the filesystem answers `EROFS`; operations that are not
//! implemented answer `ENOSYS`. None silently succeeds.
//!
//! # Concurrency and transactions
//!
//! Requests are served by several threads. One lock orders them (see
//! [`Served`]): reading handlers hold it shared, changing handlers and
//! commits exclusive, so a reader never sees a change half made inside the
//! running transaction. Changes gather in the library's running
//! transaction, which is committed every `commit=` seconds by a timer
//! thread, on `fsync`/`fsyncdir`, and once more at unmount
//! ([`Served::finish`], from `destroy` and from the mount command).
//!
//! # Caching
//!
//! The mount is the only writer of its devices, and every change reaches
//! it through the kernel, so the kernel may cache a lot, for long:
//!
//! * a read-write mount uses the kernel's writeback cache: writes land in
//!   the page cache and reach the library later, in requests of up to
//!   [`MAX_WRITE`] bytes (when the kernel writes pages back, before
//!   `fsync`, on close, and at unmount). The kernel then keeps the size and
//!   the modification and change times of regular files itself and sends
//!   them with `setattr` (the library is kept from moving the times on
//!   its own: see `write.rs`); it handles `O_APPEND` and reads pages it
//!   only partly overwrites.
//! * pages stay cached across opens (`FOPEN_KEEP_CACHE`): the kernel drops
//!   by itself what truncate, fallocate and copy_file_range change.
//! * while the filesystem is nearly full, files opened write-only bypass
//!   the page cache (`FOPEN_DIRECT_IO`), so a write that does not fit is
//!   refused to the writer (see `space_watch.rs`). Append-only and
//!   synchronous files opened for writing bypass it too, and may still be
//!   mapped shared (`FUSE_DIRECT_IO_ALLOW_MMAP`).
//! * entries (negative ones too) and attributes are cached for [`TTL_RW`]
//!   (read-write) or [`TTL_RO`]. Every reply that creates or changes an
//!   inode carries its fresh attributes, and the kernel drops what it
//!   cached for the other inodes an operation touches (parent directories,
//!   the target of an unlink or rename). What the library changes on its
//!   own is notified: the bytes a file takes on disk settle when its data
//!   is written back, so after each commit the attributes of the files
//!   written since the last one are invalidated ([`Served::note_changed`]);
//!   killing a set-user-ID bit on a write invalidates that inode's.
//! * set-user-ID and set-group-ID bits are killed by the mount, not by
//!   the kernel (`FUSE_HANDLE_KILLPRIV_V2`), which spares the kernel a
//!   `getxattr("security.capability")` before every write (see `write.rs`).
//! * POSIX ACLs are enforced by the kernel (`FUSE_POSIX_ACL`), which
//!   caches each inode's ACLs (a `READDIRPLUS` entry drops them). The
//!   library keeps the mode and the access ACL in step and gives new
//!   inodes their directory's default ACL, or applies the umask, which the
//!   kernel then leaves to the mount (`FUSE_DONT_MASK`).
//!
//! # Reflinks
//!
//! `copy_file_range` between sector-aligned offsets shares extents
//! ([`Filesystem::clone_range`]), so `cp` (which tries it) reflinks;
//! other ranges are copied by the mount (see `copy.rs`). The `FICLONE` and
//! `FICLONERANGE` ioctls (`cp --reflink=always`) never reach a FUSE
//! filesystem: the kernel answers them itself, with `EOPNOTSUPP`, since
//! FUSE has no request for them.
//!
//! # Inode numbers
//!
//! FUSE names an inode by one `u64`, and the kernel treats two entries with
//! the same number as hard links of one inode. btrfs inode numbers are only
//! unique within a subvolume, so they are mapped, stably across mounts:
//!
//! * the root directory of the mounted (default) subvolume is
//!   [`fuser::INodeNo::ROOT`] (1), but shows its own number (256) as
//!   `st_ino` and in listings, as on a kernel mount;
//! * any other inode of the top-level subvolume (tree id 5) keeps its own
//!   number (btrfs never uses 1 for a file);
//! * an inode of any other subvolume is `subvol << 40 | ino`;
//! * the placeholder that stands for nested subvolume N in a snapshot
//!   (an empty directory, inode 2 in the kernel's view) takes the inode
//!   number `2^40 - 2^24 + N` in the snapshot's range: the kernel makes a
//!   fresh inode for each placeholder, and one number for all would make
//!   the FUSE kernel move a placeholder's entry to wherever another was
//!   looked up.
//!
//! Inode numbers must be below 2^40 - 2^24 and subvolume ids below 2^24;
//! anything else is answered with `EOVERFLOW`. The same number (but the
//! root's) is reported as `st_ino`, so snapshots of a file are never
//! mistaken for hard links.
//!
//! # Directory offsets
//!
//! `.` has cookie 1 and `..` cookie 2; a real entry has its DIR_INDEX
//! sequence number plus 2, so a listing resumes exactly where it stopped
//! even if it was interrupted.

mod caller_access;
pub mod control;
mod copy;
mod deferred;
mod dev;
mod reply;
mod ring;
mod served;
mod space_watch;
pub mod subvol_info;
pub mod subvol_ioctl;
mod wire;
mod write;

pub use served::Served;
pub(crate) use wire::Access;

use crate::util::rdev_to_fuse;
use control::Counter;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, Request,
};
use reply::{
    AttrReply, Caller, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply,
    IoctlReply, LseekReply, OpenReply, StatfsReply, WriteAnswer, WriteReply, XattrReply,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use ubtrfs::data::seek::Whence;
use ubtrfs::format::items::Timespec;
use ubtrfs::fs::{AtimeUpdate, FileKind, Filesystem, InodeId, Stat};

/// How long the kernel may cache entries and attributes of a read-write
/// mount: every change but those notified reaches the library through the
/// kernel (see the module documentation).
pub const TTL_RW: Duration = Duration::from_secs(60);
/// The same for a read-only mount, where nothing changes.
pub const TTL_RO: Duration = Duration::from_secs(3600);
/// Largest write request asked for. The kernel caps it further by its
/// page limit (`fs.fuse.max_pages_limit`, 1 MiB by default).
pub const MAX_WRITE: u32 = 4 << 20;
/// Readahead asked for, to match: the kernel caps it by what it offers.
pub const MAX_READAHEAD: u32 = 1 << 20;
/// Background requests (page writeback, readahead) the kernel may have
/// outstanding, instead of its 12. A stream's long writes that must wait
/// wait on the deferred-write thread, not in a FUSE thread; with room for
/// more of them, a small file's writeback at its fsync reaches a free
/// thread instead of queueing in the kernel behind the stream's
/// (`bench/compress.sh`: 4 KiB write + fsync beside a stream, 175 to 250
/// IOPS). Costs up to this many write requests (1 MiB each) held in
/// memory.
pub const MAX_BACKGROUND: u16 = 64;
/// Background requests past which the kernel's flusher leaves pages for
/// later: the kernel's own 9 (3/4 of 12), so the flusher does not flood
/// the queue that an fsync's writeback must pass (fsync writeback is
/// never held back by it; a 4 KiB write + fsync alone ran 7 % slower with
/// 48).
pub const CONGESTION_THRESHOLD: u16 = 9;
/// Tree id of the top-level subvolume.
const TOP_SUBVOL: u64 = 5;
/// Bits of a FUSE inode number that carry the btrfs inode number.
const INO_BITS: u32 = 40;
const INO_MASK: u64 = (1 << INO_BITS) - 1;
/// Largest subvolume id that fits above the inode bits.
const MAX_SUBVOL: u64 = (1 << (64 - INO_BITS)) - 1;
/// The top of each subvolume's inode bits, one number per possible
/// subvolume id, is kept for placeholders (see the module documentation).
const PLACEHOLDER_BASE: u64 = INO_MASK + 1 - (MAX_SUBVOL + 1);
/// First directory cookie of a real entry (1 and 2 are `.` and `..`).
const COOKIE_BASE: u64 = 2;

/// How a filesystem is served (from the mount options).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The directory that becomes the mount's root: a subvolume's root.
    pub root: InodeId,
    /// Serve over io_uring when the kernel offers it (`uring` option).
    pub uring: bool,
    /// When reads and listings move access times.
    pub atime: AtimeUpdate,
    /// Whether listings move directories' access times.
    pub diratime: bool,
    /// Mounted without replaying the log tree (`nologreplay`): fstrim is
    /// refused, as the log's blocks look free.
    pub nologreplay: bool,
    /// Where it is mounted (canonical): a snapshot's source must be in
    /// this mount.
    pub mountpoint: std::path::PathBuf,
}

/// A ubtrfs filesystem served over FUSE. Clones share everything: the
/// session's, the `/dev/fuse` threads' and the rings'.
#[derive(Clone)]
pub struct FuseFs {
    served: Arc<Served>,
    root: InodeId,
    /// Data sector size: `st_blocks` counts whole sectors, as the kernel does.
    sectorsize: u64,
    /// What the kernel agreed to at init.
    agreed: Arc<Agreed>,
    stats: Arc<control::Stats>,
    /// Special files (fifos, sockets, device nodes) whose last name went
    /// while the kernel still knew them: they are opened without FUSE, so
    /// they live until the kernel forgets them.
    held_until_forget: Arc<std::sync::Mutex<std::collections::HashSet<InodeId>>>,
    /// Files whose pages the kernel may hold: read through the mount or
    /// opened for writing since the kernel last forgot them. Reads of the
    /// others reach the mount (see [`FuseFs::note_access`]).
    /// Read-locked on every READ: only the first read since a FORGET
    /// takes the write lock.
    paged: Arc<std::sync::RwLock<std::collections::HashSet<InodeId>>>,
    /// Long writes waiting for writeback room, once the session started.
    deferred: Arc<OnceLock<deferred::DeferredWrites>>,
    /// Whether to ask the kernel for FUSE over io_uring.
    uring_wanted: bool,
    /// The io_uring queues, once started; stopped before the last commit.
    rings: Arc<std::sync::Mutex<Option<fuse_ring::Rings>>>,
    /// Where the mount is (see [`Options::mountpoint`]).
    mountpoint: Arc<std::path::PathBuf>,
    /// Whether data space is short enough for opens to bypass the cache.
    space: Arc<space_watch::SpaceWatch>,
    /// The mount's device, read from `/proc/self/mountinfo` once mounted.
    mount_dev: Arc<OnceLock<(u32, u32)>>,
    /// Requests served on threads of their own now (see
    /// [`FuseFs::on_own_thread`]).
    own_threads: Arc<std::sync::atomic::AtomicUsize>,
    /// When reads and listings move access times (see [`Options`]).
    atime: AtimeUpdate,
    diratime: bool,
    /// See [`Options::nologreplay`].
    nologreplay: bool,
    /// Inodes open for writing, with how many opens: the kernel may hold
    /// dirty pages of them (see [`FuseFs::on_lseek`]).
    writers: Arc<std::sync::Mutex<std::collections::HashMap<InodeId, Writers>>>,
    /// Per open directory (by its file handle), the end of the entry
    /// indexes its listing shows ([`Filesystem::dir_index_end`]).
    dir_ends: Arc<std::sync::Mutex<std::collections::HashMap<u64, u64>>>,
    /// The file handle of the next directory opened.
    next_dir_fh: Arc<std::sync::atomic::AtomicU64>,
    /// Jobs that wait for the kernel's writeback, one after another on a
    /// thread that serves no requests (see [`FuseFs::on_lseek`]).
    writeback_waits: Arc<std::sync::Mutex<Option<std::sync::mpsc::Sender<WaitJob>>>>,
}

/// A job of [`FuseFs::writeback_waits`].
type WaitJob = Box<dyn FnOnce() + Send>;

/// The file handle of opens for writing through the page cache: their
/// release counts them out of [`FuseFs::writers`]. Others have 0.
const WRITER_FH: FileHandle = FileHandle(1);
/// The file handle of opens for writing past the page cache
/// (`FOPEN_DIRECT_IO`), counted likewise.
const DIRECT_WRITER_FH: FileHandle = FileHandle(2);

/// Opens of one inode for writing.
#[derive(Clone, Copy, Default)]
struct Writers {
    /// All of them.
    all: u32,
    /// Those through the page cache.
    cached: u32,
}

/// Capabilities the kernel agreed to at init (set once, before any other
/// request).
#[derive(Default)]
struct Agreed {
    writeback_cache: AtomicBool,
    killpriv: AtomicBool,
    posix_acl: AtomicBool,
    uring: AtomicBool,
    /// The longer `fuse_setxattr_in` (`FUSE_SETXATTR_EXT`).
    setxattr_ext: AtomicBool,
    /// A request came over the ring (the kernel uses it).
    ring_used: AtomicBool,
    /// Files that bypass the page cache may be mapped shared
    /// (`FUSE_DIRECT_IO_ALLOW_MMAP`).
    direct_io_mmap: AtomicBool,
}

impl FuseFs {
    /// The session is over (unmounted, or DESTROY answered): stop taking
    /// writes and the rings, then the last commit.
    pub(crate) fn end_session(&self) {
        if let Some(d) = self.deferred.get() {
            d.stop();
        }
        // The connection is gone: the rings' threads end once their
        // requests are answered, before the last commit.
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(r) = rings
            && let Err(e) = r.stop()
        {
            tracing::warn!("io_uring queues: {e}");
        }
        // Nothing is looked up any more: deleted subvolumes that were
        // still known go before the last commit.
        if self.served.writable()
            && let Err(e) = self
                .served
                .write_committing("unmount", |fs| fs.end_subvolume_holds())
        {
            tracing::debug!("{e:?}");
        }
        // The session is over: the last commit. It runs once however often
        // this is reached; the mount command reports its outcome.
        if let Err(e) = self.served.finish() {
            tracing::debug!("{e}");
        }
    }

    /// The kernel forgot `ino` (it counts lookups, `nlookup` of them, and
    /// forgets an inode once): the last reference to a held special file
    /// is gone; the last inode the kernel knew of a subvolume deleted
    /// meanwhile takes the subvolume's tree with it.
    pub(super) fn on_forget(&self, ino: INodeNo, nlookup: u64) {
        let id = self.inode_of(ino);
        // The kernel's inode went, and its page cache with it.
        self.paged
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if self.held().remove(&id)
            && let Err(e) = self.served.write(|fs| fs.release_inode(id).map_err(errno))
        {
            tracing::debug!("releasing inode {} after forget: {e:?}", id.ino);
        }
        if self.subvol_counted(id.subvol)
            && self
                .served
                .fs_unlocked()
                .release_subvolume(id.subvol, nlookup)
        {
            fuse_ring::leave_idle();
            let dropped = self.served.write_committing("deleted subvolume", |fs| {
                fs.drop_deleted_subvolume(id.subvol)
            });
            if let Err(e) = dropped {
                tracing::warn!("dropping deleted subvolume {}: {e:?}", id.subvol);
            }
        }
    }

    /// Serve `served` as `opts` say.
    pub fn new(served: Arc<Served>, opts: Options) -> Self {
        let fs = served.fs_unlocked();
        let sectorsize = u64::from(fs.superblock().sectorsize.max(512));
        FuseFs {
            served,
            root: opts.root,
            sectorsize,
            agreed: Arc::default(),
            stats: Arc::default(),
            held_until_forget: Arc::default(),
            paged: Arc::default(),
            deferred: Arc::default(),
            uring_wanted: opts.uring,
            rings: Arc::default(),
            mountpoint: Arc::new(opts.mountpoint),
            space: Arc::default(),
            mount_dev: Arc::default(),
            own_threads: Arc::default(),
            atime: opts.atime,
            diratime: opts.diratime,
            nologreplay: opts.nologreplay,
            writers: Arc::default(),
            dir_ends: Arc::default(),
            next_dir_fh: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            writeback_waits: Arc::default(),
        }
    }

    /// Run `job` on the thread of writeback waits (started the first
    /// time), after those queued before it; on a thread of its own if that
    /// thread cannot be had. Never on the calling thread, which may be the
    /// one to serve the writes the job waits for.
    fn after_writeback_waits(&self, job: WaitJob) {
        let mut tx = self
            .writeback_waits
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            let (send, recv) = std::sync::mpsc::channel::<WaitJob>();
            let started = std::thread::Builder::new()
                .name("writeback-wait".into())
                .spawn(move || {
                    for job in recv {
                        job();
                    }
                });
            match started {
                Ok(_) => *tx = Some(send),
                Err(e) => tracing::warn!("no thread for writeback waits: {e}"),
            }
        }
        let job = match tx.as_ref() {
            Some(t) => match t.send(job) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => job,
        };
        drop(tx);
        if let Err(e) = std::thread::Builder::new().spawn(job) {
            tracing::error!("no thread to wait for writeback: {e}");
        }
    }

    /// Directory `ino` opened: its file handle, under which the end of
    /// its entries now is kept.
    fn dir_opened(&self, ino: INodeNo) -> FileHandle {
        let fh = self.next_dir_fh.fetch_add(1, Ordering::Relaxed);
        let end = self
            .served
            .read(|fs| fs.dir_index_end(self.inode_of(ino)).map_err(errno));
        if let Ok(end) = end {
            self.dir_ends
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(fh, end);
        }
        FileHandle(fh)
    }

    /// Where the listing of directory `dir` through file handle `fh`
    /// stops: the end of its entries when it was opened, or when it was
    /// last read from the start (rewinddir). Entries renamed meanwhile
    /// get new, higher indexes: without the end, a program renaming
    /// every entry it lists would list forever.
    fn dir_end(&self, fs: &Filesystem, fh: FileHandle, dir: InodeId, offset: u64) -> Option<u64> {
        let mut ends = self.dir_ends.lock().unwrap_or_else(|e| e.into_inner());
        let end = ends.get_mut(&fh.0)?;
        if offset == 0
            && let Ok(now) = fs.dir_index_end(dir)
        {
            *end = now;
        }
        Some(*end)
    }

    /// Count an open of `id` for writing, through the page cache unless
    /// `direct`; returns its file handle.
    fn writer_opened(&self, id: InodeId, direct: bool) -> FileHandle {
        self.note_paged(id);
        let mut w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let n = w.entry(id).or_default();
        n.all += 1;
        if direct {
            DIRECT_WRITER_FH
        } else {
            n.cached += 1;
            WRITER_FH
        }
    }

    /// An open of `id` with file handle `fh` was released.
    fn writer_closed(&self, id: InodeId, fh: FileHandle) {
        if fh != WRITER_FH && fh != DIRECT_WRITER_FH {
            return;
        }
        let mut w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = w.get_mut(&id) {
            n.all = n.all.saturating_sub(1);
            if fh == WRITER_FH {
                n.cached = n.cached.saturating_sub(1);
            }
            if n.all == 0 {
                w.remove(&id);
            }
        }
    }

    /// Have the kernel look `id` up again by each of its names, once no
    /// longer open for writing: under the writeback cache it keeps a
    /// regular file's times itself, and writes past the cache do not move
    /// them there (the mount moved them on disk). A file it looks up anew
    /// (once nothing holds it) comes with the times on disk.
    fn forget_cached_times(&self, id: InodeId) {
        let Ok(refs) = self.served.read(|fs| fs.inode_refs(id)) else {
            return;
        };
        let entries: Vec<(INodeNo, Vec<u8>)> = refs
            .into_iter()
            .filter_map(|r| {
                let dir = InodeId {
                    subvol: id.subvol,
                    ino: r.parent,
                };
                Some((self.to_fuse(dir).ok()?, r.name))
            })
            .collect();
        let served = Arc::clone(&self.served);
        self.after_writeback_waits(Box::new(move || {
            for (dir, name) in entries {
                served.invalidate_entry(dir, &name);
            }
        }));
    }

    /// Whether `id` is open for writing through the page cache.
    fn has_cached_writers(&self, id: InodeId) -> bool {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .is_some_and(|n| n.cached > 0)
    }

    /// Set the inode flags of `id` under `mapped` to `flags`, keeping the
    /// others (`FS_IOC_SETFLAGS`, `FS_IOC_FSSETXATTR`), as the kernel's
    /// btrfs sets them.
    fn change_flags(
        &self,
        ino: INodeNo,
        id: InodeId,
        flags: u64,
        mapped: u64,
        reply: impl IoctlReply,
    ) {
        if !self.served.writable() {
            return reply.error(Errno::EROFS);
        }
        let change = |fs: &ubtrfs::fs::Filesystem| {
            use ubtrfs::format::consts::{INODE_NODATACOW, INODE_NODATASUM};
            let st = fs.stat(id)?;
            let cur = st.flags & ubtrfs::fs::SETTABLE_FLAGS;
            let mut want = (cur & !mapped) | flags;
            // As the kernel's: a file with data keeps its no-COW and
            // no-checksum (no-COW asked for is silently not set); an
            // empty one not asked for no-COW loses no-checksum too.
            let cow = INODE_NODATACOW | INODE_NODATASUM;
            if st.kind == FileKind::File && st.size > 0 {
                want = (want & !cow) | (cur & cow);
            } else if st.kind == FileKind::File && want & INODE_NODATACOW == 0 {
                want &= !INODE_NODATASUM;
            }
            fs.set_flags(id, want)
        };
        match self.served.write(|fs| change(fs).map_err(errno)) {
            Ok(_) => {
                reply.ioctl(0, &[]);
                // The change time moved; the kernel does not know.
                self.served.invalidate_attrs(ino);
            }
            Err(e) => reply.error(e),
        }
    }

    /// Whether `id` is open for writing.
    fn has_writers(&self, id: InodeId) -> bool {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&id)
    }

    /// `ino` is opened for reading (or listing, `dir`): move its access
    /// time as the mount options say, as the kernel does on the reads
    /// (which the page cache may answer without the mount), and have the
    /// kernel fetch it again.
    /// `st` is its attributes as the open found them: most opens decide
    /// from them, with no lookup of their own.
    fn note_access(&self, ino: INodeNo, st: &Stat, dir: bool) {
        if !self.served.takes_changes() || (dir && !self.diratime) || !self.atime.moves(st) {
            return;
        }
        let id = self.inode_of(ino);
        // Only noted in memory (the next commit writes it): no change lock.
        match self
            .served
            .read(|fs| fs.note_access(id, self.atime).map_err(errno))
        {
            // A file whose pages the kernel does not hold is read through
            // the mount, and the kernel drops its cached access time after
            // each such read by itself: no need to have it fetch every
            // attribute again (a round trip at the next read or fstat).
            // Not an empty file: no read of it reaches the mount. Checked
            // after the move: a read noted later was answered after it.
            Ok(true) if dir || st.size == 0 || self.is_paged(id) => {
                self.served.invalidate_attrs(ino)
            }
            Ok(_) => {}
            Err(e) => tracing::debug!("access time of inode {}: {e:?}", id.ino),
        }
    }

    /// Whether the kernel took the writeback cache.
    fn writeback_cache(&self) -> bool {
        self.agreed.writeback_cache.load(Ordering::Relaxed)
    }

    /// Whether data space is short: new opens for writing then bypass the
    /// page cache (see `space_watch.rs`).
    fn space_tight(&self) -> bool {
        self.writeback_cache() && self.space.tight(self.served.fs_unlocked())
    }

    /// Whether the mount kills set-user-ID bits (`FUSE_HANDLE_KILLPRIV_V2`).
    fn killpriv(&self) -> bool {
        self.agreed.killpriv.load(Ordering::Relaxed)
    }

    /// Whether the kernel enforces POSIX ACLs.
    fn posix_acl(&self) -> bool {
        self.agreed.posix_acl.load(Ordering::Relaxed)
    }

    fn is_paged(&self, id: InodeId) -> bool {
        self.paged
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }

    /// The kernel may cache pages of `id` from now on (see `paged`).
    fn note_paged(&self, id: InodeId) {
        if !self.is_paged(id) {
            self.paged
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id);
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<InodeId>> {
        self.held_until_forget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How long the kernel may cache entries and attributes.
    fn ttl(&self) -> Duration {
        if self.served.writable() {
            TTL_RW
        } else {
            TTL_RO
        }
    }

    /// The FUSE inode number of `id` (see the module documentation).
    fn to_fuse(&self, id: InodeId) -> Result<INodeNo, Errno> {
        to_fuse(self.root, id)
    }

    /// The inode a FUSE inode number stands for.
    fn inode_of(&self, ino: INodeNo) -> InodeId {
        from_fuse(self.root, ino)
    }

    fn stat(&self, fs: &Filesystem, ino: INodeNo) -> Result<Stat, Errno> {
        fs.stat(self.inode_of(ino)).map_err(errno)
    }

    /// The inode number `stat` and listings show for `id`: its FUSE
    /// number, but for the mount's root, which shows its own (256 in a
    /// subvolume's root), as on a kernel mount.
    fn st_ino(&self, id: InodeId) -> Result<INodeNo, Errno> {
        if id == self.root {
            return Ok(INodeNo(id.ino));
        }
        self.to_fuse(id)
    }

    /// The inode a descriptor's `st_ino` stands for (the inverse of
    /// [`FuseFs::st_ino`]). The root's own number may also be the FUSE
    /// number of an inode of the top-level subvolume, which is then
    /// either the root itself or out of this mount's reach.
    fn inode_of_st_ino(&self, st_ino: u64) -> InodeId {
        if st_ino == self.root.ino {
            return self.root;
        }
        self.inode_of(INodeNo(st_ino))
    }

    /// The attributes the kernel sees for `st` (`ino` is what `stat`
    /// shows: [`FuseFs::st_ino`]; an entry reply names the node apart).
    fn attr(&self, st: &Stat) -> Result<FileAttr, Errno> {
        Ok(FileAttr {
            ino: self.st_ino(st.id)?,
            size: st.size,
            blocks: st.nbytes.div_ceil(self.sectorsize) * (self.sectorsize / 512),
            atime: system_time(&st.atime),
            mtime: system_time(&st.mtime),
            ctime: system_time(&st.ctime),
            crtime: system_time(&st.otime),
            kind: file_type(st.kind),
            perm: (st.mode & 0o7777) as u16,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            rdev: match st.kind {
                FileKind::CharDev | FileKind::BlockDev => rdev_to_fuse(st.rdev),
                _ => 0,
            },
            blksize: 4096,
            flags: 0,
        })
    }

    /// The entry reply for `st`: attributes and generation. The kernel
    /// counts it as one lookup of `st`'s inode.
    fn entry(&self, st: &Stat) -> Result<(FileAttr, Generation), Errno> {
        let reply = self.entry_uncounted(st)?;
        self.kernel_learns(st.id, 1);
        Ok(reply)
    }

    /// [`FuseFs::entry`] for a reply that may not take it (readdirplus).
    /// Its `attr.ino` is the node id the entry names but for the root,
    /// whose node id (1) is not its `st_ino`: a reply that may name the
    /// root (a lookup of `..`) gives the node apart.
    fn entry_uncounted(&self, st: &Stat) -> Result<(FileAttr, Generation), Errno> {
        Ok((self.attr(st)?, Generation(st.generation)))
    }

    /// The kernel counted `n` lookups of `id`; it holds them until it
    /// forgets the inode. A subvolume deleted meanwhile keeps its tree
    /// until every inode of it is forgotten, as in the kernel (a shell
    /// may be working in it). Counted per subvolume, and only where a
    /// deletion through the mount can reach: not the top level, not the
    /// mounted subvolume.
    fn kernel_learns(&self, id: InodeId, n: u64) {
        if self.subvol_counted(id.subvol) {
            self.served.fs_unlocked().hold_subvolume(id.subvol, n);
        }
    }

    fn subvol_counted(&self, subvol: u64) -> bool {
        self.served.writable() && subvol != TOP_SUBVOL && subvol != self.root.subvol
    }

    /// The inode `name` names in directory `dir`, including `.` and `..`.
    fn child(&self, fs: &Filesystem, dir: InodeId, name: &[u8]) -> Result<InodeId, Errno> {
        match name {
            b"." => Ok(dir),
            b".." if dir == self.root => Ok(dir),
            b".." => fs.parent(dir).map_err(errno),
            _ => Ok(fs.lookup(dir, name).map_err(errno)?.id),
        }
    }

    /// Entries of `dir` from cookie `offset` on, as (cookie, name, id, kind).
    /// Hands the entries of `dir` after cookie `offset` to `add` until it
    /// says the reply is full, reading them `chunk` at a time: a listing
    /// in pages reads each page's worth, not the rest of the directory,
    /// and fills whatever size of reply the kernel asked for.
    fn list(
        &self,
        fs: &Filesystem,
        dir: InodeId,
        mut offset: u64,
        end: Option<u64>,
        chunk: usize,
        mut add: impl FnMut(Listed) -> Result<bool, Errno>,
    ) -> Result<(), Errno> {
        loop {
            let mut entries = self.entries(fs, dir, offset, chunk)?;
            let last_chunk = entries.len() < chunk;
            // Entries from `end` on came after the listing began.
            let before_end = |&(cookie, ..): &Listed| {
                end.is_none_or(|end| cookie < COOKIE_BASE || cookie - COOKIE_BASE < end)
            };
            let all_before = entries.iter().all(before_end);
            entries.retain(before_end);
            let last_chunk = last_chunk || !all_before;
            for e in entries {
                let cookie = e.0;
                if add(e)? {
                    return Ok(());
                }
                offset = cookie;
            }
            if last_chunk {
                return Ok(());
            }
        }
    }

    /// At most `limit` of them (`.` and `..` included), read from the tree.
    fn entries(
        &self,
        fs: &Filesystem,
        dir: InodeId,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<Listed>, Errno> {
        let mut out = Vec::new();
        if offset < 1 {
            out.push((1, b".".to_vec(), dir, FileKind::Dir));
        }
        if offset < 2 {
            // The mount's root has no parent inside the mount (it may be a
            // subvolume mounted with subvol=).
            let parent = if dir == self.root {
                dir
            } else {
                fs.parent(dir).map_err(errno)?
            };
            out.push((2, b"..".to_vec(), parent, FileKind::Dir));
        }
        let after = offset.saturating_sub(COOKIE_BASE);
        let rest = limit.saturating_sub(out.len());
        for e in fs.read_dir_up_to(dir, after, rest).map_err(errno)? {
            let cookie = e.index.checked_add(COOKIE_BASE).ok_or(Errno::EOVERFLOW)?;
            out.push((cookie, e.name, e.id, e.kind));
        }
        Ok(out)
    }
}

/// One directory entry for readdir: (cookie, name, inode, kind).
type Listed = (u64, Vec<u8>, InodeId, FileKind);

/// See the module documentation.
fn to_fuse(root: InodeId, id: InodeId) -> Result<INodeNo, Errno> {
    if id == root {
        return Ok(INodeNo::ROOT);
    }
    let id = match id.placeholder_of() {
        Some(nested) if nested <= MAX_SUBVOL => InodeId {
            subvol: id.subvol,
            ino: PLACEHOLDER_BASE + nested,
        },
        Some(_) => return Err(Errno::EOVERFLOW),
        None if id.ino >= PLACEHOLDER_BASE || id.ino == 0 => return Err(Errno::EOVERFLOW),
        None => id,
    };
    if id.subvol == TOP_SUBVOL {
        if id.ino == INodeNo::ROOT.0 {
            return Err(Errno::EOVERFLOW);
        }
        return Ok(INodeNo(id.ino));
    }
    if id.subvol > MAX_SUBVOL || id.subvol == 0 {
        return Err(Errno::EOVERFLOW);
    }
    Ok(INodeNo(id.subvol << INO_BITS | id.ino))
}

/// The inverse of [`to_fuse`].
fn from_fuse(root: InodeId, ino: INodeNo) -> InodeId {
    if ino == INodeNo::ROOT {
        return root;
    }
    let subvol = match ino.0 >> INO_BITS {
        0 => TOP_SUBVOL,
        subvol => subvol,
    };
    match ino.0 & INO_MASK {
        n if n >= PLACEHOLDER_BASE => InodeId::placeholder(subvol, n - PLACEHOLDER_BASE),
        n => InodeId { subvol, ino: n },
    }
}

/// The errno for a library error; damage is also logged, since the caller
/// only sees `EIO`.
fn errno(e: ubtrfs::Error) -> Errno {
    let code = e.errno();
    if code == libc::EIO {
        tracing::warn!("{e}");
    } else {
        tracing::debug!("{e}");
    }
    Errno::from_i32(code)
}

/// The errno for a library error from an xattr change: a missing xattr is
/// `ENODATA` there, not `ENOENT` (the inode itself is known to exist).
fn xattr_errno(e: ubtrfs::Error) -> Errno {
    match e {
        ubtrfs::Error::NotFound(_) => Errno::NO_XATTR,
        e => errno(e),
    }
}

/// A kind of file the kernel opens without telling the mount.
fn is_special(kind: FileKind) -> bool {
    matches!(
        kind,
        FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev
    )
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// A btrfs timestamp as a `SystemTime` (saturating at the representable ends).
fn system_time(t: &Timespec) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    if t.sec >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::from_secs(t.sec as u64) + nanos)
            .unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
            .and_then(|s| s.checked_add(nanos))
            .unwrap_or(UNIX_EPOCH)
    }
}

/// The attributes of a negative entry: inode 0 means "no such name".
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Answer an xattr request with the size-probe protocol: a request of size
/// 0 learns the size, a too-small buffer gets `ERANGE`.
fn reply_sized<R: XattrReply>(reply: R, size: u32, data: &[u8]) {
    let Ok(len) = u32::try_from(data.len()) else {
        return reply.error(Errno::E2BIG);
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

/// `fuser` calls only these two: the requests themselves never reach
/// its loop, which is not run (see `dev.rs`).
impl fuser::Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Requests are decoded in their current layouts (`wire.rs`): RENAME2
        // came with 7.23 (Linux 3.15), the last of them to change.
        let abi = config.kernel_abi();
        if (abi.0, abi.1) < (7, 23) {
            return Err(std::io::Error::other(format!(
                "the kernel's FUSE protocol {}.{} is older than 7.23 (Linux 3.15)",
                abi.0, abi.1
            )));
        }
        // A kernel without a capability simply keeps the default behaviour.
        let mut wanted = vec![
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            // The kernel enforces and caches POSIX ACLs; creating requests
            // then carry the umask unapplied, for the library to apply or
            // to replace by the directory's default ACL (see `write.rs`).
            InitFlags::FUSE_POSIX_ACL,
            InitFlags::FUSE_DONT_MASK,
            // File handles (open_by_handle_at, NFS export) outlive the
            // kernel's inodes: it then looks up "." and ".." of an inode
            // number, which stays that inode's (with its generation).
            InitFlags::FUSE_EXPORT_SUPPORT,
            // Files opened past the page cache (append-only, synchronous,
            // or while space is short) can still be mapped shared.
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ];
        if self.served.writable() {
            wanted.push(InitFlags::FUSE_WRITEBACK_CACHE);
            wanted.push(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        }
        for cap in wanted {
            match config.add_capabilities(cap) {
                Ok(()) if cap == InitFlags::FUSE_WRITEBACK_CACHE => {
                    self.agreed.writeback_cache.store(true, Ordering::Relaxed)
                }
                Ok(()) if cap == InitFlags::FUSE_HANDLE_KILLPRIV_V2 => {
                    self.agreed.killpriv.store(true, Ordering::Relaxed)
                }
                Ok(()) if cap == InitFlags::FUSE_POSIX_ACL => {
                    self.agreed.posix_acl.store(true, Ordering::Relaxed)
                }
                Ok(()) if cap == InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP => {
                    self.agreed.direct_io_mmap.store(true, Ordering::Relaxed)
                }
                Ok(()) => {}
                Err(_) => tracing::debug!("kernel lacks FUSE capability {cap:?}"),
            }
        }
        // Both capped by the kernel: take what it allows.
        if let Err(max) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD) {
            let _ = config.set_max_readahead(max);
        }
        // Unprivileged mounts are capped by the kernel (max_user_bgreq).
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(CONGESTION_THRESHOLD);
        if self.served.writable() {
            // Without the thread, long writes wait in FUSE threads as before.
            match deferred::DeferredWrites::start(self.write_ctx()) {
                Ok(d) => {
                    let _ = self.deferred.set(d);
                }
                Err(e) => tracing::warn!("no thread for deferred writes: {e}"),
            }
        }
        // Over io_uring when the kernel offers it; the rings start once
        // INIT is answered (`start_rings`).
        // Asked only where rings can be set up: once the kernel agreed, it
        // holds every request until the queues exist.
        let usable = || match fuse_ring::probe() {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("FUSE over io_uring offered but not usable here: {e}");
                false
            }
        };
        if self.uring_wanted
            && fuse_ring::kernel_enabled()
            && usable()
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok()
        {
            // Every ring entry has a payload buffer of `max_write` bytes.
            let _ = config.set_max_write(ring::MAX_WRITE);
            self.agreed.uring.store(true, Ordering::Relaxed);
        }
        // The longer `fuse_setxattr_in`, which says when setting an ACL
        // must clear set-group-ID. Our own decoding reads it either way
        // (`wire.rs`); `fuser`'s loop, which would misread it, never runs.
        if self.posix_acl()
            && config
                .add_capabilities(InitFlags::FUSE_SETXATTR_EXT)
                .is_ok()
        {
            self.agreed.setxattr_ext.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.end_session();
    }
}

/// The handlers, each written once for both transports (see `reply.rs`).
#[allow(clippy::too_many_arguments)]
impl FuseFs {
    pub(super) fn on_lookup<R: EntryReply>(
        &self,
        _req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        reply: R,
    ) {
        self.stats.count(Counter::Lookup);
        let result = self.served.read(|fs| {
            let id = self.child(fs, self.inode_of(parent), name.as_bytes())?;
            let (attr, generation) = self.entry(&fs.stat(id).map_err(errno)?)?;
            Ok((self.to_fuse(id)?, attr, generation))
        });
        match result {
            // `..` of a directory below the root, reconnecting a file
            // handle, names the root.
            Ok((node, attr, generation)) => reply.entry_of(node, &self.ttl(), &attr, generation),
            // A negative entry (inode 0) the kernel may cache: a name only
            // appears through the kernel, which then drops it.
            Err(Errno::ENOENT) => reply.entry(&self.ttl(), &negative_entry(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_getattr<R: AttrReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        reply: R,
    ) {
        self.stats.count(Counter::Getattr);
        match self
            .served
            .read(|fs| self.stat(fs, ino))
            .and_then(|st| self.attr(&st))
        {
            Ok(attr) => reply.attr(&self.ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_readlink<R: DataReply>(&self, _req: &Caller, ino: INodeNo, reply: R) {
        match self.served.read(|fs| fs.read_link(self.inode_of(ino))) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }
    pub(super) fn on_open<R: OpenReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        flags: OpenFlags,
        reply: R,
    ) {
        let writing = flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        if writing && !self.served.writable() {
            return reply.error(Errno::EROFS);
        }
        let id = self.inode_of(ino);
        let found = self.served.read(|fs| {
            let st = self.stat(fs, ino)?;
            // As in the kernel: no opening for writing in a read-only
            // subvolume (a write would be refused once the kernel sends it).
            if writing && fs.subvolume_readonly(id.subvol).map_err(errno)? {
                return Err(Errno::EROFS);
            }
            // As in the kernel: an fs-verity or immutable file is never
            // opened for writing, an append-only one only to append (the
            // FUSE kernel leaves these checks to the filesystem, and its
            // writes are not checked again).
            if writing && st.kind == FileKind::File {
                fs.check_open_for_write(id, flags.0 & libc::O_APPEND != 0)
                    .map_err(errno)?;
            }
            Ok(st)
        });
        let reading = flags.acc_mode() != OpenAccMode::O_WRONLY && flags.0 & libc::O_NOATIME == 0;
        if let Ok(st) = &found
            && reading
            && st.kind != FileKind::Dir
        {
            // Read back from pages it writes, which no read of the mount
            // follows: the kernel must fetch the moved access time.
            if writing {
                self.note_paged(id);
            }
            self.note_access(ino, st, false);
        }
        match found {
            Ok(st) if st.kind == FileKind::Dir => reply.error(Errno::EISDIR),
            // Nothing changes data behind the kernel's back (see the module
            // documentation): keep the page cache.
            Ok(_) if !self.served.writable() => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
            }
            // An append-only or synchronous file opened for writing
            // bypasses the page cache: each write then comes with the
            // file's flags. One to an append-only file that dropped
            // O_APPEND (fcntl) is refused in `on_write`, one to a
            // synchronous file is made durable before it is answered. So
            // does a file opened write-only while space is short: a write
            // that does not fit is then refused to its writer. (Not one
            // opened for reading too: a read past the cache would be
            // handed the writeback errors of other descriptors.)
            Ok(st)
                if writing
                    && st.kind == FileKind::File
                    && (st.flags
                        & (ubtrfs::format::consts::INODE_APPEND
                            | ubtrfs::format::consts::INODE_SYNC)
                        != 0
                        || flags.acc_mode() == OpenAccMode::O_WRONLY && self.space_tight()) =>
            {
                self.served.read(|fs| fs.hold_inode(id));
                reply.opened(self.writer_opened(id, true), FopenFlags::FOPEN_DIRECT_IO)
            }
            // O_TRUNC reaches `setattr` first (no atomic O_TRUNC asked for).
            // The open file keeps its inode alive if its last name goes.
            Ok(_) => {
                self.served.read(|fs| fs.hold_inode(id));
                let fh = if flags.acc_mode() == OpenAccMode::O_RDONLY {
                    FileHandle(0)
                } else {
                    self.writer_opened(id, false)
                };
                reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE)
            }
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_read<R: DataReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: R,
    ) {
        self.stats.count(Counter::Read);
        self.stats.max(Counter::MaxRead, u64::from(size));
        // Noted before the answer, which the kernel caches.
        let id = self.inode_of(ino);
        self.note_paged(id);
        match self.served.read(|fs| fs.read(id, offset, size as usize)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }
    pub(super) fn on_release<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: R,
    ) {
        let id = self.inode_of(ino);
        self.writer_closed(id, fh);
        if fh == DIRECT_WRITER_FH && !self.has_writers(id) {
            self.forget_cached_times(id);
        }
        match self.release_held(ino) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// An open file or directory of `ino` closed: the last close of one
    /// with no names left deletes it.
    fn release_held(&self, ino: INodeNo) -> Result<(), Errno> {
        if !self.served.writable() {
            return Ok(());
        }
        // The last close of an unlinked file deletes it. Every other close
        // (nearly all) only counts, under no lock of ours: taking the lock
        // for changes here held up the requests the caller sent just after
        // this asynchronous one. Over io_uring a release may be served
        // under SCHED_IDLE: the deletion, which may run long, is not.
        let id = self.inode_of(ino);
        let closed = self.served.fs_unlocked().close_inode(id).map_err(errno);
        closed.and_then(|orphan| {
            if orphan {
                fuse_ring::leave_idle();
                // The last use of a subvolume deleted while in use drops its
                // tree and commits; an orphan's deletion does not commit.
                if self.served.fs_unlocked().deleted_in_use(id.subvol) {
                    self.served
                        .write_committing("last close", |fs| fs.delete_closed_orphan(id))
                } else {
                    self.served
                        .write(|fs| fs.delete_closed_orphan(id).map_err(errno))
                }
            } else {
                Ok(())
            }
        })
    }
    pub(super) fn on_flush<R: EmptyReply>(
        &self,
        _req: &Caller,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: R,
    ) {
        // Sent on every close(2), after the kernel has written back the
        // file's dirty pages and waited for their WRITEs (writeback cache),
        // which are answered only once done. Nothing is left for it: no
        // buffers of the adapter's own, no POSIX locks (they stay with the
        // kernel), and durability is fsync's job. ENOSYS makes the kernel
        // stop sending it (it still writes back first), which spares every
        // close a round trip.
        reply.error(Errno::ENOSYS);
    }
    pub(super) fn on_fsync<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        ds: bool,
        reply: R,
    ) {
        // The kernel has written back the file's dirty pages and waited for
        // those writes before it asks. The library logs the file when it
        // can, else commits. On a read-only mount nothing is ever dirty.
        match self.served.fsync(self.inode_of(ino), ino, ds) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_opendir<R: OpenReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        flags: OpenFlags,
        reply: R,
    ) {
        match self.served.read(|fs| self.stat(fs, ino)) {
            Ok(st) if st.kind != FileKind::Dir => reply.error(Errno::ENOTDIR),
            // A read-only directory never changes: let the kernel cache listings.
            Ok(_) if !self.served.writable() => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR)
            }
            // The open directory keeps its inode if it is removed meanwhile.
            Ok(st) => {
                if flags.0 & libc::O_NOATIME == 0 {
                    self.note_access(ino, &st, true);
                }
                self.served.read(|fs| fs.hold_inode(self.inode_of(ino)));
                reply.opened(self.dir_opened(ino), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_readdir<R: DirReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: R,
    ) {
        self.stats.count(Counter::Readdir);
        let listed = self.served.read(|fs| {
            let dir = self.inode_of(ino);
            self.list(
                fs,
                dir,
                offset,
                self.dir_end(fs, fh, dir, offset),
                256,
                |(cookie, name, id, kind)| {
                    let fino = self.st_ino(id)?;
                    Ok(reply.add(fino, cookie, file_type(kind), OsStr::from_bytes(&name)))
                },
            )
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_readdirplus<R: DirPlusReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: R,
    ) {
        self.stats.count(Counter::Readdirplus);
        // Listing and attributes under one hold of the lock: one snapshot.
        // Only the entries the reply takes are looked up.
        let ttl = self.ttl();
        let listed = self.served.read(|fs| {
            let dir = self.inode_of(ino);
            self.list(
                fs,
                dir,
                offset,
                self.dir_end(fs, fh, dir, offset),
                64,
                |(cookie, name, id, kind)| {
                    let st = fs.stat(id);
                    if let Err(e) = &st {
                        tracing::debug!("listing {}: inode {} unreadable: {e}", ino.0, id.ino);
                    }
                    let Ok(st) = st else {
                        // Its inode cannot be read (damage): a plain entry
                        // (node id 0), so the rest of the listing is not
                        // lost; a lookup of it says what is wrong.
                        let attr = FileAttr {
                            ino: self.to_fuse(id)?,
                            kind: file_type(kind),
                            ..write::deleted_file(INodeNo(0))
                        };
                        return Ok(reply.add(
                            INodeNo(0),
                            cookie,
                            OsStr::from_bytes(&name),
                            &Duration::ZERO,
                            &attr,
                            Generation(0),
                        ));
                    };
                    let (attr, generation) = self.entry_uncounted(&st)?;
                    let node = self.to_fuse(id)?;
                    let full = reply.add(
                        node,
                        cookie,
                        OsStr::from_bytes(&name),
                        &ttl,
                        &attr,
                        generation,
                    );
                    // The kernel counts a lookup for each entry it takes,
                    // but for `.` and `..`.
                    if !full && name != b"." && name != b".." {
                        self.kernel_learns(id, 1);
                    }
                    Ok(full)
                },
            )
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_releasedir<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: R,
    ) {
        self.dir_ends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        match self.release_held(ino) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_fsyncdir<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        ds: bool,
        reply: R,
    ) {
        // The directory's entries go into the log tree, with the names
        // they need, as a file's fsync does.
        match self.served.fsync(self.inode_of(ino), ino, ds) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_statfs<R: StatfsReply>(&self, _req: &Caller, _ino: INodeNo, reply: R) {
        let s = self.served.read(|fs| fs.statfs());
        let bsize = u64::from(s.block_size.max(1));
        reply.statfs(
            s.total_bytes / bsize,
            s.unused_bytes / bsize,
            s.free_bytes / bsize,
            s.files,
            0,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }
    pub(super) fn on_getxattr<R: XattrReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: R,
    ) {
        self.stats.count(Counter::Getxattr);
        match self
            .served
            .read(|fs| fs.get_xattr(self.inode_of(ino), name.as_bytes()))
        {
            Ok(Some(value)) => reply_sized(reply, size, &value),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(e)),
        }
    }
    pub(super) fn on_listxattr<R: XattrReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        size: u32,
        reply: R,
    ) {
        match self.served.read(|fs| fs.list_xattrs(self.inode_of(ino))) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                reply_sized(reply, size, &list);
            }
            Err(e) => reply.error(errno(e)),
        }
    }
    pub(super) fn on_access<R: EmptyReply>(
        &self,
        req: &Caller,
        ino: INodeNo,
        mask: AccessFlags,
        reply: R,
    ) {
        let st = match self.served.read(|fs| self.stat(fs, ino)) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if mask.contains(AccessFlags::W_OK) && !self.served.writable() {
            return reply.error(Errno::EROFS);
        }
        if permitted(&st, req.uid(), req.gid(), mask) {
            reply.ok();
        } else {
            reply.error(Errno::EACCES);
        }
    }
    // Everything below changes the filesystem (see `write.rs`): EROFS on a
    // read-only mount.

    pub(super) fn on_setattr<R: AttrReply>(
        &self,
        req: &Caller,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<fuser::BsdFileFlags>,
        reply: R,
    ) {
        // Birth time, backup times and BSD flags come from macOS only.
        if crtime.is_some() || chgtime.is_some() || bkuptime.is_some() || flags.is_some() {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let change = write::Change {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            open_file: fh.is_some(),
        };
        self.stats.count(Counter::Setattr);
        match self.do_setattr(req, ino, change) {
            Ok(attr) => reply.attr(&self.ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_mknod<R: EntryReply>(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: R,
    ) {
        match self.do_create(req, parent, Some(name), mode, umask, rdev) {
            Ok((attr, generation)) => reply.entry(&self.ttl(), &attr, generation),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_mkdir<R: EntryReply>(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: R,
    ) {
        let mode = libc::S_IFDIR | (mode & 0o7777);
        match self.do_create(req, parent, Some(name), mode, umask, 0) {
            Ok((attr, generation)) => reply.entry(&self.ttl(), &attr, generation),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_unlink<R: EmptyReply>(
        &self,
        _req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        reply: R,
    ) {
        let dir = self.inode_of(parent);
        match self.served.write(|fs| {
            // A special file may be open without FUSE ever seeing an open:
            // its last name going keeps it until the kernel forgets it.
            let held = fs
                .unlink_holding(dir, name.as_bytes(), is_special)
                .map_err(errno)?;
            if let Some(id) = held {
                self.held().insert(id);
            }
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_rmdir<R: EmptyReply>(
        &self,
        _req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        reply: R,
    ) {
        let dir = self.inode_of(parent);
        let name = name.as_bytes();
        // An empty subvolume goes with rmdir, and its deletion commits: a
        // failure there is a failed commit.
        let subvolume = self
            .served
            .read(|fs| fs.lookup(dir, name))
            .is_ok_and(|e| e.id.subvol != dir.subvol);
        let done = if subvolume {
            self.served
                .write_committing("subvolume deletion", |fs| fs.rmdir(dir, name))
        } else {
            self.served.write(|fs| fs.rmdir(dir, name).map_err(errno))
        };
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_symlink<R: EntryReply>(
        &self,
        req: &Caller,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: R,
    ) {
        match self.do_symlink(req, parent, link_name, target.as_os_str()) {
            Ok((attr, generation)) => reply.entry(&self.ttl(), &attr, generation),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_rename<R: EmptyReply>(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: R,
    ) {
        match self.do_rename(req, parent, name, newparent, newname, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_link<R: EntryReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: R,
    ) {
        let (id, dir) = (self.inode_of(ino), self.inode_of(newparent));
        let result = self.served.write(|fs| {
            let st = fs.link(id, dir, newname.as_bytes()).map_err(errno)?;
            self.entry(&st)
        });
        match result {
            Ok((attr, generation)) => reply.entry(&self.ttl(), &attr, generation),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_write<R: WriteReply>(
        &self,
        req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: fuser::WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: R,
    ) {
        self.stats.count(Counter::Write);
        self.stats.max(Counter::MaxWrite, data.len() as u64);
        // A write past the page cache comes with the file's flags: to an
        // append-only file, only with O_APPEND (the kernel's check on
        // fcntl, which FUSE leaves to the filesystem); to a synchronous
        // file (`chattr +S`), durable before it is answered, as the
        // kernel's write makes it. The page cache's own writes were
        // allowed when their file was opened.
        use ubtrfs::format::consts::{INODE_APPEND, INODE_SYNC};
        let mut sync = false;
        let cached = write_flags.contains(fuser::WriteFlags::FUSE_WRITE_CACHE);
        if !cached {
            let file_flags = match self.served.read(|fs| self.stat(fs, ino)) {
                Ok(st) => st.flags,
                Err(e) => return reply.error(e),
            };
            if file_flags & INODE_APPEND != 0 && flags.0 & libc::O_APPEND == 0 {
                return reply.error(Errno::EPERM);
            }
            sync = file_flags & INODE_SYNC != 0;
        } else if self.agreed.direct_io_mmap.load(Ordering::Relaxed)
            && !self.has_cached_writers(self.inode_of(ino))
        {
            // Page cache writes of a file open for writing only past the
            // cache come from a shared mapping (FUSE maps those files).
            // An append-only file is opened so, and its mapping must not
            // change its data (the kernel refuses such a mapping on its
            // own filesystems; FUSE does not know the flag): refused, and
            // the pages dropped, so the change is not seen nor sent again
            // with a later write of the page. (A file opened through the
            // cache before it became append-only goes on as in the kernel.)
            match self.served.read(|fs| self.stat(fs, ino)) {
                Ok(st) if st.flags & INODE_APPEND != 0 => {
                    reply.error(Errno::EPERM);
                    let served = Arc::clone(&self.served);
                    let len = data.len() as u64;
                    self.after_writeback_waits(Box::new(move || {
                        served.invalidate_pages(ino, offset, len)
                    }));
                    return;
                }
                Ok(_) => {}
                Err(e) => return reply.error(e),
            }
        }
        let kill = write_flags
            .contains(fuser::WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            .then(|| req.pid());
        let reply: Box<dyn WriteAnswer> = Box::new(reply);
        let deferred = self.deferred.get().filter(|d| {
            !sync
                && d.wants(ino, data.len(), || {
                    self.served.fs_unlocked().writes_must_wait()
                })
        });
        let reply = match deferred {
            Some(d) => {
                let job = deferred::Job {
                    ino,
                    offset,
                    data: data.to_vec(),
                    kill,
                    cached,
                    reply,
                };
                match d.submit(job) {
                    None => return,
                    Some(job) => job.reply,
                }
            }
            None => reply,
        };
        match self.write_ctx().write(ino, offset, data, kill, cached) {
            Ok((n, killed)) => {
                if sync && let Err(e) = self.served.fsync(self.inode_of(ino), ino, false) {
                    return reply.answer(Err(e));
                }
                reply.answer(Ok(n));
                if killed || !cached {
                    // The kernel still has the old mode cached, or (a
                    // write past the cache, whose times the mount moved)
                    // the old times.
                    self.served.invalidate_attrs(ino);
                }
            }
            Err(e) => reply.answer(Err(e)),
        }
    }
    pub(super) fn on_setxattr<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        kill_sgid: bool,
        reply: R,
    ) {
        match self.do_setxattr(ino, name, value, flags, position, kill_sgid) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_removexattr<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        name: &OsStr,
        reply: R,
    ) {
        let id = self.inode_of(ino);
        match self
            .served
            .write(|fs| fs.remove_xattr(id, name.as_bytes()).map_err(xattr_errno))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_create<R: CreateReply>(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: R,
    ) {
        match self.do_create(req, parent, Some(name), mode, umask, 0) {
            Ok((attr, generation)) => {
                let id = self.inode_of(attr.ino);
                self.served.read(|fs| fs.hold_inode(id));
                let direct = flags & libc::O_ACCMODE == libc::O_WRONLY && self.space_tight();
                let (fh, open) = match flags & libc::O_ACCMODE {
                    libc::O_RDONLY => (FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
                    _ if direct => (self.writer_opened(id, true), FopenFlags::FOPEN_DIRECT_IO),
                    _ => (self.writer_opened(id, false), FopenFlags::FOPEN_KEEP_CACHE),
                };
                reply.created(&self.ttl(), &attr, generation, fh, open)
            }
            Err(e) => reply.error(e),
        }
    }
    /// `O_TMPFILE`: a file with no name in `parent`, deleted with its
    /// last close unless `linkat` names it (the library holds it).
    pub(super) fn on_tmpfile<R: CreateReply>(
        &self,
        req: &Caller,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        reply: R,
    ) {
        match self.do_create(req, parent, None, libc::S_IFREG | (mode & 0o7777), umask, 0) {
            Ok((attr, generation)) => {
                let fh = self.writer_opened(self.inode_of(attr.ino), false);
                let (ttl, keep) = (self.ttl(), FopenFlags::FOPEN_KEEP_CACHE);
                reply.created(&ttl, &attr, generation, fh, keep)
            }
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_fallocate<R: EmptyReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: R,
    ) {
        match self.do_fallocate(ino, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_lseek<R: LseekReply>(
        &self,
        _req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: R,
    ) {
        // The kernel asks only for SEEK_DATA and SEEK_HOLE; it handles the
        // others itself.
        let whence = match whence {
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let id = self.inode_of(ino);
        let seek = move |me: &FuseFs| {
            me.served
                .read(|fs| fs.seek(id, offset, whence))
                .map_err(errno)
                .and_then(|at| i64::try_from(at).map_err(|_| Errno::EOVERFLOW))
        };
        // The kernel asks without writing back first: data its cache holds
        // for a file open for writing would be holes here. Written back
        // first, on a thread that serves no requests (the writes come
        // through the others).
        if !(self.writeback_cache() && self.has_writers(id)) {
            return match seek(self) {
                Ok(at) => reply.offset(at),
                Err(e) => reply.error(e),
            };
        }
        let me = self.clone();
        self.after_writeback_waits(Box::new(move || {
            me.write_back_file(ino, id);
            match seek(&me) {
                Ok(at) => reply.offset(at),
                Err(e) => reply.error(e),
            }
        }));
    }

    /// Have the kernel write back the pages it caches of file `ino` and
    /// wait for them: opened by its file handle (export support), then
    /// `sync_file_range`. Needs `CAP_DAC_READ_SEARCH`; without it, or on
    /// any failure, nothing is written back (logged).
    fn write_back_file(&self, ino: INodeNo, id: InodeId) {
        use std::os::unix::fs::OpenOptionsExt;
        let Ok(generation) = self.served.read(|fs| fs.stat(id).map_err(errno)) else {
            return;
        };
        // A directory opened (not O_PATH, which open_by_handle_at refuses),
        // without moving its access time.
        let mnt = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOATIME)
            .open(&*self.mountpoint)
        {
            Ok(f) => f,
            Err(e) => return tracing::debug!("writing back inode {}: {e}", id.ino),
        };
        // The FUSE kernel's handle: node id (high half first), generation.
        #[repr(C)]
        struct FuseHandle {
            bytes: u32,
            kind: i32,
            words: [u32; 3],
        }
        let mut h = FuseHandle {
            bytes: 12,
            kind: 0x81,
            words: [
                (ino.0 >> 32) as u32,
                ino.0 as u32,
                generation.generation as u32,
            ],
        };
        // SAFETY: a file_handle header followed by its 12 bytes; the
        // descriptor returned is owned below.
        let fd = unsafe {
            libc::open_by_handle_at(
                std::os::fd::AsRawFd::as_raw_fd(&mnt),
                (&mut h as *mut FuseHandle).cast(),
                libc::O_RDONLY | libc::O_NOATIME | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return tracing::debug!("writing back inode {}: {e}", id.ino);
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let file = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let how = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: sync_file_range on a descriptor this function owns.
        if unsafe { libc::sync_file_range(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, how) } != 0
        {
            let e = std::io::Error::last_os_error();
            tracing::debug!("writing back inode {}: {e}", id.ino);
        }
    }
    pub(super) fn on_copy_file_range<R: WriteReply>(
        &self,
        _req: &Caller,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: fuser::CopyFileRangeFlags,
        reply: R,
    ) {
        self.stats.count(Counter::CopyFileRange);
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let copy = copy::Copy {
            src: ino_in,
            src_off: offset_in,
            dst: ino_out,
            dst_off: offset_out,
            len,
        };
        match self.do_copy_file_range(copy) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }
    pub(super) fn on_ioctl<R: IoctlReply>(
        &self,
        req: &Caller,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: R,
    ) {
        // chattr/lsattr: the kernel turns FS_IOC_GETFLAGS/SETFLAGS into these.
        let id = self.inode_of(ino);
        if cmd != control::UBTRFS_IOC_SERVER_INFO {
            self.stats.count(Counter::Ioctl);
        }
        // The kernel's stand-in for a nested subvolume in a snapshot is a
        // bare directory that answers no ioctl (flags, subvolume and
        // filesystem ioctls alike); ubtrfs' own ('u') still reach the mount.
        if id.is_placeholder() && (cmd >> 8) & 0xff != u32::from(b'u') {
            return reply.error(Errno::ENOTTY);
        }
        if let Some(request) = subvol_ioctl::decode(cmd, in_data) {
            let request = match request {
                Ok(r) => r,
                Err(e) => return reply.error(e),
            };
            // As in the kernel (without `user_subvol_rm_allowed`): only
            // root deletes.
            if matches!(request, subvol_ioctl::SubvolRequest::Destroy { .. })
                && !caller_access::Credentials::is_admin(req.uid(), req.pid())
            {
                return reply.error(Errno::EPERM);
            }
            // Served, and the kernel's cache of the name dropped, on a
            // thread that serves no requests (see `subvol_ioctl`).
            let caller = *req;
            return self.on_own_thread(reply, move |me| {
                me.subvol_request(&caller, ino, &request)?;
                me.served.invalidate_entry(ino, request.name());
                me.served.invalidate_attrs(ino);
                Ok(Vec::new())
            });
        }
        if cmd == FITRIM {
            // fstrim: root only, as in the kernel; long, so on a thread
            // that serves no requests.
            if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                return reply.error(Errno::EPERM);
            }
            let word = |i: usize| {
                in_data
                    .get(i * 8..i * 8 + 8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            };
            // The blocks of a log not replayed are free in the block
            // groups: trimming them would lose it (the kernel refuses too).
            if self.nologreplay {
                return reply.error(Errno::EROFS);
            }
            let (Some(start), Some(len), Some(min_len)) = (word(0), word(1), word(2)) else {
                return reply.error(Errno::EINVAL);
            };
            let range = move |trimmed: u64| {
                let mut out = Vec::with_capacity(24);
                for v in [start, trimmed, min_len] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out
            };
            let sb = self.served.fs_unlocked().superblock();
            if len < u64::from(sb.sectorsize) || start == u64::MAX {
                return reply.error(Errno::EINVAL);
            }
            // As the kernel: nothing to trim past the end or on a
            // read-only mount, and that is no error.
            if start >= self.served.fs_unlocked().total_bytes() || !self.served.writable() {
                return reply.ioctl(0, &range(0));
            }
            return self.on_own_thread(reply, move |me| {
                let done = me
                    .served
                    .fs_unlocked()
                    .trim(start, len, min_len)
                    .map_err(errno)?;
                Ok(range(done.bytes()))
            });
        }
        if cmd == BTRFS_IOC_SUBVOL_SETFLAGS {
            // Commits, and may have the kernel write back first: on a
            // thread that serves no requests, as subvolume requests.
            let caller = *req;
            let flags = in_data
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
            return self.on_own_thread(reply, move |me| {
                me.set_subvol_flags(&caller, ino, flags)
                    .map(|()| Vec::new())
            });
        }
        if cmd == FS_IOC_SETFSLABEL {
            // As in the kernel: CAP_SYS_ADMIN; commits, so on a thread that
            // serves no requests.
            if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                return reply.error(Errno::EPERM);
            }
            let Some(raw) = in_data.get(..256) else {
                return reply.error(Errno::EINVAL);
            };
            let label = raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())].to_vec();
            return self.on_own_thread(reply, move |me| {
                me.served
                    .write_committing("label", |fs| fs.set_label(&label))
                    .map(|()| Vec::new())
            });
        }
        if cmd == BTRFS_IOC_QUOTA_RESCAN {
            // As in the kernel: CAP_SYS_ADMIN. Done before the answer
            // (the kernel's runs in the background; its WAIT below then
            // has nothing to wait for), on a thread that serves nothing.
            if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                return reply.error(Errno::EPERM);
            }
            return self.on_own_thread(reply, move |me| {
                me.served
                    .write_committing("quota rescan", |fs| fs.quota_rescan())
                    .map(|_| Vec::new())
            });
        }
        if cmd == BTRFS_IOC_DEFAULT_SUBVOL {
            // As in the kernel: CAP_SYS_ADMIN; 0 is the top level.
            if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                return reply.error(Errno::EPERM);
            }
            let Some(id) = in_data
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            else {
                return reply.error(Errno::EINVAL);
            };
            return self.on_own_thread(reply, move |me| {
                me.served
                    .write_committing("set-default", |fs| fs.set_default_subvolume(id))
                    .map(|()| Vec::new())
            });
        }
        if cmd == BTRFS_IOC_QUOTA_RESCAN_WAIT {
            return reply.ioctl(0, &[]);
        }
        if cmd == subvol_info::BTRFS_IOC_SET_RECEIVED_SUBVOL {
            // Commits: on a thread that serves no requests, as above.
            let caller = *req;
            let args = in_data.to_vec();
            return self.on_own_thread(reply, move |me| me.set_received(&caller, ino, &args));
        }
        match cmd {
            // `btrfs subvolume show`, `btrfs property`: what the subvolume
            // holding the inode is; anyone may ask, as in the kernel.
            subvol_info::BTRFS_IOC_GET_SUBVOL_INFO => {
                let info = self.served.read(|fs| -> ubtrfs::Result<_> {
                    let item = fs.subvolume_root_item(id.subvol)?;
                    let link = fs.subvolume_link(id.subvol)?;
                    if link.is_none() && id.subvol != ubtrfs::format::consts::FS_TREE_OBJECTID {
                        return Err(ubtrfs::Error::NotFound(format!(
                            "subvolume {} has no link",
                            id.subvol
                        )));
                    }
                    Ok(subvol_info::GetSubvolInfo::of(
                        id.subvol,
                        &item,
                        link.as_ref(),
                    ))
                });
                match info {
                    Ok(info) => reply.ioctl(0, info.bytes()),
                    Err(e) => reply.error(errno(e)),
                }
            }
            // `btrfs property get ro`: the subvolume's read-only flag.
            BTRFS_IOC_SUBVOL_GETFLAGS => {
                if id.ino != ubtrfs::format::consts::FIRST_INODE || id.is_placeholder() {
                    return reply.error(Errno::EINVAL);
                }
                match self.served.read(|fs| fs.subvolume_readonly(id.subvol)) {
                    Ok(ro) => {
                        let flags = if ro { subvol_ioctl::SUBVOL_RDONLY } else { 0 };
                        reply.ioctl(0, &flags.to_le_bytes())
                    }
                    Err(e) => reply.error(errno(e)),
                }
            }
            control::UBTRFS_IOC_SERVER_INFO => {
                let mut flags = 0;
                if self.writeback_cache() {
                    flags |= control::FLAG_WRITEBACK_CACHE;
                }
                if self.killpriv() {
                    flags |= control::FLAG_KILLPRIV_V2;
                }
                if self.posix_acl() {
                    flags |= control::FLAG_POSIX_ACL;
                }
                if self.served.writable() {
                    flags |= control::FLAG_READ_WRITE;
                }
                if self.agreed.ring_used.load(Ordering::Relaxed) {
                    flags |= control::FLAG_URING;
                }
                reply.ioctl(0, &self.stats.reply(flags))
            }
            // `btrfs device stats`: anyone reads, only an admin resets.
            BTRFS_IOC_GET_DEV_STATS => {
                let word = |i: usize| {
                    in_data
                        .get(i * 8..i * 8 + 8)
                        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                };
                let (Some(devid), Some(nr_items), Some(flags)) = (word(0), word(1), word(2)) else {
                    return reply.error(Errno::EINVAL);
                };
                let reset = flags & DEV_STATS_RESET != 0;
                if reset && !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                    return reply.error(Errno::EPERM);
                }
                // Reset in memory on a read-only mount, as the kernel does.
                let found = self.served.read(|fs| -> Result<_, Errno> {
                    let entries = if reset {
                        fs.reset_device_stats(Some(devid))
                    } else {
                        fs.device_stats()
                    }
                    .map_err(errno)?;
                    let e = entries.into_iter().find(|e| e.devid == devid);
                    e.map(|e| e.values).ok_or(Errno::ENODEV)
                });
                match found {
                    Ok(values) => {
                        let n = (nr_items as usize).min(values.len());
                        let mut out = vec![0u8; DEV_STATS_ARGS_SIZE];
                        out[..8].copy_from_slice(&devid.to_le_bytes());
                        out[8..16].copy_from_slice(&(n as u64).to_le_bytes());
                        out[16..24].copy_from_slice(&flags.to_le_bytes());
                        for (i, v) in values[..n].iter().enumerate() {
                            out[24 + i * 8..32 + i * 8].copy_from_slice(&v.to_le_bytes());
                        }
                        reply.ioctl(0, &out)
                    }
                    Err(e) => reply.error(e),
                }
            }
            control::UBTRFS_IOC_DEFAULT_SUBVOL => {
                match self.served.read(|fs| fs.default_subvolume().map_err(errno)) {
                    Ok(id) => reply.ioctl(0, &id.to_le_bytes()),
                    Err(e) => reply.error(e),
                }
            }
            FS_IOC_GETFSLABEL => {
                let mut out = self.served.read(|fs| fs.label_bytes());
                out.resize(256, 0);
                reply.ioctl(0, &out)
            }
            FS_IOC_GETFLAGS => match self.served.read(|fs| fs.stat(id)) {
                Ok(st) => reply.ioctl(0, &to_fs_flags(st.flags).to_le_bytes()),
                Err(e) => reply.error(errno(e)),
            },
            FS_IOC_SETFLAGS => {
                let Some(raw) = in_data.get(..4) else {
                    return reply.error(Errno::EINVAL);
                };
                let wanted = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
                let Some(flags) = from_fs_flags(wanted) else {
                    // Flags the library does not enforce are refused, not pretended.
                    return reply.error(Errno::EOPNOTSUPP);
                };
                // Flags chattr cannot see here are kept as they are.
                let mapped = FS_FLAG_MAP.iter().fold(0, |a, (_, b)| a | b);
                self.change_flags(ino, id, flags, mapped, reply);
            }
            FS_IOC_FSSETXATTR => {
                let word = |i: usize| {
                    in_data
                        .get(i * 4..i * 4 + 4)
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
                };
                let (Some(xflags), Some(extsize), Some(projid), Some(cowextsize)) =
                    (word(0), word(1), word(3), word(4))
                else {
                    return reply.error(Errno::EINVAL);
                };
                // As btrfs: the flags chattr also has, no extent size
                // hints, no project ids (the kernel's btrfs refuses those).
                let known = XFLAG_MAP.iter().fold(0, |a, (x, _)| a | x);
                if xflags & !known != 0 || extsize != 0 || projid != 0 || cowextsize != 0 {
                    return reply.error(Errno::EOPNOTSUPP);
                }
                let flags = XFLAG_MAP
                    .iter()
                    .filter(|(x, _)| xflags & x != 0)
                    .fold(0, |a, (_, b)| a | b);
                let mapped = XFLAG_MAP.iter().fold(0, |a, (_, b)| a | b);
                self.change_flags(ino, id, flags, mapped, reply);
            }
            control::UBTRFS_IOC_SPACE_INFO => {
                match self.served.read(|fs| fs.space_info().map_err(errno)) {
                    Ok(spaces) => reply.ioctl(0, &control::encode_space(&spaces)),
                    Err(e) => reply.error(e),
                }
            }
            control::UBTRFS_IOC_USAGE => match self.served.read(|fs| fs.usage().map_err(errno)) {
                Ok(u) => reply.ioctl(0, &control::encode_usage(&u)),
                Err(e) => reply.error(e),
            },
            control::UBTRFS_IOC_SCRUB => {
                if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                    return reply.error(Errno::EPERM);
                }
                let Some((repair, mut cursor)) = control::decode_scrub_request(in_data) else {
                    return reply.error(Errno::EINVAL);
                };
                if repair && !self.served.writable() {
                    return reply.error(Errno::EROFS);
                }
                // A step may wait for the transaction: never on a thread
                // that serves requests.
                self.on_own_thread(reply, move |me| {
                    let mut report = ubtrfs::scrub::ScrubReport::default();
                    let supers = cursor.phase == ubtrfs::scrub::ScrubPhase::Supers;
                    let mut step = |fs: &ubtrfs::fs::Filesystem| {
                        fs.scrub_step(&mut cursor, repair, SCRUB_STEP_BYTES, &mut report)
                            .map(|()| fs.superblock().bytes_used)
                    };
                    // Mending superblocks commits: with readers shut out,
                    // as every commit of the mount.
                    let in_use = if repair && supers {
                        me.served.write_committing("scrub", step)?
                    } else {
                        me.served.read(|fs| step(fs).map_err(errno))?
                    };
                    Ok(control::encode_scrub_reply(&cursor, in_use, &report))
                });
            }
            control::UBTRFS_IOC_SUBVOL_LIST => {
                if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                    return reply.error(Errno::EPERM);
                }
                let after = in_data
                    .get(..8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
                let listed = self.served.read(|fs| {
                    let all = fs.subvolumes().map_err(errno)?;
                    // On a mount of another subvolume (subvol=), those below
                    // it are shown from it, as btrfs-progs shows them.
                    let mut base = match self.root.subvol {
                        ubtrfs::format::consts::FS_TREE_OBJECTID => Vec::new(),
                        id => fs.subvolume_path(&all, id).map_err(errno)?,
                    };
                    if !base.is_empty() {
                        base.push(b'/');
                    }
                    let (mut out, mut bytes) = (Vec::new(), 0);
                    // In id order (the root tree's), as the reply wants.
                    for s in all.iter().filter(|s| s.id > after) {
                        // One whose link cannot be followed (damaged) is
                        // left out, as btrfs-progs leaves it.
                        let path = match fs.subvolume_path(&all, s.id) {
                            Ok(p) => p,
                            Err(e) => {
                                tracing::warn!("subvolume {}: {e}", s.id);
                                continue;
                            }
                        };
                        let path = match path.strip_prefix(&base[..]) {
                            Some(below) => below.to_vec(),
                            None => path,
                        };
                        bytes += control::LISTED_HEADER + path.len();
                        out.push(control::ListedSubvol {
                            id: s.id,
                            parent: s.parent,
                            generation: s.generation,
                            readonly: s.readonly,
                            path,
                        });
                        // More than fit in one reply are never sent.
                        if bytes > control::LIST_SIZE {
                            break;
                        }
                    }
                    Ok(out)
                });
                match listed {
                    Ok(l) => reply.ioctl(0, &control::encode_list(&l)),
                    Err(e) => reply.error(e),
                }
            }
            // `btrfs filesystem sync`, `ubtrfs sync`: the kernel never sends
            // FUSE_SYNCFS to a mount like this one (only to virtiofs), so
            // syncfs(2) writes back to the mount but cannot make it commit.
            BTRFS_IOC_SYNC => match self.served.commit("sync") {
                Ok(()) => reply.ioctl(0, &[]),
                Err(e) => reply.error(e),
            },
            // `ubtrfs filesystem resize` (and `btrfs filesystem resize`'s
            // request): root only, as in the kernel.
            BTRFS_IOC_RESIZE => {
                if !caller_access::Credentials::is_admin(req.uid(), req.pid()) {
                    return reply.error(Errno::EPERM);
                }
                let name = in_data.get(8..).unwrap_or_default();
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                let Ok(text) = std::str::from_utf8(name) else {
                    return reply.error(Errno::EINVAL);
                };
                let Ok(request) = ubtrfs::fs::resize::ResizeRequest::parse(text) else {
                    return reply.error(Errno::EINVAL);
                };
                match self
                    .served
                    .write_committing("resize", |fs| fs.resize_device(&request))
                {
                    Ok(r) => {
                        tracing::info!(
                            "resized device {} ({}) from {} to {} bytes",
                            r.devid,
                            r.path.display(),
                            r.old,
                            r.new
                        );
                        reply.ioctl(0, &[])
                    }
                    Err(e) => reply.error(e),
                }
            }
            // The kernel reads the extended attributes too before a change.
            FS_IOC_FSGETXATTR => match self.served.read(|fs| fs.stat(id)) {
                Ok(st) => {
                    let mut fsx = [0u8; 28];
                    fsx[..4].copy_from_slice(&to_xflags(st.flags).to_le_bytes());
                    reply.ioctl(0, &fsx)
                }
                Err(e) => reply.error(errno(e)),
            },
            _ => reply.error(Errno::ENOTTY),
        }
    }
}

impl FuseFs {
    /// Create, snapshot or delete a subvolume in directory `ino` (see
    /// [`subvol_ioctl`]).
    fn subvol_request(
        &self,
        req: &Caller,
        ino: INodeNo,
        request: &subvol_ioctl::SubvolRequest,
    ) -> Result<(), Errno> {
        use subvol_ioctl::SubvolRequest;
        if !self.served.writable() {
            return Err(Errno::EROFS);
        }
        let views = self.writable_views(req, ino)?;
        let dir = self.inode_of(ino);
        let name = request.name();
        // Another user than root creates and snapshots where the kernel
        // would let them (deletions were refused before the thread).
        let caller = match caller_access::Credentials::of(req.pid()) {
            Ok(c) if req.uid() == 0 && c.admin => None,
            Ok(mut c) => {
                // The request's own ids are the ones its kernel call had.
                (c.uid, c.gid) = (req.uid(), req.gid());
                Some(c)
            }
            Err(_) if req.uid() == 0 => return Err(Errno::EPERM),
            Err(e) => return Err(e),
        };
        match request {
            SubvolRequest::Create { .. } => {
                if let Some(who) = &caller {
                    self.check_may_link(&views, ino, name, who)?;
                }
                // The kernel applies the caller's umask to the new root.
                let mode = 0o777 & !caller_umask(req.pid()).unwrap_or(0o022);
                self.served.write(|fs| {
                    if self.stat(fs, ino)?.kind != FileKind::Dir {
                        return Err(Errno::ENOTDIR);
                    }
                    let root = fs
                        .create_subvolume(dir, name, req.uid(), req.gid())
                        .map_err(errno)?;
                    if mode != 0o755 {
                        let m = ubtrfs::fs::SetAttr {
                            mode: Some(mode),
                            ..Default::default()
                        };
                        fs.setattr(root, m).map_err(errno)?;
                    }
                    Ok(())
                })
            }
            SubvolRequest::Snapshot { fd, readonly, .. } => {
                // The source, found and held before any lock is taken.
                let source = caller_access::pin(req.pid(), *fd)?;
                if self.device() != Some(source.dev) {
                    return Err(Errno::EXDEV);
                }
                let src = self.inode_of_st_ino(source.ino);
                if let Some(who) = &caller {
                    // The kernel's order: the source's owner, then the name.
                    let owner = self.served.read(|fs| fs.stat(src).map_err(errno))?.uid;
                    if owner != who.uid && !who.fowner {
                        return Err(Errno::EPERM);
                    }
                }
                write_back_kernel_cache(&source);
                if let Some(who) = &caller {
                    self.check_may_link(&views, ino, name, who)?;
                }
                // Commits inside: a failure there is a failed commit.
                self.served.write_committing("snapshot", |fs| {
                    if fs.stat(dir)?.kind != FileKind::Dir {
                        return Err(ubtrfs::Error::NotDir(format!("inode {}", dir.ino)));
                    }
                    fs.stat(src)?;
                    if src.ino != ubtrfs::format::consts::FIRST_INODE {
                        return Err(ubtrfs::Error::Invalid("not a subvolume root".into()));
                    }
                    fs.create_snapshot(src.subvol, dir, name, *readonly)
                        .map(drop)
                })
            }
            SubvolRequest::Destroy { .. } => {
                // The names in the subvolume's root, which the kernel may
                // still cache for a descriptor opened before: dropped
                // after, as the kernel's btrfs prunes them.
                let root = self.served.read(|fs| {
                    let root = fs.lookup(dir, name).ok()?.id;
                    Some((root, fs.read_dir(root, 0).ok()?))
                });
                self.served.write_committing("subvolume deletion", |fs| {
                    fs.delete_subvolume(dir, name, false)
                })?;
                if let Some((root, entries)) = root
                    && let Ok(root) = self.to_fuse(root)
                {
                    for e in entries {
                        self.served.invalidate_entry(root, &e.name);
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether `who`, who is not root, may link a new subvolume as `name`
    /// in directory `ino`, as the kernel decides it: `EEXIST` first, then
    /// the caller's permission on its own descriptor of the directory (see
    /// `caller_access`). No lock is held: the kernel may ask for
    /// attributes meanwhile.
    fn check_may_link(
        &self,
        views: &[caller_access::Pinned],
        ino: INodeNo,
        name: &[u8],
        who: &caller_access::Credentials,
    ) -> Result<(), Errno> {
        let dir = self.inode_of(ino);
        match self.served.read(|fs| fs.lookup(dir, name)) {
            Ok(_) => return Err(Errno::EEXIST),
            Err(ubtrfs::Error::NotFound(_)) => {}
            Err(e) => return Err(errno(e)),
        }
        if views.is_empty() {
            // The descriptor the request came on is gone, or not the
            // caller's own: nothing to check against.
            return Err(Errno::EPERM);
        }
        // Every view the caller holds of the directory must allow it.
        for dir in views {
            caller_access::may_add_name(dir, who)?;
        }
        Ok(())
    }

    /// The caller's views of `ino` (its descriptors of it, pinned), found
    /// once per request; `EROFS` if one goes through a read-only mount (a
    /// read-only bind mount of this one), as the kernel answers any
    /// caller, root too.
    fn writable_views(
        &self,
        req: &Caller,
        ino: INodeNo,
    ) -> Result<Vec<caller_access::Pinned>, Errno> {
        let Some(dev) = self.device() else {
            return Ok(Vec::new());
        };
        let st_ino = self.st_ino(self.inode_of(ino))?;
        let views = caller_access::descriptors_of(req.pid(), dev, &[ino.0, st_ino.0]);
        if views.iter().any(caller_access::read_only_mount) {
            return Err(Errno::EROFS);
        }
        Ok(views)
    }

    /// The mount's device (`major:minor`).
    fn device(&self) -> Option<(u32, u32)> {
        self.mount_dev
            .get()
            .copied()
            .or_else(|| subvol_ioctl::mount_device(&self.mountpoint))
    }

    /// Serve a request that commits, or waits for the kernel, on a thread
    /// of its own, which answers when `work` is done: a serving thread
    /// must never wait for the kernel (see `subvol_ioctl`). At most
    /// [`OWN_THREADS`] at once; beyond, `EAGAIN`.
    fn on_own_thread<R: IoctlReply + Send + 'static>(
        &self,
        reply: R,
        work: impl FnOnce(&FuseFs) -> Result<Vec<u8>, Errno> + Send + 'static,
    ) {
        if self.own_threads.fetch_add(1, Ordering::AcqRel) >= OWN_THREADS {
            self.own_threads.fetch_sub(1, Ordering::AcqRel);
            return reply.error(Errno::EAGAIN);
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("subvolume".into())
            .spawn(move || {
                let done = work(&me);
                me.own_threads.fetch_sub(1, Ordering::AcqRel);
                match done {
                    Ok(out) => reply.ioctl(0, &out),
                    Err(e) => reply.error(e),
                }
            });
        if let Err(e) = spawned {
            self.own_threads.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("no thread for a subvolume request: {e}");
        }
    }

    /// `BTRFS_IOC_SUBVOL_SETFLAGS` on the root of subvolume `ino`
    /// (`btrfs property set ro`): by its owner or root, as in the kernel.
    /// Before it turns read-only, the kernel writes back what it caches.
    fn set_subvol_flags(
        &self,
        req: &Caller,
        ino: INodeNo,
        flags: Option<u64>,
    ) -> Result<(), Errno> {
        let id = self.inode_of(ino);
        // The kernel's order: owner, writable mount, subvolume root, flags.
        let who = caller_access::Credentials::of(req.pid())?;
        if !(req.uid() == 0 && who.admin) {
            let owner = self.served.read(|fs| fs.stat(id).map_err(errno))?.uid;
            if owner != req.uid() && !who.fowner {
                return Err(Errno::EPERM);
            }
        }
        if !self.served.writable() {
            return Err(Errno::EROFS);
        }
        let views = self.writable_views(req, ino)?;
        if id.ino != ubtrfs::format::consts::FIRST_INODE || id.is_placeholder() {
            return Err(Errno::EINVAL);
        }
        let flags = flags.ok_or(Errno::EINVAL)?;
        if flags & !subvol_ioctl::SUBVOL_RDONLY != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let readonly = flags & subvol_ioctl::SUBVOL_RDONLY != 0;
        if readonly && let Some(dir) = views.first() {
            write_back_kernel_cache(dir);
        }
        self.served.write_committing("property", |fs| {
            fs.set_subvolume_readonly(id.subvol, readonly)
        })
    }

    /// `BTRFS_IOC_SET_RECEIVED_SUBVOL` on the root of subvolume `ino`
    /// (`btrfs receive` at its end; all zero from `btrfs property set -f
    /// ro false`): by its owner or root, on a writable subvolume, as in
    /// the kernel. Answers the request with the receive transid and time.
    fn set_received(&self, req: &Caller, ino: INodeNo, args: &[u8]) -> Result<Vec<u8>, Errno> {
        let id = self.inode_of(ino);
        // The owner, or CAP_FOWNER, as the kernel asks here (root too).
        let who = caller_access::Credentials::of(req.pid())?;
        let owner = self.served.read(|fs| fs.stat(id).map_err(errno))?.uid;
        if owner != req.uid() && !who.fowner {
            return Err(Errno::EPERM);
        }
        if !self.served.writable() {
            return Err(Errno::EROFS);
        }
        self.writable_views(req, ino)?;
        if id.ino != ubtrfs::format::consts::FIRST_INODE || id.is_placeholder() {
            return Err(Errno::EINVAL);
        }
        let r = subvol_info::SetReceived::decode(args).ok_or(Errno::EINVAL)?;
        let (rtransid, rtime) = self.served.write_committing("receive", |fs| {
            fs.set_received(id.subvol, r.uuid, r.stransid, r.stime)
        })?;
        Ok(subvol_info::SetReceived::reply(args, rtransid, rtime))
    }

    /// Learn the mount's device, once mounted (snapshot sources are
    /// checked against it).
    pub fn note_mounted(&self) {
        if let Some(dev) = subvol_ioctl::mount_device(&self.mountpoint) {
            let _ = self.mount_dev.set(dev);
            self.space.learn_dirty_limit(dev);
        }
    }
}

/// Requests served on threads of their own at once, at most.
const OWN_THREADS: usize = 16;

/// Bytes one scrub step of a mount checks: changes wait for a step.
const SCRUB_STEP_BYTES: u64 = 4 << 20;

/// How long a snapshot waits for the writes of the kernel's cached pages
/// to reach the mount (other requests may keep the queue busy).
const WRITE_BACK_WAIT: Duration = Duration::from_secs(2);

/// Have the kernel write back the pages it caches for the mount, through
/// `dir`, a caller's descriptor of a directory in it (a snapshot's
/// source): a snapshot holds what was written before it was asked for,
/// whoever asks. The kernel sends the writes to the mount's other threads.
/// Nothing to do through a file that is no directory (the request is
/// refused later).
fn write_back_kernel_cache(dir: &caller_access::Pinned) {
    let Some(f) = caller_access::open_dir(dir) else {
        return;
    };
    // A fresh descriptor's syncfs also reports an earlier writeback error
    // of any file, not this request's: logged, not answered.
    // SAFETY: a plain system call on a descriptor open for this scope.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
        tracing::warn!(
            "writing back before a snapshot: {}",
            std::io::Error::last_os_error()
        );
    }
    drop(f);
    // syncfs returns once the pages are handed to FUSE, and their writes
    // may still wait in the connection's queue (behind other background
    // requests): wait, a while at most, until none but this request is.
    let waiting = format!("/sys/fs/fuse/connections/{}/waiting", dir.dev.1);
    let deadline = std::time::Instant::now() + WRITE_BACK_WAIT;
    loop {
        let Some(n) = std::fs::read_to_string(&waiting)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        else {
            tracing::debug!("{waiting} unreadable: not waiting for the writes to arrive");
            break;
        };
        if n <= 1 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                "{n} requests still queued after {WRITE_BACK_WAIT:?}: snapshot taken without waiting longer"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The umask of process `pid`, from `/proc/PID/status`.
fn caller_umask(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let v = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

/// `FITRIM`, `_IOWR('X', 121, struct fstrim_range)`: trim free space.
const FITRIM: u32 = 0xC018_5879;
/// `BTRFS_IOC_DEFAULT_SUBVOL`, `_IOW(0x94, 19, u64)`: set the default
/// subvolume.
pub const BTRFS_IOC_DEFAULT_SUBVOL: u32 = 0x4008_9413;
/// `BTRFS_IOC_QUOTA_RESCAN`, `_IOW(0x94, 44, struct
/// btrfs_ioctl_quota_rescan_args)` (64 bytes), and
/// `BTRFS_IOC_QUOTA_RESCAN_WAIT`, `_IO(0x94, 46)`.
pub const BTRFS_IOC_QUOTA_RESCAN: u32 = 0x4040_942c;
pub const BTRFS_IOC_QUOTA_RESCAN_WAIT: u32 = 0x0000_942e;
/// `BTRFS_IOC_GET_DEV_STATS`, `_IOWR(0x94, 52, struct
/// btrfs_ioctl_get_dev_stats)`: devid, item count, flags, the counters,
/// room for more (1,032 bytes).
pub const BTRFS_IOC_GET_DEV_STATS: u32 = 0xC408_9434;
pub const DEV_STATS_ARGS_SIZE: usize = 1032;
/// Its flag: set the counters to zero after reading them.
pub const DEV_STATS_RESET: u64 = 1;
/// `FS_IOC_GETFSLABEL` / `FS_IOC_SETFSLABEL` (`btrfs filesystem label`:
/// 256 bytes, NUL-padded).
const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
/// `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` (the long-sized encoding).
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// `BTRFS_IOC_SUBVOL_GETFLAGS`, `_IOR(0x94, 25, u64)`, and `SETFLAGS`,
/// `_IOW(0x94, 26, u64)`: a subvolume's read-only flag
/// (`BTRFS_SUBVOL_RDONLY`).
pub const BTRFS_IOC_SUBVOL_GETFLAGS: u32 = 0x8008_9419;
pub const BTRFS_IOC_SUBVOL_SETFLAGS: u32 = 0x4008_941a;
/// `BTRFS_IOC_SYNC`, `_IO(0x94, 8)`: commit the running transaction.
pub const BTRFS_IOC_SYNC: u32 = 0x9408;
/// `BTRFS_IOC_RESIZE`, `_IOW(0x94, 3, struct btrfs_ioctl_vol_args)`: the
/// request as text in the name field (after an 8-byte descriptor).
pub const BTRFS_IOC_RESIZE: u32 = 0x5000_9403;
/// `FS_IOC_FSGETXATTR` and `FS_IOC_FSSETXATTR` (struct fsxattr, 28 bytes).
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// The `fsx_xflags` btrfs takes, and their btrfs inode flags.
const XFLAG_MAP: [(u32, u64); 5] = [
    (0x08, ubtrfs::format::consts::INODE_IMMUTABLE),
    (0x10, ubtrfs::format::consts::INODE_APPEND),
    (0x20, ubtrfs::format::consts::INODE_SYNC),
    (0x40, ubtrfs::format::consts::INODE_NOATIME),
    (0x80, ubtrfs::format::consts::INODE_NODUMP),
];

/// The `fsx_xflags` for btrfs inode flags (immutable, append-only, no-dump
/// and no-atime apply). The kernel compares these with a change to let
/// only CAP_LINUX_IMMUTABLE switch immutable and append-only.
fn to_xflags(flags: u64) -> u32 {
    XFLAG_MAP
        .iter()
        .filter(|(_, b)| flags & b != 0)
        .fold(0, |a, (x, _)| a | x)
}

/// The `chattr` flags ubtrfs keeps, and their btrfs inode flags.
const FS_FLAG_MAP: [(u32, u64); 9] = [
    (0x0000_0010, ubtrfs::format::consts::INODE_IMMUTABLE), // i: immutable
    (0x0000_0020, ubtrfs::format::consts::INODE_APPEND),    // a: append only
    (0x0000_0008, ubtrfs::format::consts::INODE_SYNC),      // S: synchronous writes
    (0x0001_0000, ubtrfs::format::consts::INODE_DIRSYNC),   // D: kept, as btrfs keeps it
    (0x0080_0000, ubtrfs::format::consts::INODE_NODATACOW), // C: no copy-on-write
    (0x0000_0004, ubtrfs::format::consts::INODE_COMPRESS),  // c: compress
    (0x0000_0400, ubtrfs::format::consts::INODE_NOCOMPRESS), // m: no compression
    (0x0000_0040, ubtrfs::format::consts::INODE_NODUMP),    // d: no dump
    (0x0000_0080, ubtrfs::format::consts::INODE_NOATIME),   // A: no atime
];

fn to_fs_flags(flags: u64) -> u32 {
    FS_FLAG_MAP
        .iter()
        .filter(|(_, b)| flags & b != 0)
        .fold(0, |a, (f, _)| a | f)
}

/// The btrfs flags for `chattr` flags, or `None` if one is not kept (such as
/// synchronous updates, which the library does not honour yet).
fn from_fs_flags(wanted: u32) -> Option<u64> {
    let known = FS_FLAG_MAP.iter().fold(0, |a, (f, _)| a | f);
    // 0x8_0000 (extents) and 0x1000_0000 (inline data) are reported by other
    // filesystems and echoed back by chattr; they mean nothing here.
    if wanted & !(known | 0x0008_0000 | 0x1000_0000) != 0 {
        return None;
    }
    Some(
        FS_FLAG_MAP
            .iter()
            .filter(|(f, _)| wanted & f != 0)
            .fold(0, |a, (_, b)| a | b),
    )
}

/// Whether `uid`/`gid` may access `st` with `mask` (the caller refuses
/// writes on a read-only mount). Supplementary groups are not known here;
/// mounts use `default_permissions`, so the kernel makes the real check
/// and does not ask this one.
fn permitted(st: &Stat, uid: u32, gid: u32, mask: AccessFlags) -> bool {
    let mut want = 0;
    for (flag, bit) in [
        (AccessFlags::R_OK, 4),
        (AccessFlags::W_OK, 2),
        (AccessFlags::X_OK, 1),
    ] {
        if mask.contains(flag) {
            want |= bit;
        }
    }
    if want == 0 {
        return true;
    }
    if uid == 0 {
        // Root reads and writes anything and executes what has any
        // execute bit (or a directory).
        return want & 1 == 0 || st.kind == FileKind::Dir || st.mode & 0o111 != 0;
    }
    let bits = if uid == st.uid {
        st.mode >> 6
    } else if gid == st.gid {
        st.mode >> 3
    } else {
        st.mode
    } & 7;
    bits & want == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_round_trip() {
        let root = InodeId {
            subvol: 5,
            ino: 256,
        };
        let cases = [
            InodeId {
                subvol: 5,
                ino: 257,
            },
            InodeId { subvol: 5, ino: 2 },
            InodeId {
                subvol: 256,
                ino: 256,
            },
            InodeId {
                subvol: 300,
                ino: 9_978_956,
            },
            InodeId {
                subvol: MAX_SUBVOL,
                ino: PLACEHOLDER_BASE - 1,
            },
            InodeId::placeholder(5, 256),
            InodeId::placeholder(300, 257),
            InodeId::placeholder(300, 258),
            InodeId::placeholder(MAX_SUBVOL, MAX_SUBVOL),
        ];
        assert_eq!(to_fuse(root, root), Ok(INodeNo::ROOT));
        assert_eq!(from_fuse(root, INodeNo::ROOT), root);
        let mut seen = std::collections::HashSet::new();
        for id in cases {
            let n = to_fuse(root, id).unwrap();
            assert_ne!(n, INodeNo::ROOT);
            assert_eq!(from_fuse(root, n), id);
            assert!(seen.insert(n), "{id:?} shares {n:?}");
        }
        // Real inode numbers stop below the placeholders' range.
        assert_eq!(
            to_fuse(
                root,
                InodeId {
                    subvol: 300,
                    ino: PLACEHOLDER_BASE
                }
            ),
            Err(Errno::EOVERFLOW)
        );
        assert_eq!(
            to_fuse(root, InodeId::placeholder(300, MAX_SUBVOL + 1)),
            Err(Errno::EOVERFLOW)
        );
        // The same inode number in two subvolumes gives two FUSE inodes.
        let a = to_fuse(
            root,
            InodeId {
                subvol: 5,
                ino: 300,
            },
        )
        .unwrap();
        let b = to_fuse(
            root,
            InodeId {
                subvol: 256,
                ino: 300,
            },
        )
        .unwrap();
        assert_ne!(a, b);
        assert_eq!(
            to_fuse(
                root,
                InodeId {
                    subvol: 5,
                    ino: 1 << 40
                }
            ),
            Err(Errno::EOVERFLOW)
        );
        assert_eq!(
            to_fuse(
                root,
                InodeId {
                    subvol: 1 << 24,
                    ino: 257
                }
            ),
            Err(Errno::EOVERFLOW)
        );
    }

    #[test]
    fn other_default_subvolume() {
        let root = InodeId {
            subvol: 257,
            ino: 256,
        };
        assert_eq!(to_fuse(root, root), Ok(INodeNo::ROOT));
        let top = InodeId {
            subvol: 5,
            ino: 256,
        };
        let n = to_fuse(root, top).unwrap();
        assert_eq!(from_fuse(root, n), top);
    }

    #[test]
    fn times() {
        let t = system_time(&Timespec { sec: 1, nsec: 5 });
        assert_eq!(t, UNIX_EPOCH + Duration::new(1, 5));
        let t = system_time(&Timespec {
            sec: -2,
            nsec: 500_000_000,
        });
        assert_eq!(t, UNIX_EPOCH - Duration::from_millis(1500));
        let _ = system_time(&Timespec {
            sec: i64::MAX,
            nsec: u32::MAX,
        });
        let _ = system_time(&Timespec {
            sec: i64::MIN,
            nsec: u32::MAX,
        });
    }
}

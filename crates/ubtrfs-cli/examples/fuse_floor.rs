//! The FUSE floor for `bench/metadata.sh`: a filesystem that keeps names
//! and sizes in memory and throws file data away, mounted with the FUSE
//! crate, thread count and kernel capabilities of `ubtrfs mount`. Whatever
//! a workload costs here is what FUSE costs (request round trips, copies
//! through /dev/fuse, the kernel's FUSE client), with next to no
//! filesystem behind it.
//!
//! ```text
//! fuse_floor [--nouring] MOUNTPOINT   # serves until unmounted (fusermount3 -u MOUNTPOINT)
//! ```
//!
//! Requests come over io_uring when the kernel offers it (as for `ubtrfs
//! mount`), through /dev/fuse with `--nouring`.
//!
//! Reads return zeros up to the size written. No persistence, no
//! permissions beyond the kernel's `default_permissions`.

use anyhow::{Context, Result, bail};
use fuse_ring::abi::{Out, opcode, split_name};
use fuser::{
    Config, Errno, FileAttr, FileType, FopenFlags, INodeNo, InitFlags, KernelConfig, MountOption,
    Request,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// As in ubtrfs' adapter (read-write mounts).
const TTL: Duration = Duration::from_secs(60);
/// As in ubtrfs' adapter; the kernel caps both.
const MAX_WRITE: u32 = 4 << 20;
const MAX_READAHEAD: u32 = 1 << 20;
const ROOT: u64 = 1;

struct Node {
    /// Directory entries by name; `None` for a file.
    entries: Option<BTreeMap<Vec<u8>, u64>>,
    size: u64,
    perm: u16,
    nlink: u32,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
}

struct Inner {
    nodes: HashMap<u64, Node>,
    next: u64,
}

/// The session's side: INIT and DESTROY, which `fuser` calls; requests
/// go to [`RingFloor`].
struct Floor {
    /// Whether the kernel agreed to serve over io_uring.
    uring: Arc<AtomicBool>,
    /// Whether to ask it (`--nouring` says no).
    uring_wanted: bool,
    /// The rings, once started; joined before the session ends.
    rings: Arc<Mutex<Option<fuse_ring::Rings>>>,
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

fn attr(ino: u64, n: &Node) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: n.size,
        blocks: n.size.div_ceil(512),
        atime: n.mtime,
        mtime: n.mtime,
        ctime: n.mtime,
        crtime: n.mtime,
        kind: if n.entries.is_some() {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: n.perm,
        nlink: n.nlink,
        uid: n.uid,
        gid: n.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Inner {
    fn attr_of(&self, ino: u64) -> Result<FileAttr, Errno> {
        self.nodes
            .get(&ino)
            .map(|n| attr(ino, n))
            .ok_or(Errno::ENOENT)
    }

    fn dir(&mut self, ino: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>, Errno> {
        self.nodes
            .get_mut(&ino)
            .ok_or(Errno::ENOENT)?
            .entries
            .as_mut()
            .ok_or(Errno::ENOTDIR)
    }

    fn make(
        &mut self,
        (uid, gid): (u32, u32),
        parent: u64,
        name: &OsStr,
        perm: u32,
        dir: bool,
    ) -> Result<FileAttr, Errno> {
        let ino = self.next;
        let d = self.dir(parent)?;
        if d.contains_key(name.as_bytes()) {
            return Err(Errno::EEXIST);
        }
        d.insert(name.as_bytes().to_vec(), ino);
        self.next += 1;
        let n = Node {
            entries: dir.then(BTreeMap::new),
            size: 0,
            perm: (perm & 0o7777) as u16,
            nlink: if dir { 2 } else { 1 },
            uid,
            gid,
            mtime: SystemTime::now(),
        };
        let a = attr(ino, &n);
        self.nodes.insert(ino, n);
        Ok(a)
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = *self
            .dir(parent)?
            .get(name.as_bytes())
            .ok_or(Errno::ENOENT)?;
        let n = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        match (&n.entries, dir) {
            (Some(e), true) if !e.is_empty() => return Err(Errno::ENOTEMPTY),
            (Some(_), false) => return Err(Errno::EISDIR),
            (None, true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.dir(parent)?.remove(name.as_bytes());
        self.nodes.remove(&ino);
        Ok(())
    }

    /// Entries of `ino` from cookie `offset` on: `.` is 1, `..` 2, the
    /// n-th name (by name order) n + 3.
    fn list(&mut self, ino: u64, offset: u64) -> Result<Vec<(u64, Vec<u8>, u64)>, Errno> {
        let d = self.dir(ino)?;
        let mut out = vec![(1, b".".to_vec(), ino), (2, b"..".to_vec(), ino)];
        out.extend(
            d.iter()
                .enumerate()
                .map(|(i, (name, &child))| (i as u64 + 3, name.clone(), child)),
        );
        out.retain(|(cookie, _, _)| *cookie > offset);
        Ok(out)
    }
}

impl fuser::Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The capabilities ubtrfs' adapter asks for on a read-write mount,
        // so the kernel behaves alike (writeback cache included).
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_WRITEBACK_CACHE,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            let _ = config.add_capabilities(cap);
        }
        if let Err(max) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD) {
            let _ = config.set_max_readahead(max);
        }
        if self.uring_wanted
            && fuse_ring::kernel_enabled()
            && fuse_ring::probe().is_ok()
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok()
        {
            // The ring's payload buffers must hold the largest write.
            let _ = config.set_max_write(RING_MAX_WRITE);
            self.uring.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(r) = rings {
            let _ = r.stop();
        }
    }
}

/// `max_write` when serving over io_uring: every entry has a payload
/// buffer this large, and the kernel sends no more in one write anyway.
const RING_MAX_WRITE: u32 = 1 << 20;

fn wire(a: &FileAttr) -> fuse_ring::abi::Attr {
    fuse_ring::from_fuser::attr(a)
}

/// The same filesystem, answering requests that come over io_uring or
/// are read from /dev/fuse.
struct RingFloor {
    inner: Arc<Mutex<Inner>>,
}

impl RingFloor {
    fn serve(&self, req: &fuse_ring::ring::Request<'_>) -> Result<Out, Errno> {
        let h = req.header;
        let name = || {
            split_name(req.payload)
                .map(|(n, _)| OsStr::from_bytes(n))
                .ok_or(Errno::EINVAL)
        };
        let mut out = Out::with_capacity(256);
        let mut g = lock(&self.inner);
        match h.opcode {
            opcode::LOOKUP => {
                let r = g
                    .dir(h.nodeid)
                    .and_then(|d| d.get(name()?.as_bytes()).copied().ok_or(Errno::ENOENT))
                    .and_then(|ino| g.attr_of(ino));
                match r {
                    Ok(a) => out.entry(a.ino.0, 0, TTL, &wire(&a)),
                    Err(Errno::ENOENT) => {
                        let mut none = wire(&attr(ROOT, &g.nodes[&ROOT]));
                        none.ino = 0;
                        out.entry(0, 0, TTL, &none)
                    }
                    Err(e) => return Err(e),
                };
            }
            opcode::GETATTR => {
                out.attr_out(TTL, &wire(&g.attr_of(h.nodeid)?));
            }
            opcode::SETATTR => {
                let n = g.nodes.get_mut(&h.nodeid).ok_or(Errno::ENOENT)?;
                let valid = req.arg.u32(0);
                if valid & (1 << 0) != 0 {
                    n.perm = (req.arg.u32(68) & 0o7777) as u16;
                }
                if valid & (1 << 3) != 0 {
                    n.size = req.arg.u64(16);
                }
                n.mtime = SystemTime::now();
                out.attr_out(TTL, &wire(&attr(h.nodeid, n)));
            }
            opcode::MKDIR | opcode::CREATE => {
                let dir = h.opcode == opcode::MKDIR;
                let (mode, umask) = if dir {
                    (req.arg.u32(0), req.arg.u32(4))
                } else {
                    (req.arg.u32(4), req.arg.u32(8))
                };
                let a = g.make((h.uid, h.gid), h.nodeid, name()?, mode & !umask, dir)?;
                out.entry(a.ino.0, 0, TTL, &wire(&a));
                if !dir {
                    out.open(0, FopenFlags::FOPEN_KEEP_CACHE.bits());
                }
            }
            opcode::UNLINK | opcode::RMDIR => {
                g.remove(h.nodeid, name()?, h.opcode == opcode::RMDIR)?;
            }
            opcode::OPEN => {
                g.attr_of(h.nodeid)?;
                out.open(0, FopenFlags::FOPEN_KEEP_CACHE.bits());
            }
            opcode::OPENDIR => {
                g.dir(h.nodeid)?;
                out.open(0, 0);
            }
            opcode::READ => {
                let n = g.nodes.get(&h.nodeid).ok_or(Errno::ENOENT)?;
                let len = n
                    .size
                    .saturating_sub(req.arg.u64(8))
                    .min(u64::from(req.arg.u32(16)));
                out.0.resize(len as usize, 0);
            }
            opcode::WRITE => {
                let n = g.nodes.get_mut(&h.nodeid).ok_or(Errno::ENOENT)?;
                n.size = n.size.max(req.arg.u64(8) + req.payload.len() as u64);
                n.mtime = SystemTime::now();
                out.u32(req.payload.len() as u32).u32(0);
            }
            opcode::READDIR | opcode::READDIRPLUS => {
                let limit = req.arg.u32(16) as usize;
                for (cookie, name, child) in g.list(h.nodeid, req.arg.u64(8))? {
                    let Ok(a) = g.attr_of(child) else { continue };
                    let kind = fuse_ring::from_fuser::dirent_type(a.kind);
                    let fits = if h.opcode == opcode::READDIR {
                        out.dirent(child, cookie, kind, &name, limit)
                    } else {
                        out.direntplus((child, 0, TTL, &wire(&a)), cookie, kind, &name, limit)
                    };
                    if !fits {
                        break;
                    }
                }
            }
            // As ubtrfs: the kernel stops sending FLUSH.
            opcode::FLUSH => return Err(Errno::ENOSYS),
            opcode::RELEASE | opcode::RELEASEDIR | opcode::FSYNC | opcode::FSYNCDIR => {}
            opcode::STATFS => {
                let files = g.nodes.len() as u64;
                out.u64(1 << 30)
                    .u64(1 << 30)
                    .u64(1 << 30)
                    .u64(files + (1 << 30))
                    .u64(1 << 30);
                out.u32(4096).u32(255).u32(4096).u32(0);
                out.0.resize(80, 0);
            }
            _ => return Err(Errno::ENOSYS),
        }
        Ok(out)
    }
}

impl fuse_ring::Handler for RingFloor {
    fn handle(&self, entry: fuse_ring::RingEntry) {
        match self.serve(&entry.request()) {
            Ok(out) => entry.reply(&[&out.0]),
            Err(e) => entry.error(i32::from(e)),
        }
    }
}

impl fuse_ring::dev::DevHandler for RingFloor {
    fn handle(&self, req: fuse_ring::ring::Request<'_>, answer: fuse_ring::dev::DevAnswer) {
        match self.serve(&req) {
            Ok(out) => answer.reply(&[&out.0]),
            Err(e) => answer.error(i32::from(e)),
        }
    }
    fn forget(&self, _nodeid: u64, _nlookup: u64) {}
}

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let nouring = args.first().is_some_and(|a| a == "--nouring");
    if nouring {
        args.remove(0);
    }
    let [mountpoint] = args.as_slice() else {
        bail!("usage: fuse_floor [--nouring] MOUNTPOINT");
    };
    let mut nodes = HashMap::new();
    nodes.insert(
        ROOT,
        Node {
            entries: Some(BTreeMap::new()),
            size: 0,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            mtime: SystemTime::now(),
        },
    );
    let inner = Arc::new(Mutex::new(Inner { nodes, next: 2 }));
    let uring = Arc::new(AtomicBool::new(false));
    let rings = Arc::new(Mutex::new(None));
    let fs = Floor {
        uring: Arc::clone(&uring),
        uring_wanted: !nouring,
        rings: Arc::clone(&rings),
    };
    // The session setup of `ubtrfs mount`: same thread count, kernel
    // permission checks.
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::DefaultPermissions,
        MountOption::FSName("fuse_floor".into()),
        MountOption::Subtype("fuse_floor".into()),
        MountOption::RW,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.n_threads = Some(
        std::thread::available_parallelism()
            .map(|n| n.get().clamp(2, 8))
            .unwrap_or(2),
    );
    let session = fuser::Session::new(fs, mountpoint, &config)
        .with_context(|| format!("cannot mount on {mountpoint}"))?;
    // INIT is done: if the kernel agreed, requests go over io_uring from
    // now on. The descriptor lives as long as the session, which outlives
    // the rings (joined in `destroy`).
    if uring.load(Ordering::Relaxed) {
        let queues = fuse_ring::probe()?;
        let ring = fuse_ring::RingConfig {
            queues,
            // As `ubtrfs mount` sets its queues up.
            threads_per_queue: (16 / queues.max(1)).clamp(1, 4),
            depth: 1,
            payload_size: RING_MAX_WRITE as usize,
            pin: true,
            idle_wait: true,
        };
        let handler = Arc::new(RingFloor {
            inner: Arc::clone(&inner),
        });
        let started = fuse_ring::Rings::start(session.as_fd().as_raw_fd(), &ring, handler)?;
        *rings.lock().unwrap_or_else(|e| e.into_inner()) = Some(started);
    }
    // /dev/fuse is read by the threads `ubtrfs mount` uses (one beside the
    // rings), not by fuser's loop.
    let threads = if uring.load(Ordering::Relaxed) {
        1
    } else {
        config.n_threads.unwrap_or(1)
    };
    let dev = fuse_ring::dev::DevThreads::start(
        session.as_fd(),
        threads,
        MAX_WRITE as usize + fuse_ring::dev::REQUEST_ROOM,
        false,
        Arc::new(RingFloor { inner }),
    )?;
    dev.join().context("serving")?;
    // Stops the rings (`destroy`), then unmounts.
    drop(session);
    Ok(())
}

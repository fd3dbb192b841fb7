//! Large writes that must wait for writeback room, served by a thread of
//! their own.
//!
//! A stream of writes is paced by the device (or by compression): each
//! write waits until the data before it is on its way. Waiting in a FUSE
//! thread leaves that thread to nothing else, and with a few threads all
//! of them end up waiting behind the stream while an fsync, a read or a
//! small write of another file queues in the kernel. Such a write is
//! handed here instead: one thread waits for room and writes them in the
//! order they came, and the FUSE threads go on. Every later write to an
//! inode with writes waiting here follows them, so one file's writes are
//! never reordered.

use super::reply::WriteAnswer;
use super::write::WriteCtx;
use fuser::INodeNo;
use std::collections::HashMap;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Writes at least this long wait here when there is no room; shorter
/// ones (a page an fsync flushes) are written at once.
pub(super) const DEFER_MIN: usize = ubtrfs::data::write::SMALL_WRITE;

/// A write handed over, with its reply.
pub(super) struct Job {
    pub ino: INodeNo,
    pub offset: u64,
    pub data: Vec<u8>,
    /// The writing process, when set-user-ID bits must go.
    pub kill: Option<u32>,
    /// The kernel's page cache writes it (else it moves the file's times).
    pub cached: bool,
    pub reply: Box<dyn WriteAnswer>,
}

/// Deferred writes not yet answered, per inode.
type Waiting = Arc<Mutex<HashMap<INodeNo, usize>>>;

/// The thread of deferred writes.
pub(super) struct DeferredWrites {
    waiting: Waiting,
    tx: Mutex<Option<Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DeferredWrites {
    /// Start the thread, writing through `ctx`.
    pub fn start(ctx: WriteCtx) -> std::io::Result<Self> {
        let waiting: Waiting = Arc::default();
        let (tx, rx) = channel::<Job>();
        let w = Arc::clone(&waiting);
        let worker = std::thread::Builder::new()
            .name("deferred-writes".into())
            .spawn(move || {
                for job in rx {
                    match ctx.write(job.ino, job.offset, &job.data, job.kill, job.cached) {
                        Ok((n, killed)) => {
                            job.reply.answer(Ok(n));
                            if killed || !job.cached {
                                ctx.served.invalidate_attrs(job.ino);
                            }
                        }
                        Err(e) => job.reply.answer(Err(e)),
                    }
                    let mut m = lock(&w);
                    if let Some(n) = m.get_mut(&job.ino) {
                        *n -= 1;
                        if *n == 0 {
                            m.remove(&job.ino);
                        }
                    }
                }
            })?;
        Ok(DeferredWrites {
            waiting,
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Whether a write of `len` bytes to `ino` should wait here: it is
    /// long and there is no room (`no_room`), or writes to its inode wait
    /// here already.
    pub fn wants(&self, ino: INodeNo, len: usize, no_room: impl FnOnce() -> bool) -> bool {
        lock(&self.waiting).contains_key(&ino) || len >= DEFER_MIN && no_room()
    }

    /// Hand `job` over; gives it back if the thread is gone.
    pub fn submit(&self, job: Job) -> Option<Job> {
        let mut m = lock(&self.waiting);
        let tx = lock(&self.tx);
        let Some(tx) = tx.as_ref() else {
            return Some(job);
        };
        let ino = job.ino;
        match tx.send(job) {
            Ok(()) => {
                *m.entry(ino).or_default() += 1;
                None
            }
            Err(e) => Some(e.0),
        }
    }

    /// Answer every write handed over, then stop the thread.
    pub fn stop(&self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.worker).take() {
            let _ = t.join();
        }
    }
}

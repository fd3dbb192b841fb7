//! The rings: threads that each own an io_uring, keep entries registered
//! with the kernel's FUSE queue of one CPU, and hand each arriving request
//! to the [`Handler`].
//!
//! An entry is a pair of buffers the kernel copies a request into (a
//! 288-byte header block and a payload as large as the largest write). Its
//! command completes when a request arrives; the reply goes back into the
//! same buffers and is committed with the command that also fetches the
//! entry's next request. A thread with few entries is a thread that is
//! free when its entries are: several threads per queue let one request
//! wait (an fsync) while others on the same CPU go on.

use crate::Error;
use crate::abi::{Args, IN_HEADER_LEN, InHeader, OUT_HEADER_LEN};
use crate::idle_wait::{Bouncing, IDLE_WAIT_MAX, IdleWait, can_wait_idle, served_idle};
use io_uring::{IoUring, cqueue, opcode, squeue::Entry128, types};
use std::cell::UnsafeCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

/// `struct fuse_uring_req_header`: request/reply header, the operation's
/// fixed argument, then `struct fuse_uring_ent_in_out`.
const HEADERS_LEN: usize = 288;
const OP_IN_AT: usize = 128;
const OP_IN_LEN: usize = 128;
const ENT_COMMIT_ID_AT: usize = 256 + 8;
const ENT_PAYLOAD_SZ_AT: usize = 256 + 16;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The kernel wants exactly two buffers per entry: headers, payload.
const IOVECS: u32 = 2;
/// `user_data` of the eventfd read that wakes a thread for replies made
/// on other threads.
const WAKE: u64 = u64::MAX;
/// The kernel's smallest payload (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;
/// Entries one thread registers at most, spares included: FUSE cannot
/// take an entry back, and each has a payload buffer.
const MAX_ENTRIES_PER_THREAD: usize = 16;
/// How long `Rings::start` waits for the kernel to take the entries.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How many rings, entries and buffers to set up.
#[derive(Clone, Debug)]
pub struct RingConfig {
    /// Queues: one per possible CPU ([`crate::possible_cpus`]).
    pub queues: usize,
    /// Threads (each with its own ring) serving one queue.
    pub threads_per_queue: usize,
    /// Entries each thread keeps registered.
    pub depth: usize,
    /// Payload buffer size: at least the mount's `max_write` and its
    /// largest read (`max_pages` pages).
    pub payload_size: usize,
    /// Run each queue's threads on that queue's CPU.
    pub pin: bool,
    /// While callers are seen bouncing between CPUs, commit answers and
    /// wait for requests under `SCHED_IDLE` (see [`crate::idle_wait`]).
    /// Ignored where a thread may not return to the normal policy
    /// ([`crate::can_wait_idle`]).
    pub idle_wait: bool,
}

/// What serves the requests. Called on a ring thread; the entry may be
/// moved to another thread and replied to there.
pub trait Handler: Send + Sync + 'static {
    /// Serves one request: read [`RingEntry::request`], then reply.
    fn handle(&self, entry: RingEntry);
}

/// One entry's buffers. The kernel writes them while the entry waits for
/// a request; the [`RingEntry`] that holds the request has them to itself
/// until it replies. Nothing else touches them.
struct Buffers {
    /// Set when the entry's request is answered, cleared when one arrives.
    answered: AtomicBool,
    headers: UnsafeCell<Box<[u8]>>,
    payload: UnsafeCell<Box<[u8]>>,
    iov: UnsafeCell<[libc::iovec; 2]>,
}

// SAFETY: access is handed over as described on `Buffers`: the ring thread
// only while the entry is with the kernel, the `RingEntry` only while it
// holds the request.
unsafe impl Sync for Buffers {}
unsafe impl Send for Buffers {}

impl Buffers {
    fn new(payload_size: usize) -> Arc<Buffers> {
        let b = Arc::new(Buffers {
            answered: AtomicBool::new(false),
            headers: UnsafeCell::new(vec![0u8; HEADERS_LEN].into_boxed_slice()),
            payload: UnsafeCell::new(vec![0u8; payload_size].into_boxed_slice()),
            iov: UnsafeCell::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            ),
        });
        // SAFETY: nobody else has the buffers yet.
        unsafe {
            let h = &mut *b.headers.get();
            let p = &mut *b.payload.get();
            *b.iov.get() = [
                libc::iovec {
                    iov_base: h.as_mut_ptr().cast(),
                    iov_len: h.len(),
                },
                libc::iovec {
                    iov_base: p.as_mut_ptr().cast(),
                    iov_len: p.len(),
                },
            ];
        }
        b
    }
}

/// Replies waiting to be committed by the thread that owns their entries.
struct Mailbox {
    replied: Mutex<Vec<(usize, u64)>>,
    wake: OwnedFd,
    owner: OnceLock<ThreadId>,
    /// Asked to stop (`Rings::stop`).
    stop: AtomicBool,
}

impl Mailbox {
    fn post(&self, index: usize, commit_id: u64) {
        self.replied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((index, commit_id));
        // The owner looks at its mailbox before it waits again.
        if self.owner.get() != Some(&std::thread::current().id()) {
            self.wake();
        }
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an eventfd takes 8-byte writes from this buffer.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// A request the kernel handed over, and the way to answer it. Dropping it
/// unanswered answers EIO, so the caller never waits for ever.
pub struct RingEntry {
    bufs: Arc<Buffers>,
    index: usize,
    mailbox: Arc<Mailbox>,
    header: InHeader,
    arg_len: usize,
    payload_len: usize,
    commit_id: u64,
    replied: bool,
}

/// A request as it arrived: header, the operation's fixed argument, and
/// the rest (names, data).
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Who asks what of which inode.
    pub header: InHeader,
    /// The fixed argument structure (`fuse_write_in`, ...), empty for
    /// operations without one (LOOKUP, UNLINK, ...).
    pub arg: Args<'a>,
    /// Names and data following the fixed argument.
    pub payload: &'a [u8],
}

impl RingEntry {
    /// The request, borrowed from the entry's buffers: answering takes the
    /// entry, so the borrow ends before the buffers are reused for the reply.
    pub fn request(&self) -> Request<'_> {
        // SAFETY: this entry holds the request (see `Buffers`).
        let (h, p) = unsafe { (&*self.bufs.headers.get(), &*self.bufs.payload.get()) };
        Request {
            header: self.header,
            arg: Args(&h[OP_IN_AT..OP_IN_AT + self.arg_len]),
            payload: &p[..self.payload_len],
        }
    }

    /// The request's header.
    pub fn header(&self) -> InHeader {
        self.header
    }

    /// Answers with the concatenation of `parts` as the reply's arguments.
    /// A reply too large for the entry answers EIO instead.
    pub fn reply(mut self, parts: &[&[u8]]) {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        // SAFETY: this entry holds the buffers until it posts the commit.
        let payload = unsafe { &mut *self.bufs.payload.get() };
        if total > payload.len() {
            return self.error(libc::EIO);
        }
        let mut at = 0;
        for p in parts {
            payload[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.finish(0, total);
    }

    /// Answers with an error number (positive, as in `errno`).
    pub fn error(mut self, errno: i32) {
        self.finish(-errno.abs(), 0);
    }

    fn finish(&mut self, error: i32, payload_len: usize) {
        // SAFETY: as in `reply`.
        let h = unsafe { &mut *self.bufs.headers.get() };
        let len = (OUT_HEADER_LEN + payload_len) as u32;
        h[0..4].copy_from_slice(&len.to_ne_bytes());
        h[4..8].copy_from_slice(&error.to_ne_bytes());
        h[8..16].copy_from_slice(&self.header.unique.to_ne_bytes());
        h[ENT_PAYLOAD_SZ_AT..ENT_PAYLOAD_SZ_AT + 4]
            .copy_from_slice(&(payload_len as u32).to_ne_bytes());
        self.replied = true;
        self.bufs.answered.store(true, Ordering::Release);
        self.mailbox.post(self.index, self.commit_id);
    }
}

impl Drop for RingEntry {
    fn drop(&mut self) {
        if !self.replied {
            self.finish(-libc::EIO, 0);
        }
    }
}

/// The running rings.
pub struct Rings {
    threads: Vec<JoinHandle<(io::Result<()>, Queue)>>,
    mailboxes: Vec<Arc<Mailbox>>,
    /// What the threads share to wait idle, and its watchdog.
    bouncing: Option<(Arc<Bouncing>, JoinHandle<()>)>,
}

impl Rings {
    /// Sets up every queue's rings on `fuse` (the session's `/dev/fuse`
    /// descriptor) and starts their threads. All rings exist before any
    /// entry is registered: once the first one is, the kernel holds new
    /// requests until every queue has one, so a half set-up would hang
    /// the mount. Registration waits for the kernel to finish INIT.
    pub fn start(
        fuse: RawFd,
        config: &RingConfig,
        handler: Arc<dyn Handler>,
    ) -> Result<Rings, Error> {
        let payload_size = config.payload_size.max(MIN_PAYLOAD);
        let depth = config.depth.max(1);
        let mut prepared = Vec::new();
        for qid in 0..config.queues {
            for _ in 0..config.threads_per_queue.max(1) {
                let sq = ((depth + 1).next_power_of_two() as u32).max(4);
                let ring: IoUring<Entry128, cqueue::Entry> = IoUring::builder().build(sq)?;
                // SAFETY: plain eventfd creation; the result is checked.
                let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                if efd < 0 {
                    return Err(io::Error::last_os_error().into());
                }
                let mailbox = Arc::new(Mailbox {
                    replied: Mutex::new(Vec::new()),
                    // SAFETY: a descriptor just created and owned by nobody else.
                    wake: unsafe { OwnedFd::from_raw_fd(efd) },
                    owner: OnceLock::new(),
                    stop: AtomicBool::new(false),
                });
                let bufs = (0..depth).map(|_| Buffers::new(payload_size)).collect();
                prepared.push(Queue {
                    ring,
                    wake_buf: Box::new(0),
                    fuse,
                    qid: qid as u16,
                    mailbox,
                    bufs,
                    payload_size,
                    pin: config.pin,
                    bouncing: None,
                });
            }
        }
        let mut bouncing = None;
        if config.idle_wait && can_wait_idle() {
            let shared = Bouncing::new(prepared.len());
            // Prepared queue by queue, a run of threads each.
            let per_queue = config.threads_per_queue.max(1);
            for (i, q) in prepared.iter_mut().enumerate() {
                let first = i - i % per_queue;
                q.bouncing = Some((Arc::clone(&shared), i, first..first + per_queue));
            }
            let watchdog = shared.start_watchdog()?;
            bouncing = Some((shared, watchdog));
        }
        let mut threads = Vec::new();
        let mailboxes = prepared.iter().map(|q| Arc::clone(&q.mailbox)).collect();
        let count = prepared.len();
        let (started, registered) = std::sync::mpsc::channel();
        for mut q in prepared {
            let handler = Arc::clone(&handler);
            let started = started.clone();
            let name = format!("fuse-ring-{}", q.qid);
            // The queue (its ring and buffers) is dropped by whoever joins
            // the thread: once the thread is gone the kernel writes into no
            // entry of a closing ring.
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let r = q.serve(&*handler, Some(started));
                (r, q)
            });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    Rings {
                        threads,
                        mailboxes,
                        bouncing,
                    }
                    .stop_quietly();
                    return Err(e.into());
                }
            }
        }
        let rings = Rings {
            threads,
            mailboxes,
            bouncing,
        };
        // A refused entry makes the kernel fall back to /dev/fuse for good:
        // fail the start rather than serve half one way, half the other.
        for _ in 0..count {
            let outcome = registered
                .recv_timeout(START_TIMEOUT)
                .unwrap_or_else(|_| Err(io::Error::other("no answer from the kernel")));
            if let Err(e) = outcome {
                rings.stop_quietly();
                return Err(Error::Register(e));
            }
        }
        Ok(rings)
    }

    fn stop_quietly(self) {
        let _ = self.stop();
    }

    /// Stops every thread once the request it is serving is answered, and
    /// waits for them. After an unmount they have ended already; before,
    /// requests still to come wait until the kernel ends the connection.
    /// The first error a thread met, if any.
    pub fn stop(self) -> io::Result<()> {
        for m in &self.mailboxes {
            m.stop.store(true, Ordering::Release);
            m.wake();
        }
        let mut first = Ok(());
        for t in self.threads {
            let r = match t.join() {
                Ok((r, queue)) => {
                    drop(queue);
                    r
                }
                Err(_) => Err(io::Error::other("ring thread panicked")),
            };
            if first.is_ok() {
                first = r;
            }
        }
        if let Some((shared, watchdog)) = self.bouncing {
            shared.stop();
            let _ = watchdog.join();
        }
        first
    }
}

/// Where a thread reports once whether the kernel took its entries.
type Started = Option<std::sync::mpsc::Sender<io::Result<()>>>;

/// One thread's ring and entries, for one queue.
struct Queue {
    /// First, so it is closed (its reads cancelled) before `wake_buf` and
    /// the entries' buffers go.
    ring: IoUring<Entry128, cqueue::Entry>,
    /// Where the eventfd read lands.
    wake_buf: Box<u64>,
    fuse: RawFd,
    qid: u16,
    mailbox: Arc<Mailbox>,
    bufs: Vec<Arc<Buffers>>,
    payload_size: usize,
    pin: bool,
    /// Shared by the mount's threads when they may wait idle, this
    /// thread's number among them and those of its queue's threads.
    bouncing: Option<(Arc<Bouncing>, usize, std::ops::Range<usize>)>,
}

/// `struct fuse_uring_cmd_req` in the command area of a 128-byte SQE.
fn command(op: u32, fuse: RawFd, qid: u16, commit_id: u64, addr: Option<u64>) -> Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut sqe = opcode::UringCmd80::new(types::Fd(fuse), op).cmd(cmd);
    if let Some(a) = addr {
        sqe = sqe.addr(Some(a));
    }
    let sqe = sqe.build();
    if addr.is_none() {
        return sqe;
    }
    // The iovec count goes in the SQE's `len` (bytes 24..28), which the
    // builder does not expose.
    // SAFETY: `Entry128` is a plain 128-byte `repr(C)` SQE.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&IOVECS.to_ne_bytes());
    // SAFETY: as above; every byte pattern is a valid SQE to build.
    unsafe { std::mem::transmute::<[u8; 128], Entry128>(raw) }
}

impl Queue {
    fn register(&self, index: usize) -> Entry128 {
        let iov = self.bufs[index].iov.get() as u64;
        command(CMD_REGISTER, self.fuse, self.qid, 0, Some(iov)).user_data(index as u64)
    }

    fn push(&mut self, sqe: &Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an SQE points at lives in `self.bufs`
            // or `self.wake_buf`, which outlive the ring (field order).
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Serves until the connection ends or `stop`; reports once through
    /// `started` whether the kernel took the entries.
    fn serve(&mut self, handler: &dyn Handler, mut started: Started) -> io::Result<()> {
        let r = self.serve_until_done(handler, &mut started);
        // Failed before reporting: `Rings::start` must not wait for us.
        if let (Some(tx), Err(e)) = (started, &r) {
            // The errno kept: the caller tells an ended connection apart.
            let copy = match e.raw_os_error() {
                Some(n) => io::Error::from_raw_os_error(n),
                None => io::Error::new(e.kind(), e.to_string()),
            };
            let _ = tx.send(Err(copy));
        }
        r
    }

    fn serve_until_done(&mut self, handler: &dyn Handler, started: &mut Started) -> io::Result<()> {
        let _ = self.mailbox.owner.set(std::thread::current().id());
        if self.pin {
            pin_to_cpu(usize::from(self.qid));
        }
        let wake_fd = self.mailbox.wake.as_raw_fd();
        let wake_at: *mut u64 = &mut *self.wake_buf;
        let wake_read = move || {
            let read = opcode::Read::new(types::Fd(wake_fd), wake_at.cast(), 8).build();
            Entry128::from(read.user_data(WAKE))
        };
        self.push(&wake_read())?;
        for i in 0..self.bufs.len() {
            let sqe = self.register(i);
            self.push(&sqe)?;
        }
        let mut live = self.bufs.len();
        let mut first_error = None;
        let mut idle_wait = self
            .bouncing
            .take()
            .and_then(|(b, i, siblings)| IdleWait::for_this_thread(b, i, siblings, self.qid));
        // Entries whose request is answered on another thread, later.
        let mut held = std::collections::HashSet::new();
        // The kernel refuses an entry at once, while it takes one in
        // silence: what completed during the first submission tells.
        self.ring.submit()?;
        let mut completed: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let refused = completed.iter().find(|&&(data, res)| {
            data != WAKE && res < 0 && res != -libc::EAGAIN && res != -libc::EINTR
        });
        if let Some(&(_, res)) = refused {
            return Err(io::Error::from_raw_os_error(-res));
        }
        if let Some(tx) = started.take() {
            let _ = tx.send(Ok(()));
        }
        loop {
            let replied = std::mem::take(
                &mut *self
                    .mailbox
                    .replied
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            for (index, commit_id) in replied {
                held.remove(&index);
                let sqe = command(CMD_COMMIT_AND_FETCH, self.fuse, self.qid, commit_id, None)
                    .user_data(index as u64);
                self.push(&sqe)?;
            }
            if live == 0 || self.mailbox.stop.load(Ordering::Acquire) {
                break;
            }
            if completed.is_empty() {
                // The answers wake their callers: committed idle, they
                // stay on this CPU (see `idle_wait`).
                let idle = match idle_wait.as_mut().map(|iw| iw.before_wait()) {
                    Some(Some(idle)) => idle,
                    // Stuck under `SCHED_IDLE`: no more idle waits.
                    Some(None) => {
                        idle_wait = None;
                        false
                    }
                    None => false,
                };
                let waited = if idle {
                    let ts = types::Timespec::from(IDLE_WAIT_MAX);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                } else {
                    self.ring.submit_and_wait(1)
                };
                // An idle wait that ended without a request: look again.
                let waited = match waited {
                    Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(0),
                    w => w,
                };
                match waited {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                completed.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            } else {
                self.ring.submit()?;
            }
            // Back to normal unless callers still bounce and the batch holds
            // only requests served idle (releases, short namespace and
            // attribute requests): data, fsync and the like, and any batch
            // once callers stopped bouncing, are served under the normal
            // policy. `before_wait` looks again at the next wait.
            if let Some(iw) = &mut idle_wait
                && iw.is_idle()
                && (!iw.callers_bounce()
                    || completed.iter().any(|&(d, r)| {
                        d != WAKE && r >= 0 && !served_idle(self.opcode_of(d as usize))
                    }))
                && !iw.after_wait()
            {
                idle_wait = None;
            }
            for (data, res) in completed.drain(..) {
                if data == WAKE {
                    self.push(&wake_read())?;
                    continue;
                }
                let index = data as usize;
                match res {
                    0.. => {
                        let entry = self.arrived(index);
                        if let Some(iw) = &mut idle_wait {
                            iw.saw(entry.header.pid);
                        }
                        // A panicking handler drops the entry, which
                        // answers EIO; the queue goes on.
                        let handled =
                            std::panic::catch_unwind(AssertUnwindSafe(|| handler.handle(entry)));
                        if handled.is_err() {
                            first_error
                                .get_or_insert(io::Error::other("a request handler panicked"));
                        }
                        // Held for later (a deferred write): if that was the
                        // last entry free, register a spare, so this thread
                        // still takes requests.
                        if !self.bufs[index].answered.load(Ordering::Acquire)
                            && held.insert(index)
                            && held.len() == live
                            && self.bufs.len() < MAX_ENTRIES_PER_THREAD
                        {
                            self.bufs.push(Buffers::new(self.payload_size));
                            let sqe = self.register(self.bufs.len() - 1);
                            self.push(&sqe)?;
                            live += 1;
                        }
                    }
                    // Registered before the kernel finished INIT.
                    r if r == -libc::EAGAIN || r == -libc::EINTR => {
                        std::thread::sleep(Duration::from_millis(1));
                        let sqe = self.register(index);
                        self.push(&sqe)?;
                    }
                    // The connection is over (unmount, abort): the entry too.
                    r => {
                        live -= 1;
                        let ended = [libc::ENOTCONN, libc::ECANCELED, libc::ECONNABORTED];
                        if !ended.contains(&-r) && first_error.is_none() {
                            first_error = Some(io::Error::from_raw_os_error(-r));
                        }
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The opcode of the request that arrived in entry `index`.
    fn opcode_of(&self, index: usize) -> u32 {
        let Some(bufs) = self.bufs.get(index) else {
            return 0;
        };
        // SAFETY: the kernel is done with the entry until it is committed.
        let h = unsafe { &*bufs.headers.get() };
        InHeader::parse(&h[..IN_HEADER_LEN]).opcode
    }

    /// The entry at `index` holds a request: hand it out.
    fn arrived(&self, index: usize) -> RingEntry {
        let bufs = Arc::clone(&self.bufs[index]);
        bufs.answered.store(false, Ordering::Release);
        // SAFETY: the kernel is done with the entry until it is committed.
        let h = unsafe { &*bufs.headers.get() };
        let header = InHeader::parse(&h[..IN_HEADER_LEN]);
        let a = Args(h);
        let payload_cap = unsafe { (&*bufs.payload.get()).len() };
        let payload_len = (a.u32(ENT_PAYLOAD_SZ_AT) as usize).min(payload_cap);
        // What is neither header nor payload is the fixed argument.
        let arg_len = (header.len as usize)
            .saturating_sub(IN_HEADER_LEN + payload_len)
            .min(OP_IN_LEN);
        RingEntry {
            bufs,
            index,
            mailbox: Arc::clone(&self.mailbox),
            header,
            arg_len,
            payload_len,
            commit_id: a.u64(ENT_COMMIT_ID_AT),
            replied: false,
        }
    }
}

pub(crate) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays inside it for any
    // CPU below its size, which the check ensures.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < 8 * std::mem::size_of::<libc::cpu_set_t>() {
            libc::CPU_SET(cpu, &mut set);
            // Best effort: an offline CPU only costs locality.
            let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

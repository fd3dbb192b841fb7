//! Waiting under `SCHED_IDLE` while callers bounce between CPUs.
//!
//! A request is served on the caller's CPU. When the answer wakes the
//! caller, the scheduler sees that CPU busy (the ring thread is still on
//! it) and may move the caller to an idle one; its next request then goes
//! to that CPU's queue, whose answer moves it back. Once started, this
//! ping-pong feeds itself (the scheduler prefers the CPU the caller last
//! came from while it is idle), and in a VM each move costs more than a
//! small request. It shows when the mount and its callers are in
//! different scheduling groups (a daemon's own session under autogroup,
//! another cgroup).
//!
//! A CPU whose runnable threads are all under `SCHED_IDLE` counts as idle.
//! So while callers are seen bouncing (every request tells from which
//! caller, by thread id, it came on which queue), a ring thread commits
//! its answers and waits for the next request under `SCHED_IDLE`. Waiting,
//! not only committing, matters: a thread woken for an asynchronous
//! request (the RELEASE sent just before the next GETATTR) is runnable
//! when the GETATTR's answer wakes the caller, and keeps the CPU busy
//! unless it too is under `SCHED_IDLE`.
//!
//! It also serves short requests (lookups, attributes, creates, unlinks,
//! releases: [`served_idle`]) without leaving `SCHED_IDLE`: two policy
//! changes cost about what such a request does, and took a fifth of
//! one-process stat's time. Data, fsync, ioctls and locks are served
//! under the normal policy, and a handler about to do long work (a
//! truncate, the deletion at a last close) leaves idle first
//! ([`leave_idle`]). A thread idle while it holds the filesystem's lock
//! delays others only if another thread wants its CPU, which the load
//! check below keeps rare and the watchdog ends. Its I/O keeps the
//! normal best-effort priority, set explicitly.
//!
//! A thread under `SCHED_IDLE` on a CPU busy with other work may wait for
//! it for milliseconds, or seconds behind several busy processes. So a
//! thread goes idle, and stays idle from one wait to the next, only when
//! the machine is otherwise quiet (the running
//! count of `/proc/loadavg`, with its queue's idle threads and, on larger
//! machines, half the CPUs allowed for), waits idle 50 ms at once
//! before it looks again, and a watchdog thread under
//! the normal policy looks every 5 ms at the threads that are idle: one
//! found runnable at two looks without having run between (woken, but
//! kept off its CPU by other work) goes back to the normal policy, and
//! idle waits end until callers bounce again.
//! The cost is a read of `/proc/loadavg` at most every [`LOAD_FRESH`]
//! (shared by the threads: read at every wait it took more of the server's
//! time than the handlers of small requests), and two policy changes
//! around each request that is not served idle, against 20-30 µs a move.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Callers remembered at once (by thread id, slots shared on collision).
const SLOTS: usize = 64;
/// Requests one ring thread judges at a time (consecutive blocks).
const WINDOW: u32 = 128;
/// How long a verdict of "bouncing" holds. Callers are watched all the
/// while, but those kept in place do not renew it: when it ends, they
/// bounce again for a window or two before it is renewed.
const HOLD: Duration = Duration::from_secs(1);
/// How often the watchdog looks while threads wait idle.
const WATCH_PERIOD: Duration = Duration::from_millis(5);
/// How long a thread waits idle at once: then it looks again whether it
/// should, so a thread without requests is back to normal this long
/// after callers stop bouncing.
pub(crate) const IDLE_WAIT_MAX: Duration = Duration::from_millis(50);
/// How long a running count read from `/proc/loadavg` stands: well under
/// the watchdog's [`WATCH_PERIOD`], which catches a thread gone idle on a
/// CPU that got busy meanwhile.
const LOAD_FRESH: Duration = Duration::from_millis(1);

/// One slot per cache line: slots are written from every CPU.
#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

/// A ring thread's id while it waits idle, else 0; one per cache line.
#[repr(align(64))]
#[derive(Default)]
struct IdleSlot(AtomicI32);

/// What all ring threads of a mount share: where each caller's last
/// request arrived, until when callers count as bouncing, and which
/// threads wait idle now.
pub(crate) struct Bouncing {
    last_queue: Box<[Slot]>,
    epoch: Instant,
    /// Milliseconds since `epoch` until which callers count as bouncing;
    /// 0: they do not.
    until_ms: AtomicU64,
    /// Per ring thread: its thread id while it waits idle, else 0.
    idle: Box<[IdleSlot]>,
    /// Runnable threads on the machine at most for a thread to go idle.
    max_running: u32,
    /// The last running count read from `/proc/loadavg`, and when
    /// (microseconds since `epoch`, plus one; 0: never).
    running: AtomicU32,
    running_at_us: AtomicU64,
    /// The watchdog sleeps until callers bounce again.
    watch_asleep: AtomicBool,
    stop: AtomicBool,
    watchdog: OnceLock<Thread>,
}

impl Bouncing {
    /// For `threads` ring threads.
    pub(crate) fn new(threads: usize) -> Arc<Bouncing> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Bouncing::with_max_running(threads, (cpus / 2).max(1) as u32)
    }

    fn with_max_running(threads: usize, max_running: u32) -> Arc<Bouncing> {
        Arc::new(Bouncing {
            last_queue: (0..SLOTS).map(|_| Slot::default()).collect(),
            epoch: Instant::now(),
            until_ms: AtomicU64::new(0),
            idle: (0..threads).map(|_| IdleSlot::default()).collect(),
            max_running,
            running: AtomicU32::new(0),
            running_at_us: AtomicU64::new(0),
            watch_asleep: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            watchdog: OnceLock::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        // Never 0, which means "off".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Runnable threads on the machine, as read from `loadavg` (this
    /// thread's open `/proc/loadavg`) or by any thread within [`LOAD_FRESH`].
    fn running_now(&self, loadavg: &File) -> Option<u32> {
        let now = self.epoch.elapsed().as_micros() as u64 + 1;
        let at = self.running_at_us.load(Ordering::Acquire);
        if at != 0 && now.saturating_sub(at) < LOAD_FRESH.as_micros() as u64 {
            return Some(self.running.load(Ordering::Relaxed));
        }
        let n = running(loadavg)?;
        self.running.store(n, Ordering::Relaxed);
        self.running_at_us.store(now, Ordering::Release);
        Some(n)
    }

    /// Whether callers were seen bouncing lately.
    fn on(&self) -> bool {
        let until = self.until_ms.load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
    }

    /// Callers bounce: for [`HOLD`] from now. Wakes the watchdog if they
    /// did not before.
    fn turn_on(&self) {
        let was_on = self.on();
        let until = self.now_ms() + HOLD.as_millis() as u64;
        self.until_ms.store(until, Ordering::Relaxed);
        if !was_on && let Some(w) = self.watchdog.get() {
            w.unpark();
        }
    }

    /// Records that caller `pid` sent a request to queue `qid`; whether
    /// its previous request came to another queue.
    fn moved(&self, pid: u32, qid: u16) -> bool {
        if pid == 0 {
            return false;
        }
        let now = (u64::from(pid) << 16) | u64::from(qid);
        let slot = &self.last_queue[pid as usize % SLOTS].0;
        // Read before written: a caller that stays keeps the line shared.
        let before = slot.load(Ordering::Relaxed);
        if before == now {
            return false;
        }
        slot.store(now, Ordering::Relaxed);
        before >> 16 == u64::from(pid)
    }

    /// Starts the watchdog (see the module's documentation). It ends at
    /// [`Bouncing::stop`], or once nothing else holds the `Bouncing`.
    pub(crate) fn start_watchdog(self: &Arc<Self>) -> io::Result<JoinHandle<()>> {
        let weak = Arc::downgrade(self);
        let t = std::thread::Builder::new()
            .name("ring-idle-watch".into())
            .spawn(move || watch(weak))?;
        let _ = self.watchdog.set(t.thread().clone());
        Ok(t)
    }

    /// Ends the watchdog.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.watchdog.get() {
            w.unpark();
        }
    }
}

/// The `/proc` files of a thread the watchdog looks at, kept open: opened
/// anew at every look they cost more than the look itself.
struct ThreadFiles {
    tid: i32,
    stat: File,
    schedstat: File,
}

impl ThreadFiles {
    fn open(tid: i32) -> Option<ThreadFiles> {
        let dir = format!("/proc/self/task/{tid}");
        Some(ThreadFiles {
            tid,
            stat: File::open(format!("{dir}/stat")).ok()?,
            schedstat: File::open(format!("{dir}/schedstat")).ok()?,
        })
    }

    /// Whether the thread is runnable now, and how long it has run in all
    /// (nanoseconds); `None` once it is gone.
    fn cpu_state(&self) -> Option<(bool, u64)> {
        let mut buf = [0u8; 512];
        let n = self.stat.read_at(&mut buf, 0).ok()?;
        let stat = &buf[..n];
        // "tid (comm) S ...": the state follows the last ')'.
        let end = stat.iter().rposition(|&c| c == b')')?;
        let runnable = stat.get(end + 2) == Some(&b'R');
        let n = self.schedstat.read_at(&mut buf, 0).ok()?;
        let sched = std::str::from_utf8(&buf[..n]).ok()?;
        let ran = sched.split_ascii_whitespace().next()?.parse().ok()?;
        Some((runnable, ran))
    }
}

/// Whether thread `tid` of this process is runnable now, and how long it
/// has run in all (nanoseconds), through `files` (opened or reopened for
/// `tid` as needed); `None` for a thread that is gone (or a thread id that
/// is not ours).
fn cpu_state(files: &mut Option<ThreadFiles>, tid: i32) -> Option<(bool, u64)> {
    if files.as_ref().is_none_or(|f| f.tid != tid) {
        *files = ThreadFiles::open(tid);
    }
    let state = files.as_ref()?.cpu_state();
    if state.is_none() {
        // Gone: not kept for a thread that may come with its id.
        *files = None;
    }
    state
}

/// What a thread may have run between two looks and still count as kept
/// off its CPU.
const BARELY_RAN: Duration = Duration::from_micros(100);

fn watch(weak: Weak<Bouncing>) {
    // Per ring thread: the thread id seen waiting idle and runnable at the
    // last look, and how long it had run then.
    let mut last: Vec<(i32, u64)> = Vec::new();
    let mut files: Vec<Option<ThreadFiles>> = Vec::new();
    loop {
        let Some(b) = weak.upgrade() else { return };
        if b.stop.load(Ordering::Acquire) {
            return;
        }
        last.resize(b.idle.len(), (0, 0));
        files.resize_with(b.idle.len(), || None);
        let mut waiting = false;
        for ((slot, seen), files) in b.idle.iter().zip(last.iter_mut()).zip(files.iter_mut()) {
            let tid = slot.0.load(Ordering::Acquire);
            let state = if tid == 0 {
                None
            } else {
                cpu_state(files, tid)
            };
            waiting |= state.is_some();
            let Some((true, ran)) = state else {
                *seen = (0, 0);
                continue;
            };
            // Waiting idle and runnable at both looks, and (next to) not
            // run between: woken, but kept off its CPU by other work. (A
            // thread that gets its CPU stops waiting idle at once.)
            if seen.0 == tid && ran.saturating_sub(seen.1) < BARELY_RAN.as_nanos() as u64 {
                // Unflagged first, then back to normal (only if it was
                // still flagged): the thread sees the flag gone and forgets
                // it was idle, never to be left idle and unwatched.
                if slot
                    .0
                    .compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    set_policy_of(tid, libc::SCHED_OTHER);
                }
                b.until_ms.store(0, Ordering::Relaxed);
            }
            *seen = (tid, ran);
        }
        let mut on = b.on();
        if !waiting && !on {
            // About to sleep long: a thread that flags itself idle from
            // here on wakes the watchdog (its verdict may have run out
            // just after it looked), and one that did already is seen.
            b.watch_asleep.store(true, Ordering::SeqCst);
            on = b.idle.iter().any(|t| t.0.load(Ordering::SeqCst) != 0) || b.on();
            if on {
                b.watch_asleep.store(false, Ordering::SeqCst);
            }
        }
        if waiting || on {
            drop(b);
            std::thread::park_timeout(WATCH_PERIOD);
        } else {
            // Woken when callers start bouncing (`turn_on`) or a thread
            // flags itself idle.
            drop(b);
            std::thread::park_timeout(HOLD);
            if let Some(b) = weak.upgrade() {
                b.watch_asleep.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// One ring thread's part: its view of callers, and whether it waits
/// idle now.
pub(crate) struct IdleWait {
    shared: Arc<Bouncing>,
    index: usize,
    /// The numbers of the threads serving the same queue, this one's too.
    siblings: std::ops::Range<usize>,
    qid: u16,
    tid: i32,
    requests: u32,
    moves: u32,
    /// Kept open: a read is a `pread` of a few bytes.
    loadavg: File,
    idle: bool,
}

impl IdleWait {
    /// The part of ring thread `index` (serving queue `qid` with the
    /// threads `siblings`), if it may wait idle: it runs under the normal
    /// policy (which it returns to) and `/proc/loadavg` opens.
    pub(crate) fn for_this_thread(
        shared: Arc<Bouncing>,
        index: usize,
        siblings: std::ops::Range<usize>,
        qid: u16,
    ) -> Option<Self> {
        // SAFETY: plain queries of the calling thread.
        let (policy, tid) = unsafe { (libc::sched_getscheduler(0), libc::gettid()) };
        if policy != libc::SCHED_OTHER
            || !siblings.contains(&index)
            || siblings.end > shared.idle.len()
            || !keep_io_priority()
        {
            return None;
        }
        Some(IdleWait {
            shared,
            index,
            siblings,
            qid,
            tid,
            requests: 0,
            moves: 0,
            loadavg: File::open("/proc/loadavg").ok()?,
            idle: false,
        })
    }

    /// Counts a request from `pid` on this thread's queue; at the end of a
    /// window where at least a quarter of the requests came from callers
    /// that had just moved, callers count as bouncing for [`HOLD`].
    pub(crate) fn saw(&mut self, pid: u32) {
        self.requests += 1;
        if self.shared.moved(pid, self.qid) {
            self.moves += 1;
        }
        if self.requests < WINDOW {
            return;
        }
        if self.moves * 4 >= self.requests {
            self.shared.turn_on();
        }
        self.requests = 0;
        self.moves = 0;
    }

    /// Before the thread commits its answers and waits: goes idle, or
    /// stays idle from the last wait, if callers bounce and the machine is
    /// otherwise quiet; whether it waits idle (the wait is then at most
    /// [`IDLE_WAIT_MAX`]). `None`: it was idle and could not return to the
    /// normal policy (see [`IdleWait::after_wait`]).
    pub(crate) fn before_wait(&mut self) -> Option<bool> {
        if self.idle && !IDLE_HERE.get() {
            // A handler left idle ([`leave_idle`]): decide anew.
            self.shared.idle[self.index].0.store(0, Ordering::Release);
            self.idle = false;
        } else if self.idle && self.shared.idle[self.index].0.load(Ordering::Acquire) != self.tid {
            // Unflagged by the watchdog, which puts it back to normal
            // just after: done here too, so it holds whatever comes next.
            self.idle = false;
            IDLE_HERE.set(false);
            set_policy_of(0, libc::SCHED_OTHER);
        }
        if !self.shared.on() || !self.quiet() {
            // Served idle so far, but other work came up: back to normal.
            return self.after_wait().then_some(false);
        }
        if !self.idle && set_policy_of(0, libc::SCHED_IDLE) {
            self.idle = true;
            IDLE_HERE.set(true);
            self.shared.idle[self.index]
                .0
                .store(self.tid, Ordering::SeqCst);
            if self.shared.watch_asleep.load(Ordering::SeqCst)
                && let Some(w) = self.shared.watchdog.get()
            {
                w.unpark();
            }
        }
        Some(self.idle)
    }

    /// Whether the machine is otherwise quiet: no more runnable threads
    /// than allowed, this thread's and its queue's idle threads aside.
    /// Those siblings do not count: one woken for an asynchronous request
    /// (the RELEASE sent just before the GETATTR answered here) is
    /// runnable, but idle; one kept off its CPU by other work is the
    /// watchdog's to find.
    fn quiet(&self) -> bool {
        let idle_siblings = self
            .siblings
            .clone()
            .filter(|&i| i != self.index && self.shared.idle[i].0.load(Ordering::Relaxed) != 0);
        // The running count includes this thread.
        let allowed = self.shared.max_running + idle_siblings.count() as u32;
        self.shared
            .running_now(&self.loadavg)
            .is_some_and(|n| n <= allowed)
    }

    /// Whether this thread runs under `SCHED_IDLE` now.
    pub(crate) fn is_idle(&self) -> bool {
        self.idle && IDLE_HERE.get()
    }

    /// Whether callers were seen bouncing lately (idle waits are on).
    pub(crate) fn callers_bounce(&self) -> bool {
        self.shared.on()
    }

    /// After the wait: back to the normal policy. `false` if the thread
    /// could not return (the nice limit shrank since [`can_wait_idle`]
    /// said yes): it stays under `SCHED_IDLE`, and should not wait idle
    /// again.
    pub(crate) fn after_wait(&mut self) -> bool {
        if !self.idle {
            return true;
        }
        self.shared.idle[self.index].0.store(0, Ordering::Release);
        self.idle = false;
        leave_idle()
    }
}

thread_local! {
    /// This thread runs under `SCHED_IDLE`, put there by its [`IdleWait`].
    static IDLE_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Back to the normal policy, if this ring thread serves a request under
/// `SCHED_IDLE` (see [`served_idle`]); `false` if it could not return. A
/// handler calls it before long work (a truncate, a deletion): under
/// `SCHED_IDLE` it could be kept off its CPU while others wait for it.
/// Does nothing on other threads.
pub fn leave_idle() -> bool {
    if !IDLE_HERE.get() {
        return true;
    }
    // Still flagged if it failed: the thread is idle all the same.
    let back = set_policy_of(0, libc::SCHED_OTHER);
    IDLE_HERE.set(!back);
    back
}

impl Drop for IdleWait {
    fn drop(&mut self) {
        // A thread id must not outlive its thread in the table.
        self.shared.idle[self.index].0.store(0, Ordering::Release);
    }
}

/// Whether a request with `opcode` is served without leaving `SCHED_IDLE`
/// while callers bounce: a release, whose answer nobody waits for, and the
/// short requests of the namespace and attributes. Each of those costs a
/// few microseconds, about what two policy changes cost; served under the
/// normal policy they took a fifth of one-process stat's time. Data,
/// fsync, ioctls and locks, which may run long, write back or wait for the
/// device, and directory reads, whose work (a page of names, tree blocks
/// read cold) dwarfs two policy changes, are served under the normal
/// policy.
pub(crate) fn served_idle(opcode: u32) -> bool {
    use crate::abi::opcode::*;
    matches!(
        opcode,
        RELEASE
            | RELEASEDIR
            | LOOKUP
            | GETATTR
            | STATX
            | SETATTR
            | ACCESS
            | READLINK
            | OPEN
            | OPENDIR
            | CREATE
            | MKNOD
            | MKDIR
            | SYMLINK
            | LINK
            | UNLINK
            | RMDIR
            | RENAME
            | RENAME2
            | GETXATTR
            | LISTXATTR
            | SETXATTR
            | REMOVEXATTR
            | STATFS
            | FLUSH
    )
}

/// Runnable threads on the machine, the caller included (the fourth
/// field of `/proc/loadavg`, "running/total").
fn running(loadavg: &File) -> Option<u32> {
    let mut buf = [0u8; 128];
    let n = loadavg.read_at(&mut buf, 0).ok()?;
    running_of(&buf[..n])
}

fn running_of(loadavg: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(loadavg).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// `ioprio_get(2)`/`ioprio_set(2)` on one thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
/// Where the class sits in an I/O priority.
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
/// The class of a thread whose priority follows its CPU policy and nice.
const IOPRIO_CLASS_NONE: libc::c_int = 0;
const IOPRIO_CLASS_BE: libc::c_int = 2;

/// The best-effort I/O priority a thread of `nice` has by default.
fn best_effort_for(nice: libc::c_int) -> libc::c_int {
    (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | ((nice.clamp(-20, 19) + 20) / 5)
}

/// Gives the calling thread, if its I/O priority follows its policy (none
/// was set, as by `ionice`), the one it has under the normal policy, set
/// explicitly: otherwise it takes the idle I/O class under `SCHED_IDLE`,
/// and its reads (a cold lookup's tree blocks) would wait for any other
/// I/O on the device. Whether the thread has a priority of its own now.
fn keep_io_priority() -> bool {
    // SAFETY: plain system calls on the calling thread (who 0).
    unsafe {
        let now = libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0);
        if now < 0 {
            return false;
        }
        if (now as libc::c_int) >> IOPRIO_CLASS_SHIFT != IOPRIO_CLASS_NONE {
            return true;
        }
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            best_effort_for(nice),
        ) == 0
    }
}

/// Sets the scheduling policy of thread `tid` (0: the calling one);
/// whether it took.
fn set_policy_of(tid: i32, policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call with a valid param.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

/// Whether a thread of this process may go to `SCHED_IDLE` and back to
/// the normal policy: going back needs `CAP_SYS_NICE` or an `RLIMIT_NICE`
/// of at least 20 - nice. Tried on a thread of its own (which inherits
/// the caller's nice value and ends under whatever policy it is left
/// with).
pub fn can_wait_idle() -> bool {
    std::thread::spawn(|| set_policy_of(0, libc::SCHED_IDLE) && set_policy_of(0, libc::SCHED_OTHER))
        .join()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: a plain query of the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_running_count_is_read_again_once_stale() {
        let shared = Bouncing::new(1);
        let f = File::open("/proc/loadavg").unwrap();
        let real = shared.running_now(&f).unwrap();
        assert!((1..100_000).contains(&real), "{real} runnable");
        // Another thread's fresh reading stands (dated ahead: fresh
        // however long this thread is preempted)...
        let ahead = shared.epoch.elapsed().as_micros() as u64 + 60_000_000;
        shared.running.store(100_000, Ordering::Relaxed);
        shared.running_at_us.store(ahead, Ordering::Release);
        assert_eq!(shared.running_now(&f), Some(100_000));
        // ...a stale one does not.
        let now = shared.epoch.elapsed().as_micros() as u64 + 1;
        shared.running_at_us.store(now, Ordering::Release);
        std::thread::sleep(LOAD_FRESH * 2);
        assert!(shared.running_now(&f).unwrap() < 100_000);
    }

    #[test]
    fn releases_and_short_requests_are_served_idle_data_and_fsync_are_not() {
        use crate::abi::opcode::*;
        for op in [
            RELEASE, RELEASEDIR, LOOKUP, GETATTR, SETATTR, CREATE, OPEN, UNLINK, MKDIR, RENAME,
        ] {
            assert!(served_idle(op), "opcode {op} is short");
        }
        for op in [
            READDIR,
            READDIRPLUS,
            READ,
            WRITE,
            FSYNC,
            FSYNCDIR,
            FALLOCATE,
            COPY_FILE_RANGE,
            LSEEK,
            IOCTL,
            SETLKW,
        ] {
            assert!(!served_idle(op), "opcode {op} may run long");
        }
    }

    fn io_priority() -> libc::c_long {
        const IOPRIO_WHO_PROCESS: libc::c_int = 1;
        // SAFETY: a plain query of the calling thread.
        unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) }
    }

    #[test]
    fn a_thread_waiting_idle_keeps_its_io_priority() {
        assert_eq!(best_effort_for(0), (2 << 13) | 4);
        assert_eq!(best_effort_for(19), (2 << 13) | 7);
        assert_eq!(best_effort_for(-20), 2 << 13);
        std::thread::spawn(|| {
            let before = io_priority();
            let shared = Bouncing::with_max_running(1, 1000);
            shared.turn_on();
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
            assert_eq!(p.before_wait(), Some(true));
            assert_eq!(policy(), libc::SCHED_IDLE);
            if before >> 13 == libc::c_long::from(IOPRIO_CLASS_NONE) {
                // Unset, it would follow the policy (the idle class):
                // set to what the normal policy gives.
                // SAFETY: a plain query of the calling thread.
                let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
                assert_eq!(io_priority(), libc::c_long::from(best_effort_for(nice)));
            } else {
                assert_eq!(io_priority(), before, "one set by the operator stays");
            }
            assert!(p.after_wait());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_the_watchdog_returned_to_normal_goes_idle_again_for_real() {
        std::thread::spawn(|| {
            let shared = Bouncing::with_max_running(1, 1000);
            shared.turn_on();
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
            assert_eq!(p.before_wait(), Some(true));
            // What the watchdog does to a thread it finds kept off its CPU.
            assert!(set_policy_of(0, libc::SCHED_OTHER));
            shared.idle[0].0.store(0, Ordering::Release);
            shared.turn_on();
            assert_eq!(p.before_wait(), Some(true));
            assert_eq!(policy(), libc::SCHED_IDLE, "believed idle, but normal");
            assert_ne!(shared.idle[0].0.load(Ordering::Relaxed), 0);
            assert!(p.after_wait());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_caller_that_bounces_turns_idle_waits_on() {
        let shared = Bouncing::new(2);
        let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
        let mut other = IdleWait::for_this_thread(Arc::clone(&shared), 1, 1..2, 1).unwrap();
        // Windows are per thread: each sees a whole one.
        for _ in 0..WINDOW {
            p.saw(4242);
            other.saw(4242);
        }
        assert!(shared.on());
    }

    #[test]
    fn callers_that_stay_leave_waits_normal() {
        let shared = Bouncing::new(2);
        let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
        let mut other = IdleWait::for_this_thread(Arc::clone(&shared), 1, 1..2, 1).unwrap();
        // Callers that each stay on their queue, two of them sharing a slot.
        for _ in 0..WINDOW * 2 {
            p.saw(7);
            other.saw(7 + SLOTS as u32);
            p.saw(100);
            other.saw(101);
        }
        assert!(!shared.on());
        // Requests without a caller (pid 0: writeback) never count as moving.
        for _ in 0..WINDOW {
            p.saw(0);
            other.saw(0);
        }
        assert!(!shared.on());
    }

    #[test]
    fn runnable_threads_come_from_loadavg() {
        assert_eq!(running_of(b"0.15 1.10 2.49 3/85 29609\n"), Some(3));
        assert_eq!(running_of(b"garbage"), None);
        // This thread is running: at least one.
        let f = File::open("/proc/loadavg").unwrap();
        assert!(running(&f).is_some_and(|n| n >= 1));
    }

    #[test]
    fn a_thread_waits_idle_only_while_callers_bounce_and_returns_to_normal() {
        std::thread::spawn(|| {
            // Any number of runnable threads allowed: the tests run beside
            // each other.
            let shared = Bouncing::with_max_running(2, 1000);
            assert!(IdleWait::for_this_thread(Arc::clone(&shared), 0, 1..2, 0).is_none());
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..2, 0).unwrap();
            assert_eq!(p.before_wait(), Some(false), "idle without bouncing");
            assert_eq!(policy(), libc::SCHED_OTHER);
            shared.turn_on();
            assert_eq!(p.before_wait(), Some(true));
            assert_eq!(policy(), libc::SCHED_IDLE);
            // SAFETY: a plain query of the calling thread.
            let tid = unsafe { libc::gettid() };
            assert_eq!(shared.idle[0].0.load(Ordering::Relaxed), tid);
            assert!(p.after_wait());
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert_eq!(shared.idle[0].0.load(Ordering::Relaxed), 0);
            // Callers no longer bounce: normal waits.
            shared.until_ms.store(0, Ordering::Relaxed);
            assert_eq!(p.before_wait(), Some(false));
            assert!(p.after_wait());
            // A machine busier than allowed: no idle wait.
            let busy = Bouncing::with_max_running(1, 0);
            busy.turn_on();
            let mut q = IdleWait::for_this_thread(busy, 0, 0..1, 0).unwrap();
            assert_eq!(
                q.before_wait(),
                Some(false),
                "this thread alone is one runnable"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_stays_idle_across_waits_until_the_machine_gets_busy() {
        std::thread::spawn(|| {
            let shared = Bouncing::with_max_running(1, 1000);
            shared.turn_on();
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
            assert_eq!(p.before_wait(), Some(true));
            // Served idle, waits again: still idle, still flagged.
            assert_eq!(p.before_wait(), Some(true));
            assert_eq!(policy(), libc::SCHED_IDLE);
            assert_ne!(shared.idle[0].0.load(Ordering::Relaxed), 0);
            // A fresh running count above the allowance (dated ahead, so
            // it stays fresh however long this thread is preempted): back
            // to normal before the next wait, and unflagged.
            let ahead = shared.epoch.elapsed().as_micros() as u64 + 60_000_000;
            shared.running.store(100_000, Ordering::Relaxed);
            shared.running_at_us.store(ahead, Ordering::Release);
            assert_eq!(p.before_wait(), Some(false));
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert_eq!(shared.idle[0].0.load(Ordering::Relaxed), 0);
            // Quiet again (no count yet: it is read anew): idle.
            shared.running_at_us.store(0, Ordering::Release);
            assert_eq!(p.before_wait(), Some(true));
            // Callers stop bouncing: back to normal at the next wait.
            shared.until_ms.store(0, Ordering::Relaxed);
            assert_eq!(p.before_wait(), Some(false));
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_handler_served_idle_can_leave_idle_and_the_next_wait_is_idle_again() {
        std::thread::spawn(|| {
            let shared = Bouncing::with_max_running(1, 1000);
            shared.turn_on();
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
            assert!(leave_idle(), "a thread that is not idle stays as it is");
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert_eq!(p.before_wait(), Some(true));
            assert_eq!(policy(), libc::SCHED_IDLE);
            // A release served idle needs the lock for changes.
            assert!(leave_idle());
            assert_eq!(policy(), libc::SCHED_OTHER);
            // Its thread then waits idle again, flagged for the watchdog.
            assert_eq!(p.before_wait(), Some(true));
            assert_eq!(policy(), libc::SCHED_IDLE);
            assert_ne!(shared.idle[0].0.load(Ordering::Relaxed), 0);
            assert!(p.after_wait());
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert_eq!(shared.idle[0].0.load(Ordering::Relaxed), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_going_idle_wakes_a_sleeping_watchdog() {
        std::thread::spawn(|| {
            let shared = Bouncing::with_max_running(1, 1000);
            let watchdog = shared.start_watchdog().unwrap();
            let asleep = |want: bool| {
                let t0 = Instant::now();
                while shared.watch_asleep.load(Ordering::SeqCst) != want {
                    assert!(t0.elapsed() < HOLD / 2, "watchdog asleep: not {want}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            asleep(true);
            // The verdict as a thread saw it just before it ran out, set
            // without waking the watchdog as `turn_on` does.
            shared
                .until_ms
                .store(shared.now_ms() + 60_000, Ordering::Relaxed);
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
            assert_eq!(p.before_wait(), Some(true));
            // Woken well within its long sleep, it watches.
            asleep(false);
            assert!(p.after_wait());
            shared.stop();
            watchdog.join().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_watchdog_returns_a_thread_kept_off_its_cpu_to_normal() {
        // Going back to the normal policy needs CAP_SYS_NICE or an
        // RLIMIT_NICE allowing it; the tests run as root.
        assert!(can_wait_idle(), "this process may not leave SCHED_IDLE");
        let shared = Bouncing::with_max_running(1, 1);
        let watchdog = shared.start_watchdog().unwrap();
        shared.turn_on();
        let s2 = Arc::clone(&shared);
        // Flagged as waiting idle, but runnable all along, on a CPU a
        // thread under the normal policy keeps busy: as a thread woken for
        // a request and kept off its CPU.
        let cpu = 0;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let busy = std::thread::spawn(move || {
            crate::ring::pin_to_cpu(cpu);
            while !stop2.load(Ordering::Relaxed) {}
        });
        let kept_off = std::thread::spawn(move || {
            crate::ring::pin_to_cpu(cpu);
            assert!(set_policy_of(0, libc::SCHED_IDLE));
            // SAFETY: a plain query of the calling thread.
            s2.idle[0]
                .0
                .store(unsafe { libc::gettid() }, Ordering::Release);
            let deadline = Instant::now() + Duration::from_secs(10);
            while policy() == libc::SCHED_IDLE && Instant::now() < deadline {}
            // The watchdog unflags it just after the policy change.
            let deadline = Instant::now() + Duration::from_secs(1);
            while s2.idle[0].0.load(Ordering::Acquire) != 0 && Instant::now() < deadline {}
            let flagged = s2.idle[0].0.swap(0, Ordering::AcqRel);
            (policy(), flagged)
        });
        let (back, flagged) = kept_off.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        assert_eq!(back, libc::SCHED_OTHER);
        assert_eq!(flagged, 0, "returned to normal but still flagged idle");
        // Other work: no more idle waits until callers bounce again.
        assert!(!shared.on());
        shared.stop();
        watchdog.join().unwrap();
    }
}

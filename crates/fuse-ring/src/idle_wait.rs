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
//! its answers and waits for the next request under `SCHED_IDLE`, and
//! serves requests under the normal policy. Waiting, not only
//! committing, matters: a thread woken for an asynchronous request (the
//! RELEASE sent just before the next GETATTR) is runnable when the
//! GETATTR's answer wakes the caller, and keeps the CPU busy unless it
//! too is under `SCHED_IDLE`.
//!
//! A thread under `SCHED_IDLE` on a CPU busy with other work may wait for
//! it for milliseconds, or seconds behind several busy processes. So a
//! thread goes idle only when nothing else is runnable on the machine (or
//! on more than half of its CPUs: `/proc/loadavg`), and a watchdog thread
//! under the normal policy looks every 5 ms while callers bounce: when
//! other work shows up, it returns every waiting thread to the normal
//! policy. The cost is two policy changes and a read of `/proc/loadavg`
//! a request (about 4 µs), against 20-30 µs a move.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
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
/// How often the watchdog looks while threads may wait idle.
const WATCH_PERIOD: Duration = Duration::from_millis(5);

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
    stop: AtomicBool,
    watchdog: OnceLock<Thread>,
}

impl Bouncing {
    /// For `threads` ring threads.
    pub(crate) fn new(threads: usize) -> Arc<Bouncing> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Arc::new(Bouncing {
            last_queue: (0..SLOTS).map(|_| Slot::default()).collect(),
            epoch: Instant::now(),
            until_ms: AtomicU64::new(0),
            idle: (0..threads).map(|_| IdleSlot::default()).collect(),
            max_running: (cpus / 2).max(1) as u32,
            stop: AtomicBool::new(false),
            watchdog: OnceLock::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        // Never 0, which means "off".
        self.epoch.elapsed().as_millis() as u64 + 1
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

    /// Returns every thread waiting idle to the normal policy.
    fn wake_all_normal(&self) {
        for slot in self.idle.iter() {
            let tid = slot.0.load(Ordering::Acquire);
            if tid != 0 {
                set_policy_of(tid, libc::SCHED_OTHER);
            }
        }
    }
}

fn watch(weak: Weak<Bouncing>) {
    let Ok(loadavg) = File::open("/proc/loadavg") else {
        return;
    };
    // Looks in a row that found other work.
    let mut busy = 0;
    loop {
        let Some(b) = weak.upgrade() else { return };
        if b.stop.load(Ordering::Acquire) {
            return;
        }
        let waiting = b.idle.iter().any(|t| t.0.load(Ordering::Relaxed) != 0);
        if !waiting && !b.on() {
            drop(b);
            busy = 0;
            // Woken when callers start bouncing (`turn_on`).
            std::thread::park_timeout(HOLD);
            continue;
        }
        // The watchdog counts itself among the runnable threads. Once,
        // it may be callers and ring threads passing by: the waiting
        // threads go normal for one wait. Twice in a row, it is other
        // work: no more idle waits until callers bounce again.
        if running(&loadavg).is_none_or(|n| n > b.max_running + 1) {
            b.wake_all_normal();
            busy += 1;
            if busy >= 2 {
                b.until_ms.store(0, Ordering::Relaxed);
            }
        } else {
            busy = 0;
        }
        drop(b);
        std::thread::park_timeout(WATCH_PERIOD);
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

    /// Before the thread commits its answers and waits: goes idle if
    /// callers bounce and nothing else is runnable. Threads of this queue
    /// waiting idle do not count: one woken for an asynchronous request
    /// (the RELEASE sent just before the GETATTR answered here) is
    /// runnable, but idle.
    pub(crate) fn before_wait(&mut self) {
        if self.idle || !self.shared.on() {
            return;
        }
        let idle_siblings = self.shared.idle[self.siblings.clone()]
            .iter()
            .filter(|t| t.0.load(Ordering::Relaxed) != 0)
            .count() as u32;
        let allowed = self.shared.max_running + idle_siblings;
        if running(&self.loadavg).is_none_or(|n| n > allowed) {
            return;
        }
        if set_policy_of(0, libc::SCHED_IDLE) {
            self.idle = true;
            // After the change: the watchdog must never see the thread id
            // of a thread that has gone normal and stays so.
            self.shared.idle[self.index]
                .0
                .store(self.tid, Ordering::Release);
        }
    }

    /// After the wait: back to the normal policy. `false` if the thread
    /// could not return (the nice limit changed since [`can_wait_idle`]
    /// said yes) and must stop going idle.
    pub(crate) fn after_wait(&mut self) -> bool {
        if !self.idle {
            return true;
        }
        self.shared.idle[self.index].0.store(0, Ordering::Release);
        self.idle = false;
        set_policy_of(0, libc::SCHED_OTHER)
    }
}

impl Drop for IdleWait {
    fn drop(&mut self) {
        // A thread id must not outlive its thread in the table.
        self.shared.idle[self.index].0.store(0, Ordering::Release);
    }
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
            let shared = Bouncing::new(1);
            let mut p = IdleWait::for_this_thread(Arc::clone(&shared), 0, 0..1, 0).unwrap();
            p.before_wait();
            assert_eq!(policy(), libc::SCHED_OTHER, "idle without bouncing");
            shared.turn_on();
            // Other runnable threads (the test harness's) may hold it back:
            // it goes idle only when nothing else runs. Try a few times.
            for _ in 0..1000 {
                p.before_wait();
                if p.idle {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if p.idle {
                assert_eq!(policy(), libc::SCHED_IDLE);
                // SAFETY: a plain query of the calling thread.
                let tid = unsafe { libc::gettid() };
                assert_eq!(shared.idle[0].0.load(Ordering::Relaxed), tid);
            } else {
                assert_eq!(policy(), libc::SCHED_OTHER);
            }
            let back = p.after_wait();
            assert_eq!(back, policy() == libc::SCHED_OTHER);
            assert_eq!(shared.idle[0].0.load(Ordering::Relaxed), 0);
            if can_wait_idle() {
                assert!(back);
                assert_eq!(policy(), libc::SCHED_OTHER);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_watchdog_returns_idle_threads_to_normal_when_work_shows_up() {
        // The tests run as root, or at least with CAP_SYS_NICE.
        assert!(can_wait_idle(), "a thread may not return from SCHED_IDLE");
        let shared = Bouncing::new(1);
        let watchdog = shared.start_watchdog().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = Arc::clone(&shared);
        let waiter = std::thread::spawn(move || {
            // Goes idle by hand (the machine may be busy), as a waiting
            // ring thread does, and waits.
            assert!(set_policy_of(0, libc::SCHED_IDLE));
            // SAFETY: a plain query of the calling thread.
            s2.idle[0]
                .0
                .store(unsafe { libc::gettid() }, Ordering::Release);
            tx.send(()).unwrap();
            std::thread::park();
            let p = policy();
            s2.idle[0].0.store(0, Ordering::Release);
            p
        });
        rx.recv().unwrap();
        shared.turn_on();
        // Busy threads beyond what an idle wait allows.
        let stop = Arc::new(AtomicBool::new(false));
        let busy: Vec<_> = (0..shared.max_running + 2)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || while !stop.load(Ordering::Relaxed) {})
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        busy.into_iter().for_each(|t| t.join().unwrap());
        waiter.thread().unpark();
        assert_eq!(waiter.join().unwrap(), libc::SCHED_OTHER);
        // Other work twice in a row: no more idle waits for now.
        assert!(!shared.on());
        shared.stop();
        watchdog.join().unwrap();
    }
}

//! Committing answers under `SCHED_IDLE` while callers bounce between CPUs.
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
//! A CPU whose only runnable thread is under `SCHED_IDLE` counts as idle,
//! so a ring thread that commits its answers under it keeps the woken
//! caller on its CPU. The thread goes back to its normal policy right
//! after, before it waits for the next request: a thread under
//! `SCHED_IDLE` on a CPU busy with other work may wait for the CPU for
//! milliseconds, or seconds behind several busy processes. For the same
//! reason it is done only when nothing but this thread is runnable on the
//! machine (or on half of its CPUs), and only while callers are seen
//! bouncing: every request tells from which caller (thread id) it came on
//! which queue. It costs two policy changes, a read of `/proc/loadavg`
//! and a system call of its own (about 5 µs), against 20-30 µs a move.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Callers remembered at once (by thread id, slots shared on collision).
const SLOTS: usize = 64;
/// Requests one ring thread judges at a time (consecutive blocks).
const WINDOW: u32 = 128;
/// How long a verdict of "bouncing" holds. Callers are watched all the
/// while, but those kept in place do not renew it: when it ends, they
/// bounce again for a window or two before it is renewed.
const HOLD: Duration = Duration::from_secs(1);

/// One slot per cache line: slots are written from every CPU.
#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

/// What all ring threads of a mount share: where each caller's last
/// request arrived, and until when answers are committed idle.
pub(crate) struct Bouncing {
    last_queue: Box<[Slot]>,
    epoch: Instant,
    /// Milliseconds since `epoch` until which callers count as bouncing;
    /// 0: they do not.
    until_ms: AtomicU64,
}

impl Bouncing {
    pub(crate) fn new() -> Bouncing {
        Bouncing {
            last_queue: (0..SLOTS).map(|_| Slot::default()).collect(),
            epoch: Instant::now(),
            until_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        // Never 0, which means "off".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether callers were seen bouncing lately.
    pub(crate) fn on(&self) -> bool {
        let until = self.until_ms.load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
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
}

/// One ring thread's part: its view of callers, and whether it may
/// commit idle at all.
pub(crate) struct IdleCommit {
    shared: std::sync::Arc<Bouncing>,
    qid: u16,
    requests: u32,
    moves: u32,
    /// Kept open: a read is a `pread` of a few bytes.
    loadavg: File,
    /// Runnable threads on the machine at most for an idle commit.
    max_running: u32,
}

impl IdleCommit {
    /// This thread's part, if it may commit idle: it runs under the
    /// normal policy (which it returns to) and `/proc/loadavg` opens.
    pub(crate) fn for_this_thread(
        shared: std::sync::Arc<Bouncing>,
        qid: u16,
    ) -> Option<IdleCommit> {
        // SAFETY: a plain query of the calling thread.
        if unsafe { libc::sched_getscheduler(0) } != libc::SCHED_OTHER {
            return None;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some(IdleCommit {
            shared,
            qid,
            requests: 0,
            moves: 0,
            loadavg: File::open("/proc/loadavg").ok()?,
            max_running: (cpus / 2).max(1) as u32,
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
            let until = self.shared.now_ms() + HOLD.as_millis() as u64;
            self.shared.until_ms.store(until, Ordering::Relaxed);
        }
        self.requests = 0;
        self.moves = 0;
    }

    /// Whether the answers about to be committed should be, idle: callers
    /// bounce, and no other thread is runnable (beyond `max_running`).
    /// A thread of this queue woken for an asynchronous request (the
    /// RELEASE sent just before the GETATTR answered here) keeps the CPU
    /// busy: then the caller still moves. Letting it run first
    /// (`sched_yield`) was tried: the scheduler keeps running this thread.
    pub(crate) fn wanted(&self) -> bool {
        self.shared.on() && self.running().is_some_and(|n| n <= self.max_running)
    }

    /// Runnable threads on the machine, this one included (the fourth
    /// field of `/proc/loadavg`, "running/total").
    fn running(&self) -> Option<u32> {
        let mut buf = [0u8; 128];
        let n = self.loadavg.read_at(&mut buf, 0).ok()?;
        running_of(&buf[..n])
    }

    /// Runs `commit` (which submits the answers) under `SCHED_IDLE`, then
    /// returns to the normal policy. `false` if the thread could not
    /// return and stays under `SCHED_IDLE` (the nice limit changed since
    /// [`can_commit_idle`] said yes).
    pub(crate) fn commit_idle<T>(&self, commit: impl FnOnce() -> T) -> (T, bool) {
        if !set_policy(libc::SCHED_IDLE) {
            return (commit(), true);
        }
        let r = commit();
        (r, set_policy(libc::SCHED_OTHER))
    }
}

fn running_of(loadavg: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(loadavg).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// Sets the calling thread's scheduling policy; whether it took.
fn set_policy(policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread with a valid param.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// Whether a thread of this process may go to `SCHED_IDLE` and back to
/// the normal policy: going back needs `CAP_SYS_NICE` or an `RLIMIT_NICE`
/// of at least 20 - nice. Tried on a thread of its own (which inherits
/// the caller's nice value and ends under whatever policy it is left
/// with).
pub fn can_commit_idle() -> bool {
    std::thread::spawn(|| set_policy(libc::SCHED_IDLE) && set_policy(libc::SCHED_OTHER))
        .join()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn part() -> IdleCommit {
        IdleCommit::for_this_thread(Arc::new(Bouncing::new()), 1).expect("test threads are normal")
    }

    #[test]
    fn a_caller_that_bounces_turns_idle_commits_on() {
        let mut p = part();
        let mut other = IdleCommit::for_this_thread(Arc::clone(&p.shared), 0).unwrap();
        // Windows are per thread: each sees a whole one.
        for _ in 0..WINDOW {
            p.saw(4242);
            other.saw(4242);
        }
        assert!(p.shared.on());
    }

    #[test]
    fn callers_that_stay_leave_commits_normal() {
        let mut p = part();
        let mut other = IdleCommit::for_this_thread(Arc::clone(&p.shared), 0).unwrap();
        // Callers that each stay on their queue, two of them sharing a slot.
        for _ in 0..WINDOW * 2 {
            p.saw(7);
            other.saw(7 + SLOTS as u32);
            p.saw(100);
            other.saw(101);
        }
        assert!(!p.shared.on());
        // Requests without a caller (pid 0: writeback) never count as moving.
        for _ in 0..WINDOW {
            p.saw(0);
            other.saw(0);
        }
        assert!(!p.shared.on());
    }

    #[test]
    fn runnable_threads_come_from_loadavg() {
        assert_eq!(running_of(b"0.15 1.10 2.49 3/85 29609\n"), Some(3));
        assert_eq!(running_of(b"garbage"), None);
        // This thread is running: at least one.
        assert!(part().running().is_some_and(|n| n >= 1));
    }

    #[test]
    fn a_commit_runs_idle_and_the_thread_returns_to_normal() {
        std::thread::spawn(|| {
            let p = part();
            // SAFETY: plain queries of the calling thread.
            let (during, back) = p.commit_idle(|| unsafe { libc::sched_getscheduler(0) });
            let after = unsafe { libc::sched_getscheduler(0) };
            if can_commit_idle() {
                assert_eq!(
                    (during, back, after),
                    (libc::SCHED_IDLE, true, libc::SCHED_OTHER)
                );
            } else {
                // Refused on the way back: the caller must be told.
                assert_eq!((during, back), (libc::SCHED_IDLE, false));
            }
        })
        .join()
        .unwrap();
    }
}

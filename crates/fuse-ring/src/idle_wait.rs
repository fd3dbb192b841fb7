//! Waiting under `SCHED_IDLE` while callers bounce between CPUs.
//!
//! A request is served on the caller's CPU. When the answer wakes the
//! caller, the scheduler sees that CPU busy (the ring thread is still on
//! it) and may move the caller to an idle one; its next request then goes
//! to that CPU's queue, whose answer moves it back. Once started, this
//! ping-pong feeds itself (the scheduler prefers the CPU the caller last
//! came from while it is idle), and in a VM each move costs more than a
//! small request. It shows when the mount and its callers are in
//! different scheduling groups (a daemon's own session, another cgroup).
//!
//! A thread under `SCHED_IDLE` counts as idle to the scheduler, so a
//! thread that commits its answer and waits under it keeps the caller on
//! its CPU. The switch costs two system calls a request, and a thread
//! waiting under `SCHED_IDLE` is woken late when its CPU is busy with
//! other work. So it is done only while callers are seen bouncing: every
//! request tells from which caller (thread id) it came on which queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Callers remembered at once (by thread id, slots shared on collision).
const SLOTS: usize = 64;
/// Requests one ring thread judges at a time.
const WINDOW: u32 = 128;
/// How long a verdict of "bouncing" holds before callers are watched
/// again with normal waits (while waits are idle, nobody bounces).
const HOLD: Duration = Duration::from_secs(1);

/// One slot per cache line: slots are written from every CPU.
#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

/// What all ring threads of a mount share: where each caller's last
/// request arrived, and until when ring threads wait under `SCHED_IDLE`.
pub(crate) struct IdleWait {
    last_queue: Box<[Slot]>,
    epoch: Instant,
    /// Milliseconds since `epoch` until which waits are idle; 0: not.
    until_ms: AtomicU64,
}

impl IdleWait {
    pub(crate) fn new() -> IdleWait {
        IdleWait {
            last_queue: (0..SLOTS).map(|_| Slot::default()).collect(),
            epoch: Instant::now(),
            until_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        // Never 0, which means "off".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether a thread about to wait should wait under `SCHED_IDLE`.
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

/// One ring thread's view: requests and moves in its current window.
#[derive(Default)]
pub(crate) struct Watch {
    requests: u32,
    moves: u32,
}

impl Watch {
    /// Counts a request from `pid` on queue `qid`; at the end of a window
    /// where at least a quarter of the requests came from callers that had
    /// just moved, turns idle waits on for [`HOLD`].
    pub(crate) fn saw(&mut self, shared: &IdleWait, pid: u32, qid: u16) {
        self.requests += 1;
        if shared.moved(pid, qid) {
            self.moves += 1;
        }
        if self.requests < WINDOW {
            return;
        }
        if self.moves * 4 >= self.requests {
            let until = shared.now_ms() + HOLD.as_millis() as u64;
            shared.until_ms.store(until, Ordering::Relaxed);
        }
        *self = Watch::default();
    }
}

/// Sets the calling thread's scheduling policy; whether it took.
pub(crate) fn set_policy(policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread with a valid param.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// Whether a thread of this process may go to `SCHED_IDLE` and back to
/// the normal policy: going back needs `CAP_SYS_NICE` or an `RLIMIT_NICE`
/// that allows the thread's nice value. Tried on a thread of its own,
/// which ends under whatever policy it is left with.
pub fn can_wait_idle() -> bool {
    std::thread::spawn(|| set_policy(libc::SCHED_IDLE) && set_policy(libc::SCHED_OTHER))
        .join()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_that_bounces_turns_idle_waits_on() {
        let shared = IdleWait::new();
        let mut w = Watch::default();
        for i in 0..WINDOW {
            w.saw(&shared, 4242, (i % 2) as u16);
        }
        assert!(shared.on());
    }

    #[test]
    fn callers_that_stay_leave_waits_normal() {
        let shared = IdleWait::new();
        let mut w = Watch::default();
        // Four callers, each on its own queue, some sharing a slot.
        for i in 0..(WINDOW * 4) {
            let pid = [7, 7 + SLOTS as u32, 100, 101][(i % 4) as usize];
            w.saw(&shared, pid, (i % 4) as u16);
        }
        assert!(!shared.on());
        // Kernel threads (pid 0) never count as moving.
        for i in 0..WINDOW {
            w.saw(&shared, 0, (i % 2) as u16);
        }
        assert!(!shared.on());
    }

    #[test]
    fn going_idle_and_back_is_allowed_where_the_kernel_allows_it() {
        // SAFETY: plain queries of this process.
        let root = unsafe { libc::geteuid() } == 0;
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut lim) }, 0);
        // Nice 0 needs an RLIMIT_NICE of 20 without CAP_SYS_NICE.
        assert_eq!(can_wait_idle(), root || lim.rlim_cur >= 20);
    }
}

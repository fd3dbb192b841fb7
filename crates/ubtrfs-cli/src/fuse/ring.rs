//! Serving the mount over io_uring (the `fuse-ring` crate), when the
//! kernel offers it: each request is decoded in `wire.rs` and given to the
//! same handler as one read from `/dev/fuse`, with an answer that goes
//! back over the ring.
//!
//! `fuser` negotiates the connection; what the kernel never sends over
//! the ring (FORGET, INTERRUPT, DESTROY) is read from `/dev/fuse`
//! (`dev.rs`).

use super::FuseFs;
use super::wire::{Access, Decoded, Wire, WireReply, allowed, has_payload};
use fuse_ring::{RingConfig, RingEntry, Rings};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// `max_write` over the ring: each entry has a payload buffer this large,
/// and the kernel sends at most `max_pages` (256 pages) in one write anyway.
pub(super) const MAX_WRITE: u32 = 1 << 20;
/// Threads per CPU queue, each with one entry: a request never waits for a
/// busy thread while another of its queue is free. Fewer on machines with
/// many CPUs, where each queue sees less: at most 16 threads in all unless
/// there are more CPUs than that (each entry has a 1 MiB buffer).
fn threads_per_queue(queues: usize) -> usize {
    (16 / queues.max(1)).clamp(1, 4)
}

impl FuseFs {
    /// Starts serving over io_uring on `fuse` (the session's descriptor)
    /// if the kernel agreed at INIT; `false` if it did not.
    pub(crate) fn start_rings(
        &self,
        fuse: RawFd,
        access: Access,
    ) -> Result<bool, fuse_ring::Error> {
        if !self.agreed.uring.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let queues = fuse_ring::probe()?;
        let config = RingConfig {
            queues,
            threads_per_queue: threads_per_queue(queues),
            depth: 1,
            payload_size: MAX_WRITE as usize,
            pin: true,
            idle_wait: true,
        };
        let server = Arc::new(RingServer {
            fs: self.clone(),
            access,
        });
        let rings = Rings::start(fuse, &config, server)?;
        *self.rings.lock().unwrap_or_else(|e| e.into_inner()) = Some(rings);
        Ok(true)
    }
}

struct RingServer {
    fs: FuseFs,
    access: Access,
}

impl fuse_ring::Handler for RingServer {
    fn handle(&self, entry: RingEntry) {
        let h = entry.header();
        // Read before written: a store on every request would bounce the
        // line between the CPUs' queues.
        let used = &self.fs.agreed.ring_used;
        if !used.load(Ordering::Relaxed) {
            used.store(true, Ordering::Relaxed);
        }
        if !allowed(&self.access, h.opcode, h.uid) {
            return entry.error(libc::EACCES);
        }
        // Requests whose arguments are all in the fixed part are answered
        // straight into the entry; the others borrow names or data from
        // its payload, so their answer waits until the handler is done
        // with them (see `Slot`).
        if !has_payload(h.opcode) {
            let req = Decoded::of(&entry.request());
            return self
                .fs
                .serve_fixed(req, WireReply::new(RingTarget::Direct(entry)));
        }
        let slot = Arc::new(Mutex::new(Slot::default()));
        self.fs.serve_named(
            &entry.request(),
            WireReply::new(RingTarget::Slot(slot.clone())),
        );
        // Unanswered yet if a deferred write answers from another thread.
        settle(&slot, |s| s.entry = Some(entry));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An answer made while the request's payload was still borrowed.
enum Answer {
    Ok(Vec<u8>),
    Err(i32),
}

impl Answer {
    fn send(self, entry: RingEntry) {
        match self {
            Answer::Ok(body) => entry.reply(&[&body]),
            Answer::Err(e) => entry.error(e),
        }
    }
}

/// Where an answer meets its entry: whichever comes second sends it.
#[derive(Default)]
struct Slot {
    entry: Option<RingEntry>,
    answer: Option<Answer>,
}

/// Puts what just came (the entry or its answer) into `slot`; whichever
/// completes the pair sends it, outside the lock.
fn settle(slot: &Mutex<Slot>, put: impl FnOnce(&mut Slot)) {
    let mut s = lock(slot);
    put(&mut s);
    match (s.entry.take(), s.answer.take()) {
        (Some(entry), Some(answer)) => {
            drop(s);
            answer.send(entry);
        }
        (entry, answer) => (s.entry, s.answer) = (entry, answer),
    }
}

/// Where an answer over the ring goes.
enum RingTarget {
    /// The handler borrows nothing of the entry: answer into it at once.
    Direct(RingEntry),
    Slot(Arc<Mutex<Slot>>),
}

impl Wire for RingTarget {
    fn send(self, parts: &[&[u8]]) {
        match self {
            RingTarget::Direct(entry) => entry.reply(parts),
            RingTarget::Slot(slot) => {
                let answer = Answer::Ok(parts.concat());
                settle(&slot, |s| s.answer = Some(answer));
            }
        }
    }

    fn fail(self, errno: i32) {
        match self {
            RingTarget::Direct(entry) => entry.error(errno),
            RingTarget::Slot(slot) => settle(&slot, |s| s.answer = Some(Answer::Err(errno))),
        }
    }
}

//! A persistent pool of checksum workers for the `offload` checksum mode
//! (seed 003): the writing thread hands a range of data to the pool, writes
//! the data to the device meanwhile, then helps with whatever is left and
//! waits for the rest at completion.
//!
//! The threads start once per process, on first use, and stay: spawning a
//! thread per extent cost more than the checksum of a small extent. One
//! pool serves every filesystem of the process, since they share the cores.
//!
//! A job is cut into chunks of whole sectors that any thread may claim, the
//! submitter included: a submitter that finishes its device write early
//! hashes instead of sleeping, so offloading never idles the writing thread
//! while work is queued, and a busy pool degrades to inline hashing.

use crate::format::CsumType;
use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// What the checksums of a job look like.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CsumSpec {
    /// The algorithm.
    pub csum_type: CsumType,
    /// Bytes per checksummed sector.
    pub sectorsize: usize,
    /// Bytes kept of each checksum.
    pub csum_size: usize,
}

impl CsumSpec {
    /// The checksums of `data`, one per sector, concatenated.
    pub fn sums(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len().div_ceil(self.sectorsize) * self.csum_size);
        self.sums_into(data, &mut out);
        out
    }

    /// Append the checksums of `data` to `out`.
    pub fn sums_into(&self, data: &[u8], out: &mut Vec<u8>) {
        for sector in data.chunks(self.sectorsize) {
            out.extend_from_slice(&self.csum_type.compute(sector)[..self.csum_size]);
        }
    }
}

/// How busy the pool is, as seen by a submitter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolLoad {
    /// Worker threads in the pool.
    pub workers: usize,
    /// Workers hashing right now.
    pub active: usize,
    /// Jobs with chunks nobody has claimed yet.
    pub queued: usize,
}

impl PoolLoad {
    /// Whether a new job would queue behind a backlog: as many jobs wait
    /// for a worker as there are workers. Workers still busy with the last
    /// chunks of jobs nobody else waits for do not count: the writer that
    /// submitted the previous piece sees them finishing right now.
    pub fn saturated(&self) -> bool {
        self.workers == 0 || self.queued >= self.workers
    }
}

struct JobState {
    sums: Vec<u8>,
    left: usize,
    failed: bool,
}

struct Job {
    data: Arc<Vec<u8>>,
    range: Range<usize>,
    spec: CsumSpec,
    chunk: usize,
    nchunks: usize,
    /// Next chunk to claim; past `nchunks` once all are claimed.
    next: AtomicUsize,
    state: Mutex<JobState>,
    done: Condvar,
}

impl Job {
    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.nchunks
    }

    /// Claim and hash chunks until none is left; returns the chunks done.
    fn run(&self) -> usize {
        let mut n = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.nchunks {
                return n;
            }
            let lo = self.range.start + i * self.chunk;
            let hi = (lo + self.chunk).min(self.range.end);
            // A panic in a hash must not leave the submitter waiting forever.
            let sums = catch_unwind(AssertUnwindSafe(|| self.spec.sums(&self.data[lo..hi])));
            let per_chunk = self.chunk / self.spec.sectorsize * self.spec.csum_size;
            let mut st = lock(&self.state);
            match sums {
                Ok(s) => st.sums[i * per_chunk..i * per_chunk + s.len()].copy_from_slice(&s),
                Err(_) => st.failed = true,
            }
            st.left -= 1;
            if st.left == 0 {
                self.done.notify_all();
            }
            n += 1;
        }
    }
}

struct Shared {
    queue: Mutex<VecDeque<Arc<Job>>>,
    ready: Condvar,
    active: AtomicUsize,
    stop: AtomicBool,
}

/// A set of checksum worker threads fed from one queue.
pub(crate) struct CsumPool {
    shared: Arc<Shared>,
    workers: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process' pool, started on first use.
pub(crate) fn pool() -> &'static CsumPool {
    static POOL: OnceLock<CsumPool> = OnceLock::new();
    POOL.get_or_init(|| {
        // The submitter hashes too, so one worker fewer than cores keeps
        // every core busy without oversubscribing them; at least one, so
        // hashing can overlap a device write even on one core.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        CsumPool::new((cores.saturating_sub(1)).clamp(1, 8))
    })
}

impl CsumPool {
    /// A pool of `workers` threads (fewer if threads cannot be started).
    pub fn new(workers: usize) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let mut started = 0;
        for i in 0..workers {
            let sh = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("ubtrfs-csum-{i}"))
                .spawn(move || worker(&sh));
            if spawned.is_ok() {
                started += 1;
            }
        }
        CsumPool {
            shared,
            workers: started,
        }
    }

    /// How busy the pool is now.
    pub fn load(&self) -> PoolLoad {
        let queued = lock(&self.shared.queue)
            .iter()
            .filter(|j| !j.exhausted())
            .count();
        PoolLoad {
            workers: self.workers,
            active: self.shared.active.load(Ordering::Relaxed),
            queued,
        }
    }

    /// Start checksumming `data[range]`; the caller must end with
    /// [`Ticket::finish`].
    pub fn submit(&self, data: Arc<Vec<u8>>, range: Range<usize>, spec: CsumSpec) -> Ticket<'_> {
        let len = range.len();
        // About eight chunks a job, so the submitter and every worker get a
        // share; never less than a sector.
        let ss = spec.sectorsize.max(1);
        let chunk = (len / 8).max(16 << 10).div_ceil(ss) * ss;
        let nchunks = len.div_ceil(chunk).max(1);
        let job = Arc::new(Job {
            data,
            range,
            spec,
            chunk,
            nchunks,
            next: AtomicUsize::new(0),
            state: Mutex::new(JobState {
                sums: vec![0; len.div_ceil(ss) * spec.csum_size],
                left: nchunks,
                failed: false,
            }),
            done: Condvar::new(),
        });
        if self.workers > 0 {
            lock(&self.shared.queue).push_back(Arc::clone(&job));
            // The submitter takes a chunk too: wake at most one worker per other chunk.
            for _ in 0..(nchunks - 1).clamp(1, self.workers) {
                self.shared.ready.notify_one();
            }
        }
        Ticket { pool: self, job }
    }
}

impl Drop for CsumPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _q = lock(&self.shared.queue);
        self.shared.ready.notify_all();
    }
}

fn worker(sh: &Shared) {
    loop {
        let job = {
            let mut q = lock(&sh.queue);
            loop {
                if sh.stop.load(Ordering::Relaxed) {
                    return;
                }
                while q.front().is_some_and(|j| j.exhausted()) {
                    q.pop_front();
                }
                if let Some(j) = q.front() {
                    break Arc::clone(j);
                }
                q = sh.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        sh.active.fetch_add(1, Ordering::Relaxed);
        job.run();
        sh.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A submitted job; [`Ticket::finish`] returns its checksums.
pub(crate) struct Ticket<'a> {
    pool: &'a CsumPool,
    job: Arc<Job>,
}

/// Where the time of an offloaded job went, from the submitter's side.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Finished {
    /// Nanoseconds the submitter spent hashing chunks itself.
    pub help_ns: u64,
    /// Nanoseconds it then waited for workers still hashing.
    pub wait_ns: u64,
    /// Chunks the submitter hashed itself, of `chunks`.
    pub helped: usize,
    /// Chunks in the job.
    pub chunks: usize,
}

impl Ticket<'_> {
    /// Hash what no worker has claimed, wait for the rest, and return the
    /// checksums; `None` if a worker failed.
    pub fn finish(self) -> (Option<Vec<u8>>, Finished) {
        let t = Instant::now();
        let helped = self.job.run();
        let help_ns = t.elapsed().as_nanos() as u64;
        // Nothing is left to claim: drop the job from the queue now rather
        // than keep its data alive until a worker passes by.
        lock(&self.pool.shared.queue).retain(|j| !Arc::ptr_eq(j, &self.job));
        let t = Instant::now();
        let mut st = lock(&self.job.state);
        while st.left > 0 {
            st = self.job.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let wait_ns = t.elapsed().as_nanos() as u64;
        let sums = (!st.failed).then(|| std::mem::take(&mut st.sums));
        (
            sums,
            Finished {
                help_ns,
                wait_ns,
                helped,
                chunks: self.job.nchunks,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Arc<Vec<u8>> {
        Arc::new(
            (0..len)
                .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[2])
                .collect(),
        )
    }

    #[test]
    fn pool_sums_match_inline_sums() {
        let pool = CsumPool::new(2);
        for csum_type in [CsumType::Crc32c, CsumType::Sha256, CsumType::Blake2b] {
            let spec = CsumSpec {
                csum_type,
                sectorsize: 4096,
                csum_size: csum_type.size(),
            };
            for len in [4096, 12288, 65536, 1 << 20, (1 << 20) + 4096 * 3] {
                let d = data(len + 8192);
                let range = 8192..8192 + len;
                let (sums, f) = pool.submit(Arc::clone(&d), range.clone(), spec).finish();
                assert_eq!(sums.unwrap(), spec.sums(&d[range]), "{csum_type:?} {len}");
                assert!(f.helped <= f.chunks);
            }
        }
        assert_eq!(pool.load().queued, 0);
    }

    #[test]
    fn pool_without_workers_hashes_in_the_submitter() {
        let pool = CsumPool::new(0);
        assert!(pool.load().saturated());
        let spec = CsumSpec {
            csum_type: CsumType::Crc32c,
            sectorsize: 4096,
            csum_size: 4,
        };
        let d = data(256 << 10);
        let (sums, f) = pool.submit(Arc::clone(&d), 0..d.len(), spec).finish();
        assert_eq!(sums.unwrap(), spec.sums(&d));
        assert_eq!(f.helped, f.chunks);
    }

    #[test]
    fn many_submitters_share_one_pool() {
        let pool = CsumPool::new(2);
        let spec = CsumSpec {
            csum_type: CsumType::Xxhash64,
            sectorsize: 4096,
            csum_size: 8,
        };
        std::thread::scope(|s| {
            for t in 0..4 {
                let pool = &pool;
                s.spawn(move || {
                    for i in 0..20 {
                        let d = data((i + t + 1) * 16384);
                        let (sums, _) = pool.submit(Arc::clone(&d), 0..d.len(), spec).finish();
                        assert_eq!(sums.unwrap(), spec.sums(&d));
                    }
                });
            }
        });
    }
}

//! Compressed writeback off the change lock (DESIGN.md layer 8). A
//! compressed extent's size is known only once its data is compressed,
//! and compressing takes far longer than writing: under a stream of
//! writes to a `compress=` mount, the dirty data of a file is copied into
//! a job and compressed by threads of its own while everybody else goes
//! on. The data stays dirty meanwhile (reads, truncates and overwrites
//! see nothing different). The next holder of the change lock that
//! writes back takes the finished job: if the dirty bytes are still the
//! ones compressed, they become compressed extents, otherwise the job is
//! dropped and the newer bytes stay dirty. A job is only ever a head
//! start: whatever writes the file back without it does what it would
//! have done anyway.

use super::compress_heuristic::looks_incompressible;
use super::compression::{Compression, compress};
use crate::Result;
use crate::format::consts::MAX_COMPRESSED_RAM;
use crate::fs::InodeId;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One piece of a compressed range: a compressed extent (or a plain one,
/// where compressing did not save a sector, as the kernel does).
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    /// File offset of the piece's first byte.
    pub file_offset: u64,
    /// Where its bytes are in [`Compressed::data`].
    pub at: usize,
    /// Its bytes on disk (whole sectors).
    pub disk_len: usize,
    pub kind: Compression,
    /// Bytes of the file it covers.
    pub ram_len: u64,
}

/// A range of a file, compressed: the pieces' bytes one after another.
#[derive(Debug, Default)]
pub(crate) struct Compressed {
    pub data: Vec<u8>,
    pub pieces: Vec<Piece>,
}

/// How a range is compressed: the algorithm, its level, and whether every
/// piece is tried (`compress-force`) or only pieces that do not look
/// incompressible ([`super::compress_heuristic`], the `compress` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompressWith {
    pub kind: Compression,
    pub level: Option<i32>,
    pub force: bool,
}

/// Most threads one range is compressed on.
const MAX_WORKERS: usize = 8;

/// Compress `data`, the file's bytes from `offset`, in pieces of at most
/// 128 KiB of file data (the kernel's largest compressed extent), the
/// pieces spread over the machine's CPUs; at a lower CPU priority if
/// `background` (a job nobody waits for yet). Neighbouring pieces that
/// stay plain become one piece: one extent, as the kernel writes them.
pub(crate) fn compress_range(
    data: &[u8],
    offset: u64,
    with: CompressWith,
    sectorsize: u32,
    background: bool,
) -> Result<Compressed> {
    let chunks: Vec<&[u8]> = data.chunks(MAX_COMPRESSED_RAM as usize).collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_WORKERS)
        .min(chunks.len());
    let one = |c: &[u8]| -> Result<Option<Vec<u8>>> {
        let ss = sectorsize as usize;
        if !with.force && looks_incompressible(c) {
            return Ok(None);
        }
        Ok(
            compress(with.kind, with.level, c, sectorsize)?.map(|mut z| {
                z.resize(z.len().div_ceil(ss) * ss, 0);
                z
            }),
        )
    };
    let results: Vec<Result<Option<Vec<u8>>>> = if workers <= 1 {
        chunks.iter().map(|c| one(c)).collect()
    } else {
        let mut slots: Vec<Option<Result<Option<Vec<u8>>>>> = Vec::new();
        slots.resize_with(chunks.len(), || None);
        let share = |w: usize| {
            (w..chunks.len())
                .step_by(workers)
                .map(|i| (i, one(chunks[i])))
                .collect::<Vec<_>>()
        };
        std::thread::scope(|s| {
            // The caller takes the first share; a thread that cannot be
            // started or that fails leaves its share to the caller below.
            let handles: Vec<_> = (1..workers)
                .filter_map(|w| {
                    let share = &share;
                    std::thread::Builder::new()
                        .name("compress".into())
                        .spawn_scoped(s, move || {
                            if background {
                                lower_priority();
                            }
                            share(w)
                        })
                        .ok()
                })
                .collect();
            for (i, r) in share(0) {
                slots[i] = Some(r);
            }
            for h in handles {
                for (i, r) in h.join().unwrap_or_default() {
                    slots[i] = Some(r);
                }
            }
        });
        slots
            .into_iter()
            .zip(&chunks)
            .map(|(r, c)| r.unwrap_or_else(|| one(c)))
            .collect()
    };
    let mut out = Compressed::default();
    for (i, (chunk, r)) in chunks.iter().zip(results).enumerate() {
        let file_offset = offset + (i as u64) * MAX_COMPRESSED_RAM;
        let at = out.data.len();
        let kind = match r? {
            Some(z) => {
                out.data.extend_from_slice(&z);
                with.kind
            }
            None => {
                out.data.extend_from_slice(chunk);
                if let Some(last) = out.pieces.last_mut()
                    && last.kind == Compression::None
                    && last.file_offset + last.ram_len == file_offset
                {
                    last.disk_len += chunk.len();
                    last.ram_len += chunk.len() as u64;
                    continue;
                }
                Compression::None
            }
        };
        out.pieces.push(Piece {
            file_offset,
            at,
            disk_len: out.data.len() - at,
            kind,
            ram_len: chunk.len() as u64,
        });
    }
    Ok(out)
}

/// Give the calling thread a lower CPU priority (nice 10): compressing a
/// stream can keep every CPU busy, and the threads serving other
/// requests (an fsync, a read) must not queue behind it.
fn lower_priority() {
    // SAFETY: gettid and setpriority take no pointers; a failure leaves
    // the priority as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// A job: a copy of a file's dirty bytes and, once done, their
/// compressed form.
struct Job {
    /// Tells jobs apart (two never share a range, but a finished one must
    /// find its own job whatever happens).
    seq: u64,
    id: InodeId,
    offset: u64,
    input: Arc<Vec<u8>>,
    out: Option<Result<Compressed>>,
}

/// A finished job, taken for its extents.
pub(crate) struct Done {
    pub id: InodeId,
    pub offset: u64,
    /// The dirty bytes it compressed.
    pub input: Arc<Vec<u8>>,
    pub out: Result<Compressed>,
}

#[derive(Default)]
struct State {
    jobs: Vec<Job>,
    next_seq: u64,
    /// Bytes of jobs not yet compressed.
    compressing: u64,
    /// Bytes of all jobs not yet taken.
    held: u64,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Notified when a job is done.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Buffers kept for new jobs' copies at most.
const SPARES: usize = 4;

/// The compression jobs of a filesystem.
#[derive(Default)]
pub(crate) struct CompressJobs {
    shared: Arc<Shared>,
    /// Buffers of jobs taken, for new jobs' copies: fresh memory costs a
    /// page fault and a zeroed page per 4 KiB, under the change lock.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl CompressJobs {
    /// Compress `input`, the dirty bytes of `id` at `offset` (a copy, or
    /// a run lent by [`super::delalloc`]), on a thread of its own. False if no thread could be started (the bytes stay
    /// dirty and are compressed at writeback as before).
    pub fn submit(
        &self,
        id: InodeId,
        offset: u64,
        input: Arc<Vec<u8>>,
        with: CompressWith,
        sectorsize: u32,
    ) -> bool {
        let len = input.len() as u64;
        // Registered before the thread starts: it finds its job.
        let seq = {
            let mut s = self.shared.lock();
            let seq = s.next_seq;
            s.next_seq += 1;
            s.jobs.push(Job {
                seq,
                id,
                offset,
                input: Arc::clone(&input),
                out: None,
            });
            s.compressing += len;
            s.held += len;
            seq
        };
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name("compress".into())
            .spawn(move || {
                lower_priority();
                // Whatever happens, the job ends: fsync and commit wait
                // for it.
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    compress_range(&input, offset, with, sectorsize, true)
                }))
                .unwrap_or_else(|_| Err(crate::Error::Invalid("compressing panicked".into())));
                // The job's buffer is then the taker's alone, to reuse.
                drop(input);
                let mut s = shared.lock();
                s.compressing -= len;
                if let Some(j) = s.jobs.iter_mut().find(|j| j.seq == seq) {
                    j.out = Some(out);
                }
                drop(s);
                shared.done.notify_all();
            });
        if spawned.is_ok() {
            return true;
        }
        let mut s = self.shared.lock();
        s.jobs.retain(|j| j.seq != seq);
        s.compressing -= len;
        s.held -= len;
        false
    }

    /// An empty buffer for a job's copy.
    pub fn buffer(&self) -> Vec<u8> {
        self.spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default()
    }

    /// Keep the buffer of a job taken for a later job's copy.
    pub fn recycle(&self, mut buf: Vec<u8>) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < SPARES {
            buf.clear();
            spare.push(buf);
        }
    }

    /// Bytes of dirty data in jobs not yet taken.
    pub fn held(&self) -> u64 {
        self.shared.lock().held
    }

    /// The file ranges of `id` jobs hold, as (offset, length).
    pub fn covered(&self, id: InodeId) -> Vec<(u64, u64)> {
        let s = self.shared.lock();
        let mut v: Vec<(u64, u64)> = s
            .jobs
            .iter()
            .filter(|j| j.id == id)
            .map(|j| (j.offset, j.input.len() as u64))
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether any job holds data of `id`.
    pub fn has(&self, id: InodeId) -> bool {
        self.shared.lock().jobs.iter().any(|j| j.id == id)
    }

    /// Whether at most `limit` bytes are being compressed.
    pub fn has_room(&self, limit: u64) -> bool {
        self.shared.lock().compressing <= limit
    }

    /// Wait until at most `limit` bytes are being compressed.
    pub fn wait_for_room(&self, limit: u64) {
        let mut s = self.shared.lock();
        while s.compressing > limit {
            s = self.shared.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Take the finished jobs of `owner` (every file's if `None`); with
    /// `wait`, wait for the unfinished ones first.
    pub fn take(&self, owner: Option<InodeId>, wait: bool) -> Vec<Done> {
        let mut s = self.shared.lock();
        let mine = |j: &Job| owner.is_none_or(|o| j.id == o);
        while wait && s.jobs.iter().any(|j| mine(j) && j.out.is_none()) {
            s = self.shared.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        let mut out = Vec::new();
        let mut keep = Vec::with_capacity(s.jobs.len());
        for mut j in std::mem::take(&mut s.jobs) {
            match j.out.take() {
                Some(r) if mine(&j) => out.push(Done {
                    id: j.id,
                    offset: j.offset,
                    input: j.input,
                    out: r,
                }),
                other => {
                    j.out = other;
                    keep.push(j);
                }
            }
        }
        s.jobs = keep;
        s.held -= out.iter().map(|d| d.input.len() as u64).sum::<u64>();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces cover the range in order, compressed where that saves a
    /// sector, and decompress to the input.
    #[test]
    fn compress_range_pieces_decompress_to_the_input() {
        let mut data = Vec::new();
        for i in 0..700u32 {
            data.extend_from_slice(format!("line {i} of some text\n").repeat(40).as_bytes());
        }
        let mut x = 5u64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        data.extend_from_slice(&noise);
        data.resize(data.len().div_ceil(4096) * 4096, 0);
        for force in [false, true] {
            let with = CompressWith {
                kind: Compression::Zstd,
                level: None,
                force,
            };
            check_pieces(&data, with);
        }
    }

    fn check_pieces(data: &[u8], with: CompressWith) {
        let c = compress_range(data, 1 << 20, with, 4096, false).unwrap();
        let mut back = Vec::new();
        let mut next = 1u64 << 20;
        for p in &c.pieces {
            assert_eq!(p.file_offset, next);
            assert_eq!(p.disk_len % 4096, 0);
            let bytes = &c.data[p.at..p.at + p.disk_len];
            match p.kind {
                Compression::None => back.extend_from_slice(bytes),
                k => back.extend(
                    super::super::compression::decompress(k, bytes, p.ram_len as usize, 4096)
                        .unwrap(),
                ),
            }
            next += p.ram_len;
        }
        assert_eq!(back, data);
        assert!(c.pieces.iter().any(|p| p.kind == Compression::Zstd));
        assert!(c.pieces.iter().any(|p| p.kind == Compression::None));
        // Plain neighbours are one extent; compressed pieces hold at most
        // 128 KiB of the file.
        for pair in c.pieces.windows(2) {
            assert!(pair[0].kind != Compression::None || pair[1].kind != Compression::None);
        }
        for p in &c.pieces {
            assert!(p.kind == Compression::None || p.ram_len <= MAX_COMPRESSED_RAM);
        }
    }

    /// Random data is one plain piece, compressed or not as `force` says
    /// only in the work spent: the result is the same.
    #[test]
    fn random_data_is_one_plain_piece() {
        let mut x = 9u64;
        let noise: Vec<u8> = (0..(1usize << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        for force in [false, true] {
            let with = CompressWith {
                kind: Compression::Zstd,
                level: None,
                force,
            };
            let c = compress_range(&noise, 0, with, 4096, false).unwrap();
            assert_eq!(c.pieces.len(), 1, "force {force}");
            assert_eq!(c.pieces[0].kind, Compression::None);
            assert_eq!(c.pieces[0].ram_len, 1 << 20);
            assert_eq!(c.pieces[0].disk_len, 1 << 20);
            assert_eq!(c.data, noise);
        }
    }

    fn with(kind: Compression) -> CompressWith {
        CompressWith {
            kind,
            level: None,
            force: false,
        }
    }

    #[test]
    fn jobs_finish_and_are_taken_by_owner() {
        let jobs = CompressJobs::default();
        let a = InodeId {
            subvol: 5,
            ino: 257,
        };
        let b = InodeId {
            subvol: 5,
            ino: 258,
        };
        let text = b"abcdefgh".repeat(64 * 1024);
        assert!(jobs.submit(a, 0, Arc::new(text.clone()), with(Compression::Zlib), 4096));
        assert!(jobs.submit(
            b,
            4096,
            Arc::new(text.clone()),
            with(Compression::Lzo),
            4096
        ));
        assert_eq!(jobs.held(), 2 * text.len() as u64);
        assert_eq!(jobs.covered(b), vec![(4096, text.len() as u64)]);
        let got = jobs.take(Some(b), true);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id, got[0].offset), (b, 4096));
        assert!(got[0].out.as_ref().unwrap().data.len() < text.len() / 4);
        assert_eq!(jobs.held(), text.len() as u64);
        let rest = jobs.take(None, true);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].id, a);
        assert_eq!(jobs.held(), 0);
        jobs.wait_for_room(0);
    }
}

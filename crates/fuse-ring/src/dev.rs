//! Serving requests read from `/dev/fuse`: the transport every kernel
//! has, and where the kernel sends what never goes over the rings
//! (FORGET, INTERRUPT, DESTROY).
//!
//! Each thread reads from a clone of the session's descriptor of its own
//! (the kernel then keeps each thread's requests apart, and an answer
//! must go back through the descriptor its request came from). A request
//! is split into the same [`Request`] the rings give: header, fixed
//! argument, names or data after it.

use crate::abi::{Args, IN_HEADER_LEN, InHeader, OUT_HEADER_LEN, opcode};
use crate::ring::Request;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `FUSE_FORGET`, `FUSE_INTERRUPT`, `FUSE_BATCH_FORGET`, `FUSE_INIT`: the
/// requests this loop answers (or not) itself.
const FORGET: u32 = 2;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// Parts of an answer written without joining them first.
const MAX_PARTS: usize = 3;

/// Room for the largest request beside `max_write` bytes of data: the
/// header, the largest fixed argument and names (the kernel's own minimum
/// read buffer is 8 KiB).
pub const REQUEST_ROOM: usize = 8192;

/// What serves the requests read from `/dev/fuse`.
pub trait DevHandler: Send + Sync + 'static {
    /// Serves one request, answering through `answer` (here or on another
    /// thread). The request borrows the thread's buffer: it is read again
    /// once this returns.
    fn handle(&self, req: Request<'_>, answer: DevAnswer);
    /// The kernel dropped `nlookup` of its lookups of `nodeid`; it wants
    /// no answer.
    fn forget(&self, nodeid: u64, nlookup: u64);
}

/// The answer to one request, written to the descriptor it came from.
/// Dropped unanswered, it answers EIO, so no caller waits for ever.
pub struct DevAnswer {
    fd: Arc<OwnedFd>,
    unique: u64,
    answered: bool,
}

impl DevAnswer {
    /// Answers with the concatenation of `parts` as the reply's arguments.
    pub fn reply(mut self, parts: &[&[u8]]) {
        self.write(0, parts);
    }

    /// Answers with an error number (positive, as in `errno`).
    pub fn error(mut self, errno: i32) {
        self.write(-errno.abs(), &[]);
    }

    fn write(&mut self, error: i32, parts: &[&[u8]]) {
        self.answered = true;
        let len = OUT_HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut header = [0u8; OUT_HEADER_LEN];
        header[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        header[4..8].copy_from_slice(&error.to_ne_bytes());
        header[8..16].copy_from_slice(&self.unique.to_ne_bytes());
        // Every request answers through here: no allocation for the usual
        // one or two parts.
        let joined: Vec<u8>;
        let one: [&[u8]; 1];
        let parts = if parts.len() > MAX_PARTS {
            joined = parts.concat();
            one = [&joined[..]];
            &one[..]
        } else {
            parts
        };
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [empty; MAX_PARTS + 1];
        let mut n = 0;
        for p in std::iter::once(&header[..]).chain(parts.iter().copied()) {
            if !p.is_empty() {
                iov[n] = libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                };
                n += 1;
            }
        }
        // SAFETY: the first `n` iovecs point into slices that outlive the
        // call. A failure has no one to go to: ENOENT means the request
        // was interrupted and is gone, anything else that the connection
        // is ending.
        unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), n as i32) };
    }
}

impl Drop for DevAnswer {
    fn drop(&mut self) {
        if !self.answered {
            self.write(-libc::EIO, &[]);
        }
    }
}

/// The length of the fixed argument of `op` before its names or data;
/// `None` when the whole body is the fixed argument. `setxattr_ext`: the
/// connection agreed to the longer `fuse_setxattr_in`.
pub fn fixed_arg_len(op: u32, setxattr_ext: bool) -> Option<usize> {
    use opcode::*;
    Some(match op {
        LOOKUP | SYMLINK | UNLINK | RMDIR | REMOVEXATTR => 0,
        MKDIR | RENAME | LINK | GETXATTR => 8,
        MKNOD | RENAME2 | CREATE | TMPFILE => 16,
        SETXATTR if setxattr_ext => 16,
        SETXATTR => 8,
        IOCTL => 32,
        WRITE => 40,
        _ => return None,
    })
}

/// Splits the request in `buf` (as read from `/dev/fuse`, one whole
/// request); `None` if it is shorter than a header, or than the
/// extensions its header names.
pub fn split(buf: &[u8], setxattr_ext: bool) -> Option<Request<'_>> {
    if buf.len() < IN_HEADER_LEN {
        return None;
    }
    let header = InHeader::parse(buf);
    let len = (header.len as usize).min(buf.len());
    // Extensions (security context, supplementary groups) sit at the end;
    // none is asked for, but a kernel may append them anyway.
    let ext = usize::from(header.total_extlen) * 8;
    let body = buf.get(IN_HEADER_LEN..len.checked_sub(ext)?)?;
    let (arg, payload) = match fixed_arg_len(header.opcode, setxattr_ext) {
        Some(n) => body.split_at(n.min(body.len())),
        None => (body, &body[body.len()..]),
    };
    Some(Request {
        header,
        arg: Args(arg),
        payload,
    })
}

/// The threads reading `/dev/fuse`.
pub struct DevThreads {
    threads: Vec<JoinHandle<io::Result<()>>>,
}

impl DevThreads {
    /// Starts `threads` threads (at least one) reading requests of the
    /// session `fd` into buffers of `buf_size` bytes each and giving them
    /// to `handler`. They end when the connection does (unmount, or
    /// DESTROY answered).
    pub fn start(
        fd: BorrowedFd<'_>,
        threads: usize,
        buf_size: usize,
        setxattr_ext: bool,
        handler: Arc<dyn DevHandler>,
    ) -> io::Result<DevThreads> {
        let mut fds = Vec::new();
        for _ in 0..threads.max(1) {
            // Where /dev/fuse cannot be opened (a sandbox handed only the
            // session's descriptor), threads share that one, as they may.
            let own = clone_fd(fd.as_raw_fd()).or_else(|_| fd.try_clone_to_owned())?;
            fds.push(own);
        }
        let mut out = DevThreads {
            threads: Vec::new(),
        };
        for (i, fd) in fds.into_iter().enumerate() {
            let handler = Arc::clone(&handler);
            let fd = Arc::new(fd);
            let t = std::thread::Builder::new()
                .name(format!("fuse-dev-{i}"))
                .spawn(move || serve(&fd, buf_size, setxattr_ext, &*handler))?;
            out.threads.push(t);
        }
        Ok(out)
    }

    /// Waits for every thread; the first error any of them met.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a /dev/fuse thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// A descriptor of its own for the connection of `session`.
fn clone_fd(session: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: a plain open of a path; the result is checked.
    let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let id = session as u32;
    // SAFETY: the ioctl reads one u32 from a live local.
    if unsafe { libc::ioctl(fd.as_raw_fd(), DEV_IOC_CLONE, &id) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// One thread's loop: read a request, serve it, until the connection ends.
fn serve(
    fd: &Arc<OwnedFd>,
    buf_size: usize,
    setxattr_ext: bool,
    handler: &dyn DevHandler,
) -> io::Result<()> {
    let mut buf = vec![0u8; buf_size.max(REQUEST_ROOM)];
    loop {
        // SAFETY: reads into a buffer we own, at most its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Interrupted, or the request was taken back meanwhile.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                // Unmounted: the connection is over.
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            }
        }
        let Some(req) = split(&buf[..n as usize], setxattr_ext) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a /dev/fuse request of {n} bytes is shorter than its header says"),
            ));
        };
        let h = req.header;
        // Forgets want no answer.
        match h.opcode {
            FORGET => {
                handler.forget(h.nodeid, req.arg.u64(0));
                continue;
            }
            BATCH_FORGET => {
                let count = req.arg.u32(0) as usize;
                let items = req.arg.0.get(8..).unwrap_or_default();
                for one in items.chunks_exact(16).take(count) {
                    let one = Args(one);
                    handler.forget(one.u64(0), one.u64(8));
                }
                continue;
            }
            _ => {}
        }
        let answer = DevAnswer {
            fd: Arc::clone(fd),
            unique: h.unique,
            answered: false,
        };
        match h.opcode {
            // Interrupts are not served (as with `fuser`); the request
            // they name runs to its end.
            INTERRUPT => answer.error(libc::ENOSYS),
            // Negotiated once, before this loop started.
            INIT => answer.error(libc::EPROTO),
            opcode::DESTROY => {
                answer.reply(&[]);
                return Ok(());
            }
            _ => handler.handle(req, answer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: u32, body: &[u8]) -> Vec<u8> {
        let h = InHeader {
            len: (IN_HEADER_LEN + body.len()) as u32,
            opcode: op,
            unique: 9,
            nodeid: 1,
            ..InHeader::default()
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn names_and_data_are_split_from_the_fixed_argument() {
        let mut body = vec![7u8; 40];
        body.extend_from_slice(b"data");
        let b = request(opcode::WRITE, &body);
        let r = split(&b, false).unwrap();
        assert_eq!((r.arg.0.len(), r.payload), (40, &b"data"[..]));

        let b = request(opcode::LOOKUP, b"name\0");
        let r = split(&b, false).unwrap();
        assert_eq!((r.arg.0.len(), r.payload), (0, &b"name\0"[..]));

        let b = request(opcode::GETATTR, &[1u8; 16]);
        let r = split(&b, false).unwrap();
        assert_eq!((r.arg.0.len(), r.payload.len()), (16, 0));
    }

    #[test]
    fn setxattr_argument_length_follows_the_agreement() {
        let mut body = vec![0u8; 16];
        body.extend_from_slice(b"user.a\0v");
        let b = request(opcode::SETXATTR, &body);
        assert_eq!(split(&b, true).unwrap().arg.0.len(), 16);
        assert_eq!(split(&b, false).unwrap().arg.0.len(), 8);
    }

    /// What `answer` writes, read back through a pipe.
    fn written(answer: impl FnOnce(DevAnswer)) -> Vec<u8> {
        let mut ends = [0; 2];
        // SAFETY: `ends` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: both were just made and are owned here alone.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        answer(DevAnswer {
            fd: Arc::new(w),
            unique: 77,
            answered: false,
        });
        let mut buf = vec![0u8; 4096];
        // SAFETY: reads into a buffer owned here, at most its length.
        let n = unsafe { libc::read(r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(n.max(0) as usize);
        buf
    }

    #[test]
    fn answers_carry_header_parts_and_errors() {
        let parts: [&[u8]; 5] = [b"ab", b"", b"cde", b"f", b"gh"];
        let b = written(|a| a.reply(&parts));
        let h = Args(&b);
        assert_eq!((h.u32(0), h.u32(4), h.u64(8)), (24, 0, 77));
        assert_eq!(&b[16..], b"abcdefgh");
        let b = written(|a| a.error(libc::ENOENT));
        assert_eq!(
            (Args(&b).u32(0), Args(&b).u32(4) as i32),
            (16, -libc::ENOENT)
        );
        // Dropped unanswered: EIO, so the caller does not wait for ever.
        let b = written(drop);
        assert_eq!(Args(&b).u32(4) as i32, -libc::EIO);
    }

    #[test]
    fn short_requests_are_refused_not_read_past() {
        assert!(split(&[0u8; 10], false).is_none());
        // A body shorter than its fixed argument gives what is there.
        let b = request(opcode::WRITE, &[1u8; 8]);
        let r = split(&b, false).unwrap();
        assert_eq!((r.arg.0.len(), r.payload.len()), (8, 0));
        // Extensions longer than the body.
        let mut b = request(opcode::GETATTR, &[0u8; 8]);
        b[36] = 4;
        assert!(split(&b, false).is_none());
    }
}

//! Serving the mount through `/dev/fuse` (`fuse_ring::dev`): every request
//! when the kernel offers no io_uring, and FORGET, INTERRUPT and DESTROY
//! beside the rings. Requests are decoded in `wire.rs`, as the ring's are,
//! so both ways answer the same (statx with the birth time, the ACL
//! set-group-ID kill), which `fuser`'s own loop could not.

use super::FuseFs;
use super::wire::{Access, Decoded, Wire, WireReply, allowed, has_payload};
use fuse_ring::dev::{DevAnswer, DevHandler, DevThreads};
use fuse_ring::ring::Request;
use fuser::INodeNo;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

struct DevServer {
    fs: FuseFs,
    access: Access,
}

impl DevHandler for DevServer {
    fn handle(&self, req: Request<'_>, answer: DevAnswer) {
        let h = req.header;
        if !allowed(&self.access, h.opcode, h.uid) {
            return answer.error(libc::EACCES);
        }
        // The thread's buffer is not read again before this returns, and a
        // write answered later copies its data first: answers go at once.
        if has_payload(h.opcode) {
            self.fs.serve_named(&req, WireReply::new(answer));
        } else {
            self.fs
                .serve_fixed(Decoded::of(&req), WireReply::new(answer));
        }
    }

    fn forget(&self, nodeid: u64, nlookup: u64) {
        self.fs.on_forget(INodeNo(nodeid), nlookup);
    }
}

impl Wire for DevAnswer {
    fn send(self, parts: &[&[u8]]) {
        self.reply(parts);
    }
    fn fail(self, errno: i32) {
        self.error(errno);
    }
}

impl FuseFs {
    /// Starts `threads` threads serving the session `fd` (negotiated
    /// already) from `/dev/fuse`. They end when the connection does; then
    /// [`FuseFs::end_session`].
    pub(crate) fn serve_dev(
        &self,
        fd: BorrowedFd<'_>,
        threads: usize,
        access: Access,
    ) -> std::io::Result<DevThreads> {
        let server = Arc::new(DevServer {
            fs: self.clone(),
            access,
        });
        let room = super::MAX_WRITE as usize + fuse_ring::dev::REQUEST_ROOM;
        let ext = self
            .agreed
            .setxattr_ext
            .load(std::sync::atomic::Ordering::Relaxed);
        DevThreads::start(fd, threads, room, ext, server)
    }
}

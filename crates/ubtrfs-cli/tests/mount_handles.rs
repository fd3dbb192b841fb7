//! File handles (`name_to_handle_at`, `open_by_handle_at`, what an NFS
//! export uses) on the read-write FUSE mount, against the kernel's btrfs
//! (fstests' generic/426, 467 and 477 found them missing): handles of a
//! directory, a subdirectory and a file still open them after the kernel
//! dropped its caches, and the handle of a deleted file is stale, on the
//! kernel's mount and on `ubtrfs mount` alike.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3 and
//! python3.

mod common;

use common::check_image;
use common::steps::{Step, Who, against_kernel};
use testkit::*;

/// Takes handles, deletes one file, drops the caches, opens each handle.
const HANDLES: &str = r#"python3 - <<'EOF'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class FH(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
def handle(path):
    h = FH(); h.bytes = 128; mid = ctypes.c_int()
    if libc.name_to_handle_at(-100, path.encode(), ctypes.byref(h), ctypes.byref(mid), 0) != 0:
        raise OSError(ctypes.get_errno(), "name_to_handle_at " + path)
    return h
def open_h(mfd, h, flags=os.O_RDONLY):
    fd = libc.open_by_handle_at(mfd, ctypes.byref(h), flags)
    if fd < 0:
        e = ctypes.get_errno(); return "error " + os.strerror(e)
    return fd
def drop():
    os.sync(); open("/proc/sys/vm/drop_caches", "w").write("3\n")
mfd = os.open(".", os.O_RDONLY)
os.makedirs("hd/sub", exist_ok=True)
open("hd/sub/kept", "w").write("kept data\n")
open("hd/gone", "w").write("x")
hs = {n: handle(n) for n in ["hd", "hd/sub", "hd/sub/kept", "hd/gone"]}
os.unlink("hd/gone")
drop()
for n, h in hs.items():
    fd = open_h(mfd, h)
    if isinstance(fd, str):
        print(n, fd); continue
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        print(n, "dir", sorted(os.listdir(fd)))
    else:
        print(n, "file", os.read(fd, 100))
    os.close(fd)
EOF
"#;

#[test]
fn file_handles_outlive_the_kernels_caches() {
    require_privileged!();
    assert!(which("python3").is_some(), "python3 not found");
    let t = TestDir::new("mount-handles").unwrap();
    let steps = [Step {
        who: Who::Root,
        ok: true,
        script: HANDLES,
        err: "",
    }];
    let c = against_kernel(&t, &steps, "", &["-o", "commit=300"]);
    assert!(
        c.printed[0].contains("hd/sub/kept file b'kept data\\n'"),
        "{}",
        c.printed[0]
    );
    check_image(&c.ubtrfs_img);
}

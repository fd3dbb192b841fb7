//! Immutable and append-only files and directories (`chattr +i`, `+a`) on
//! the read-write FUSE mount, against the kernel's btrfs. The FUSE kernel
//! leaves these checks to the filesystem, so the mount makes them; the
//! same steps run on a kernel loop mount and on `ubtrfs mount`, and each
//! must succeed or be refused (EPERM) alike and print the same:
//!
//! - an immutable file takes no write, truncate, chmod, times, xattr,
//!   link, rename or unlink;
//! - an append-only file takes appends (through `O_APPEND`) and times,
//!   nothing else; a write open without `O_APPEND` is refused;
//! - an immutable directory takes no new name and gives none, an
//!   append-only one takes new names and gives none;
//! - only a caller with `CAP_LINUX_IMMUTABLE` sets or clears the flags
//!   (the kernel checks that, from what the mount reports);
//! - cleared, everything goes again; the image then passes `btrfs check`
//!   and the kernel reads the flags ubtrfs wrote.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3,
//! util-linux (`setpriv`), e2fsprogs (`chattr`, `lsattr`), xfsprogs
//! (`xfs_io`, whose chattr sets the flags through `FS_IOC_FSSETXATTR`)
//! and attr.

mod common;

use common::check_image;
use common::steps::{Step, Who, against_kernel, kernel_reads_the_same, run_step};
use std::path::Path;
use testkit::*;

const EPERM: &str = "Operation not permitted";
const EINVAL: &str = "Invalid argument";

const fn root(ok: bool, script: &'static str) -> Step {
    Step {
        who: Who::Root,
        ok,
        script,
        err: EPERM,
    }
}

const fn user(ok: bool, script: &'static str) -> Step {
    Step {
        who: Who::User,
        ok,
        script,
        err: EPERM,
    }
}

/// A step by root that fails with EINVAL.
const fn einval(script: &'static str) -> Step {
    Step {
        who: Who::Root,
        ok: false,
        script,
        err: EINVAL,
    }
}

/// A step by root that fails with EOPNOTSUPP.
const fn unsupported(script: &'static str) -> Step {
    Step {
        who: Who::Root,
        ok: false,
        script,
        err: "Operation not supported",
    }
}

/// The flags of everything left, as `lsattr` shows them.
const SHOW_ALL: &str = "lsattr -d keep-i keep-a keep-d && cat keep-a && ls keep-d";

const STEPS: &[Step] = &[
    root(
        true,
        "echo a > f && echo a > g && mkdir d e && touch d/x e/x \
         && chattr +i f d && chattr +a g e && lsattr -d f g d e",
    ),
    // Immutable file.
    root(false, "echo b >> f"),
    root(false, "echo b > f"),
    root(false, "printf X | dd of=f bs=1 conv=notrunc status=none"),
    root(false, "truncate -s 0 f"),
    root(false, "chmod 600 f"),
    root(false, "chown 1000 f"),
    root(false, "touch f"),
    root(false, "touch -d @1000000000 f"),
    root(false, "setfattr -n user.x -v 1 f"),
    root(false, "ln f f-link"),
    root(false, "mv f f-moved"),
    root(false, "rm f"),
    root(false, "echo z > other && mv other f"),
    root(true, "cat f && stat -c '%s %a %h' f && rm other"),
    // Append-only file.
    root(true, "echo b >> g && cat g"),
    root(false, "echo c > g"),
    root(false, "printf X | dd of=g bs=1 conv=notrunc status=none"),
    root(false, "truncate -s 1 g"),
    root(false, "fallocate -p -o 0 -l 1 g"),
    root(true, "touch g"),
    root(false, "chmod 600 g"),
    root(false, "setfattr -n user.x -v 1 g"),
    root(false, "ln g g-link"),
    root(false, "mv g g-moved"),
    root(false, "rm g"),
    root(
        true,
        "python3 -c \"import os; fd = os.open('g', os.O_WRONLY | os.O_APPEND); \
         os.write(fd, b'c\\n'); os.close(fd)\" && cat g && stat -c %s g",
    ),
    root(false, "touch -d @1000000000 g"),
    root(false, "touch -m -d @1000000000 g"),
    // utimensat(now, omit) and (omit, now): times given, though "now".
    root(false, "touch -a g"),
    root(false, "touch -m g"),
    // utimensat(now, an explicit modification time): refused too.
    root(
        false,
        "python3 -c \"import ctypes, os\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
ts = (ctypes.c_long * 4)(0, (1 << 30) - 1, 1000000000, 0)\n\
if libc.utimensat(-100, b'g', ts, 0):\n\
\traise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\"",
    ),
    root(true, "touch g && stat -c %s g"),
    // Dropping O_APPEND (refused by the kernel at fcntl, by the mount at
    // the write), a shared writable mapping (refused by the kernel at
    // mmap; FUSE maps it, and the mount refuses its writes: msync fails,
    // and the pages are dropped). A later append that writes the same
    // page must not take the mapping's change with it.
    root(
        false,
        "python3 -c \"import os, fcntl\n\
fd = os.open('g', os.O_WRONLY | os.O_APPEND)\n\
fcntl.fcntl(fd, fcntl.F_SETFL, 0)\n\
os.pwrite(fd, b'XX', 0)\"",
    ),
    root(
        true,
        "python3 -c \"import os, mmap\n\
fd = os.open('g', os.O_RDWR | os.O_APPEND)\n\
try:\n\tm = mmap.mmap(fd, 2, mmap.MAP_SHARED, mmap.PROT_WRITE)\n\
\tm[0:2] = b'XX'; m.flush(); print('written')\n\
except OSError:\n\tprint('refused')\" && printf 'd\\n' >> g && sync && echo 3 > /proc/sys/vm/drop_caches \
         && cat g",
    ),
    root(
        false,
        "python3 -c \"import os; os.truncate('g', os.stat('g').st_size)\"",
    ),
    root(
        false,
        "python3 -c \"import os; os.truncate('f', os.stat('f').st_size)\"",
    ),
    // Appends whose pages the writeback cache may send in any order.
    root(
        true,
        "printf x > big && chattr +a big && python3 -c \"import os\n\
fd = os.open('big', os.O_WRONLY | os.O_APPEND)\n\
for i in range(24): os.write(fd, bytes([i % 251 + 1]) * (1 << 20))\n\
os.fsync(fd); os.close(fd)\" && sync && echo 3 > /proc/sys/vm/drop_caches \
         && sha256sum big && stat -c %s big",
    ),
    // A file open to append before it became append-only appends, its
    // pages sent back in any order.
    root(
        true,
        "printf x > pre && python3 -c \"import os, subprocess\n\
fd = os.open('pre', os.O_WRONLY | os.O_APPEND)\n\
subprocess.run(['chattr', '+a', 'pre'], check=True)\n\
for i in range(32): os.write(fd, bytes([i + 1]) * (1 << 20))\n\
os.fsync(fd); os.close(fd)\" && echo 3 > /proc/sys/vm/drop_caches \
         && sha256sum pre && stat -c %s pre && chattr -a pre && rm pre",
    ),
    // A file open for writing before it became immutable still takes
    // writes, as in the kernel.
    root(
        true,
        "printf 12345 > early && python3 -c \"import os, subprocess\n\
fd = os.open('early', os.O_WRONLY)\n\
subprocess.run(['chattr', '+i', 'early'], check=True)\n\
os.pwrite(fd, b'ab', 1); os.write(fd, b'Z'); os.close(fd)\" && cat early && lsattr early",
    ),
    // So does ftruncate through it; never through one of an append-only
    // file.
    root(
        true,
        "printf 12345678 > early2 && python3 -c \"import os, subprocess\n\
fd = os.open('early2', os.O_WRONLY)\n\
subprocess.run(['chattr', '+i', 'early2'], check=True)\n\
os.ftruncate(fd, 3); os.ftruncate(fd, 6); os.close(fd)\" && od -c early2 && lsattr early2 \
         && chattr -i early2 && rm early2",
    ),
    root(
        false,
        "printf abc > ap && chattr +a ap && python3 -c \"import os\n\
fd = os.open('ap', os.O_WRONLY | os.O_APPEND)\n\
os.ftruncate(fd, 1)\"",
    ),
    root(true, "chattr -a ap && cat ap && rm ap"),
    // Another user's append drops set-user-ID, append-only or not.
    root(true, "printf s > suid && chmod 4777 suid && chattr +a suid"),
    user(true, "echo more >> suid"),
    root(
        true,
        "stat -c %a suid && cat suid && chattr -a suid big && chattr -i early && rm suid early big",
    ),
    // Immutable and append-only directories.
    root(false, "touch d/new"),
    root(false, "mkdir d/sub"),
    root(false, "rm d/x"),
    root(false, "mv d/x d/y"),
    root(false, "mv d d-moved"),
    root(true, "touch e/new && mkdir e/sub && ln -s x e/sl && ls e"),
    root(false, "rm e/x"),
    root(false, "rmdir e/sub"),
    root(false, "mv e/x e/y"),
    root(false, "mv e/x x-out"),
    root(true, "echo q > q && mv q e/q && ls e"),
    root(false, "echo r > r && mv r e/x"),
    // Only CAP_LINUX_IMMUTABLE sets or clears the flags; the owner sets
    // the others.
    root(true, "rm r && touch mine && chown 1000:2000 mine"),
    user(false, "chattr +i mine"),
    user(false, "chattr +a mine"),
    user(true, "chattr +A mine && lsattr mine"),
    root(true, "chattr +i mine && lsattr mine"),
    user(false, "chattr -i mine"),
    // The same flags through FS_IOC_FSSETXATTR (`xfs_io chattr`), which
    // takes no extent size hint, project id or other flag on btrfs.
    root(
        true,
        "touch xf && chown 1000:2000 xf \
         && xfs_io -r -c 'chattr +A' -c 'chattr +d' -c 'lsattr -v' xf && lsattr xf",
    ),
    user(true, "xfs_io -r -c 'chattr -d' xf && lsattr xf"),
    user(false, "xfs_io -r -c 'chattr +i' xf"),
    root(
        true,
        "xfs_io -r -c 'chattr +i' -c 'chattr +a' -c 'lsattr -v' xf && lsattr xf \
         && xfs_io -r -c 'chattr -i' -c 'chattr -a' xf && lsattr xf",
    ),
    unsupported("xfs_io -r -c 'chattr +x' xf"),
    unsupported(
        "python3 -c \"import fcntl, os, struct\n\
fd = os.open('xf', os.O_RDONLY)\n\
fcntl.ioctl(fd, 0x401c5820, struct.pack('<5I8x', 0, 65536, 0, 0, 0))\"",
    ),
    root(true, "xfs_io -r -c 'lsattr -v' xf && rm xf"),
    // Synchronous writes (S, xfs_io's s) and directory updates (D, which
    // btrfs keeps and does not act on).
    root(
        true,
        "touch sf && mkdir sd && chattr +S sf && chattr +D sd && lsattr sf && lsattr -d sd \
         && xfs_io -r -c 'chattr -s' -c 'lsattr -v' sf && xfs_io -r -c 'chattr +s' -c 'lsattr -v' sf \
         && echo data > sf && echo more >> sf && cat sf && touch sd/new && ls sd && lsattr sd/new \
         && rm -r sf sd",
    ),
    // A synchronous file opened for reading and writing maps shared.
    root(
        true,
        "printf abcdef > sm && chattr +S sm && python3 -c \"import os, mmap\n\
fd = os.open('sm', os.O_RDWR)\n\
m = mmap.mmap(fd, 4, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)\n\
m[1:3] = b'XY'; m.flush(); m.close(); os.close(fd)\" && sync \
         && echo 3 > /proc/sys/vm/drop_caches && cat sm && echo && rm sm",
    ),
    // Cleared, everything goes again.
    root(
        true,
        "chattr -i f d mine && chattr -a g e && echo new > f && rm g d/x e/x mine \
         && rm -r e d && cat f && ls",
    ),
    // What the kernel must read back.
    root(
        true,
        "echo i > keep-i && echo a > keep-a && mkdir keep-d && touch keep-d/in \
         && chattr +i keep-i && chattr +a keep-a keep-d",
    ),
    root(true, SHOW_ALL),
];

/// Run `script` with `sh -c` in `dir` as `who`; returns whether it
/// succeeded, and its stdout and stderr.
#[test]
fn immutable_and_append_only_work_as_in_the_kernel() {
    require_privileged!();
    for tool in [
        "setpriv",
        "chattr",
        "lsattr",
        "setfattr",
        "fallocate",
        "xfs_io",
    ] {
        assert!(which(tool).is_some(), "{tool} not found");
    }
    let t = TestDir::new("mount-flags").unwrap();
    let c = against_kernel(&t, STEPS, "", &["-o", "allow_other", "-o", "commit=300"]);
    let (ubtrfs_img, got) = (c.ubtrfs_img, c.printed);

    // What ubtrfs wrote is what the kernel reads.
    check_image(&ubtrfs_img);
    kernel_reads_the_same(&t, &ubtrfs_img, SHOW_ALL, &got);
}

/// The compression property (`btrfs.compression`), as `btrfs property
/// set` and `setfattr` make it, and `chattr +c`, which brings it.
const PROP_STEPS: &[Step] = &[
    root(
        true,
        "mkdir pd && setfattr -n btrfs.compression -v zstd pd && touch pd/f && mkdir pd/sub \
         && ln -s x pd/sl && mkfifo pd/fifo \
         && getfattr -h -d -m btrfs pd/f pd/sub pd/sl pd/fifo && lsattr -d pd pd/f pd/sub",
    ),
    root(
        true,
        "touch g && for v in zstd:3 lzo none no ''; do setfattr -n btrfs.compression -v \"$v\" g \
         && getfattr -h --only-values -n btrfs.compression g; echo; lsattr g; done",
    ),
    einval("setfattr -n btrfs.compression -v bogus g"),
    einval("setfattr -n btrfs.compression -v ZSTD g"),
    einval("setfattr -n btrfs.bogus -v 1 g"),
    einval("touch nc && chattr +C nc && setfattr -n btrfs.compression -v zlib nc"),
    root(
        true,
        "setfattr -n btrfs.compression -v zlib g && setfattr -x btrfs.compression g && lsattr g \
         && getfattr -h -d -m btrfs g",
    ),
    // chattr +c names the mount's algorithm (zlib without one), +m and -c
    // take the property away.
    root(
        true,
        "touch a b c && chattr +c a && chattr +m b && setfattr -n btrfs.compression -v zstd c \
         && chattr -c c && getfattr -h -d -m btrfs a b c; lsattr a b c",
    ),
    root(
        true,
        "setfattr -n btrfs.compression -v lzo c && chattr +A c \
         && getfattr -h -d -m btrfs c && lsattr c",
    ),
    // Symbolic links take it and keep nothing; a no-COW file may lose
    // what it does not have.
    root(
        true,
        "setfattr -h -n btrfs.compression -v zstd pd/sl && getfattr -h -d -m btrfs pd/sl; \
         setfattr -n btrfs.compression -v '' nc && lsattr nc",
    ),
    Step {
        who: Who::Root,
        ok: false,
        script: "setfattr -x btrfs.compression nc",
        err: "No such attribute",
    },
    Step {
        who: Who::Root,
        ok: false,
        script: "python3 -c \"import os; os.setxattr('g', 'btrfs.compression', b'', os.XATTR_REPLACE)\"",
        err: "No data available",
    },
    einval("touch m && chattr +m m && chattr +C m"),
    // Inherited as the algorithm's name; "none" as the flag only; by a
    // new subvolume too.
    root(
        true,
        "mkdir z5 nn && setfattr -n btrfs.compression -v zstd:5 z5 \
         && setfattr -n btrfs.compression -v none nn && touch z5/f nn/f \
         && $BTRFS subvolume create z5/sv > /dev/null && setfattr -n btrfs.compression -v lzo . \
         && $BTRFS subvolume create nn/sv > /dev/null && setfattr -x btrfs.compression . \
         && getfattr -h -d -m btrfs z5/f nn/f z5/sv nn/sv; lsattr z5/f nn/f \
         && lsattr -d z5/sv nn/sv",
    ),
    // Written data is compressed as the property says.
    root(
        true,
        "yes 'the same line again' | head -c 2000000 > pd/f && yes 'other words' \
         | head -c 1000000 > pd/sub/g && sync && du -k --apparent-size pd/f pd/sub/g",
    ),
];

/// How many file extents of tree 5 in `img` are compressed with zstd,
/// and whether its superblock says zstd is used.
fn zstd_use(img: &Path) -> (usize, bool) {
    let tree = run_args(
        "btrfs",
        [
            "inspect-internal".as_ref(),
            "dump-tree".as_ref(),
            "-t".as_ref(),
            "5".as_ref(),
            img.as_os_str(),
        ],
    )
    .unwrap();
    let sup = run_args(
        "btrfs",
        [
            "inspect-internal".as_ref(),
            "dump-super".as_ref(),
            img.as_os_str(),
        ],
    )
    .unwrap();
    let flags = sup
        .lines()
        .find_map(|l| l.strip_prefix("incompat_flags"))
        .and_then(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    (
        tree.matches("extent compression 3 (zstd)").count(),
        flags & (1 << 4) != 0,
    )
}

#[test]
fn compression_property_works_as_in_the_kernel() {
    require_privileged!();
    for tool in ["chattr", "lsattr", "setfattr", "getfattr"] {
        assert!(which(tool).is_some(), "{tool} not found");
    }
    let t = TestDir::new("mount-prop").unwrap();
    let c = against_kernel(&t, PROP_STEPS, "", &["-o", "commit=300"]);
    let (kernel_img, ubtrfs_img) = (c.kernel_img, c.ubtrfs_img);
    check_image(&ubtrfs_img);
    let (kernel_zstd, kernel_flag) = zstd_use(&kernel_img);
    let (ours, our_flag) = zstd_use(&ubtrfs_img);
    assert!(
        kernel_zstd > 0 && kernel_flag,
        "the kernel: {kernel_zstd} {kernel_flag}"
    );
    assert!(ours > 0, "no zstd extent from the property");
    assert!(our_flag, "zstd extents, and the superblock does not say so");
    // The kernel reads back what the property made.
    let kernel = Mount::single(&ubtrfs_img, &t.join("kernel-reads"), "ro").unwrap();
    let (ok, out, err) = run_step(
        kernel.path(),
        Who::Root,
        "sha256sum pd/f pd/sub/g && getfattr -h -d -m btrfs pd/f pd/sub",
        "btrfs",
    );
    assert!(ok, "{err}");
    assert!(out.contains("btrfs.compression=\"zstd\""), "{out}");
    kernel.unmount().unwrap();
}

/// Compression choices of directories with the mount's `nodatacow`: new
/// files take the directory's flag and the mount's no-COW, not the
/// property (the kernel does not let the two meet otherwise).
const NODATACOW_STEPS: &[Step] = &[
    root(
        true,
        "mkdir d && chattr +c d && touch d/f && mkdir d/s && lsattr d/f && lsattr -d d/s \
         && getfattr -h -d -m btrfs d/f d/s; setfattr -n btrfs.compression -v zstd d \
         && touch d/g && lsattr d/g && getfattr -h -d -m btrfs d/g",
    ),
    einval("echo x > e && chattr +c e"),
    root(true, "lsattr e d/f"),
];

#[test]
fn compression_choices_under_nodatacow_as_in_the_kernel() {
    require_privileged!();
    let t = TestDir::new("mount-prop-nodatacow").unwrap();
    let c = against_kernel(
        &t,
        NODATACOW_STEPS,
        "nodatacow",
        &["-o", "commit=300,nodatacow"],
    );
    let ubtrfs_img = c.ubtrfs_img;
    check_image(&ubtrfs_img);
}

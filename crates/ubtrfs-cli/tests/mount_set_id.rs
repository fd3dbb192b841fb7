//! Set-user-ID and set-group-ID bits cleared by changes of contents on
//! the read-write FUSE mount, against the kernel's btrfs (fstests'
//! generic/683-685 found a difference): another user's write, append,
//! preallocation, hole punch, zeroing and truncate clear set-user-ID,
//! and set-group-ID when the file is group-executable or the writer is
//! outside the file's group; root's changes clear nothing. The same steps
//! run on a kernel loop mount and on `ubtrfs mount` and must print the
//! same modes.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3 and
//! util-linux (`setpriv`, `fallocate`).

mod common;

use common::check_image;
use common::steps::{Step, Who, against_kernel};
use testkit::*;

const fn step(who: Who, script: &'static str) -> Step {
    Step {
        who,
        ok: true,
        script,
        err: "",
    }
}

/// Files of every set-ID and execute mix, owned by root (group 0), and
/// the same in the other user's group (2000).
const RESET: &str = "for m in 6666 6676 6766 6777 2666 2676; do \
       printf 0123456789 > f$m && chown 0:0 f$m && chmod $m f$m; \
       printf 0123456789 > g$m && chown 0:2000 g$m && chmod $m g$m; done";
const SHOW: &str = "stat -c '%n %a' f* g*";

const STEPS: &[Step] = &[
    step(Who::Root, RESET),
    step(Who::User, "for f in f* g*; do fallocate -l 8192 $f; done"),
    step(Who::Root, SHOW),
    step(Who::Root, RESET),
    step(
        Who::User,
        "for f in f* g*; do fallocate -p -o 0 -l 4 $f; done",
    ),
    step(Who::Root, SHOW),
    step(Who::Root, RESET),
    step(
        Who::User,
        "for f in f* g*; do fallocate -z -o 0 -l 4 $f; done",
    ),
    step(Who::Root, SHOW),
    step(Who::Root, RESET),
    step(Who::User, "for f in f* g*; do printf more >> $f; done"),
    step(Who::Root, SHOW),
    step(Who::Root, RESET),
    step(
        Who::User,
        "for f in f* g*; do dd if=/dev/zero of=$f bs=1 count=2 seek=3 conv=notrunc status=none; done",
    ),
    step(Who::Root, SHOW),
    step(Who::Root, RESET),
    step(Who::User, "for f in f* g*; do truncate -s 4 $f; done"),
    step(Who::Root, SHOW),
    step(Who::Root, RESET),
    step(
        Who::Root,
        "for f in f* g*; do fallocate -l 8192 $f; printf more >> $f; done",
    ),
    step(Who::Root, SHOW),
];

#[test]
fn changes_of_contents_clear_set_id_bits_as_in_the_kernel() {
    require_privileged!();
    for tool in ["setpriv", "fallocate"] {
        assert!(which(tool).is_some(), "{tool} not found");
    }
    let t = TestDir::new("mount-set-id").unwrap();
    let c = against_kernel(&t, STEPS, "", &["-o", "allow_other", "-o", "commit=300"]);
    // The writer outside the group took set-group-ID off a file that is
    // not group-executable.
    assert!(c.printed[2].contains("f6666 666"), "{}", c.printed[2]);
    check_image(&c.ubtrfs_img);
}

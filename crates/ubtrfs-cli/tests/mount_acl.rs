//! POSIX ACLs on the read-write FUSE mount, against the kernel's btrfs:
//! the same steps (`setfacl`, `chmod`, creating files with a umask,
//! reading and writing as another user) run on a kernel loop mount and on
//! `ubtrfs mount`, and each must succeed or be refused alike and print the
//! same (`getfacl`, modes, the raw xattrs). Checked:
//!
//! - a named-user entry lets that user read a root-owned 0600 file;
//! - `chmod` moves the ACL's mask (and the kernel's cached ACL follows);
//! - a directory's default ACL is inherited by new files, directories
//!   (also as their default ACL), fifos, not symbolic links, and the
//!   umask is then ignored;
//! - without a default ACL the umask applies;
//! - an ACL that says no more than the mode is not stored;
//! - an ACL set by the owner from outside the file's group clears its
//!   set-group-ID bit;
//! - all of it over io_uring (the test script has the kernel offer it)
//!   and through `/dev/fuse` (`-o nouring`);
//! - the image then passes `btrfs check` and the kernel reads the ACLs
//!   ubtrfs wrote.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3,
//! util-linux (`setpriv`) and acl (`getfacl`, `setfacl`) and attr
//! (`getfattr`).

mod common;

use common::steps::{Step, Who, kernel_reads_the_same, run_steps};
use common::{check_image, new_image, start_mount};
use testkit::*;

/// Size of the test images (sparse).
const IMAGE_SIZE: u64 = 300 << 20;
/// What a refused step says.
const EACCES: &str = "Permission denied";

const fn root(script: &'static str) -> Step {
    Step {
        who: Who::Root,
        ok: true,
        script,
        err: EACCES,
    }
}

const fn user(ok: bool, script: &'static str) -> Step {
    Step {
        who: Who::User,
        ok,
        script,
        err: EACCES,
    }
}

/// What every file the steps make looks like: modes and raw xattrs.
const SHOW_ALL: &str = "stat -c '%n %A %a %u %g' f d d/nf d/nd d/np d/sl d/nd/deeper \
     d/nd/by-user p/f p/d p/q e d/after \
     && getfattr -h -e hex -m - -d f d d/nf d/nd d/np d/sl d/nd/deeper d/nd/by-user \
        p/f p/d p/q e d/after";

const STEPS: &[Step] = &[
    root("umask 022; printf secret > f && chmod 600 f"),
    user(false, "cat f"),
    // A named user entry grants read.
    root("setfacl -m u:1000:r f && getfacl -n f && stat -c '%A %a' f"),
    user(true, "cat f"),
    user(false, "printf x >> f"),
    // chmod moves the mask: the entry is masked out, then back.
    root("chmod 600 f && getfacl -n f"),
    user(false, "cat f"),
    root("chmod 640 f && getfacl -n f"),
    user(true, "cat f"),
    // A default ACL is inherited; the umask is ignored then.
    root("mkdir d && setfacl -d -m u:1000:rwx,g::r-x,o::--- d && getfacl -n d"),
    root(
        "umask 077; printf data > d/nf && mkdir d/nd && mkfifo d/np && ln -s nf d/sl \
         && mkdir d/nd/deeper && getfacl -n d/nf d/nd d/np d/nd/deeper \
         && stat -c '%n %A %a' d/nf d/nd d/np d/sl d/nd/deeper",
    ),
    user(
        true,
        "printf more >> d/nf && cat d/nf && umask 022 && printf y > d/nd/by-user \
         && getfacl -n d/nd/by-user",
    ),
    user(false, "printf no > d/not-mine"),
    // No default ACL: the umask applies.
    root(
        "mkdir p && umask 027 && printf z > p/f && mkdir p/d && mkfifo p/q \
         && stat -c '%n %a' p/f p/d p/q && getfattr -m - -d p/f p/d p/q",
    ),
    // An ACL the mode says all of is not stored; -b drops the entries.
    root(
        "printf e > e && setfacl -m u::rwx,g::r--,o::--- e && stat -c %a e \
         && getfattr -m - -d e && setfacl -b f && stat -c %a f && getfattr -m - -d f",
    ),
    user(false, "cat f"),
    // Without its default ACL, the directory gives the umask again.
    root("setfacl -k d && umask 022 && printf k > d/after && getfacl -n d d/after"),
    // The owner is not in the group (3000): setting an ACL clears
    // set-group-ID; root's chmod sets it again and root keeps it.
    root("printf s > sg && chown 1000:3000 sg && chmod 2770 sg && stat -c '%A %a' sg"),
    user(true, "setfacl -m u:1000:rwx sg && stat -c '%A %a' sg"),
    root("chmod 2770 sg && setfacl -m u:1000:rwx sg && stat -c '%A %a' sg && getfacl -n sg"),
    root(SHOW_ALL),
];

#[test]
fn acls_work_as_in_the_kernel() {
    require_privileged!();
    for tool in ["setpriv", "setfacl", "getfacl", "getfattr"] {
        assert!(which(tool).is_some(), "{tool} not found");
    }
    let t = TestDir::new("mount-acl").unwrap();
    let kernel_img = new_image(&t, "kernel.img", IMAGE_SIZE);
    let ubtrfs_img = new_image(&t, "ubtrfs.img", IMAGE_SIZE);

    let kernel = Mount::single(&kernel_img, &t.join("kernel"), "").unwrap();
    let expected = run_steps("kernel btrfs", kernel.path(), STEPS, "btrfs");
    kernel.unmount().unwrap();

    // Over io_uring (where the kernel offers it) and through /dev/fuse:
    // both answer the same, set-group-ID kill included.
    let mut got = Vec::new();
    for (how, extra) in [("default", None), ("nouring", Some("nouring"))] {
        let img = if extra.is_some() {
            new_image(&t, "ubtrfs-dev.img", IMAGE_SIZE)
        } else {
            ubtrfs_img.clone()
        };
        let mut args = vec!["-o", "allow_other", "-o", "commit=300"];
        if let Some(o) = extra {
            args.extend(["-o", o]);
        }
        let m = start_mount(&img, &t.join(format!("fuse-{how}")), &args);
        got = run_steps("ubtrfs", m.path(), STEPS, common::ubtrfs_bin());
        m.unmount().unwrap();
        for (e, g) in expected.iter().zip(&got) {
            assert_eq!(g, e, "ubtrfs ({how}) printed otherwise than the kernel");
        }
        if extra.is_some() {
            check_image(&img);
        }
    }

    // What ubtrfs wrote is what the kernel reads.
    check_image(&ubtrfs_img);
    kernel_reads_the_same(&t, &ubtrfs_img, SHOW_ALL, &got);
}

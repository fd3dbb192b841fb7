//! Access times and inodes kept by open directories on the read-write
//! FUSE mount, against the kernel's btrfs (fstests' generic/003 and
//! generic/035 found these). The FUSE kernel never moves access times
//! itself, so the mount does, as the kernel's `relatime` (the default),
//! `strictatime` and `noatime` say, and as the no-atime flag
//! (`chattr +A`) says; the same steps run on a kernel loop mount and on
//! `ubtrfs mount` and must print the same:
//!
//! - a read moves a file's access time when it is not after its last
//!   modification (relatime), every time (strictatime), or never
//!   (noatime, or the file's +A flag); a listing does the same to a
//!   directory's; a write does not;
//! - a directory removed (rmdir, or replaced by rename) while open keeps
//!   its inode for the open descriptor, with no links;
//! - chattr moves a directory's change time;
//! - a listing ends while the program renames each entry it lists (each
//!   rename gives the name a new, higher index: fstests' generic/736),
//!   and shows only the entries there were when it began.
//!
//! Needs root, loop devices, the btrfs module, btrfs-progs, fuse3,
//! e2fsprogs (`chattr`) and python3.

mod common;

use common::check_image;
use common::steps::{Step, Who, against_kernel};
use testkit::*;

const fn root(script: &'static str) -> Step {
    Step {
        who: Who::Root,
        ok: true,
        script,
        err: "",
    }
}

/// A script that runs `$cmd` and says whether the access time of
/// `$target` moved.
macro_rules! atime_after {
    ($target:literal, $cmd:literal) => {
        concat!(
            "a=$(stat -c %x ",
            $target,
            "); sleep 0.05; ",
            $cmd,
            " >/dev/null; b=$(stat -c %x ",
            $target,
            "); [ \"$a\" = \"$b\" ] && echo ",
            $target,
            " atime same || echo ",
            $target,
            " atime moved"
        )
    };
}

const SETUP: &str = "echo hi > f && mkdir d d2 d3 e && touch d/x && sleep 0.05";

const RELATIME_STEPS: &[Step] = &[
    root(SETUP),
    root(atime_after!("f", "cat f")),
    root(atime_after!("f", "cat f")),
    root(atime_after!("d", "ls d")),
    root(atime_after!("d", "ls d")),
    root(concat!("touch -m f && ", atime_after!("f", "cat f"))),
    root(concat!(
        "chattr +A f && touch -m f && ",
        atime_after!("f", "cat f"),
        " && chattr -A f"
    )),
    root(concat!(
        "touch -m f && ",
        atime_after!("f", "sh -c 'echo more >> f'")
    )),
    root(concat!("touch -m f && ", atime_after!("f", "cat f"))),
    // Directories removed while open (generic/035).
    root(
        "rm d/x && python3 -c \"
import os
fd = os.open('d2', os.O_RDONLY)
os.rename('d3', 'd2')
print('replaced: links', os.fstat(fd).st_nlink)
os.close(fd)
fd = os.open('d', os.O_RDONLY)
os.rmdir('d')
st = os.fstat(fd)
print('removed: links', st.st_nlink, 'size', st.st_size)
try:
    print('listed', os.listdir(fd))
except OSError as e:
    print('listing:', e.strerror)
os.close(fd)
\" && ls",
    ),
    root(
        "c1=$(stat -c %z e); sleep 0.05; chattr +A e; chattr -A e; c2=$(stat -c %z e); \
         [ \"$c1\" = \"$c2\" ] && echo e ctime same || echo e ctime moved",
    ),
];

const STRICTATIME_STEPS: &[Step] = &[
    root(SETUP),
    root(atime_after!("f", "cat f")),
    root(atime_after!("f", "cat f")),
    root(atime_after!("d", "ls d")),
    root(atime_after!("d", "ls d")),
];

const NOATIME_STEPS: &[Step] = &[
    root(SETUP),
    root(atime_after!("f", "cat f")),
    root(atime_after!("d", "ls d")),
];

const NODIRATIME_STEPS: &[Step] = &[
    root(SETUP),
    root(atime_after!("f", "cat f")),
    root(atime_after!("d", "ls d")),
];

#[test]
fn access_times_move_as_in_the_kernel() {
    require_privileged!();
    for tool in ["chattr", "python3"] {
        assert!(which(tool).is_some(), "{tool} not found");
    }
    let t = TestDir::new("mount-times").unwrap();
    let c = against_kernel(&t, RELATIME_STEPS, "", &["-o", "commit=300"]);
    check_image(&c.ubtrfs_img);
    for (name, steps, options) in [
        ("strictatime", STRICTATIME_STEPS, "strictatime"),
        ("noatime", NOATIME_STEPS, "noatime"),
        ("nodiratime", NODIRATIME_STEPS, "nodiratime"),
    ] {
        let t = TestDir::new(&format!("mount-times-{name}")).unwrap();
        let c = against_kernel(&t, steps, options, &["-o", options]);
        check_image(&c.ubtrfs_img);
    }
}

/// Lists a directory of 3000 files, renaming each entry away and back as
/// it comes (a listing that followed the new indexes would never end),
/// and creating one more file half way.
const RENAME_WHILE_LISTING: &str = r#"python3 - <<'EOF'
import os
os.mkdir('many')
for i in range(3000):
    open(f'many/{i}', 'w').close()
seen = 0
with os.scandir('many') as it:
    for e in it:
        seen += 1
        if seen > 9000:
            break
        os.rename(f'many/{e.name}', 'many/TEMP')
        os.rename('many/TEMP', f'many/{e.name}')
        if seen == 1500:
            open('many/later', 'w').close()
print('listed', min(seen, 9000), 'now', len(os.listdir('many')))
EOF
"#;

#[test]
fn a_listing_ends_while_its_entries_are_renamed() {
    require_privileged!();
    assert!(which("python3").is_some(), "python3 not found");
    let t = TestDir::new("mount-times-rename-listing").unwrap();
    let c = against_kernel(&t, &[root(RENAME_WHILE_LISTING)], "", &["-o", "commit=300"]);
    assert!(
        c.printed[0].contains("listed 3000 now 3001"),
        "{}",
        c.printed[0]
    );
    check_image(&c.ubtrfs_img);
}

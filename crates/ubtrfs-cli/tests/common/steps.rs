//! Shell steps run alike on a kernel btrfs mount and on a ubtrfs mount:
//! each must succeed or fail as it says, and what each prints is compared
//! between the two.

use std::path::Path;
use std::process::{Command, Stdio};

/// The other user and group the user steps run as.
pub const USER: (u32, u32) = (1000, 2000);

/// Who runs a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Root,
    /// [`USER`], without supplementary groups.
    User,
}

/// One step: who runs the script, whether it must succeed, and what its
/// failure says.
pub struct Step {
    pub who: Who,
    pub ok: bool,
    pub script: &'static str,
    pub err: &'static str,
}

/// Run `script` with `sh -c` in `dir` as `who`, with `$BTRFS` the command
/// that makes subvolumes there; returns whether it succeeded, and its
/// stdout and stderr.
pub fn run_step(dir: &Path, who: Who, script: &str, btrfs: &str) -> (bool, String, String) {
    let mut cmd = match who {
        Who::Root => Command::new("sh"),
        Who::User => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", USER.0))
                .arg(format!("--regid={}", USER.1))
                .arg("--clear-groups")
                .arg("sh");
            c
        }
    };
    let out = cmd
        .args(["-c", script])
        .env("BTRFS", btrfs)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Run every step of `steps` in `dir` (`what` names the target in
/// messages), asserting each succeeds or fails as it must; returns what
/// each printed.
pub fn run_steps(what: &str, dir: &Path, steps: &[Step], btrfs: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let (ok, out, err) = run_step(dir, s.who, s.script, btrfs);
        assert_eq!(
            ok,
            s.ok,
            "{what}: step {i} ({:?}: {}) {}:\n{out}{err}",
            s.who,
            s.script,
            if ok { "succeeded" } else { "failed" }
        );
        if !ok {
            assert!(
                err.contains(s.err),
                "{what}: step {i} ({}) failed for another reason: {err}",
                s.script
            );
        }
        seen.push(format!("step {i} ({}):\n{out}", s.script));
    }
    seen
}

/// Images and what their steps printed, from [`against_kernel`].
pub struct Compared {
    pub kernel_img: std::path::PathBuf,
    pub ubtrfs_img: std::path::PathBuf,
    /// What each step printed on the ubtrfs mount (the kernel's too).
    pub printed: Vec<String>,
}

/// Run `steps` on a new kernel btrfs image mounted with `kernel_options`,
/// then on a new image under `ubtrfs mount` with `ubtrfs_args` (root of
/// each mount opened to every user), asserting that every step prints on
/// ubtrfs what it printed on the kernel. Both images are unmounted after.
pub fn against_kernel(
    t: &testkit::TestDir,
    steps: &[Step],
    kernel_options: &str,
    ubtrfs_args: &[&str],
) -> Compared {
    use std::os::unix::fs::PermissionsExt;
    const IMAGE_SIZE: u64 = 300 << 20;
    let open_to_all =
        |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    let kernel_img = super::new_image(t, "kernel.img", IMAGE_SIZE);
    let ubtrfs_img = super::new_image(t, "ubtrfs.img", IMAGE_SIZE);
    let kernel = testkit::Mount::single(&kernel_img, &t.join("kernel"), kernel_options).unwrap();
    open_to_all(kernel.path());
    let expected = run_steps("kernel btrfs", kernel.path(), steps, "btrfs");
    kernel.unmount().unwrap();
    let m = super::start_mount(&ubtrfs_img, &t.join("fuse"), ubtrfs_args);
    open_to_all(m.path());
    let printed = run_steps("ubtrfs", m.path(), steps, super::ubtrfs_bin());
    m.unmount().unwrap();
    for (e, g) in expected.iter().zip(&printed) {
        assert_eq!(g, e, "ubtrfs printed otherwise than the kernel");
    }
    Compared {
        kernel_img,
        ubtrfs_img,
        printed,
    }
}

/// Mount `img`, written by ubtrfs, read-only with the kernel and assert
/// that `script`, the last of the steps that printed `printed` on
/// ubtrfs, prints there what it printed on ubtrfs.
pub fn kernel_reads_the_same(t: &testkit::TestDir, img: &Path, script: &str, printed: &[String]) {
    let kernel = testkit::Mount::single(img, &t.join("kernel-reads"), "ro").unwrap();
    let (ok, out, err) = run_step(kernel.path(), Who::Root, script, "btrfs");
    assert!(ok, "{err}");
    let last = printed.len() - 1;
    assert_eq!(
        format!("step {last} ({script}):\n{out}"),
        printed[last],
        "the kernel reads otherwise what ubtrfs wrote"
    );
    kernel.unmount().unwrap();
}

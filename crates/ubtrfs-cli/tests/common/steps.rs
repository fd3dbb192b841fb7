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

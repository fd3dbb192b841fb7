//! Seed devices and sprouts, made by btrfs-progs and the kernel.

use crate::cmd::run;
use crate::loopdev::Loop;
use crate::mount::Mount;
use anyhow::Result;
use std::path::Path;
use std::process::Command;

/// Make the filesystem on the images `seeds` a seed (`btrfstune -S 1`) and
/// sprout it onto the image `sprout` with the kernel: the seed mounted
/// (read-only, as the kernel mounts seeds), `sprout` added as a device,
/// the mount made writable; then `write` into it at its mount point `mnt`.
pub fn sprout_from(
    seeds: &[&Path],
    sprout: &Path,
    mnt: &Path,
    write: impl FnOnce(&Path),
) -> Result<()> {
    {
        // btrfstune finds the other devices of a filesystem by a scan.
        let loops = seeds
            .iter()
            .map(|s| Loop::attach(s))
            .collect::<Result<Vec<Loop>>>()?;
        let devs: Vec<_> = loops.iter().map(|l| l.device()).collect();
        run(Command::new("btrfs").args(["device", "scan"]).args(&devs))?;
        let tuned = run(Command::new("btrfstune").args(["-S", "1"]).arg(devs[0]));
        let _ = Command::new("btrfs")
            .args(["device", "scan", "--forget"])
            .args(&devs)
            .status();
        tuned?;
    }
    let m = Mount::new(seeds, mnt, "")?;
    let added = Loop::attach(sprout)?;
    run(Command::new("btrfs")
        .args(["device", "add", "-f"])
        .arg(added.device())
        .arg(m.path()))?;
    run(Command::new("mount")
        .args(["-o", "remount,rw"])
        .arg(m.path()))?;
    write(m.path());
    let unmounted = m.unmount();
    let _ = Command::new("btrfs")
        .args(["device", "scan", "--forget"])
        .arg(added.device())
        .status();
    unmounted
}

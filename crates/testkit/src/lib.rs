//! Test support for ubtrfs: corpus images, loop mounts, tree comparison.
//!
//! The kernel and btrfs-progs are the oracles (see `DESIGN.md`, "Testing"):
//! this crate makes images with `mkfs.btrfs --rootdir` and with the kernel
//! through loop mounts, mounts them with the kernel, generates
//! deterministic source trees, and compares trees entry by entry.
//!
//! Most of it needs root, loop devices, the btrfs kernel module and
//! btrfs-progs; start such tests with [`require_privileged!`].
//! Environment variables:
//!
//! - `UBTRFS_TEST_DIR`: where per-test temporary directories go (default:
//!   the system temp dir);
//! - `UBTRFS_KEEP_TEST_DIR=1`: keep them after the test, for inspection;
//! - `UBTRFS_CORPUS_DIR`: where cached corpus images go (default:
//!   `testkit-corpus` in the cargo target profile dir);
//! - `UBTRFS_REQUIRE_PRIVILEGED=1`: fail, rather than skip, privileged
//!   tests that cannot run (set by `scripts/test.sh`).
//!
//! ```no_run
//! use testkit::*;
//! # fn main() -> anyhow::Result<()> {
//! let t = TestDir::new("example")?;
//! let src = t.join("src");
//! gen_tree(&src, 1, &TreeSpec::small())?;
//! let img = mkfs_rootdir_image(t.path(), &src, &MkfsOptions::default())?;
//! btrfs_check(&img)?;
//! let m = img.mount(&t.join("mnt"), "ro")?;
//! compare_trees_with(&src, m.path(), &CompareOptions::mkfs_rootdir())
//!     .map_err(|d| anyhow::anyhow!(d.join("\n")))?;
//! # Ok(()) }
//! ```

mod cmd;
pub mod compare;
pub mod corpus;
pub mod fuse_mount;
pub mod generate;
mod loopdev;
pub mod model;
mod mount;
pub mod populate;
pub mod scratch_fs;
mod seed;
pub mod snapshot;
pub mod sys;
mod tmp;

pub use cmd::{
    command, output_of, privileged_required, privileged_unavailable, run, run_args, run_bytes,
    which,
};
pub use compare::{CompareOptions, compare_trees, compare_trees_with};
pub use corpus::{
    Compression, Csum, Image, KernelCorpus, KernelImageOptions, MkfsOptions, Profile, btrfs_check,
    btrfs_check_file, cached_kernel_image, cached_rootdir_image, copy_image, kernel_image, mkfs,
    mkfs_devices_with_files, mkfs_file, mkfs_rootdir_image, mkfs_version,
};
pub use generate::{GenSummary, Rng, TreeSpec, gen_tree, xorshift_bytes};
pub use loopdev::Loop;
pub use mount::{Mount, dmesg_tail, umount};
pub use seed::sprout_from;
pub use tmp::{TestDir, base_dir, is_mount_point, mounts_below, sparse_file, unmount_below};

//! `ubtrfs`: the command line of ubtrfs, modelled on btrfs-progs.
//!
//! Each command group lives in its own module under [`cmd`]; the FUSE adapter
//! is in [`fuse`]. This file only parses the command line, sets up logging
//! and turns an error into a message on stderr and a non-zero exit code.

mod cmd;
mod fuse;
mod mountinfo;
mod util;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// btrfs in user space: read, restore, inspect and mount btrfs filesystems
/// without the kernel's btrfs driver.
#[derive(Parser, Debug)]
#[command(name = "ubtrfs", version, propagate_version = true)]
struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

/// The top-level commands.
#[derive(Subcommand, Debug)]
enum Command {
    /// List a directory (or a file) inside a filesystem.
    Ls(cmd::ls::Args),
    /// Write the contents of a file inside a filesystem to stdout.
    Cat(cmd::cat::Args),
    /// Copy files out of a filesystem into a directory of the host.
    Restore(cmd::restore::Args),
    /// Mount a filesystem through FUSE.
    Mount(cmd::mount::Args),
    /// Unmount a FUSE mount and wait for its last commit.
    Umount(cmd::umount::Args),
    /// Write back and commit a ubtrfs FUSE mount (`btrfs filesystem sync`).
    Sync(cmd::sync::Args),
    /// Check every copy of the metadata and checksummed data of a
    /// filesystem (unmounted, or a ubtrfs mount), and mend bad copies from
    /// good ones.
    Scrub(cmd::scrub::Args),
    /// Check that an unmounted filesystem's trees agree with one another
    /// (`btrfs check --readonly`).
    Check(cmd::check::Args),
    /// Make a new filesystem on one or more devices or image files.
    Mkfs(Box<cmd::mkfs::Args>),
    /// Look at on-disk structures.
    #[command(subcommand)]
    Inspect(cmd::inspect::Command),
    /// Subvolumes and snapshots: create, snapshot, delete, list, the
    /// default one.
    #[command(subcommand)]
    Subvolume(cmd::subvolume::Command),
    /// Space, size and label of a filesystem (`btrfs filesystem df`,
    /// `usage`, `resize`, `label`).
    #[command(subcommand)]
    Filesystem(cmd::filesystem::Command),
    /// The devices of a filesystem (`btrfs device stats`).
    #[command(subcommand)]
    Device(cmd::device::Command),
    /// Quota groups (`btrfs quota rescan`).
    #[command(subcommand)]
    Quota(cmd::quota::Command),
    /// Show or set a subvolume's read-only flag (`btrfs property ro`).
    #[command(subcommand)]
    Property(cmd::property::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    util::init_logging(cli.verbose);
    let result = match cli.command {
        Command::Ls(args) => cmd::ls::run(args),
        Command::Cat(args) => cmd::cat::run(args),
        Command::Restore(args) => cmd::restore::run(args, cli.verbose),
        Command::Mount(args) => cmd::mount::run(args),
        Command::Umount(args) => cmd::umount::run(args),
        Command::Sync(args) => cmd::sync::run(args),
        Command::Scrub(args) => cmd::scrub::run(args),
        Command::Check(args) => cmd::check::run(args),
        Command::Mkfs(args) => cmd::mkfs::run(*args),
        Command::Inspect(command) => cmd::inspect::run(command),
        Command::Subvolume(command) => cmd::subvolume::run(command),
        Command::Property(command) => cmd::property::run(command),
        Command::Filesystem(command) => cmd::filesystem::run(command),
        Command::Device(command) => cmd::device::run(command),
        Command::Quota(command) => cmd::quota::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<util::ExitWith>().is_some() => {
            ExitCode::from(e.downcast_ref::<util::ExitWith>().map_or(1, |x| x.0))
        }
        Err(e) => {
            eprintln!("ubtrfs: error: {}", util::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

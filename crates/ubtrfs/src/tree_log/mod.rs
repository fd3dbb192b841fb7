//! The log tree (layer 9): what fsync wrote since the last commit.
//!
//! When the kernel fsyncs a file it does not commit a transaction: it
//! writes the changed items of the inode (and of the directories that
//! need it) into a per-subvolume log tree, and points the superblock's
//! `log_root` at a tree of those logs. After a crash the next mount
//! replays the logs into the fs trees. ubtrfs does the same:
//!
//! - [`read`]: the log trees, every block verified;
//! - `replay`, `names`, `extents`, `fixup`: the replay, on a filesystem
//!   opened read-write (then committed, which clears `log_root`), or in
//!   memory for a read-only open, so that readers never see the state
//!   before the fsyncs the kernel would show.
//!
//! - `write`: [`Filesystem::fsync`], which logs a changed file when it
//!   can and commits otherwise;
//! - `log_tree`: the log being written, its blocks and the log sync.

mod dir_log;
mod extents;
mod fixup;
mod log_tree;
mod names;
pub mod read;
mod replay;
mod write;

pub(crate) use log_tree::LogTree;
pub use replay::ReplaySummary;
pub use write::{LogOnly, PendingSync, Synced};

use crate::format::consts::ROOT_TREE_OBJECTID;
use crate::fs::Filesystem;
use crate::volume::DeviceSet;
use crate::{Error, Result};

/// On a filesystem just opened read-write (nothing allocated yet): replay
/// its log, if it has one, and commit. The commit's superblock has no log.
pub(crate) fn replay_at_open(fs: &mut Filesystem) -> Result<Option<ReplaySummary>> {
    let Some(log) = read::read_log(fs).map_err(in_log)? else {
        return Ok(None);
    };
    let summary = {
        let mut w = fs.writer_deleting_uncommitted()?;
        let s = replay::replay_log(fs, &mut w, &log).map_err(in_log)?;
        // Even a log that changed nothing must leave the superblock: make
        // sure the commit has something to write.
        fs.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| ed.cow_root(root))?;
        fs.commit_locked(&mut w)?;
        s
    };
    fs.sb.log_root = 0;
    fs.sb.log_root_level = 0;
    fs.warnings.extend(summary.warnings.iter().cloned());
    fs.warnings.push(format!(
        "replayed the log tree (changes fsync'd after the last commit): {} inodes and {} file extents in subvolumes {:?}",
        summary.inodes, summary.extents, summary.subvols
    ));
    Ok(Some(summary))
}

/// Open the filesystem on `set` for reading with its log replayed in
/// memory: the devices are never written. Fails, naming the log, if the
/// replay cannot be done.
pub(crate) fn open_replayed_in_memory(set: DeviceSet) -> Result<Filesystem> {
    // What stops writing stops the replay too; other errors are the
    // filesystem's own.
    let unsupported = |e: Error| match e {
        Error::Unsupported(_) | Error::Devices(_) | Error::ReadOnly(_) => {
            Error::Unsupported(format!(
                "the filesystem has a log tree (changes fsync'd after the last commit), and replaying it needs what writing needs: {e}; mount it once with the kernel to replay it"
            ))
        }
        e => e,
    };
    let mut fs = Filesystem::open_with_writer(set).map_err(unsupported)?;
    let replayed = (|| -> Result<ReplaySummary> {
        let log =
            read::read_log(&fs)?.ok_or_else(|| Error::corrupt("the log vanished while opening"))?;
        let mut w = fs.writer_deleting_uncommitted()?;
        let s = replay::replay_log(&fs, &mut w, &log)?;
        // Inodes the replay orphaned go, as the orphan cleanup after a
        // read-write open would delete them.
        for &subvol in &s.subvols {
            fs.clean_orphans(&mut w, subvol)?;
        }
        Ok(s)
    })()
    .map_err(in_log)?;
    // Read-only from here on: the replayed blocks live in the reader's
    // overlay of uncommitted blocks and are never written.
    fs.writer = None;
    fs.warnings.extend(replayed.warnings);
    fs.warnings.push(
        "the log tree (changes fsync'd after the last commit) was replayed in memory; opening the filesystem read-write replays it on disk".into(),
    );
    Ok(fs)
}

/// Damage found while reading or replaying the log, said to be the log's.
fn in_log(e: Error) -> Error {
    match e {
        Error::BadTreeBlock { .. } | Error::Corrupt(_) => Error::Corrupt(format!(
            "the log tree (changes fsync'd after the last commit) cannot be replayed: {e}"
        )),
        e => e,
    }
}

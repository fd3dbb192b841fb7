//! Check: read a filesystem's trees and tell whether they agree with one
//! another, as `btrfs check --readonly` does. Nothing is written.
//!
//! Each part of the check is one module:
//! - [`extent_refs`]: every tree block and data extent the trees reach
//!   has an extent item whose back references match the references found
//!   (by root, or by parent block for full-backref blocks; a subvolume
//!   whose deletion stopped half way is walked from where it stopped),
//!   and every block group's `used` is the sum of its extents;
//! - [`space`]: chunks, block groups, device extents and device items
//!   agree, and the free-space tree lists exactly the space no extent
//!   holds;
//! - [`fs_tree`]: per subvolume, every inode's names, link count, byte
//!   count, directory size and file extents, and the links between
//!   subvolumes in the root tree;
//! - [`csums`]: checksums only for data extents, and for every data extent
//!   of a file that has them.
//!
//! A block that cannot be read is a problem in its own right; the rest of
//! the check goes on without what hangs below it.

mod csums;
mod extent_refs;
mod fs_tree;
mod space;

use crate::Result;
use crate::fs::Filesystem;

/// Problems remembered by description; the count goes on past it.
const PROBLEMS_MAX: usize = 1000;

/// The part of the filesystem a problem is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckArea {
    /// A tree block that cannot be read or verified.
    TreeBlocks,
    /// Extent items and their back references.
    ExtentRefs,
    /// Block group items and their usage.
    BlockGroups,
    /// Chunks, device extents and device items.
    Chunks,
    /// The free-space tree.
    FreeSpace,
    /// The checksum tree.
    Checksums,
    /// Inodes, names and file extents of a subvolume.
    FsTree,
    /// Links between subvolumes (root refs and their directory entries).
    RootRefs,
    /// The superblock's totals.
    Superblock,
}

impl CheckArea {
    /// A short name, as the CLI prints it.
    pub fn name(self) -> &'static str {
        match self {
            CheckArea::TreeBlocks => "tree blocks",
            CheckArea::ExtentRefs => "extent refs",
            CheckArea::BlockGroups => "block groups",
            CheckArea::Chunks => "chunks",
            CheckArea::FreeSpace => "free space",
            CheckArea::Checksums => "checksums",
            CheckArea::FsTree => "fs tree",
            CheckArea::RootRefs => "root refs",
            CheckArea::Superblock => "superblock",
        }
    }
}

/// One thing found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where it is.
    pub area: CheckArea,
    /// What is wrong, naming the block, extent, inode or item.
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.area.name(), self.what)
    }
}

/// What a check found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// The first problems found (up to a thousand).
    pub problems: Vec<Problem>,
    /// How many problems were found in all.
    pub problem_count: u64,
    /// What was not checked, and why.
    pub notes: Vec<String>,
    /// Trees walked.
    pub trees: u64,
    /// Tree blocks read.
    pub tree_blocks: u64,
    /// Extent items checked.
    pub extents: u64,
    /// Inodes checked (every subvolume's).
    pub inodes: u64,
    /// Bytes the block groups say are used.
    pub bytes_used: u64,
}

impl CheckReport {
    /// Whether nothing was found wrong.
    pub fn clean(&self) -> bool {
        self.problem_count == 0
    }

    pub(crate) fn problem(&mut self, area: CheckArea, what: String) {
        self.problem_count += 1;
        if self.problems.len() < PROBLEMS_MAX {
            self.problems.push(Problem { area, what });
        }
    }

    /// Problems found in `area` (of those remembered).
    pub fn in_area(&self, area: CheckArea) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(move |p| p.area == area)
    }
}

/// The problems, a line each, and how many there were in all.
impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for p in &self.problems {
            writeln!(f, "{p}")?;
        }
        write!(f, "{} problems found", self.problem_count)
    }
}

/// The parts of a check, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStage {
    /// Walking every tree and matching references with the extent tree.
    ExtentRefs,
    /// Chunks, device extents and free space.
    Space,
    /// Subvolume trees.
    FsTrees,
    /// The checksum tree.
    Checksums,
}

impl CheckStage {
    /// What the stage does, for a progress line.
    pub fn describe(self) -> &'static str {
        match self {
            CheckStage::ExtentRefs => "checking extents and their references",
            CheckStage::Space => "checking chunks, device extents and free space",
            CheckStage::FsTrees => "checking inodes, directories and file extents",
            CheckStage::Checksums => "checking the checksum tree",
        }
    }
}

impl Filesystem {
    /// Check the filesystem's trees against one another (see the
    /// [module](crate::check) documentation). Errors only when the check
    /// cannot start (the root tree unreadable); what is wrong inside is in
    /// the report. `stage` is told as each part starts.
    ///
    /// Open the filesystem with [`Filesystem::open_without_log_replay`]
    /// to check what is on disk: a replayed log is in memory only.
    pub fn check(&self, stage: &mut dyn FnMut(CheckStage)) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        stage(CheckStage::ExtentRefs);
        let extents = extent_refs::check(self, &mut report)?;
        stage(CheckStage::Space);
        space::check(self, &extents, &mut report)?;
        stage(CheckStage::FsTrees);
        let needs_csums = fs_tree::check(self, &mut report)?;
        stage(CheckStage::Checksums);
        csums::check(self, &extents, &needs_csums, &mut report)?;
        Ok(report)
    }
}

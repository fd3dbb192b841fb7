//! Logging names (DESIGN.md layer 9): what an fsync after a rename, an
//! unlink, a link or a create needs, and the fsync of a directory, in the
//! kernel's layout (docs/log-tree-kernel-cases.md).
//!
//! - A directory goes into the log as its inode item, its names, a
//!   DIR_INDEX item for each entry it gained since the last commit, and
//!   DIR_LOG_INDEX ranges over the indexes whose entries changed (split
//!   around unchanged ones): a replay drops the committed entries a range
//!   covers that the log does not hold.
//! - The directories made since the commit that a logged directory has
//!   entries for go in with their entries too, and so on down, as the
//!   kernel's directory fsync does; a later log looks at them again.
//! - An inode whose names changed goes in with all of them (INODE_REF and
//!   INODE_EXTREF items). One logged only for its names has an inode item
//!   of generation 0, which a replay takes as "this inode exists" and does
//!   not apply over an inode it has, so its data stays as committed (or as
//!   an earlier fsync logged it).
//!
//! A directory the last commit had and that moved since is not logged:
//! its subtree would show at the new place as committed, which it never
//! was there. Such an fsync commits, as the kernel's does. So does the
//! fsync of a file in such a directory or below one ([`file_in_place`]):
//! a log of the file alone would show it at the directory's old place.
//! Above a subvolume's root, the walk goes on from the directory that
//! holds the subvolume's link (`subvolume_in_place` in `write`).
//!
//! What must be logged closes over itself: a directory's changed entries
//! name inodes whose other names may have changed too, whose directories
//! must then be logged, and so on. [`plan`] walks that closure; past
//! [`MAX_LOGGED`] inodes it gives up and the fsync commits.
//!
//! The log shows names as of one moment: a directory or an inode whose
//! names the log holds and that lost a name since (a rename, an unlink)
//! is logged again at the next fsync, whatever that fsync is for (a stale
//! entry could otherwise bring back a name that moved elsewhere). Names
//! only added leave what the log holds true of an earlier moment.
//!
//! A directory's changes are found by comparing its DIR_INDEX items now
//! and at the last commit, skipping the leaves both trees share: the cost
//! follows what changed, not the size of the directory.

use super::log_tree::{ItemMap, LogTree};
use crate::alloc::Allocator;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{DirItem, InodeItem, InodeRef};
use crate::fs::InodeId;
use crate::tree::Tree;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// The most inodes (directories included) one fsync logs for names before
/// it commits instead.
pub(super) const MAX_LOGGED: usize = 512;

/// What to log of one subvolume's names.
#[derive(Default)]
pub(super) struct NamePlan {
    /// Directories to log: the key span of their DIR_LOG_INDEX and
    /// DIR_INDEX items to set, the items, and the highest entry index the
    /// directory has had.
    dirs: BTreeMap<u64, DirLog>,
    /// Inodes to log with their names (every directory above too).
    named: BTreeSet<u64>,
    /// Inodes gone since the last commit: the log must not hold them, or
    /// a replay would bring them back.
    pub gone: BTreeSet<u64>,
}

/// What the log already holds of one subvolume: a directory's entry the
/// log has as it is now, naming an inode whose names the log has, needs no
/// new look at that inode (had it lost a name since, it would be logged
/// again anyway); nor does a removed entry the log's ranges cover already.
pub(super) struct Logged<'a> {
    pub subvol: u64,
    pub items: Option<&'a ItemMap>,
    pub named: &'a BTreeSet<InodeId>,
    /// Inodes found gone since the commit and dropped from the log.
    pub gone: &'a BTreeSet<InodeId>,
    /// Per directory the log holds, the highest entry index it had then.
    pub dir_max: &'a HashMap<InodeId, u64>,
    /// Per directory the log holds, the new directories it had entries
    /// for.
    pub subdirs: &'a HashMap<InodeId, BTreeSet<u64>>,
    /// Entries removed since the log's names were last brought up to
    /// date.
    pub removed_from: &'a Removed,
}

/// Per directory, the (index, inode) of each entry removed.
pub(super) type Removed = BTreeMap<u64, Vec<(u64, u64)>>;

impl Logged<'_> {
    fn names(&self, ino: u64) -> bool {
        self.named.contains(&InodeId {
            subvol: self.subvol,
            ino,
        })
    }

    fn is_gone(&self, ino: u64) -> bool {
        self.gone.contains(&InodeId {
            subvol: self.subvol,
            ino,
        })
    }

    /// Whether the log has DIR_INDEX item `key` as `raw`, naming `target`,
    /// whose names the log has.
    fn has_entry(&self, key: &Key, raw: &[u8], target: u64) -> bool {
        self.names(target)
            && self
                .items
                .and_then(|m| m.get(key))
                .is_some_and(|d| d == raw)
    }

    /// The highest entry index of directory `dir` when it was last logged
    /// (if the log holds it) and the entries it lost since: since then it
    /// gained only entries with higher indexes.
    fn logged_dir(&self, dir: u64) -> Option<(u64, &[(u64, u64)])> {
        let prev = self.dir_max.get(&InodeId {
            subvol: self.subvol,
            ino: dir,
        })?;
        let gone = self.removed_from.get(&dir).map_or(&[][..], Vec::as_slice);
        Some((*prev, gone))
    }

    /// The new directories directory `dir` had entries for when logged.
    fn subdirs(&self, dir: u64) -> impl Iterator<Item = u64> + '_ {
        self.subdirs
            .get(&InodeId {
                subvol: self.subvol,
                ino: dir,
            })
            .into_iter()
            .flatten()
            .copied()
    }

    /// Whether a DIR_LOG_INDEX range of `dir` in the log covers `index`.
    fn has_removal(&self, dir: u64, index: u64) -> bool {
        let Some(m) = self.items else {
            return false;
        };
        let lo = Key::new(dir, DIR_LOG_INDEX_KEY, 0);
        m.range(lo..=Key::new(dir, DIR_LOG_INDEX_KEY, index))
            .next_back()
            .and_then(|(_, d)| d.get(..8)?.try_into().ok().map(u64::from_le_bytes))
            .is_some_and(|end| end >= index)
    }
}

/// What to log of one directory's entries.
struct DirLog {
    /// Key spans of the log to make hold exactly these items.
    spans: Vec<(Key, Key, ItemMap)>,
    max_index: u64,
    /// The directories new since the commit it has entries for.
    subdirs: BTreeSet<u64>,
}

/// Something the closure still has to look at.
enum Todo {
    /// An inode's names; logged even if unchanged when `true`.
    Names(u64, bool),
    /// A directory's entries.
    Entries(u64),
    /// The entries of a directory new since the commit, below a logged
    /// one: logged unless the log has them as they are.
    Subdir(u64),
}

/// The names of inode `ino` in `tree`, in a fixed order.
fn names_of(tree: &Tree<'_>, ino: u64) -> Result<Vec<InodeRef>> {
    let mut out = Vec::new();
    for it in tree.range(
        Key::new(ino, INODE_REF_KEY, 0),
        Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
    )? {
        let it = it?;
        let k = it.key();
        match k.item_type {
            INODE_REF_KEY => out.extend(InodeRef::parse_refs(it.data(), k.offset)?),
            _ => out.extend(InodeRef::parse_extrefs(it.data())?),
        }
    }
    out.sort_by(|a, b| (a.parent, a.index, &a.name).cmp(&(b.parent, b.index, &b.name)));
    Ok(out)
}

fn inode_of(tree: &Tree<'_>, ino: u64) -> Result<Option<InodeItem>> {
    tree.get(&Key::new(ino, INODE_ITEM_KEY, 0))?
        .map(|it| InodeItem::parse(it.data()))
        .transpose()
}

fn is_dir(item: &InodeItem) -> bool {
    item.mode & libc::S_IFMT == libc::S_IFDIR
}

/// Whether entry `d` names a directory the last commit (`old`) did not
/// have. A logged directory takes such a directory's entries with it
/// (and theirs, and so on), as the kernel's directory fsync does: else
/// the files in it would come back only when fsync'd themselves.
fn is_new_dir(old: &Tree<'_>, d: &DirItem) -> Result<bool> {
    Ok(d.file_type == FT_DIR
        && d.location.item_type == INODE_ITEM_KEY
        && inode_of(old, d.location.objectid)?.is_none())
}

/// The highest entry index of directory `dir` in `tree` (0 if none).
fn last_index(tree: &Tree<'_>, dir: u64) -> Result<u64> {
    Ok(tree
        .get_le(&Key::new(dir, DIR_INDEX_KEY, u64::MAX))?
        .map(|it| it.key())
        .filter(|k| k.objectid == dir && k.item_type == DIR_INDEX_KEY)
        .map_or(0, |k| k.offset))
}

/// Entries of a directory by index: (target key, name, raw item).
type Entries = BTreeMap<u64, (Key, Vec<u8>, Vec<u8>)>;

/// The entries of directory `dir` now (`cur`) and at the last commit
/// (`old`) in the DIR_INDEX leaves the two trees do not share, and the
/// first index of each leaf they share (whose entries are all unchanged).
fn dir_changes(
    cur: &Tree<'_>,
    old: &Tree<'_>,
    dir: u64,
) -> Result<(Entries, Entries, BTreeSet<u64>)> {
    let (lo, hi) = (
        Key::new(dir, DIR_INDEX_KEY, 0),
        Key::new(dir, DIR_INDEX_KEY, u64::MAX),
    );
    let (now, before) = (cur.leaves(lo, hi)?, old.leaves(lo, hi)?);
    let blocks = |v: &[std::sync::Arc<crate::format::node::Node>]| -> BTreeSet<u64> {
        v.iter().map(|l| l.header.bytenr).collect()
    };
    let shared: BTreeSet<u64> = blocks(&now)
        .intersection(&blocks(&before))
        .copied()
        .collect();
    let mut same = BTreeSet::new();
    let mut read = |leaves: &[std::sync::Arc<crate::format::node::Node>]| -> Result<Entries> {
        let mut out = Entries::new();
        for leaf in leaves {
            let shared = shared.contains(&leaf.header.bytenr);
            for slot in 0..leaf.nritems() {
                let k = leaf.key(slot);
                if k < lo || k > hi {
                    continue;
                }
                if shared {
                    same.insert(k.offset);
                    break;
                }
                let data = leaf.item(slot).data;
                let d = DirItem::parse_all(data)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::corrupt(format!("empty DIR_INDEX item {k}")))?;
                out.insert(k.offset, (d.location, d.name, data.to_vec()));
            }
        }
        Ok(out)
    };
    let n = read(&now)?;
    let b = read(&before)?;
    Ok((n, b, same))
}

/// Whether the name `r` of an inode would be made right by a replay from
/// the inode's back reference alone: its directory is one the committed
/// tree `old` has, under the same names still (`cur`), with no entry of
/// that name or index there.
fn added_by_ref(cur: &Tree<'_>, old: &Tree<'_>, r: &InodeRef) -> Result<bool> {
    if !inode_of(old, r.parent)?.is_some_and(|d| is_dir(&d)) {
        return Ok(false);
    }
    // A directory moved since (or below one) would show the name at its
    // old place.
    if !unmoved(cur, old, r.parent)? {
        return Ok(false);
    }
    if old
        .get(&Key::new(r.parent, DIR_INDEX_KEY, r.index))?
        .is_some()
    {
        return Ok(false);
    }
    let hash = crate::fs::dir::name_hash(&r.name);
    Ok(match old.get(&Key::new(r.parent, DIR_ITEM_KEY, hash))? {
        Some(it) => !DirItem::parse_all(it.data())?
            .iter()
            .any(|d| d.name == r.name),
        None => true,
    })
}

/// Whether directory `dir` and every directory above it have the names
/// the last commit gave them (a directory new since counts by its
/// parent's): else what the log says of `dir` would show where it was
/// at the commit, a path that has not held it since. The kernel commits
/// then too.
pub(super) fn unmoved(cur: &Tree<'_>, old: &Tree<'_>, dir: u64) -> Result<bool> {
    let mut d = dir;
    // Deeper than any path can be: a loop in damaged names.
    for _ in 0..4096 {
        let now = names_of(cur, d)?;
        let Some(up) = now.first().map(|r| r.parent) else {
            return Ok(false);
        };
        if up == d {
            // The subvolume's root directory.
            return Ok(true);
        }
        let before = names_of(old, d)?;
        if !before.is_empty() && before != now {
            return Ok(false);
        }
        d = up;
    }
    Ok(false)
}

/// Whether every directory that holds a name of file `ino` (and every
/// directory above) has the names the last commit gave it. Else a log of
/// the file would show it, after a replay, at a directory's old place,
/// where it no longer is: its fsync commits instead. (A directory the
/// file is fsync'd for is looked at by [`plan`] already.)
pub(super) fn file_in_place(cur: &Tree<'_>, old: &Tree<'_>, ino: u64) -> Result<bool> {
    let parents: BTreeSet<u64> = names_of(cur, ino)?.iter().map(|r| r.parent).collect();
    for p in parents {
        if !unmoved(cur, old, p)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The DIR_LOG_INDEX ranges for a directory whose entries at `changed`
/// indexes differ from the committed ones and at `same` indexes do not:
/// each run of changed indexes, up to the next unchanged one (or the end
/// of all indexes).
fn ranges(changed: &BTreeSet<u64>, same: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &c in changed {
        if out.last().is_some_and(|&(_, end)| c <= end) {
            continue;
        }
        let end = same.range(c..).next().map_or(u64::MAX, |&next| next - 1);
        out.push((c, end));
    }
    out
}

/// Walk the closure of what must be logged so that the names of the
/// inodes `inodes` (logged even where unchanged) and the entries of the
/// directories `dirs` (all in one subvolume, `cur` as it is and `old` as
/// last committed) survive a replay. `None` if something cannot be logged this way: the caller
/// commits.
pub(super) fn plan(
    cur: &Tree<'_>,
    old: &Tree<'_>,
    logged: &Logged<'_>,
    inodes: impl IntoIterator<Item = u64>,
    dirs: impl IntoIterator<Item = u64>,
) -> Result<Option<NamePlan>> {
    let mut todo: VecDeque<Todo> = inodes.into_iter().map(|i| Todo::Names(i, true)).collect();
    todo.extend(dirs.into_iter().map(Todo::Entries));
    let mut plan = NamePlan::default();
    let mut seen = BTreeSet::new();
    let mut walked = BTreeSet::new();
    while let Some(t) = todo.pop_front() {
        if plan.named.len() + plan.gone.len() > MAX_LOGGED {
            return Ok(None);
        }
        match t {
            Todo::Names(ino, force) => {
                if !seen.insert(ino) {
                    continue;
                }
                // Gone since: every directory that had it at the commit is
                // logged, so that the replay drops it.
                if inode_of(cur, ino)?.is_none() {
                    // A directory the commit had with entries: what it held
                    // then would go with it in the replay, moved out since
                    // or not. The kernel commits here too.
                    if inode_of(old, ino)?.is_some_and(|i| is_dir(&i))
                        && old.items_of(ino, DIR_INDEX_KEY)?.next().is_some()
                    {
                        return Ok(None);
                    }
                    plan.gone.insert(ino);
                    for r in names_of(old, ino)? {
                        todo.push_back(Todo::Entries(r.parent));
                    }
                    continue;
                }
                let (now, before) = (names_of(cur, ino)?, names_of(old, ino)?);
                if now == before && !force && !plan.dirs.contains_key(&ino) {
                    continue;
                }
                // A directory the commit had, moved since: what lies under
                // it would show at its new place as the commit had it, a
                // tree that never was. The kernel commits here too.
                if now != before
                    && !before.is_empty()
                    && inode_of(cur, ino)?.is_some_and(|i| is_dir(&i))
                {
                    return Ok(None);
                }
                plan.named.insert(ino);
                for r in before.iter().filter(|r| !now.contains(r)) {
                    todo.push_back(Todo::Entries(r.parent));
                }
                for r in now.iter().filter(|r| !before.contains(r)) {
                    // A subvolume root's ".." names itself.
                    if r.parent != ino && !added_by_ref(cur, old, r)? {
                        todo.push_back(Todo::Entries(r.parent));
                    }
                }
            }
            Todo::Entries(dir) | Todo::Subdir(dir) => {
                if !walked.insert(dir) {
                    continue;
                }
                if inode_of(cur, dir)?.is_none() && inode_of(old, dir)?.is_none() {
                    // New since the commit and gone again: it leaves the log.
                    plan.gone.insert(dir);
                    continue;
                }
                if !inode_of(cur, dir)?.is_some_and(|d| is_dir(&d)) {
                    // A directory the commit had, removed since: its
                    // entries would go with it in the replay.
                    return Ok(None);
                }
                if let (Todo::Subdir(_), Some((prev, removed))) = (&t, logged.logged_dir(dir))
                    && removed.is_empty()
                    && last_index(cur, dir)? <= prev
                {
                    // Unchanged since logged; what is below may not be.
                    for s in logged.subdirs(dir) {
                        todo.push_back(Todo::Subdir(s));
                    }
                    continue;
                }
                if !unmoved(cur, old, dir)? {
                    return Ok(None);
                }
                if let Some((prev, removed)) = logged.logged_dir(dir) {
                    // What the log holds of it stays right but for the
                    // entries removed since (their DIR_INDEX items go, a
                    // committed one gets a range unless one covers it)
                    // and the entries added since, with higher indexes
                    // (a range up to the end of all indexes covers them).
                    let mut spans = Vec::new();
                    for &(i, t) in removed {
                        let key = Key::new(dir, DIR_INDEX_KEY, i);
                        spans.push((key, key, ItemMap::new()));
                        if old.get(&key)?.is_some() && !logged.has_removal(dir, i) {
                            let k = Key::new(dir, DIR_LOG_INDEX_KEY, i);
                            spans.push((k, k, [(k, i.to_le_bytes().to_vec())].into()));
                        }
                        if t == 0 {
                            // A subvolume link went: commits make those.
                            return Ok(None);
                        }
                        todo.push_back(Todo::Names(t, false));
                    }
                    let mut items = ItemMap::new();
                    let mut max_index = prev;
                    let mut subdirs: BTreeSet<u64> = logged.subdirs(dir).collect();
                    for it in cur.range(
                        Key::new(dir, DIR_INDEX_KEY, prev + 1),
                        Key::new(dir, DIR_INDEX_KEY, u64::MAX),
                    )? {
                        let it = it?;
                        let d = DirItem::parse_all(it.data())?
                            .into_iter()
                            .next()
                            .ok_or_else(|| {
                                Error::corrupt(format!("empty DIR_INDEX item {}", it.key()))
                            })?;
                        if d.location.item_type != INODE_ITEM_KEY {
                            return Ok(None);
                        }
                        let key = it.key();
                        max_index = key.offset;
                        if !logged.has_entry(&key, it.data(), d.location.objectid) {
                            todo.push_back(Todo::Names(d.location.objectid, false));
                        }
                        if is_new_dir(old, &d)? {
                            subdirs.insert(d.location.objectid);
                        }
                        items.insert(key, it.data().to_vec());
                    }
                    spans.push((
                        Key::new(dir, DIR_INDEX_KEY, prev + 1),
                        Key::new(dir, DIR_INDEX_KEY, u64::MAX),
                        items,
                    ));
                    if max_index > prev && !logged.has_removal(dir, u64::MAX) {
                        let k = Key::new(dir, DIR_LOG_INDEX_KEY, prev + 1);
                        spans.push((k, k, [(k, u64::MAX.to_le_bytes().to_vec())].into()));
                    }
                    todo.extend(subdirs.iter().map(|&s| Todo::Subdir(s)));
                    plan.dirs.insert(
                        dir,
                        DirLog {
                            spans,
                            max_index,
                            subdirs,
                        },
                    );
                    seen.remove(&dir);
                    todo.push_back(Todo::Names(dir, true));
                    continue;
                }
                let (now, before, mut same) = dir_changes(cur, old, dir)?;
                let mut changed = BTreeSet::new();
                let mut items = ItemMap::new();
                let mut subdirs = BTreeSet::new();
                for (&i, (loc, name, raw)) in &now {
                    if before
                        .get(&i)
                        .is_some_and(|(l, n, _)| l == loc && n == name)
                    {
                        same.insert(i);
                        continue;
                    }
                    if loc.item_type != INODE_ITEM_KEY {
                        // Links to subvolumes are made by commits only.
                        return Ok(None);
                    }
                    changed.insert(i);
                    let key = Key::new(dir, DIR_INDEX_KEY, i);
                    if !logged.has_entry(&key, raw, loc.objectid) {
                        todo.push_back(Todo::Names(loc.objectid, false));
                    }
                    if let Some(d) = DirItem::parse_all(raw)?.first()
                        && is_new_dir(old, d)?
                    {
                        subdirs.insert(loc.objectid);
                        todo.push_back(Todo::Subdir(loc.objectid));
                    }
                    items.insert(key, raw.clone());
                }
                for (&i, (loc, _, _)) in &before {
                    if same.contains(&i) {
                        continue;
                    }
                    if loc.item_type != INODE_ITEM_KEY {
                        return Ok(None);
                    }
                    changed.insert(i);
                    let t = loc.objectid;
                    if !logged.has_removal(dir, i)
                        || !logged.names(t) && !logged.is_gone(t) && inode_of(cur, t)?.is_some()
                    {
                        todo.push_back(Todo::Names(loc.objectid, false));
                    }
                }
                for (a, b) in ranges(&changed, &same) {
                    items.insert(
                        Key::new(dir, DIR_LOG_INDEX_KEY, a),
                        b.to_le_bytes().to_vec(),
                    );
                }
                plan.dirs.insert(
                    dir,
                    DirLog {
                        spans: vec![(
                            Key::new(dir, DIR_LOG_ITEM_KEY, 0),
                            Key::new(dir, DIR_INDEX_KEY, u64::MAX),
                            items,
                        )],
                        max_index: last_index(cur, dir)?.max(last_index(old, dir)?),
                        subdirs,
                    },
                );
                // A logged directory carries its own names, as the
                // kernel's do.
                seen.remove(&dir);
                todo.push_back(Todo::Names(dir, true));
            }
        }
    }
    Ok(Some(plan))
}

/// Write `plan` for subvolume `subvol` into `log`. Inodes whose data the
/// log already holds (an fsync logged them in this transaction) keep their
/// logged inode item, with the link count of their names now.
pub(super) fn write(
    log: &mut LogTree,
    alloc: &mut Allocator,
    subvol: u64,
    cur: &Tree<'_>,
    old: &Tree<'_>,
    plan: &NamePlan,
) -> Result<()> {
    for &ino in &plan.named {
        let Some(item) = inode_of(cur, ino)? else {
            continue;
        };
        let names = names_of(cur, ino)?;
        let mut refs = ItemMap::new();
        for it in cur.range(
            Key::new(ino, INODE_REF_KEY, 0),
            Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
        )? {
            let it = it?;
            refs.insert(it.key(), it.data().to_vec());
        }
        log.set_range(
            alloc,
            subvol,
            Key::new(ino, INODE_REF_KEY, 0),
            Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
            refs,
        )?;
        let item_key = Key::new(ino, INODE_ITEM_KEY, 0);
        let logged = log
            .items(subvol)
            .and_then(|m| m.get(&item_key))
            .map(|d| InodeItem::parse(d))
            .transpose()?
            .filter(|i| i.generation != 0);
        let dir_logged = plan.dirs.contains_key(&ino);
        let committed = inode_of(old, ino)?;
        let is_new = committed.is_none();
        let (head, xattrs_from) = if dir_logged {
            // A directory logged with its entries: as it is now; a new one
            // with size 0, which the replay's added entries grow.
            let mut i = item.clone();
            if committed.is_none() {
                i.size = 0;
            }
            (Some(i), Some(cur))
        } else if let Some(mut i) = logged {
            i.nlink = names.len() as u32;
            (Some(i), None)
        } else {
            match committed {
                // Only "it exists": the replay keeps the inode it has.
                Some(mut i) => {
                    i.generation = 0;
                    i.size = 0;
                    i.nlink = names.len() as u32;
                    (Some(i), Some(old))
                }
                None => {
                    let mut i = item.clone();
                    match i.mode & libc::S_IFMT {
                        // A new file's data is not logged (the kernel's
                        // way): it comes back empty.
                        libc::S_IFREG => {
                            i.generation = 0;
                            i.size = 0;
                        }
                        libc::S_IFDIR => i.size = 0,
                        _ => {}
                    }
                    (Some(i), Some(cur))
                }
            }
        };
        if let Some(mut i) = head {
            i.nbytes = 0;
            log.set_range(
                alloc,
                subvol,
                item_key,
                item_key,
                [(item_key, i.to_bytes())].into(),
            )?;
        }
        if let Some(t) = xattrs_from {
            copy_items(log, alloc, subvol, t, ino, XATTR_ITEM_KEY)?;
        }
        // A new symlink needs its target, an inline extent.
        if is_new && item.mode & libc::S_IFMT == libc::S_IFLNK {
            copy_items(log, alloc, subvol, cur, ino, EXTENT_DATA_KEY)?;
        }
    }
    for (&dir, d) in &plan.dirs {
        for (lo, hi, items) in &d.spans {
            log.set_range(alloc, subvol, *lo, *hi, items.clone())?;
        }
        let id = InodeId { subvol, ino: dir };
        log.dir_max.insert(id, d.max_index);
        log.subdirs
            .entry(id)
            .or_default()
            .extend(d.subdirs.iter().copied());
    }
    for &ino in &plan.named {
        log.named.insert(InodeId { subvol, ino });
    }
    for &dir in plan.dirs.keys() {
        log.dirs.insert(InodeId { subvol, ino: dir });
    }
    Ok(())
}

/// Make the log hold exactly the items of type `item_type` that inode
/// `ino` has in `tree`.
fn copy_items(
    log: &mut LogTree,
    alloc: &mut Allocator,
    subvol: u64,
    tree: &Tree<'_>,
    ino: u64,
    item_type: u8,
) -> Result<()> {
    let mut x = ItemMap::new();
    for it in tree.items_of(ino, item_type)? {
        let it = it?;
        x.insert(it.key(), it.data().to_vec());
    }
    let (lo, hi) = (
        Key::new(ino, item_type, 0),
        Key::new(ino, item_type, u64::MAX),
    );
    log.set_range(alloc, subvol, lo, hi, x)?;
    Ok(())
}

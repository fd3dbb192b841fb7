//! Subvolume trees: every inode's names agree with its directories'
//! entries, its link count with its names, its byte count with its file
//! extents, a directory's size with its entries; file extents do not
//! overlap (nor leave gaps without the no-holes feature); an inode with no
//! names waits for deletion (an orphan item). Then the links between
//! subvolumes: root refs, root backrefs and the directory entries that
//! name a subvolume agree.

use super::extent_refs::tree_name;
use super::{CheckArea, CheckReport};
use crate::Result;
use crate::format::Key;
use crate::format::consts::*;
use crate::format::items::{
    DirItem, ExtentBody, FileExtentItem, InodeItem, InodeRef, RootItem, RootRef,
};
use crate::fs::Filesystem;
use crate::fs::dir::name_hash;
use crate::transaction::{LAST_FREE_OBJECTID, is_subvol_tree};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Data ranges that must have checksums: start -> (length, who needs it).
pub(super) type CsumNeeds = BTreeMap<u64, (u64, String)>;

/// A directory entry as its DIR_INDEX or DIR_ITEM says.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    name: Vec<u8>,
    location: Key,
    file_type: u8,
}

/// A subvolume link found in a directory: (subvolume, dir, index, name, child).
type SubvolLink = (u64, u64, u64, Vec<u8>, u64);

/// What one inode's items add up to.
#[derive(Default)]
struct InodeState {
    ino: u64,
    item: Option<InodeItem>,
    names: u64,
    nbytes: u64,
    dir_size: u64,
    /// End of the last file extent.
    extent_end: u64,
    /// Whether a file extent was seen.
    extents: bool,
}

pub(super) fn check(fs: &Filesystem, report: &mut CheckReport) -> Result<CsumNeeds> {
    let mut needs = CsumNeeds::new();
    let mut links = Vec::new();
    let mut roots = Vec::new();
    for item in fs.root_tree().range(Key::MIN, Key::MAX)? {
        let item = item?;
        let key = item.key();
        if key.item_type == ROOT_ITEM_KEY
            && (is_subvol_tree(key.objectid) || key.objectid == DATA_RELOC_TREE_OBJECTID)
            && let Ok(r) = RootItem::parse(item.data())
            && r.refs > 0
        {
            roots.push((key.objectid, r.root_dirid));
        }
    }
    for (id, root_dirid) in roots {
        let tree = match fs.tree_by_id(id) {
            Ok(t) => t,
            Err(e) => {
                report.problem(CheckArea::FsTree, format!("tree {}: {e}", tree_name(id)));
                continue;
            }
        };
        let mut pass = TreePass {
            id,
            root_dirid,
            no_holes: fs.superblock().incompat_flags & INCOMPAT_NO_HOLES != 0,
            sectorsize: fs.superblock().sectorsize as u64,
            generation: fs.superblock().generation,
            ..Default::default()
        };
        let iter = match tree.range(Key::MIN, Key::MAX) {
            Ok(i) => i,
            Err(e) => {
                report.problem(
                    CheckArea::TreeBlocks,
                    format!("tree {}: {e}", tree_name(id)),
                );
                continue;
            }
        };
        let mut readable = true;
        for item in iter {
            match item {
                Ok(item) => pass.item(item.key(), item.data(), &mut needs, report),
                Err(e) => {
                    report.problem(
                        CheckArea::TreeBlocks,
                        format!("tree {}: {e}", tree_name(id)),
                    );
                    readable = false;
                    break;
                }
            }
        }
        pass.finish_inode(report);
        // Cross checks need every item of the tree.
        if readable {
            pass.cross_check(report);
        }
        links.append(&mut pass.subvol_links);
    }
    root_refs(fs, &links, report)?;
    Ok(needs)
}

#[derive(Default)]
struct TreePass {
    id: u64,
    root_dirid: u64,
    no_holes: bool,
    sectorsize: u64,
    /// The last commit's generation: no inode may be newer.
    generation: u64,
    inode: Option<InodeState>,
    /// (inode, parent, index, name) of every INODE_REF/EXTREF entry.
    names: HashSet<(u64, u64, u64, Vec<u8>)>,
    /// DIR_INDEX entries by (directory, index).
    index: HashMap<(u64, u64), Entry>,
    /// DIR_ITEM entries by (directory, name).
    items: HashMap<(u64, Vec<u8>), Entry>,
    /// File type of every inode.
    kinds: HashMap<u64, u8>,
    /// Inodes without names (they need an orphan item).
    unlinked: Vec<u64>,
    orphans: HashSet<u64>,
    subvol_links: Vec<SubvolLink>,
}

fn file_type(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FT_REG_FILE,
        libc::S_IFDIR => FT_DIR,
        libc::S_IFCHR => FT_CHRDEV,
        libc::S_IFBLK => FT_BLKDEV,
        libc::S_IFIFO => FT_FIFO,
        libc::S_IFSOCK => FT_SOCK,
        libc::S_IFLNK => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}

impl TreePass {
    fn problem(&self, report: &mut CheckReport, what: String) {
        report.problem(
            CheckArea::FsTree,
            format!("tree {}: {what}", tree_name(self.id)),
        );
    }

    fn item(&mut self, key: Key, data: &[u8], needs: &mut CsumNeeds, report: &mut CheckReport) {
        if key.objectid == ORPHAN_OBJECTID && key.item_type == ORPHAN_ITEM_KEY {
            self.orphans.insert(key.offset);
            return;
        }
        if !(FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&key.objectid) {
            return;
        }
        if self.inode.as_ref().is_none_or(|s| s.ino != key.objectid) {
            self.finish_inode(report);
            self.inode = Some(InodeState {
                ino: key.objectid,
                ..Default::default()
            });
        }
        let ino = key.objectid;
        let parsed: Result<()> = (|| {
            match key.item_type {
                INODE_ITEM_KEY => {
                    let it = InodeItem::parse(data)?;
                    self.kinds.insert(ino, file_type(it.mode));
                    if let Some(s) = self.inode.as_mut() {
                        s.item = Some(it);
                    }
                }
                INODE_REF_KEY | INODE_EXTREF_KEY => {
                    let refs = if key.item_type == INODE_REF_KEY {
                        InodeRef::parse_refs(data, key.offset)?
                    } else {
                        InodeRef::parse_extrefs(data)?
                    };
                    for r in refs {
                        if let Some(s) = self.inode.as_mut() {
                            s.names += 1;
                        }
                        // The root directory's ".." names itself.
                        if ino == self.root_dirid && r.parent == ino {
                            continue;
                        }
                        self.names.insert((ino, r.parent, r.index, r.name));
                    }
                }
                DIR_ITEM_KEY | XATTR_ITEM_KEY => {
                    for e in DirItem::parse_all(data)? {
                        if name_hash(&e.name) != key.offset {
                            self.problem(
                                report,
                                format!(
                                    "{} {key}: the name {:?} does not hash to the key's offset",
                                    if key.item_type == DIR_ITEM_KEY {
                                        "directory item"
                                    } else {
                                        "xattr"
                                    },
                                    String::from_utf8_lossy(&e.name)
                                ),
                            );
                        }
                        if key.item_type == DIR_ITEM_KEY {
                            self.items.insert(
                                (ino, e.name.clone()),
                                Entry {
                                    name: e.name,
                                    location: e.location,
                                    file_type: e.file_type,
                                },
                            );
                        }
                    }
                }
                DIR_INDEX_KEY => {
                    let mut all = DirItem::parse_all(data)?;
                    if all.len() != 1 {
                        self.problem(
                            report,
                            format!("directory index {key} holds {} entries, not one", all.len()),
                        );
                    }
                    if let Some(e) = all.pop() {
                        if let Some(s) = self.inode.as_mut() {
                            s.dir_size += 2 * e.name.len() as u64;
                        }
                        if e.location.item_type == ROOT_ITEM_KEY {
                            self.subvol_links.push((
                                self.id,
                                ino,
                                key.offset,
                                e.name.clone(),
                                e.location.objectid,
                            ));
                        }
                        self.index.insert(
                            (ino, key.offset),
                            Entry {
                                name: e.name,
                                location: e.location,
                                file_type: e.file_type,
                            },
                        );
                    }
                }
                EXTENT_DATA_KEY => self.file_extent(key, data, needs, report)?,
                _ => {}
            }
            Ok(())
        })();
        if let Err(e) = parsed {
            self.problem(report, format!("item {key}: {e}"));
        }
    }

    fn file_extent(
        &mut self,
        key: Key,
        data: &[u8],
        needs: &mut CsumNeeds,
        report: &mut CheckReport,
    ) -> Result<()> {
        let fe = FileExtentItem::parse(data)?;
        let id = self.id;
        let no_holes = self.no_holes;
        let sectorsize = self.sectorsize.max(1);
        let Some(s) = self.inode.as_mut() else {
            return Ok(());
        };
        let mut problems = Vec::new();
        if s.extents && key.offset < s.extent_end {
            problems.push(format!(
                "inode {}: the file extent at {} overlaps the one before it (which ends at {})",
                s.ino, key.offset, s.extent_end
            ));
        } else if !no_holes
            && key.offset > s.extent_end
            // Past the file's end (space preallocated with KEEP_SIZE) a
            // gap is allowed.
            && s.item.as_ref().is_some_and(|i| s.extent_end < i.size)
        {
            problems.push(format!(
                "inode {}: no file extent covers {}..{} (a gap without the no-holes feature)",
                s.ino, s.extent_end, key.offset
            ));
        }
        s.extents = true;
        // An inline extent covers its whole sector.
        let len = match fe.body {
            ExtentBody::Inline(_) => fe.len().next_multiple_of(sectorsize),
            ExtentBody::Regular { .. } => fe.len(),
        };
        s.extent_end = key.offset.saturating_add(len);
        match &fe.body {
            ExtentBody::Inline(bytes) => {
                if key.offset != 0 {
                    problems.push(format!(
                        "inode {}: an inline extent at offset {}, not 0",
                        s.ino, key.offset
                    ));
                }
                if fe.compression == 0 && bytes.len() as u64 != fe.ram_bytes {
                    problems.push(format!(
                        "inode {}: an inline extent of {} bytes says it holds {}",
                        s.ino,
                        bytes.len(),
                        fe.ram_bytes
                    ));
                }
                s.nbytes += fe.ram_bytes;
            }
            ExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => {
                if *disk_bytenr != 0 {
                    s.nbytes += num_bytes;
                    let nodatasum = s
                        .item
                        .as_ref()
                        .is_some_and(|i| i.flags & INODE_NODATASUM != 0);
                    if fe.extent_type == FILE_EXTENT_REG && !nodatasum {
                        let (start, len) = if fe.compression != 0 {
                            (*disk_bytenr, *disk_num_bytes)
                        } else {
                            (disk_bytenr.saturating_add(*offset), *num_bytes)
                        };
                        needs.entry(start).or_insert_with(|| {
                            (
                                len,
                                format!(
                                    "tree {} inode {} offset {}",
                                    tree_name(id),
                                    s.ino,
                                    key.offset
                                ),
                            )
                        });
                    }
                }
            }
        }
        for p in problems {
            self.problem(report, p);
        }
        Ok(())
    }

    /// The checks of one inode, once all its items are read.
    fn finish_inode(&mut self, report: &mut CheckReport) {
        let Some(s) = self.inode.take() else {
            return;
        };
        let Some(item) = &s.item else {
            self.problem(
                report,
                format!("inode {} has items but no inode item", s.ino),
            );
            return;
        };
        report.inodes += 1;
        let kind = file_type(item.mode);
        if item.generation > self.generation || item.transid > self.generation {
            self.problem(
                report,
                format!(
                    "inode {}: generation {} and transid {}, past the filesystem's {}",
                    s.ino, item.generation, item.transid, self.generation
                ),
            );
        }
        if kind == FT_DIR {
            // A directory removed while open has no names and no links
            // until its orphan item is processed.
            if item.nlink != 1 && !(item.nlink == 0 && s.names == 0) {
                self.problem(
                    report,
                    format!("directory {} has link count {}, not 1", s.ino, item.nlink),
                );
            }
            if s.names > 1 {
                self.problem(report, format!("directory {} has {} names", s.ino, s.names));
            }
            if item.size != s.dir_size {
                self.problem(
                    report,
                    format!(
                        "directory {}: its size is {}, its entries add up to {}",
                        s.ino, item.size, s.dir_size
                    ),
                );
            }
        } else if item.nlink as u64 != s.names {
            self.problem(
                report,
                format!(
                    "inode {}: link count {}, but it has {} names",
                    s.ino, item.nlink, s.names
                ),
            );
        }
        if s.names == 0 && s.ino != self.root_dirid {
            self.unlinked.push(s.ino);
        }
        if matches!(kind, FT_REG_FILE | FT_SYMLINK) && item.nbytes != s.nbytes {
            self.problem(
                report,
                format!(
                    "inode {}: its byte count is {}, its file extents add up to {}",
                    s.ino, item.nbytes, s.nbytes
                ),
            );
        }
        if kind == FT_REG_FILE && !self.no_holes && s.extent_end < item.size {
            self.problem(
                report,
                format!(
                    "inode {}: no file extent covers {}..{} (a gap without the no-holes feature)",
                    s.ino, s.extent_end, item.size
                ),
            );
        }
    }

    /// Names against directory entries, once the whole tree is read.
    fn cross_check(&mut self, report: &mut CheckReport) {
        let mut problems = Vec::new();
        for (ino, parent, index, name) in &self.names {
            let shown = String::from_utf8_lossy(name);
            match self.index.get(&(*parent, *index)) {
                Some(e) if e.name == *name && e.location.objectid == *ino => {}
                Some(e) => problems.push(format!(
                    "inode {ino}: its name {shown:?} in directory {parent} (index {index}) is, by the directory index, {:?} naming {}",
                    String::from_utf8_lossy(&e.name),
                    e.location.objectid
                )),
                None => problems.push(format!(
                    "inode {ino}: its name {shown:?} in directory {parent} has no directory index {index}"
                )),
            }
            if self.kinds.get(parent).is_some_and(|k| *k != FT_DIR) {
                problems.push(format!(
                    "inode {ino}: its parent {parent} is not a directory"
                ));
            }
        }
        let mut indexed: HashSet<(u64, &[u8])> = HashSet::new();
        for ((dir, index), e) in &self.index {
            indexed.insert((*dir, &e.name));
            let shown = String::from_utf8_lossy(&e.name);
            // Each entry is in the directory twice: by index and by name.
            match self.items.get(&(*dir, e.name.clone())) {
                Some(i) if i.location == e.location && i.file_type == e.file_type => {}
                Some(i) => problems.push(format!(
                    "directory {dir}: entry {shown:?} names {} (type {}) by index {index}, {} (type {}) by name",
                    e.location, e.file_type, i.location, i.file_type
                )),
                None => problems.push(format!(
                    "directory {dir}: entry {shown:?} (index {index}) has no directory item"
                )),
            }
            match e.location.item_type {
                INODE_ITEM_KEY => {}
                ROOT_ITEM_KEY => continue,
                _ => {
                    problems.push(format!(
                        "directory {dir}: entry {shown:?} (index {index}) names {}, neither an inode nor a subvolume",
                        e.location
                    ));
                    continue;
                }
            }
            let ino = e.location.objectid;
            match self.kinds.get(&ino) {
                None => problems.push(format!(
                    "directory {dir}: entry {shown:?} (index {index}) names inode {ino}, which does not exist"
                )),
                Some(k) if *k != e.file_type => problems.push(format!(
                    "directory {dir}: entry {shown:?} says file type {}, inode {ino} is of type {k}",
                    e.file_type
                )),
                Some(_) => {
                    if !self.names.contains(&(ino, *dir, *index, e.name.clone())) {
                        problems.push(format!(
                            "directory {dir}: entry {shown:?} (index {index}) names inode {ino}, which has no such name"
                        ));
                    }
                }
            }
        }
        for ((dir, name), e) in &self.items {
            if !indexed.contains(&(*dir, name.as_slice())) {
                problems.push(format!(
                    "directory {dir}: item {:?} (naming {}) has no directory index",
                    String::from_utf8_lossy(name),
                    e.location.objectid
                ));
            }
        }
        for ino in &self.unlinked {
            if !self.orphans.contains(ino) {
                problems.push(format!("inode {ino} has no names and no orphan item"));
            }
        }
        problems.sort();
        for p in problems {
            self.problem(report, p);
        }
    }
}

/// Root refs, root backrefs, and the directory entries naming subvolumes.
fn root_refs(fs: &Filesystem, links: &[SubvolLink], report: &mut CheckReport) -> Result<()> {
    let mut refs: HashMap<(u64, u64), RootRef> = HashMap::new();
    let mut backrefs: HashMap<(u64, u64), RootRef> = HashMap::new();
    let mut live = Vec::new();
    for item in fs.root_tree().range(Key::MIN, Key::MAX)? {
        let item = item?;
        let key = item.key();
        match key.item_type {
            ROOT_REF_KEY | ROOT_BACKREF_KEY => match RootRef::parse(item.data()) {
                Ok(r) if key.item_type == ROOT_REF_KEY => {
                    refs.insert((key.objectid, key.offset), r);
                }
                Ok(r) => {
                    backrefs.insert((key.offset, key.objectid), r);
                }
                Err(e) => report.problem(CheckArea::RootRefs, format!("item {key}: {e}")),
            },
            ROOT_ITEM_KEY
                if (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&key.objectid)
                    && RootItem::parse(item.data()).is_ok_and(|r| r.refs > 0) =>
            {
                live.push(key.objectid);
            }
            _ => {}
        }
    }
    let mut problems = Vec::new();
    for ((parent, child), r) in &refs {
        match backrefs.get(&(*parent, *child)) {
            Some(b) if b == r => {}
            Some(_) => problems.push(format!(
                "subvolume {child}: its root ref and root backref in {parent} differ"
            )),
            None => problems.push(format!(
                "subvolume {child}: root ref in {parent} without a root backref"
            )),
        }
        let linked = links.iter().any(|(sv, dir, index, name, c)| {
            sv == parent && c == child && *dir == r.dirid && *index == r.sequence && *name == r.name
        });
        if !linked {
            problems.push(format!(
                "subvolume {child}: its root ref names {:?} in directory {} of {parent} (index {}), which has no such entry",
                String::from_utf8_lossy(&r.name),
                r.dirid,
                r.sequence
            ));
        }
    }
    for (parent, child) in backrefs.keys() {
        if !refs.contains_key(&(*parent, *child)) {
            problems.push(format!(
                "subvolume {child}: root backref to {parent} without a root ref"
            ));
        }
    }
    // A directory entry naming a subvolume without a root ref is what a
    // snapshot keeps of the subvolumes nested in its source: not wrong.
    for id in live {
        if !backrefs.keys().any(|(_, c)| *c == id) {
            problems.push(format!(
                "subvolume {id} is linked nowhere (no root backref)"
            ));
        }
    }
    problems.sort();
    for p in problems {
        report.problem(CheckArea::RootRefs, p);
    }
    Ok(())
}

//! `ubtrfs inspect dump-tree`: print tree blocks and every item, decoded.
//!
//! The output is line-oriented; every line starts with a word saying what it
//! is, then `name=value` pairs. Values never contain spaces: names and other
//! raw bytes are escaped (`\xNN` for a space, a backslash or any byte that is
//! not printable ASCII), keys are `(objectid,TYPE,offset)`, flag words are
//! `0xHEX(NAME|NAME)`, codes with a name are `N(name)`, modes are `0oOCTAL`,
//! times are `SECONDS.NANOSECONDS`. Only `problem` and `error` lines end in
//! free text.
//!
//! ```text
//! tree id=5 name=FS_TREE root_key=(5,ROOT_ITEM,0) bytenr=30638080 level=1 generation=11
//! node bytenr=30638080 level=1 items=8 free=113 generation=11 owner=5 fsid=... chunk_uuid=... flags=0x1(WRITTEN) backref_rev=1
//!   ptr slot=0 key=(256,INODE_ITEM,0) block=30408704 gen=8
//! leaf bytenr=30408704 level=0 items=51 free=838 generation=8 owner=5 ...
//!   item slot=0 key=(256,INODE_ITEM,0) itemoff=3835 itemsize=160 kind=inode_item
//!     fields generation=3 transid=8 size=36 ... mode=0o40755 ...
//!   item slot=2 key=(256,DIR_ITEM,2691869611) itemoff=3790 itemsize=33 kind=dir_item
//!     entry kind=dir_entry location=(310,INODE_ITEM,0) type=1(FILE) ... name=pre
//! ```
//!
//! Blocks are printed depth first: a node, then each child's subtree in key
//! order. A block that cannot be read is reported on an `error` line and
//! skipped; the command then fails at the end.

use anyhow::{Result, bail};
use std::io::Write;
use std::path::PathBuf;
use ubtrfs::format::consts::*;
use ubtrfs::format::describe::{self, Ctx, Value};
use ubtrfs::format::items::RootItem;
use ubtrfs::format::key::KEY_SIZE;
use ubtrfs::format::node::{Expect, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE, Node};
use ubtrfs::format::{Key, uuid_string};
use ubtrfs::fs::Filesystem;
use ubtrfs::tree::TreeReader;

/// Arguments of `inspect dump-tree`.
#[derive(clap::Args, Debug)]
pub struct DumpTreeArgs {
    /// The devices of the filesystem (image files or block devices).
    #[arg(value_name = "DEV", required = true)]
    devices: Vec<PathBuf>,
    /// Print only this tree: a name (root, extent, chunk, dev, fs, csum,
    /// quota, uuid, free-space, block-group, data-reloc, raid-stripe, log)
    /// or a tree id. May be given several times. Without it: the root tree,
    /// the chunk tree and every tree the root tree lists.
    #[arg(short = 't', long = "tree", value_name = "TREE")]
    trees: Vec<String>,
}

/// Tree names accepted by `-t`, with their ids.
const TREE_NAMES: &[(&str, u64)] = &[
    ("root", ROOT_TREE_OBJECTID),
    ("extent", EXTENT_TREE_OBJECTID),
    ("chunk", CHUNK_TREE_OBJECTID),
    ("dev", DEV_TREE_OBJECTID),
    ("device", DEV_TREE_OBJECTID),
    ("fs", FS_TREE_OBJECTID),
    ("csum", CSUM_TREE_OBJECTID),
    ("checksum", CSUM_TREE_OBJECTID),
    ("quota", QUOTA_TREE_OBJECTID),
    ("uuid", UUID_TREE_OBJECTID),
    ("free-space", FREE_SPACE_TREE_OBJECTID),
    ("block-group", BLOCK_GROUP_TREE_OBJECTID),
    ("data-reloc", DATA_RELOC_TREE_OBJECTID),
    ("raid-stripe", RAID_STRIPE_TREE_OBJECTID),
    ("log", TREE_LOG_OBJECTID),
];

/// The id of the tree named `name` on the command line.
fn parse_tree(name: &str) -> Result<u64> {
    let lower = name.to_ascii_lowercase().replace('_', "-");
    let bare = lower.strip_suffix("-tree").unwrap_or(&lower);
    if let Some((_, id)) = TREE_NAMES.iter().find(|(n, _)| *n == bare) {
        return Ok(*id);
    }
    if let Ok(id) = name.parse::<u64>() {
        return Ok(id);
    }
    if let Ok(id) = name.parse::<i64>() {
        return Ok(id as u64);
    }
    let names: Vec<&str> = TREE_NAMES.iter().map(|(n, _)| *n).collect();
    bail!(
        "unknown tree '{name}': give a tree id or one of {}",
        names.join(", ")
    )
}

/// One tree to print: where its root is and how it was found.
#[derive(Clone, Copy)]
struct TreeRoot {
    id: u64,
    /// The root item's key, for trees found in the root tree.
    root_key: Option<Key>,
    bytenr: u64,
    level: u8,
    generation: Option<u64>,
}

/// Run `inspect dump-tree`.
pub fn run(args: DumpTreeArgs) -> Result<()> {
    let fs = super::open_fs(&args.devices)?;
    let sb = fs.superblock();
    let ctx = Ctx {
        csum_size: sb.csum_type.size(),
        sectorsize: sb.sectorsize,
    };
    let root_items = root_items(&fs)?;
    let mut roots = Vec::new();
    if args.trees.is_empty() {
        roots.push(super_root(&fs, ROOT_TREE_OBJECTID));
        roots.push(super_root(&fs, CHUNK_TREE_OBJECTID));
        roots.extend(root_items);
        if sb.log_root != 0 {
            roots.push(super_root(&fs, TREE_LOG_OBJECTID));
        }
        let has_bg_root = roots.iter().any(|r| r.id == BLOCK_GROUP_TREE_OBJECTID);
        if sb.compat_ro_flags & COMPAT_RO_BLOCK_GROUP_TREE != 0 && !has_bg_root {
            roots.push(super_root(&fs, BLOCK_GROUP_TREE_OBJECTID));
        }
    } else {
        for name in &args.trees {
            let id = parse_tree(name)?;
            roots.push(select_root(&fs, id, &root_items)?);
        }
    }

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut dumper = Dumper {
        reader: fs.tree_reader(),
        ctx,
        failures: 0,
    };
    let result = (|| -> std::io::Result<()> {
        for root in &roots {
            dumper.tree(&mut out, root)?;
        }
        out.flush()
    })();
    match result {
        // `dump-tree | head` is normal use: stop quietly.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(e.into()),
        Ok(()) => {}
    }
    if dumper.failures > 0 {
        bail!(
            "{} tree block(s) could not be read (see the error lines)",
            dumper.failures
        );
    }
    Ok(())
}

/// The root of a tree the superblock points to.
fn super_root(fs: &Filesystem, id: u64) -> TreeRoot {
    let sb = fs.superblock();
    let (bytenr, level, generation) = match id {
        ROOT_TREE_OBJECTID => (sb.root, sb.root_level, Some(sb.generation)),
        CHUNK_TREE_OBJECTID => (
            sb.chunk_root,
            sb.chunk_root_level,
            Some(sb.chunk_root_generation),
        ),
        BLOCK_GROUP_TREE_OBJECTID => (
            sb.block_group_root,
            sb.block_group_root_level,
            Some(sb.block_group_root_generation),
        ),
        // The log tree: its generation is not recorded reliably.
        _ => (sb.log_root, sb.log_root_level, None),
    };
    TreeRoot {
        id,
        root_key: None,
        bytenr,
        level,
        generation,
    }
}

/// Every tree the root tree has a root item for, in key order.
fn root_items(fs: &Filesystem) -> Result<Vec<TreeRoot>> {
    let mut out = Vec::new();
    for item in fs.root_tree().range(Key::MIN, Key::MAX)? {
        let item = item?;
        let key = item.key();
        if key.item_type != ROOT_ITEM_KEY {
            continue;
        }
        match RootItem::parse(item.data()) {
            Ok(root) => out.push(TreeRoot {
                id: key.objectid,
                root_key: Some(key),
                bytenr: root.bytenr,
                level: root.level,
                generation: Some(root.generation),
            }),
            Err(e) => eprintln!("ubtrfs: warning: root item {}: {e}", show_key(&key)),
        }
    }
    Ok(out)
}

/// The root of tree `id` for `-t`.
fn select_root(fs: &Filesystem, id: u64, root_items: &[TreeRoot]) -> Result<TreeRoot> {
    let sb = fs.superblock();
    match id {
        ROOT_TREE_OBJECTID | CHUNK_TREE_OBJECTID => return Ok(super_root(fs, id)),
        TREE_LOG_OBJECTID if sb.log_root != 0 => return Ok(super_root(fs, id)),
        TREE_LOG_OBJECTID => bail!("the filesystem has no log tree"),
        _ => {}
    }
    // The last root item of that id is the newest one.
    if let Some(r) = root_items.iter().rev().find(|r| r.id == id) {
        return Ok(*r);
    }
    if id == BLOCK_GROUP_TREE_OBJECTID && sb.compat_ro_flags & COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        return Ok(super_root(fs, id));
    }
    bail!("the filesystem has no tree {}", tree_label(id))
}

/// A tree id as `NAME` or a number.
fn tree_label(id: u64) -> String {
    describe::tree_name(id).map_or_else(|| id.to_string(), str::to_string)
}

struct Dumper<'a> {
    reader: &'a TreeReader,
    ctx: Ctx,
    failures: usize,
}

impl Dumper<'_> {
    fn tree(&mut self, out: &mut impl Write, root: &TreeRoot) -> std::io::Result<()> {
        write!(out, "tree id={} name={}", root.id, tree_label(root.id))?;
        if let Some(k) = &root.root_key {
            write!(out, " root_key={}", show_key(k))?;
        }
        write!(out, " bytenr={} level={}", root.bytenr, root.level)?;
        if let Some(g) = root.generation {
            write!(out, " generation={g}")?;
        }
        writeln!(out)?;
        let expect = Expect {
            bytenr: root.bytenr,
            generation: root.generation,
            level: Some(root.level),
            first_key: None,
        };
        self.block(out, &expect)
    }

    fn block(&mut self, out: &mut impl Write, expect: &Expect) -> std::io::Result<()> {
        let node = match self.reader.read_node(expect) {
            Ok(node) => node,
            Err(e) => {
                self.failures += 1;
                return writeln!(out, "error bytenr={} {e}", expect.bytenr);
            }
        };
        write_header(out, &node)?;
        if node.is_leaf() {
            for slot in 0..node.nritems() {
                self.item(out, &node, slot)?;
            }
            return Ok(());
        }
        for slot in 0..node.nritems() {
            let p = node.key_ptr(slot);
            writeln!(
                out,
                "  ptr slot={slot} key={} block={} gen={}",
                show_key(&p.key),
                p.blockptr,
                p.generation
            )?;
        }
        for slot in 0..node.nritems() {
            let p = node.key_ptr(slot);
            let child = Expect {
                bytenr: p.blockptr,
                generation: Some(p.generation),
                level: Some(node.level().saturating_sub(1)),
                first_key: Some(p.key),
            };
            self.block(out, &child)?;
        }
        Ok(())
    }

    fn item(&self, out: &mut impl Write, node: &Node, slot: usize) -> std::io::Result<()> {
        let item = node.item(slot);
        let d = describe::describe(&item.key, item.data, &self.ctx);
        writeln!(
            out,
            "  item slot={slot} key={} itemoff={} itemsize={} kind={}",
            show_key(&item.key),
            item_offset(node, slot),
            item.data.len(),
            d.kind
        )?;
        if !d.fields.is_empty() {
            write!(out, "    fields")?;
            for (name, value) in &d.fields {
                write!(out, " {name}={}", show_value(value))?;
            }
            writeln!(out)?;
        }
        for e in &d.entries {
            write!(out, "    entry kind={}", e.kind)?;
            for (name, value) in &e.fields {
                write!(out, " {name}={}", show_value(value))?;
            }
            writeln!(out)?;
        }
        if let Some(p) = &d.problem {
            writeln!(out, "    problem {p}")?;
        }
        Ok(())
    }
}

/// The `node` or `leaf` line of a block.
fn write_header(out: &mut impl Write, node: &Node) -> std::io::Result<()> {
    let h = &node.header;
    let size = node.bytes().len();
    let n = node.nritems();
    let (word, free) = if node.is_leaf() {
        let data_start = if n == 0 {
            size - HEADER_SIZE
        } else {
            item_offset(node, n - 1)
        };
        ("leaf", data_start.saturating_sub(n * ITEM_SIZE))
    } else {
        (
            "node",
            ((size - HEADER_SIZE) / KEY_PTR_SIZE).saturating_sub(n),
        )
    };
    writeln!(
        out,
        "{word} bytenr={} level={} items={n} free={free} generation={} owner={} fsid={} chunk_uuid={} flags={} backref_rev={}",
        h.bytenr,
        h.level,
        h.generation,
        h.owner,
        uuid_string(&h.fsid),
        uuid_string(&h.chunk_tree_uuid),
        show_value(&describe::flags(
            h.flags & ((1 << 56) - 1),
            describe::HEADER_FLAG_NAMES
        )),
        h.flags >> 56
    )
}

/// Where item `slot`'s data starts, counted from the end of the header (as
/// btrfs-progs prints it).
fn item_offset(node: &Node, slot: usize) -> usize {
    let o = HEADER_SIZE + slot * ITEM_SIZE + KEY_SIZE;
    node.bytes()
        .get(o..o + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u32::from_le_bytes(b) as usize)
}

/// A key as `(objectid,TYPE,offset)`.
fn show_key(k: &Key) -> String {
    let t = describe::item_type_name(k.item_type)
        .map_or_else(|| format!("UNKNOWN.{}", k.item_type), str::to_string);
    format!("({},{t},{})", k.objectid, k.offset)
}

/// A value without spaces (see the module documentation).
fn show_value(v: &Value) -> String {
    match v {
        Value::U64(x) => x.to_string(),
        Value::Octal(x) => format!("0o{x:o}"),
        Value::Enum(x, Some(name)) => format!("{x}({name})"),
        Value::Enum(x, None) => x.to_string(),
        Value::Flags(x, names) if names.is_empty() => format!("{x:#x}"),
        Value::Flags(x, names) => format!("{x:#x}({})", names.join("|")),
        Value::Key(k) => show_key(k),
        Value::Uuid(u) => uuid_string(u),
        Value::Time(t) => format!("{}.{:09}", t.sec, t.nsec),
        Value::Bytes(b) => escape(b),
    }
}

/// Raw bytes with space, backslash and anything not printable ASCII as `\xNN`.
fn escape(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_graphic() && c != b'\\' {
            s.push(c as char);
        } else {
            s.push_str(&format!("\\x{c:02x}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_names_and_ids() {
        assert_eq!(parse_tree("fs").unwrap(), 5);
        assert_eq!(parse_tree("FREE_SPACE").unwrap(), 10);
        assert_eq!(parse_tree("free-space-tree").unwrap(), 10);
        assert_eq!(parse_tree("256").unwrap(), 256);
        assert_eq!(parse_tree("-9").unwrap(), DATA_RELOC_TREE_OBJECTID);
        assert!(parse_tree("nope").is_err());
    }

    #[test]
    fn values_have_no_spaces() {
        assert_eq!(escape(b"a b\\\xff"), "a\\x20b\\x5c\\xff");
        assert_eq!(show_value(&Value::Octal(0o40755)), "0o40755");
        assert_eq!(
            show_value(&Value::Flags(0x18, vec!["NOCOMPRESS", "PREALLOC"])),
            "0x18(NOCOMPRESS|PREALLOC)"
        );
        assert_eq!(show_value(&Value::Flags(0, vec![])), "0x0");
        assert_eq!(
            show_key(&Key::new(5, ROOT_ITEM_KEY, u64::MAX)),
            "(5,ROOT_ITEM,18446744073709551615)"
        );
        assert_eq!(show_key(&Key::new(0, 0, 0)), "(0,UNKNOWN.0,0)");
    }
}

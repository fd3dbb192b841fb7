#!/usr/bin/env python3
"""Deterministic file tree for the read benchmark (bench/read.sh).

Writes into an existing directory (the kernel's loop mount of a fresh btrfs
image) and prints a JSON summary on stdout. The same arguments always give
the same tree: names, sizes, contents, modes and times come from one seeded
generator. Contents are slices of two pools made once at start-up (random
bytes and source-like text), so generation runs at disk speed instead of
drawing random bytes per file.

Layout:
  src/      many small files (0-16 KiB, most of them text) in a nested tree,
            like a source checkout; a few symlinks, hard links and xattrs
  large/    a few large files, 128 KiB pieces alternating random bytes and
            text, so about half compressible (read.sh writes them with the
            fs remounted compress-force=zstd)
  bigfile   one large file of random bytes (incompressible), for `cat`
"""

import argparse
import json
import os
import random
import sys

KIB = 1024
MIB = 1024 * KIB
RAND_POOL = 32 * MIB
TEXT_POOL = 8 * MIB
PIECE = 128 * KIB  # the kernel compresses in 128 KiB units

WORDS = (
    "fn let mut pub struct impl return if else match for while loop use mod "
    "self Self u8 u16 u32 u64 usize Vec Option Some None Ok Err Result "
    "const static where trait enum break continue as in ref move unsafe "
    "#include int char void unsigned long static_inline struct_btrfs "
    "inode extent offset len buf key item node leaf root tree bytenr csum "
    "generation transaction device chunk stripe sector block path slot "
    "the a of to is and that it this with for on be are by not or from"
).split()
PUNCT = ["(", ")", "{", "}", ";", ",", ".", "->", "::", " = ", " + ", "[", "]", "&", "*"]


def text_pool(rng: random.Random, size: int) -> bytes:
    """Source-like text: indented lines of words and punctuation."""
    out = []
    total = 0
    while total < size:
        indent = "    " * rng.randrange(0, 5)
        n = rng.randrange(0, 14)
        toks = [rng.choice(WORDS) if rng.random() < 0.7 else rng.choice(PUNCT) for _ in range(n)]
        line = (indent + " ".join(toks) + "\n").encode()
        out.append(line)
        total += len(line)
    return b"".join(out)[:size]


class Gen:
    """Writes files; `rng` is the current part's generator."""

    def __init__(self, args, rand: bytes, text: bytes):
        self.args = args
        self.rand = rand
        self.text = text
        self.rng = random.Random(args.seed)
        self.stats = {"files": 0, "dirs": 0, "symlinks": 0, "hardlinks": 0, "xattrs": 0,
                      "bytes": 0, "small_bytes": 0, "large_bytes": 0, "big_bytes": 0}

    def part(self, name: str) -> None:
        self.rng = random.Random(f"{self.args.seed}/{name}")

    def slice_of(self, pool: bytes, n: int) -> bytes:
        off = self.rng.randrange(0, len(pool) - n + 1)
        return pool[off:off + n]

    def put(self, path: str, chunks, mode: int = 0o644) -> int:
        n = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            for c in chunks:
                os.write(fd, c)
                n += len(c)
        finally:
            os.close(fd)
        self.stats["files"] += 1
        self.stats["bytes"] += n
        return n

    def src(self) -> None:
        """A nested tree of small files, like a source checkout."""
        rng, st = self.rng, self.stats
        root = os.path.join(self.args.dest, "src")
        os.mkdir(root)
        dirs = [(root, 0)]
        ndirs = max(1, self.args.files // 20)
        for i in range(ndirs - 1):
            parent, depth = rng.choice(dirs)
            if depth >= 6:
                parent, depth = dirs[rng.randrange(0, min(len(dirs), 50))]
            d = os.path.join(parent, f"d{i:05d}_{rng.choice(WORDS).strip('#')}")
            os.mkdir(d)
            dirs.append((d, depth + 1))
        st["dirs"] += len(dirs)
        exts = [".rs", ".c", ".h", ".py", ".md", ".txt", ".o", ".json"]
        # Fixed timestamps, so restored trees can be compared by mtime too.
        base_ns = 1_600_000_000 * 10**9
        for i in range(self.args.files):
            d, _ = rng.choice(dirs)
            ext = rng.choice(exts)
            p = os.path.join(d, f"f{i:06d}{ext}")
            # Skewed towards small sizes: mean about 5.5 KiB; those up to
            # 2 KiB are inline in the metadata.
            size = int(16 * KIB * rng.random() ** 2)
            pool = self.rand if ext == ".o" else self.text
            mode = 0o755 if rng.random() < 0.05 else 0o644
            st["small_bytes"] += self.put(p, [self.slice_of(pool, size)] if size else [], mode)
            os.utime(p, ns=(base_ns + i * 1_000_003, base_ns + i * 999_983))
            r = rng.random()
            if r < 0.01:
                os.symlink(os.path.relpath(p, d), p + ".lnk")
                st["symlinks"] += 1
            elif r < 0.015:
                os.link(p, p + ".hard")
                st["hardlinks"] += 1
            elif r < 0.02:
                os.setxattr(p, "user.bench", self.slice_of(self.text, 64))
                st["xattrs"] += 1

    def large(self) -> None:
        """A few large files, about half compressible."""
        rng = self.rng
        large = os.path.join(self.args.dest, "large")
        os.mkdir(large)
        self.stats["dirs"] += 1
        remaining = self.args.large_mib * MIB
        count = self.args.large_count
        for i in range(count):
            left = count - i
            size = remaining if left == 1 else min(remaining, int(remaining / left * rng.uniform(0.5, 1.5)))
            size -= size % KIB
            remaining -= size

            def pieces(size=size):
                done = 0
                while done < size:
                    n = min(PIECE, size - done)
                    yield self.slice_of(self.rand if rng.random() < 0.5 else self.text, n)
                    done += n

            self.stats["large_bytes"] += self.put(os.path.join(large, f"large{i}.bin"), pieces())

    def big(self) -> None:
        """One big incompressible file."""

        def chunks():
            for _ in range(self.args.big_mib):
                yield self.slice_of(self.rand, MIB)

        self.stats["big_bytes"] += self.put(os.path.join(self.args.dest, "bigfile"), chunks())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--files", type=int, required=True, help="small files under src/")
    ap.add_argument("--large-mib", type=int, required=True, help="total MiB of files under large/")
    ap.add_argument("--large-count", type=int, default=6)
    ap.add_argument("--big-mib", type=int, required=True, help="size of /bigfile in MiB")
    ap.add_argument("--parts", default="src,large,big",
                    help="comma-separated parts to write, in this order; each part has "
                         "its own seeded generator, so splitting them changes nothing")
    args = ap.parse_args()

    pools = random.Random(args.seed)
    g = Gen(args, pools.randbytes(RAND_POOL), text_pool(pools, TEXT_POOL))
    for part in args.parts.split(","):
        if part not in ("src", "large", "big"):
            ap.error(f"unknown part {part!r}")
        g.part(part)
        getattr(g, part)()
    json.dump(g.stats, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

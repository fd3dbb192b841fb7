#!/usr/bin/env bash
# Read benchmark: ubtrfs vs the kernel's btrfs vs btrfs-progs' `btrfs restore`
# on the same image, cold cache. See bench/README.md.
#
#   sudo bench/read.sh [--quick] [--runs N] [--rebuild] [--detail] [--sync]
#                      [--xfs] [--dest-dir]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench),
# UBTRFS (the binary, default target/release/ubtrfs of this checkout),
# BENCH_HYPERFINE=1 (time with hyperfine instead of the built-in timer).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=read.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
RUNS=3
QUICK=0
REBUILD=0
DETAIL=0
SYNC=0
XFS=0
DEST_DIR_MODE=0

usage() {
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --quick     a ~200 MiB image instead of ~2 GiB (smoke run)
  --runs N    cold runs per measurement (default 3; the median is reported)
  --rebuild   regenerate the cached image even if it is up to date
  --detail    also restore only src/ (small files) and only /bigfile
  --sync      include `sync -f DEST` (writeback of the copy) in restore timings
  --xfs       also copy the same tree out of an XFS image (a kernel baseline
              without checksums and without btrfs)
  --dest-dir  copy into plain directories of BENCH_DIR's filesystem, removed
              between runs, instead of a fresh loop-mounted ext4 per run
EOF
}

parse_args "--runs:RUNS" \
    "--quick:QUICK=1 --rebuild:REBUILD=1 --detail:DETAIL=1 --sync:SYNC=1 --xfs:XFS=1 --dest-dir:DEST_DIR_MODE=1" "$@"

# --- prerequisites ---------------------------------------------------------
need_root "loop mounts, drop_caches"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive number"
cmds=(mkfs.btrfs mkfs.ext4 btrfs mount umount losetup mountpoint python3 sync findmnt diff)
((XFS)) && cmds+=("mkfs.xfs (xfsprogs)")
need_commands "btrfs-progs e2fsprogs xfsprogs python3 util-linux diffutils" "${cmds[@]}"
need_ubtrfs
need_drop_caches "(a container without it cannot run cold-cache benchmarks)"
need_kernel_fs btrfs
HYPERFINE=
if [[ ${BENCH_HYPERFINE:-0} == 1 ]]; then
    command -v hyperfine >/dev/null || die "BENCH_HYPERFINE=1 but no hyperfine (apt-get install hyperfine)"
    HYPERFINE=hyperfine
fi
GNU_TIME=
if [[ -x /usr/bin/time ]] && /usr/bin/time -f '%U' -o /dev/null true 2>/dev/null; then GNU_TIME=/usr/bin/time; fi

# --- parameters ------------------------------------------------------------
if ((QUICK)); then
    name=quick FILES=8000 LARGE_MIB=32 BIG_MIB=128 IMG_MIB=1024
    results=$BENCH_DIR/read-results-quick.md
else
    name=full FILES=100000 LARGE_MIB=384 BIG_MIB=1024 IMG_MIB=4096
    results=$BENCH_DIR/read-results.md
fi
SEED=20240601
mkdir -p "$BENCH_DIR/read"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
results=$BENCH_DIR/${results##*/}
W=$BENCH_DIR/read           # everything of this script but the results
IMG=$W/$name.img
MNT=$W/mnt
XMNT=$W/mnt-xfs
XIMG=$W/$name-xfs.img
OUT=$W/dest                 # destinations: $OUT/<tool>, each its own fs
RAW=$W/runs-$name.tsv
DEST_MIB=$((IMG_MIB * 2))
mkdir -p "$MNT" "$XMNT" "$OUT"

# Benchmarks sharing BENCH_DIR (and so the disk) take turns.
bench_lock

cleanup() {
    local m
    for m in "$MNT" "$XMNT" "$OUT"/*; do
        if mountpoint -q "$m" 2>/dev/null; then umount "$m" || umount -l "$m" || true; fi
    done
    rm -rf "$OUT"
    rm -f "$W"/dest-*.img "$W/ubtrfs.bin"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh, empty destination for `tool` at $OUT/tool. By default an ext4
# made anew in a file of BENCH_DIR (same disk) and loop-mounted: every run
# writes into the same empty filesystem, and nothing has to be deleted (on
# a filesystem mounted with `discard`, removing 100k files issues 100k
# synchronous discards and takes minutes). Reusing the file keeps its blocks
# allocated. With --dest-dir: a directory, removed.
fresh_dest() {
    local tool=$1 d=$OUT/$1 img=$W/dest-$1.img
    if ((DEST_DIR_MODE)); then
        rm -rf "$d"
        mkdir -p "$d"
        return
    fi
    if mountpoint -q "$d"; then umount "$d"; fi
    [[ -f $img ]] || truncate -s "${DEST_MIB}M" "$img"
    mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$img"
    mkdir -p "$d"
    mount -o loop "$img" "$d"
}

# Remove a copy while its metadata is still cached (directory mode only:
# after a drop_caches, deleting 100k files costs a random read per inode).
drop_dest() {
    if ((DEST_DIR_MODE)); then rm -rf "${OUT:?}/$1"; fi
}

umount_if() { if mountpoint -q "$1"; then umount "$1"; fi; }

# The binary may be rebuilt while we run (cargo in another shell): time a
# snapshot of it, so every run measures the same code.
bin_info="$("$UBTRFS" --version 2>/dev/null | head -1), binary of $(date -u -r "$UBTRFS" '+%Y-%m-%d %H:%M UTC')"
private_ubtrfs "$W"

# --- the image ---------------------------------------------------------------
gen_hash=$(cat "$here/gen_tree.py" | sha256sum | cut -c1-16)
stamp="v2 gen=$gen_hash seed=$SEED files=$FILES large=$LARGE_MIB big=$BIG_MIB img=$IMG_MIB"

build_image() {
    log "building $IMG ($stamp)"
    rm -f "$IMG" "$IMG.stamp" "$IMG.facts"
    truncate -s "${IMG_MIB}M" "$IMG"
    mkfs.btrfs -q -f -L ubtrfs-bench "$IMG" >/dev/null
    local t0=$SECONDS gen=(python3 "$here/gen_tree.py" --seed "$SEED" --files "$FILES"
        --large-mib "$LARGE_MIB" --big-mib "$BIG_MIB")
    # src/ and /bigfile uncompressed (the default); large/ with the fs
    # remounted compress-force=zstd, so every 128 KiB piece that shrinks is
    # compressed and the random ones are not. (Not a btrfs.compression
    # property: it would put a btrfs.* xattr on the files.)
    mount -o loop "$IMG" "$MNT"
    "${gen[@]}" --parts src,big "$MNT" >"$IMG.facts.1"
    mount -o remount,compress-force=zstd "$MNT"
    "${gen[@]}" --parts large "$MNT" >"$IMG.facts.2"
    sync -f "$MNT"
    btrfs filesystem df "$MNT" >"$IMG.df"
    umount "$MNT"
    python3 - "$IMG.facts.1" "$IMG.facts.2" >"$IMG.facts" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print(json.dumps({k: a[k] + b[k] for k in a}))
EOF
    rm -f "$IMG.facts.1" "$IMG.facts.2"
    echo "$stamp" >"$IMG.stamp"
    log "image written by the kernel in $((SECONDS - t0)) s: $(cat "$IMG.facts")"
}

if ((REBUILD)) || [[ ! -f $IMG.stamp || $(cat "$IMG.stamp") != "$stamp" || ! -f $IMG.facts ]]; then
    build_image
else
    log "reusing $IMG"
fi
fact() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$IMG.facts" "$1"; }
TOTAL_BYTES=$(fact bytes)
SMALL_BYTES=$(fact small_bytes)
BIG_BYTES=$(fact big_bytes)

if ((XFS)); then
    xstamp="$stamp xfs"
    if ((REBUILD)) || [[ ! -f $XIMG.stamp || $(cat "$XIMG.stamp") != "$xstamp" ]]; then
        log "building $XIMG (a copy of the btrfs image's tree)"
        rm -f "$XIMG" "$XIMG.stamp"
        truncate -s "${IMG_MIB}M" "$XIMG"
        mkfs.xfs -q -f "$XIMG"
        mount -o ro,loop "$IMG" "$MNT"
        mount -o loop "$XIMG" "$XMNT"
        cp -a "$MNT/." "$XMNT/"
        umount "$XMNT"
        umount "$MNT"
        echo "$xstamp" >"$XIMG.stamp"
    fi
fi

# --- timing ------------------------------------------------------------------
# One cold run: `prep` untimed (clean the destination, drop caches), then `cmd`
# timed. Appends "case tool run wall user sys maxrss_kib" to $RAW.
: >"$RAW"
tf=$W/.time

timed_run() { # case tool run prep cmd
    local case=$1 tool=$2 run=$3 prep=$4 cmd=$5 t0 t1 u=NA s=NA m=NA
    eval "$prep"
    drop_caches
    t0=$(date +%s%N)
    local rc=0
    if [[ -n $GNU_TIME ]]; then
        $GNU_TIME -f '%U %S %M' -o "$tf" bash -c "$cmd" || rc=$?
        ((rc)) || read -r u s m <"$tf"
    else
        bash -c "$cmd" || rc=$?
    fi
    if ((rc)); then
        log "FAILED ($rc): $cmd"
        tail -n 20 "$W/log-$tool.txt" 2>/dev/null >&2 || true
        die "$case: $tool failed; the measurement would mean nothing"
    fi
    t1=$(date +%s%N)
    local wall
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "$tool" "$run" "$wall" "$u" "$s" "$m" >>"$RAW"
    log "  $case $tool run $run: ${wall} s (user $u s, sys $s s, max RSS $m KiB)"
}

hyperfine_runs() { # case tool prep cmd
    local case=$1 tool=$2 prep=$3 cmd=$4 json=$W/.hf.json
    export -f fresh_dest umount_if
    export OUT W DEST_DIR_MODE DEST_MIB
    "$HYPERFINE" --runs "$RUNS" --shell=bash --style basic \
        --prepare "$prep; sync; echo 3 > /proc/sys/vm/drop_caches" \
        --export-json "$json" "$cmd" >&2
    python3 - "$json" "$case" "$tool" >>"$RAW" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
n = len(r["times"])
for i, t in enumerate(r["times"]):
    u = r.get("user", "NA"); s = r.get("system", "NA")
    print(f"{sys.argv[2]}\t{sys.argv[3]}\t{i + 1}\t{t:.3f}\t{u}\t{s}\tNA")
EOF
}

# measure case tool prep cmd [tool prep cmd]...: all tools of one case,
# interleaved run by run (so drift in the machine hits every tool alike).
measure() {
    local case=$1; shift
    local -a tools=() preps=() cmds=()
    while (($#)); do tools+=("$1"); preps+=("$2"); cmds+=("$3"); shift 3; done
    log "$case"
    local i r
    if [[ -n $HYPERFINE ]]; then
        for i in "${!tools[@]}"; do hyperfine_runs "$case" "${tools[i]}" "${preps[i]}" "${cmds[i]}"; done
        return
    fi
    for ((r = 1; r <= RUNS; r++)); do
        for i in "${!tools[@]}"; do
            timed_run "$case" "${tools[i]}" "$r" "${preps[i]}" "${cmds[i]}"
            # The last run's copy stays, for verify_restore.
            ((r == RUNS)) || drop_dest "${tools[i]}"
        done
    done
}

sync_cmd() { ((SYNC)) && printf ' && sync -f %q' "$1" || true; }

# Restore cases. The kernel runs include mount and umount (a cold mount reads
# the superblock and trees, as ubtrfs does when it opens the image).
# $1 case, $2 ubtrfs --path, $3 what cp copies (relative to the mount),
# $4 btrfs restore --path-regex (empty: everything)
restore_case() {
    local case=$1 upath=$2 ksrc=$3 regex=$4 d
    local -a args=() re=()
    [[ -n $regex ]] && re=(--path-regex "$regex")
    d=$OUT/ubtrfs
    args+=(ubtrfs "fresh_dest ubtrfs" "$(printf '%q restore --path %q %q %q >%q 2>&1' "$UBTRFS" "$upath" "$IMG" "$d" "$W/log-ubtrfs.txt")$(sync_cmd "$d")")
    d=$OUT/kernel
    args+=(kernel "umount_if $MNT; fresh_dest kernel" "$(printf 'mount -o ro,loop %q %q && cp -a %q %q && umount %q' "$IMG" "$MNT" "$MNT/$ksrc" "$d/" "$MNT")$(sync_cmd "$d")")
    d=$OUT/btrfs-restore
    args+=(btrfs-restore "fresh_dest btrfs-restore" "$(printf 'btrfs restore -m -x -S' ; printf ' %q' "${re[@]}" "$IMG" "$d"; printf ' >%q 2>&1' "$W/log-btrfs-restore.txt")$(sync_cmd "$d")")
    if ((XFS)); then
        d=$OUT/xfs
        args+=(xfs "umount_if $XMNT; fresh_dest xfs" "$(printf 'mount -o ro,loop %q %q && cp -a %q %q && umount %q' "$XIMG" "$XMNT" "$XMNT/$ksrc" "$d/" "$XMNT")$(sync_cmd "$d")")
    fi
    measure "$case" "${args[@]}"
}

# The last runs' copies are still there: check that ubtrfs restored what the
# kernel sees (names, types, sizes, modes, owners, mtimes, link counts, bytes).
verify_restore() {
    local case=$1 a=$OUT/ubtrfs b=$OUT/kernel
    log "checking the $case copies of ubtrfs and the kernel against each other"
    local la lb
    la=$(cd "$a" && find . -path ./lost+found -prune -o -printf '%P %y %s %m %U %G %n %T@ %l\n' | grep -v '^ d ' | sort | sha256sum)
    lb=$(cd "$b" && find . -path ./lost+found -prune -o -printf '%P %y %s %m %U %G %n %T@ %l\n' | grep -v '^ d ' | sort | sha256sum)
    if [[ $la != "$lb" ]]; then
        VERIFY+="- $case: **metadata differs** between the ubtrfs and kernel copies\n"
        log "WARNING: $case: file listings differ (compare: find $a $b -printf ...)"
        return
    fi
    if ! diff -rq --no-dereference -x lost+found "$a" "$b" >&2; then
        VERIFY+="- $case: **contents differ** between the ubtrfs and kernel copies\n"
        log "WARNING: $case: contents differ"
        return
    fi
    VERIFY+="- $case: ubtrfs copy identical to the kernel's (names, types, sizes, modes, owners, mtimes, link counts, contents)\n"
}

VERIFY=
start=$SECONDS
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${load_start%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n / 4) }'; then
    log "WARNING: load average $load_start on $(nproc) CPUs: other work will disturb the timings"
fi

restore_case restore-all / . ""
verify_restore restore-all
for t in ubtrfs kernel btrfs-restore xfs; do drop_dest $t; done
if ((DETAIL)); then
    restore_case restore-src /src src/. '^/(|src(|/.*))$'
    for t in ubtrfs kernel btrfs-restore xfs; do drop_dest $t; done
    restore_case restore-bigfile /bigfile bigfile '^/(|bigfile)$'
    for t in ubtrfs kernel btrfs-restore xfs; do drop_dest $t; done
fi
for m in "$OUT"/*; do umount_if "$m"; done

# cat: the kernel side is mounted before the caches are dropped and times only
# `cat`; ubtrfs' time includes opening the image (superblock, chunk and root
# trees), which is a few tree blocks.
cat_args=(ubtrfs "true" "$(printf '%q cat %q /bigfile >/dev/null 2>%q' "$UBTRFS" "$IMG" "$W/log-ubtrfs.txt")")
cat_args+=(kernel "mountpoint -q $MNT || mount -o ro,loop $IMG $MNT" "cat $MNT/bigfile >/dev/null")
((XFS)) && cat_args+=(xfs "mountpoint -q $XMNT || mount -o ro,loop $XIMG $XMNT" "cat $XMNT/bigfile >/dev/null")
measure cat-bigfile "${cat_args[@]}"
umount_if "$MNT"
umount_if "$XMNT"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$((SECONDS - start))

# --- report ------------------------------------------------------------------
host_facts
disk_facts
backing_opts=$(findmnt -no OPTIONS --target "$BENCH_DIR")
img_alloc=$(du -B1M "$IMG" | cut -f1)
image_summary=$(python3 - "$IMG.facts" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['files']} files ({d['bytes'] / 1e6:.0f} MB), {d['dirs']} directories, "
      f"{d['symlinks']} symlinks, {d['hardlinks']} hard links, {d['xattrs']} xattrs; "
      f"src/ {d['small_bytes'] / 1e6:.0f} MB in files of 0-16 KiB, "
      f"large/ {d['large_bytes'] / 1e6:.0f} MB (zstd, about half compressible), "
      f"/bigfile {d['big_bytes'] / 1e6:.0f} MB (incompressible)")
EOF
)

python3 - "$RAW" "$results" <<EOF
import statistics, sys
from collections import defaultdict

raw, out = sys.argv[1], sys.argv[2]
runs = defaultdict(list)
order = []
for line in open(raw):
    case, tool, run, wall, u, s, m = line.rstrip("\n").split("\t")
    if case not in order:
        order.append(case)
    runs[(case, tool)].append((float(wall), u, s, m))

size = {
    "restore-all": $TOTAL_BYTES,
    "restore-src": $SMALL_BYTES,
    "restore-bigfile": $BIG_BYTES,
    "cat-bigfile": $BIG_BYTES,
}
what = {
    "restore-all": "restore whole image",
    "restore-src": "restore src/ (small files)",
    "restore-bigfile": "restore /bigfile only",
    "cat-bigfile": "cat /bigfile > /dev/null",
}
tools = ["ubtrfs", "kernel", "btrfs-restore", "xfs"]
have = [t for t in tools if any(k[1] == t for k in runs)]

def med(case, tool, i=0):
    v = runs.get((case, tool))
    if not v:
        return None
    xs = [float(r[i]) for r in v if r[i] != "NA"]
    return statistics.median(xs) if xs else None

def fmt(x, nd=2):
    return "n/a" if x is None else f"{x:.{nd}f}"

def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"**{a / b:.2f}**"

def mbs(case, t):
    return None if t is None or t == 0 else size[case] / t / 1e6

names = {"ubtrfs": "ubtrfs", "kernel": "kernel btrfs", "btrfs-restore": "btrfs restore", "xfs": "kernel xfs"}
L = []
L.append("| workload | data MB | " + " | ".join(f"{names[t]} s" for t in have)
         + " | ubtrfs / kernel | ubtrfs / btrfs restore | "
         + " | ".join(f"{names[t]} MB/s" for t in have) + " |")
L.append("|" + "---|" * (4 + 2 * len(have)))
for case in order:
    m = {t: med(case, t) for t in have}
    L.append(f"| {what.get(case, case)} | {size[case] / 1e6:.0f} | "
             + " | ".join(fmt(m[t]) for t in have)
             + f" | {ratio(m['ubtrfs'], m.get('kernel'))} | {ratio(m['ubtrfs'], m.get('btrfs-restore'))} | "
             + " | ".join(fmt(mbs(case, m[t]), 0) for t in have) + " |")
L.append("")
L.append("Medians of $RUNS cold-cache runs; ratio < 1 means ubtrfs is faster.")
L.append("")
L.append("CPU time of the timed process tree (median user + sys seconds, max RSS). "
         "Kernel work done in kernel threads (loop device, btrfs end-io and checksum "
         "workers, writeback) is not counted, so only the ubtrfs and btrfs restore "
         "columns are complete.")
L.append("")
L.append("| workload | " + " | ".join(f"{names[t]} user+sys s (max RSS MiB)" for t in have) + " |")
L.append("|" + "---|" * (1 + len(have)))
for case in order:
    cells = []
    for t in have:
        u, s, rss = med(case, t, 1), med(case, t, 2), med(case, t, 3)
        if u is None:
            cells.append("n/a")
        else:
            cells.append(f"{u:.2f} + {s:.2f}" + (f" ({rss / 1024:.0f})" if rss else ""))
    L.append(f"| {what.get(case, case)} | " + " | ".join(cells) + " |")
L.append("")
L.append("All runs (seconds): " + "; ".join(
    f"{case} {t}: " + ", ".join(f"{r[0]:.2f}" for r in runs[(case, t)])
    for case in order for t in have if (case, t) in runs))
table = "\n".join(L)
with open(out + ".table", "w") as f:
    f.write(table + "\n")
EOF

{
    echo "## Read benchmark ($name image)"
    echo
    echo "$(date -u +%Y-%m-%d), checkout $commit$dirty ($bin_info), \`bench/read.sh$( ((QUICK)) && echo ' --quick')$( ((DETAIL)) && echo ' --detail')$( ((SYNC)) && echo ' --sync')$( ((XFS)) && echo ' --xfs')\`, $RUNS runs, ${elapsed} s of measuring."
    echo
    cat "$results.table"
    echo
    echo "What was timed:"
    echo
    echo "- ubtrfs: \`ubtrfs restore IMG DEST\`, \`ubtrfs cat IMG /bigfile\` (opening the image included)."
    echo "- kernel btrfs: restore = \`mount -o ro,loop\` + \`cp -a MNT/. DEST\` + \`umount\`, all three timed;"
    echo "  cat = \`cat MNT/bigfile\` only (mounted before the caches were dropped)."
    echo "- btrfs restore: \`btrfs restore -m -x -S IMG DEST\` (btrfs-progs $(btrfs --version | awk '{print $2}'); owners, modes, times, xattrs, symlinks; it copies hard links as separate files)."
    ((XFS)) && echo "- kernel xfs: the same tree copied into an XFS image of the same size; same commands as kernel btrfs."
    echo "- Before every run: an empty destination, then \`sync\` and \`echo 3 > /proc/sys/vm/drop_caches\`."
    if ((SYNC)); then
        echo "- The writeback of the copy (\`sync -f DEST\`) is inside the restore timings."
    else
        echo "- The writeback of the copy is not timed (the copy ends in the page cache; \`sync\` runs before the next run)."
    fi
    if ((DEST_DIR_MODE)); then
        echo "- Destination: a directory in $OUT, on the same filesystem as the image, removed between runs."
    else
        echo "- Destination: a fresh ext4 per run (mkfs before each run; same sizes for every tool), in a file next to the image, loop-mounted."
    fi
    echo
    echo "Image: $IMG, $((IMG_MIB)) MiB file ($img_alloc MiB allocated), written by the kernel through a loop mount:"
    echo "$image_summary."
    echo "mkfs.btrfs defaults (4 KiB sectors, 16 KiB nodes, crc32c, metadata DUP)."
    echo
    echo "Checks:"
    echo
    printf '%b' "$VERIFY"
    echo
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r), load average $load_start at the start, $load_end at the end;"
    echo "\`$BENCH_DIR\` is $backing ($backing_opts; disk $disk, rotational=$rot, scheduler $sched, read_ahead_kb $ra)."
    [[ -n $HYPERFINE ]] && echo "Timed with $(hyperfine --version)." || echo "Timed with date +%s%N around each command${GNU_TIME:+, CPU and RSS from GNU time}."
} >"$results"
rm -f "$results.table"

echo
cat "$results"
echo
log "saved to $results; per-run times in $RAW"

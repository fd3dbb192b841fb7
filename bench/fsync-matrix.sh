#!/usr/bin/env bash
# Checksum-offload matrix (seed 003): ubtrfs' data checksum modes inline,
# offload and auto, on memory-backed images (tmpfs: a fast device) and on an
# image file on disk (a slow device), across device layouts, checksum
# algorithms, job counts and write patterns; kernel btrfs on loop devices
# over the same kind of files as a reference. See bench/README.md.
#
#   sudo bench/fsync-matrix.sh [--quick] [--runs N] [--modes LIST] [--csums LIST]
#        [--profiles LIST] [--jobs LIST] [--workloads LIST] [--no-kernel]
#        [--noise F] [--report RUNS.jsonl]
#
# Environment: BENCH_DIR (results, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary), SHM_DIR (images, default /dev/shm/ubtrfs-fsync-matrix),
# CSUM_OPT (how a mode is asked for, printf format, default "csum=%s",
# passed as `-o csum=inline`).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=fsync-matrix.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
SHM_DIR=${SHM_DIR:-/dev/shm/ubtrfs-fsync-matrix}
CSUM_OPT=${CSUM_OPT:-csum=%s}
QUICK=0
RUNS=
MODES="inline offload auto"
CSUMS=
PROFILES=
JOBS=
WORKLOADS=
KERNEL=1
NOISE=0.05
REPORT_FROM=

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --quick            smoke run: single device, crc32c and sha256, 1 and 2
                     jobs, 256 MiB per point, one run (about 4 minutes)
  --runs N           runs per cell, the median is reported (default 3; 1 with --quick)
  --noise F          a cell passes if auto >= (1 - F) x the better fixed mode
                     (default 0.05: the requirement "auto never worse")
  --modes LIST       checksum modes (default "inline offload auto")
  --csums LIST       checksum algorithms for mkfs.btrfs --csum
                     (default: all four, crc32c xxhash sha256 blake2)
  --profiles LIST    device layouts: single (one device on tmpfs), raid0 (four
                     devices on tmpfs, data raid0, metadata raid1, the layout
                     of seed 003), disk (one image file in BENCH_DIR, on disk:
                     the slow device) (default "single disk")
  --jobs LIST        fio numjobs (default "1 4"; seed 003 went to 96 on 96 CPUs)
  --workloads LIST   buffered1m: 1 MiB buffered writes, one fsync at the end
                       (the fio job of seed 003), MiB/s;
                     fsync1m: 1 MiB writes, fsync after each, IOPS;
                     fsync64k: 64 KiB writes, fsync after each (seed 000), IOPS;
                     rand4k16: random 4 KiB writes, fsync every 16 (seed 000), IOPS
                     (default: all four)
  --no-kernel        skip the kernel btrfs reference rows
  --report FILE      measure nothing: print the report of the runs in FILE (the
                     jsonl of an earlier run, or several concatenated)
EOF
}

parse_args "--runs:RUNS --modes:MODES --csums:CSUMS --profiles:PROFILES --jobs:JOBS --workloads:WORKLOADS
    --report:REPORT_FROM --noise:NOISE" "--quick:QUICK=1 --no-kernel:KERNEL=0" "$@"

# --- prerequisites ---------------------------------------------------------
if [[ -n $REPORT_FROM ]]; then
    [[ -r $REPORT_FROM ]] || die "cannot read $REPORT_FROM"
else
need_root "loop devices, mounts"
need_commands "fio btrfs-progs fuse3 python3 util-linux coreutils" \
    fio mkfs.btrfs mount umount losetup fusermount3 findmnt python3 timeout
need_ubtrfs
need_fuse
fi

if ((QUICK)); then
    name=quick
    RUNS=${RUNS:-1}; CSUMS=${CSUMS:-crc32c sha256}; PROFILES=${PROFILES:-single}
    JOBS=${JOBS:-1 2}; WORKLOADS=${WORKLOADS:-buffered1m fsync1m fsync64k rand4k16}
    DATA_MIB=256; RUNTIME=3
else
    name=full
    RUNS=${RUNS:-3}; CSUMS=${CSUMS:-crc32c xxhash sha256 blake2}; PROFILES=${PROFILES:-single disk}
    JOBS=${JOBS:-1 4}; WORKLOADS=${WORKLOADS:-buffered1m fsync1m fsync64k rand4k16}
    DATA_MIB=512; RUNTIME=3
fi
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive number"
for m in $MODES; do [[ $m =~ ^(inline|offload|auto)$ ]] || die "unknown mode $m"; done
for c in $CSUMS; do [[ $c =~ ^(crc32c|xxhash|sha256|blake2)$ ]] || die "unknown checksum $c"; done
for p in $PROFILES; do [[ $p =~ ^(single|raid0|disk)$ ]] || die "unknown profile $p"; done
for w in $WORKLOADS; do [[ $w =~ ^(buffered1m|fsync1m|fsync64k|rand4k16)$ ]] || die "unknown workload $w"; done
[[ $NOISE =~ ^0?\.[0-9]+$ ]] || die "--noise wants a fraction like 0.05"
for j in $JOBS; do [[ $j =~ ^[1-9][0-9]*$ ]] || die "--jobs wants positive numbers"; done

if [[ -n $REPORT_FROM ]]; then
    RAW=$REPORT_FROM
    results=${REPORT_FROM%.jsonl}-report.md
    OUT=$BENCH_DIR/fsync-matrix
    UBTRFS_ID="see the runs in $REPORT_FROM"
    LOAD_START='?'
    elapsed='?'
    MODE_OPT_OK=1
    RUNS=$(python3 -c 'import json,sys; print(max(json.loads(l)["run"] for l in open(sys.argv[1]) if l.strip()))' "$RAW")
else
shm_fs=$(stat -f -c %T "$(dirname "$SHM_DIR")" 2>/dev/null || echo '?')
[[ $shm_fs == tmpfs || $shm_fs == ramfs ]] || die "$(dirname "$SHM_DIR") is $shm_fs, not memory: set SHM_DIR to a tmpfs directory"
# Room for the largest layout plus the data of one point, with a margin.
need_mib=$((DATA_MIB * 3 + 1024))
avail_mib=$(df -m --output=avail "$(dirname "$SHM_DIR")" | tail -1 | tr -d ' ')
((avail_mib > need_mib)) || die "$(dirname "$SHM_DIR") has $avail_mib MiB free, the matrix needs about $need_mib MiB"

mkdir -p "$BENCH_DIR" "$SHM_DIR"
# One benchmark at a time on this work directory (the disk profile uses it).
bench_lock
if [[ " $PROFILES " == *" disk "* ]]; then
    disk_avail=$(df -m --output=avail "$BENCH_DIR" | tail -1 | tr -d ' ')
    ((disk_avail > DATA_MIB * 2 + 1024)) || die "$BENCH_DIR has $disk_avail MiB free; the disk profile needs about $((DATA_MIB * 2 + 1024)) MiB"
fi
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
OUT=$BENCH_DIR/fsync-matrix
mkdir -p "$OUT/fio"
RAW=$BENCH_DIR/fsync-matrix-runs-$name.jsonl
results=$BENCH_DIR/fsync-matrix-results$( ((QUICK)) && echo -quick || true).md
ULOG=$OUT/log-ubtrfs.txt
MNT=$SHM_DIR/mnt
mkdir -p "$MNT"
private_ubtrfs "$OUT"
: >"$RAW"
: >"$ULOG"
TICK=$(getconf CLK_TCK)

UPID=
LOOPS=()
cleanup() {
    if findmnt -rn -M "$MNT" >/dev/null 2>&1; then
        fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    fi
    if [[ -n $UPID ]]; then
        for _ in {1..100}; do kill -0 "$UPID" 2>/dev/null || break; sleep 0.1; done
        kill "$UPID" 2>/dev/null || true
    fi
    local l
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
    rm -rf "${SHM_DIR:?}"
    rm -f "$OUT/disk0.img"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- devices ------------------------------------------------------------------
# single: one 4 GiB file; raid0: four files of 1.5 GiB, data raid0, metadata
# raid1 (seed 003's RAID0 setups). Sparse files on tmpfs: only what is
# written takes memory, and it is freed with the files.
DEVS=()
fresh_fs() { # profile csum
    local p=$1 c=$2 i
    rm -f "$SHM_DIR"/dev*
    DEVS=()
    case $p in
        single) DEVS=("$SHM_DIR/dev0"); truncate -s 4G "${DEVS[0]}"
                mkfs.btrfs -f -m single -d single --csum "$c" "${DEVS[@]}" >"$OUT/log-mkfs.txt" 2>&1 ;;
        raid0) for i in 0 1 2 3; do DEVS+=("$SHM_DIR/dev$i"); truncate -s 1536M "$SHM_DIR/dev$i"; done
               mkfs.btrfs -f -m raid1 -d raid0 --csum "$c" "${DEVS[@]}" >"$OUT/log-mkfs.txt" 2>&1 ;;
        # The slow device: an image file on the disk under BENCH_DIR. Its
        # writes land in the page cache; each fsync waits for the disk.
        disk) DEVS=("$OUT/disk0.img"); rm -f "${DEVS[0]}"; truncate -s 4G "${DEVS[0]}"
              mkfs.btrfs -f -m single -d single --csum "$c" "${DEVS[@]}" >"$OUT/log-mkfs.txt" 2>&1 ;;
    esac || { cat "$OUT/log-mkfs.txt" >&2; die "mkfs.btrfs $p $c failed"; }
}

mount_ubtrfs() { # mode ("" for the mount's default)
    local mode=$1 opt=()
    [[ -n $mode ]] && opt=(-o "$(printf "$CSUM_OPT" "$mode")")
    echo "=== $(date +%T) mount ${opt[*]} ${DEVS[*]}" >>"$ULOG"
    setsid -w "$UBTRFS" mount "${opt[@]}" "${DEVS[@]}" "$MNT" >>"$ULOG" 2>&1 &
    UPID=$!
    wait_fuse_mount "$MNT" "$UPID" && return 0
    wait "$UPID" 2>/dev/null || true
    UPID=
    return 1
}

umount_ubtrfs() {
    local rc=0
    fusermount3 -u "$MNT" || fusermount3 -u -z "$MNT" || rc=$?
    wait "$UPID" || rc=$?
    UPID=
    return $rc
}

mount_kernel() {
    local d l opts=
    LOOPS=()
    for d in "${DEVS[@]}"; do
        l=$(losetup -f --show "$d")
        LOOPS+=("$l")
        opts+="${opts:+,}device=$l"
    done
    # device= names every member, so nothing depends on udev having scanned them.
    mount -o "$opts" "${LOOPS[0]}" "$MNT"
}

umount_kernel() {
    local l
    umount "$MNT"
    for l in "${LOOPS[@]}"; do losetup -d "$l"; done
    LOOPS=()
}

# --- can the mount choose the mode? -----------------------------------------------
MODE_OPT_OK=1
fresh_fs single crc32c
if mount_ubtrfs inline; then
    umount_ubtrfs || true
else
    MODE_OPT_OK=0
    why=$(grep -v '^===' "$ULOG" | tail -n 1)
    log "WARNING: \`ubtrfs mount -o $(printf "$CSUM_OPT" inline)\` is refused: $why"
    log "WARNING: the mount has no way to choose the checksum mode (the library has"
    log "         Filesystem::set_csum_mode(CsumMode::{Inline,Offload,Auto})); measuring the"
    log "         mount's default mode only. Set CSUM_OPT if the option has another name."
    MODES=default
fi

# --- one point ------------------------------------------------------------------
fio_args() { # workload jobs
    local per=$((DATA_MIB / $2))
    ((per >= 1)) || per=1
    local common="--ioengine=psync --direct=0 --fallocate=none --group_reporting=1 --output-format=json --name=writers --directory=$MNT --numjobs=$2"
    case $1 in
        buffered1m) echo "$common --rw=write --bs=1m --end_fsync=1 --size=${per}M" ;;
        fsync1m) echo "$common --rw=write --bs=1m --fsync=1 --size=${per}M --time_based --runtime=$RUNTIME" ;;
        fsync64k) echo "$common --rw=write --bs=64k --fsync=1 --size=${per}M --time_based --runtime=$RUNTIME" ;;
        rand4k16) echo "$common --rw=randwrite --bs=4k --fsync=16 --size=${per}M --time_based --runtime=$RUNTIME --randrepeat=1" ;;
    esac
}

point() { # engine(ubtrfs|kernel) mode profile csum workload jobs run
    local eng=$1 mode=$2 p=$3 c=$4 w=$5 n=$6 run=$7 json t0 t1 rc=0 cpu0=0 cpu1=0 ok=1 err=
    json=$OUT/fio/$eng-$mode-$p-$c-$w-$n-$run.json
    fresh_fs "$p" "$c"
    if [[ $eng == ubtrfs ]]; then
        mount_ubtrfs "$([[ $mode == default ]] || echo "$mode")" || die "ubtrfs mount failed: $(tail -n 3 "$ULOG")"
        cpu0=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$UPID/stat")
    else
        mount_kernel
    fi
    sync
    t0=$(now_ns)
    # shellcheck disable=SC2046
    timeout --kill-after=20 $((RUNTIME * 10 + DATA_MIB / 4 + 120)) fio --output="$json" $(fio_args "$w" "$n") \
        >"$OUT/log-fio.txt" 2>&1 || rc=$?
    t1=$(now_ns)
    [[ $eng == ubtrfs && -r /proc/$UPID/stat ]] && cpu1=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$UPID/stat")
    ((rc)) && { ok=0; err="fio exit status $rc"; log "    fio failed: $(tail -n 2 "$OUT/log-fio.txt" | tr '\n' ' ')"; }
    if [[ $eng == ubtrfs ]]; then
        umount_ubtrfs || { ok=0; err="${err:+$err; }last commit failed"; }
    else
        umount_kernel
    fi
    python3 - "$json" "$eng" "$mode" "$p" "$c" "$w" "$n" "$run" "$t0" "$t1" "$((cpu1 - cpu0))" "$TICK" "$ok" "$err" "$DATA_MIB" >>"$RAW" <<'EOF'
import json, sys
json_path, eng, mode, p, c, w, n, run, t0, t1, cpu, tick, ok, err, data_mib = sys.argv[1:]
r = {"eng": eng, "mode": mode, "profile": p, "csum": c, "wl": w, "jobs": int(n), "run": int(run),
     "wall_s": (int(t1) - int(t0)) / 1e9, "cpu_s": int(cpu) / int(tick), "ok": int(ok), "err": err}
try:
    j = json.load(open(json_path))["jobs"][0]
    r["io_bytes"] = j["write"]["io_bytes"]
    r["iops"] = j["write"]["iops"]
    if j.get("sync", {}).get("total_ios"):
        r["fsyncs"] = j["sync"]["total_ios"]
        r["fsync_mean_us"] = j["sync"]["lat_ns"]["mean"] / 1e3
except Exception as e:
    r["ok"] = 0
    r["err"] = r["err"] or f"no fio output ({e})"
# buffered1m: MiB/s over the wall time (the final fsync included);
# the fsync workloads: fio's IOPS over its time-based run.
r["mibs"] = r.get("io_bytes", 0) / 2**20 / r["wall_s"] if w == "buffered1m" else r.get("iops", 0) * {"fsync1m": 1, "fsync64k": 1 / 16, "rand4k16": 1 / 256}[w]
print(json.dumps(r))
EOF
    python3 - "$RAW" <<'EOF' >&2
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
v = f"{r['mibs']:7.1f} MiB/s" if r["wl"] == "buffered1m" else f"{r.get('iops', 0):7.0f} IOPS"
print(f"    {r['eng']:<6} {r['mode']:<8} {r['profile']:<6} {r['csum']:<7} {r['wl']:<10} jobs {r['jobs']:>2} run {r['run']}: {v}"
      + (f", ubtrfs CPU {r['cpu_s']:.2f} s" if r["eng"] == "ubtrfs" else "")
      + ("" if r["ok"] else f"  FAILED: {r['err']}"))
EOF
}

LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$LOAD_START" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    log "WARNING: load average $LOAD_START on $(nproc) CPUs: other work is running; the numbers will be noisy"
fi
start=$SECONDS
log "matrix: modes [$MODES] x profiles [$PROFILES] x csums [$CSUMS] x jobs [$JOBS] x workloads [$WORKLOADS], $RUNS run(s)$( ((KERNEL)) && echo ', plus kernel btrfs')"
for p in $PROFILES; do
    for c in $CSUMS; do
        for w in $WORKLOADS; do
            for n in $JOBS; do
                for ((r = 1; r <= RUNS; r++)); do
                    # Rotate the order of the modes from run to run, so a slow
                    # phase of the machine does not always hit the same mode.
                    read -r -a ms <<<"$MODES"
                    k=$(( (r - 1) % ${#ms[@]} ))
                    ms=("${ms[@]:k}" "${ms[@]:0:k}")
                    for m in "${ms[@]}"; do point ubtrfs "$m" "$p" "$c" "$w" "$n" "$r"; done
                    ((KERNEL)) && point kernel kernel "$p" "$c" "$w" "$n" "$r"
                done
            done
        done
    done
done
elapsed=$((SECONDS - start))
fi

# --- report ----------------------------------------------------------------------
host_facts

{
    echo "## Checksum-offload matrix ($name)"
    echo
    echo "$(date -u +%Y-%m-%d), ubtrfs $commit$dirty (binary $UBTRFS_ID), \`bench/fsync-matrix.sh$( ((QUICK)) && echo ' --quick') --runs $RUNS\`, ${elapsed} s of measuring."
    echo
    if ((!MODE_OPT_OK)); then
        echo "**The mount cannot choose the checksum mode**: \`ubtrfs mount -o $(printf "$CSUM_OPT" inline)\` is refused,"
        echo "so only the mount's default mode was measured. The library has"
        echo "\`Filesystem::set_csum_mode(CsumMode::{Inline,Offload,Auto})\`; the mount needs an option for it."
        echo
    fi
    python3 - "$RAW" "$MODES" "$NOISE" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
modes = sys.argv[2].split()
noise = float(sys.argv[3])
have_kernel = any(r["eng"] == "kernel" for r in rows)
cells = []
for r in rows:
    k = (r["profile"], r["csum"], r["wl"], r["jobs"])
    if k not in cells:
        cells.append(k)
field = {"buffered1m": "mibs", "fsync1m": "iops", "fsync64k": "iops", "rand4k16": "iops"}
def runs(k, eng, mode, fld):
    return [r[fld] for r in rows if (r["profile"], r["csum"], r["wl"], r["jobs"]) == k
            and r["eng"] == eng and r["mode"] == mode and r["ok"] and fld in r]
def med(k, eng, mode, fld):
    xs = runs(k, eng, mode, fld)
    return statistics.median(xs) if xs else None
def f(x, nd=1):
    return "n/a" if x is None else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{nd}f}")
unit = {"buffered1m": "MiB/s", "fsync1m": "IOPS", "fsync64k": "IOPS", "rand4k16": "IOPS"}
what = {"buffered1m": "1 MiB writes, fsync at the end",
        "fsync1m": "1 MiB writes, fsync each",
        "fsync64k": "64 KiB writes, fsync each",
        "rand4k16": "random 4 KiB writes, fsync every 16"}
dev = {"single": "tmpfs", "raid0": "tmpfs x4 raid0", "disk": "disk"}
fixed = [m for m in modes if m in ("inline", "offload")]
judge = "auto" in modes and len(fixed) == 2
head = "| device | csum | workload | jobs | unit | " + " | ".join(f"ubtrfs {m}" for m in modes)
if judge:
    head += " | auto / best fixed | run spread | verdict"
if have_kernel:
    head += " | kernel btrfs | ubtrfs best / kernel"
head += " | ubtrfs CPU s (" + " / ".join(modes) + ") |"
print(head)
print("|" + "---|" * (head.count("|") - 1))
ratios, fails, spreads = [], [], []
for k in cells:
    p, c, w, n = k
    v = {m: med(k, "ubtrfs", m, field[w]) for m in modes}
    line = f"| {dev[p]} | {c} | {what[w]} | {n} | {unit[w]} | " + " | ".join(f(v[m]) for m in modes)
    if judge:
        best = max((v[m] for m in fixed if v[m] is not None), default=None)
        # Run-to-run spread of this cell: for each mode, (max - min) / median
        # of its runs; the median over the modes.
        sp = [(max(xs) - min(xs)) / statistics.median(xs) for m in modes
              if len(xs := runs(k, "ubtrfs", m, field[w])) > 1 and statistics.median(xs) > 0]
        spread = statistics.median(sp) if sp else None
        if spread is not None:
            spreads.append(spread)
        if best and v["auto"] is not None:
            q = v["auto"] / best
            ratios.append((q, k))
            verdict = "ok" if q >= 1 - noise else ("within spread" if spread is not None and q >= 1 - spread else "**LOSS**")
            if q < 1 - noise:
                fails.append((q, k, spread, verdict))
            line += f" | **{q:.2f}** | " + ("n/a" if spread is None else f"{spread:.0%}") + f" | {verdict}"
        else:
            line += " | n/a | n/a | n/a"
    if have_kernel:
        kv = med(k, "kernel", "kernel", field[w])
        best_u = max((x for x in v.values() if x is not None), default=None)
        line += f" | {f(kv)} | " + (f"**{best_u / kv:.2f}**" if kv and best_u else "n/a")
    line += " | " + " / ".join(f(med(k, "ubtrfs", m, "cpu_s"), 2) for m in modes) + " |"
    print(line)
print()
if judge and ratios:
    qs = sorted(q for q, _ in ratios)
    print(f"`auto` / better fixed mode over {len(qs)} cells: min **{qs[0]:.2f}**, median {statistics.median(qs):.2f}, "
          f"max {qs[-1]:.2f}; {sum(q >= 1 - noise for q in qs)} of {len(qs)} cells at or above {1 - noise:.2f}"
          + (f"; median run spread {statistics.median(spreads):.0%}" if spreads else "") + ".")
    print()
    # The same statistic for each fixed mode against the better of the
    # other two: what "one mode over the best of two" gives on this machine
    # when nothing but noise tells the modes apart.
    for m in fixed:
        others = [o for o in modes if o != m]
        xs = []
        for k in cells:
            w = k[2]
            v = {o: med(k, "ubtrfs", o, field[w]) for o in modes}
            best = max((v[o] for o in others if v[o] is not None), default=None)
            if best and v[m] is not None:
                xs.append(v[m] / best)
        if xs:
            xs.sort()
            print(f"For comparison, {m} / better of ({', '.join(others)}): min {xs[0]:.2f}, median {statistics.median(xs):.2f}; "
                  f"{sum(x >= 1 - noise for x in xs)} of {len(xs)} cells at or above {1 - noise:.2f}.")
    print()
    for q, (p, c, w, n), spread, verdict in sorted(fails):
        print(f"- below {1 - noise:.2f}: {dev[p]} {c} {w} jobs {n}: {q:.2f}"
              + ("" if spread is None else f" (run spread {spread:.0%}: {verdict})"))
    if fails:
        print()
fails = [r for r in rows if not r["ok"]]
if fails:
    print("Failures: " + "; ".join(f"{r['eng']} {r['mode']} {r['profile']} {r['csum']} {r['wl']} jobs {r['jobs']} run {r['run']}: {r['err']}" for r in fails))
    print()
EOF
    echo "Medians of $RUNS run(s) per cell, the modes' order rotated from run to run; higher is better."
    echo "\"auto / best fixed\": auto's median over the better of inline's and offload's medians; the"
    echo "requirement is >= $(awk -v n="$NOISE" 'BEGIN { print 1 - n }') (\`--noise $NOISE\`). \"run spread\": (max - min) / median of"
    echo "one mode's runs in the cell, the median over the modes: how far two runs of the same thing"
    echo "differ on this machine; a cell below the bar but within its spread is marked so."
    if ((KERNEL)); then echo "\"ubtrfs best / kernel\" > 1 means ubtrfs is faster."; fi
    echo
    echo "- Memory-backed: every device is a sparse file in \`$SHM_DIR\` (tmpfs), made anew with"
    echo "  \`mkfs.btrfs --csum C\` for every run; single: one 4 GiB device, \`-m single -d single\`; raid0: four"
    echo "  1.5 GiB devices, \`-m raid1 -d raid0\`. ubtrfs mounts the files; the kernel mounts loop devices over them."
    echo "  disk: one 4 GiB image file in \`$OUT\` on $(df -T "$OUT" | awk 'NR == 2 { print $2 " (" $1 ")" }'), \`-m single -d single\`: writes land in the"
    echo "  page cache, every fsync waits for the disk."
    echo "- buffered1m: \`fio --rw=write --bs=1m --direct=0 --ioengine=psync --end_fsync=1\`, $DATA_MIB MiB in all split"
    echo "  over the jobs, MiB/s from the wall time; fsync1m / fsync64k: \`--fsync=1\`; rand4k16: \`--rw=randwrite --bs=4k"
    echo "  --fsync=16\`; those three time-based, $RUNTIME s, fio's IOPS."
    echo "- ubtrfs CPU: utime + stime of the ubtrfs process during fio (all its threads, checksum workers included)."
    echo "- The kernel picks its own checksum placement (no knob on this kernel unless \`/sys/fs/btrfs/UUID/offload_csum\` exists); it is a reference, not a mode."
    echo "- Load average at the start: $LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg)."
    echo
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r), $(btrfs --version | head -1), fio $(fio --version | sed 's/^fio-//')."
} >"$results"

echo
cat "$results"
echo
if [[ -n $REPORT_FROM ]]; then
    log "saved to $results"
else
    log "saved to $results; every run in $RAW, fio output in $OUT/fio, ubtrfs log in $ULOG"
fi

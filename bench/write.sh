#!/usr/bin/env bash
# Write benchmark: ubtrfs (FUSE mount) vs the kernel's btrfs vs XFS, each on
# an image file of the same size on the same disk, in one run. See
# bench/README.md.
#
#   sudo bench/write.sh [--quick] [--runtime S] [--jobs "1 2 4 8 16"] [--sections 1,2,3,4]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench),
# UBTRFS (the binary, default target/release/ubtrfs of this checkout),
# IMG_SIZE (default 4G), MKFS_BTRFS_OPTS (default "-m single -d single").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=write.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-4G}
# Seed 000 made its filesystem with "-d single -m single"; so do we, for
# both btrfs targets (mkfs.btrfs defaults to DUP metadata, which doubles
# every metadata write; set MKFS_BTRFS_OPTS="" for the defaults).
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS--m single -d single}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
QUICK=0
RUNTIME=
JOBS=
SECTIONS=1,2,3,4

usage() {
    sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --quick          smoke run: jobs 1 and 4, 3 s per fio point, 256 MiB
                   sequential file, 5,000-file tarball (about 3 minutes)
  --runtime S      seconds per fio point of section 1 (default 8; 3 with --quick)
  --jobs LIST      numjobs values of section 1 (default "1 2 4 8 16")
  --sections LIST  which sections to run (default 1,2,3,4):
                   1 seed-000 fsync jobs, 2 sequential 1 MiB write/read,
                   3 tarball extract / first reads / rm -rf, 4 device I/O per fsync
EOF
}

parse_args "--runtime:RUNTIME --jobs:JOBS --sections:SECTIONS" "--quick:QUICK=1" "$@"

# --- prerequisites ---------------------------------------------------------
need_root "loop devices, mounts, drop_caches"
need_commands "fio btrfs-progs xfsprogs fuse3 python3 util-linux tar coreutils strace" \
    fio mkfs.btrfs btrfs mkfs.xfs mount umount losetup fusermount3 findmnt python3 tar timeout strace
need_ubtrfs
need_drop_caches
need_fuse
need_kernel_fs btrfs xfs
[[ $SECTIONS =~ ^[1-4](,[1-4])*$ ]] || die "--sections wants a list like 1,3"
section_on() { [[ ,$SECTIONS, == *,$1,* ]]; }

# --- parameters ------------------------------------------------------------
if ((QUICK)); then
    name=quick
    JOBS=${JOBS:-1 4}; RUNTIME=${RUNTIME:-3}; FILE_TOTAL_MIB=256; SEQ_MIB=256
    TAR_FILES=5000; WHERE_RUNTIME=3; WHERE_JOBS="1 4"
else
    name=full
    JOBS=${JOBS:-1 2 4 8 16}; RUNTIME=${RUNTIME:-8}; FILE_TOTAL_MIB=1024; SEQ_MIB=1024
    TAR_FILES=30000; WHERE_RUNTIME=5; WHERE_JOBS="1 16"
fi
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "--runtime wants a positive number of seconds"
for j in $JOBS; do [[ $j =~ ^[1-9][0-9]*$ ]] || die "--jobs wants positive numbers"; done
SEED=20240601
TICK=$(getconf CLK_TCK)
mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/write            # images, mount points, fio output, logs
mkdir -p "$W/fio"
RAW=$BENCH_DIR/write-runs-$name.jsonl
results=$BENCH_DIR/write-results$( ((QUICK)) && echo -quick || true).md
ULOG=$W/log-ubtrfs.txt
HELPER=$W/.helper.py
private_ubtrfs "$W"
: >"$RAW"
: >"$ULOG"

TARGETS=(ubtrfs btrfs xfs)
declare -A DEV=()       # target -> device it is mounted from (image file or /dev/loopN)
declare -A UPID=()      # ubtrfs target -> pid of its `ubtrfs mount` process
UMOUNT_S=0              # wall time of the last unmount (commit included)

img_of() { echo "$W/$1.img"; }
mnt_of() { echo "$W/mnt-$1"; }

# --- cleanup: only what this script set up --------------------------------
cleanup() {
    local t m
    for t in "${!DEV[@]}"; do
        m=$(mnt_of "$t")
        if findmnt -rn -M "$m" >/dev/null 2>&1; then
            case $t in
                ubtrfs*) fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true ;;
                *) umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true ;;
            esac
        fi
        if [[ -n ${UPID[$t]:-} ]]; then
            # Give the last commit time to finish; then stop our own process.
            for _ in {1..100}; do kill -0 "${UPID[$t]}" 2>/dev/null || break; sleep 0.1; done
            kill "${UPID[$t]}" 2>/dev/null || true
        fi
        [[ ${DEV[$t]} == /dev/loop* ]] && losetup -d "${DEV[$t]}" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }

# --- targets -------------------------------------------------------------------
# Targets: ubtrfs (FUSE, on the image file), ubtrfs-loop (FUSE, on a loop
# device over the image file: section 4, to count device requests), btrfs
# (kernel, loop device), xfs (kernel, loop device).

fresh_fs() { # target: a new sparse image of IMG_SIZE with a new filesystem
    case $1 in
        xfs) mkfs_image "$(img_of "$1")" xfs "$1" ;;
        *) mkfs_image "$(img_of "$1")" btrfs "$1" ;;
    esac
}

do_mount() { # target
    local t=$1 img mnt src
    img=$(img_of "$t")
    mnt=$(mnt_of "$t")
    mkdir -p "$mnt"
    case $t in
        ubtrfs) DEV[$t]=$img ;;
        *) DEV[$t]=$(losetup -f --show "$img") ;;
    esac
    src=${DEV[$t]}
    case $t in
        ubtrfs*)
            echo "=== $(date +%T) mount $src $mnt" >>"$ULOG"
            setsid -w "$UBTRFS" mount "$src" "$mnt" >>"$ULOG" 2>&1 &
            UPID[$t]=$!
            wait_fuse_mount "$mnt" "${UPID[$t]}" && return 0
            tail -n 20 "$ULOG" >&2
            die "ubtrfs mount of $src on $mnt did not come up"
            ;;
        *) mount "$src" "$mnt" ;;
    esac
}

# Unmount, making everything durable (kernel: umount commits and flushes;
# ubtrfs: `fusermount3 -u`, then the process makes its last commit and
# exits). Sets UMOUNT_S. Returns non-zero if the ubtrfs commit failed.
do_umount() { # target
    local t=$1 mnt t0 rc=0
    mnt=$(mnt_of "$t")
    t0=$(now_ns)
    case $t in
        ubtrfs*)
            # findmnt reads mountinfo: it works even if the process died (ENOTCONN).
            if findmnt -rn -M "$mnt" >/dev/null; then
                fusermount3 -u "$mnt" || fusermount3 -u -z "$mnt" || rc=$?
            fi
            wait "${UPID[$t]}" || rc=$?
            unset "UPID[$t]"
            ;;
        *) umount "$mnt" ;;
    esac
    UMOUNT_S=$(secs "$t0" "$(now_ns)")
    [[ ${DEV[$t]} == /dev/loop* ]] && losetup -d "${DEV[$t]}"
    unset "DEV[$t]"
    if ((rc)); then
        log "WARNING: $t: unmount/last commit failed (rc $rc); see $ULOG"
        tail -n 5 "$ULOG" >&2
    fi
    return $rc
}

# If a FUSE request hangs, fio cannot be killed: abort our own connection.
abort_fuse() { # target
    local mnt conn
    mnt=$(mnt_of "$1")
    # A FUSE mount's device is 0:N; its connection is /sys/fs/fuse/connections/N.
    conn=$(findmnt -rn -M "$mnt" -o MAJ:MIN 2>/dev/null | cut -d: -f2)
    if [[ -n $conn && -w /sys/fs/fuse/connections/$conn/abort ]]; then
        log "aborting FUSE connection $conn of $mnt"
        echo 1 >"/sys/fs/fuse/connections/$conn/abort"
    fi
}

# One line of counters for before/after deltas: wall clock, machine CPU
# (busy ticks, all CPUs), loop device requests, the ubtrfs process' CPU and
# write syscalls.
snap() { # target
    local t=$1 out
    # /proc/stat cpu: user nice system idle iowait irq softirq steal (steal is not ours).
    out="t=$(now_ns) busy=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat)"
    if [[ ${DEV[$t]:-} == /dev/loop* ]]; then
        # /sys/block/loopN/stat: 5 writes completed, 7 sectors written,
        # 16 flush requests completed (Documentation/block/stat.rst).
        out+=" $(awk '{ printf "dw=%s dsec=%s dfl=%s", $5, $7, $16 }' "/sys/block/${DEV[$t]#/dev/}/stat")"
    fi
    if [[ -n ${UPID[$t]:-} && -r /proc/${UPID[$t]}/stat ]]; then
        # Fields 14 and 15 (utime, stime) of all threads; the name in
        # parentheses may hold spaces, so count from its end.
        out+=" $(awk '{ sub(/^.*\) /, ""); printf "ucpu=%d", $12 + $13 }' "/proc/${UPID[$t]}/stat")"
        out+=" $(awk '/^wchar/ { printf "wchar=%s ", $2 } /^syscw/ { printf "syscw=%s", $2 }' "/proc/${UPID[$t]}/io")"
    fi
    echo "$out"
}

row() { python3 "$HELPER" row "$@" >>"$RAW"; }
# A field of the last row written (`last_row wall_s`), or DEFAULT where
# it has none (`last_row d_ucpu 0`).
last_row() { # field [default]
    python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(r[sys.argv[2]] if len(sys.argv) < 4 else r.get(sys.argv[2], sys.argv[3]))' "$RAW" "$@"
}

# --- the helper: rows and the report -------------------------------------------
cat >"$HELPER" <<'PYEOF'
import json, statistics, sys
from collections import OrderedDict

def kv(s):
    out = {}
    for part in s.split():
        k, _, v = part.partition("=")
        out[k] = v
    return out

def num(v):
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v

def cmd_row(args):
    """row key=value... [--fio JSON] [--before SNAP --after SNAP] [--strace FILE]"""
    r = OrderedDict()
    i = 0
    before = after = None
    while i < len(args):
        a = args[i]
        if a == "--fio":
            fio_fields(r, args[i + 1]); i += 2
        elif a == "--before":
            before = kv(args[i + 1]); i += 2
        elif a == "--after":
            after = kv(args[i + 1]); i += 2
        elif a == "--strace":
            r["syscalls"] = strace_counts(args[i + 1]); i += 2
        else:
            k, _, v = a.partition("=")
            r[k] = num(v); i += 1
    if before and after:
        for k in after:
            if k in before:
                r["d_" + k] = int(after[k]) - int(before[k])
        r["wall_s"] = r.pop("d_t") / 1e9
    print(json.dumps(r))

def fio_fields(r, path):
    try:
        d = json.load(open(path))
        j = d["jobs"][0]
    except Exception as e:
        r["ok"] = 0
        r["err"] = f"fio output unreadable: {e}"
        return
    if j.get("error"):
        r["ok"] = 0
        r["err"] = f"fio error {j['error']}"
    for side in ("write", "read"):
        s = j[side]
        if s["io_bytes"]:
            r["iops"] = s["iops"]
            r["mibs"] = s["bw_bytes"] / 2**20
            r["io_bytes"] = s["io_bytes"]
            r["ios"] = s["total_ios"]
            r["runtime_ms"] = s["runtime"]
    sy = j.get("sync", {})
    if sy.get("total_ios"):
        r["fsyncs"] = sy["total_ios"]
        r["fsync_mean_us"] = sy["lat_ns"]["mean"] / 1e3
        p = sy["lat_ns"].get("percentile", {})
        if "99.000000" in p:
            r["fsync_p99_us"] = p["99.000000"] / 1e3

def strace_counts(path):
    calls = {}
    for line in open(path):
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    return calls

# ------------------------------------------------------------------------------
NAMES = {"ubtrfs": "ubtrfs", "btrfs": "kernel btrfs", "xfs": "XFS",
         "ubtrfs-loop": "ubtrfs (loop device)", "ubtrfs-strace": "ubtrfs (strace)"}

def fmt(x, nd=0):
    if x is None:
        return "n/a"
    if nd == 0 and abs(x) >= 100:
        return f"{x:,.0f}"
    if nd == 0:
        nd = 1 if abs(x) >= 10 else 2
    return f"{x:.{nd}f}"

def ratio(a, b):
    if a is None or b is None or b == 0:
        return "n/a"
    return f"**{a / b:.2f}**"

def cmd_report(args):
    raw, tick = args[0], int(args[1])
    rows = [json.loads(l) for l in open(raw) if l.strip()]
    L = []
    def get(sec, wl, tgt, jobs=None):
        for r in rows:
            if r.get("sec") == sec and r.get("wl") == wl and r.get("tgt") == tgt \
                    and (jobs is None or r.get("jobs") == jobs):
                return r
        return None
    def ok(r):
        return r is not None and r.get("ok", 1) == 1
    def val(r, k):
        return r.get(k) if ok(r) else None
    failures = [r for r in rows if r.get("ok", 1) != 1]

    # 1. fsync jobs
    wls = [("seq64k-fsync1", "Sequential 64 KiB writes, fsync after each (`--rw=write --bs=64k --fsync=1`)"),
           ("rand4k-fsync16", "Random 4 KiB writes, fsync every 16 (`--rw=randwrite --bs=4k --fsync=16`)")]
    if any(r.get("sec") == "fsync" for r in rows):
        L.append("### 1. Seed 000 fsync jobs")
        L.append("")
        for wl, title in wls:
            jobs = sorted({r["jobs"] for r in rows if r.get("sec") == "fsync" and r.get("wl") == wl})
            if not jobs:
                continue
            L.append(f"**{title}**, each job its own file; IOPS and MiB/s: higher is better, "
                     "ratios < 1 mean ubtrfs is slower.")
            L.append("")
            L.append("| jobs | ubtrfs IOPS | kernel btrfs IOPS | XFS IOPS | ubtrfs MiB/s | kernel btrfs MiB/s | XFS MiB/s "
                     "| ubtrfs / kernel btrfs | ubtrfs / XFS | fsync mean ms (ubtrfs / btrfs / XFS) | fsync p99 ms (ubtrfs / btrfs / XFS) |")
            L.append("|" + "---|" * 11)
            for n in jobs:
                rs = {t: get("fsync", wl, t, n) for t in ("ubtrfs", "btrfs", "xfs")}
                iops = {t: val(rs[t], "iops") for t in rs}
                mibs = {t: val(rs[t], "mibs") for t in rs}
                lat = " / ".join(fmt(val(rs[t], "fsync_mean_us") / 1e3 if val(rs[t], "fsync_mean_us") is not None else None, 2) for t in rs)
                p99 = " / ".join(fmt(val(rs[t], "fsync_p99_us") / 1e3 if val(rs[t], "fsync_p99_us") is not None else None, 2) for t in rs)
                L.append(f"| {n} | " + " | ".join(fmt(iops[t]) for t in rs) + " | "
                         + " | ".join(fmt(mibs[t], 1) for t in rs)
                         + f" | {ratio(iops['ubtrfs'], iops['btrfs'])} | {ratio(iops['ubtrfs'], iops['xfs'])} | {lat} | {p99} |")
            L.append("")
        # I/O and CPU per fsync, every run
        L.append("Device I/O and CPU behind each point. Kernel targets: requests completed by the loop "
                 "device (`/sys/block/loopN/stat`); ubtrfs: bytes it passed to write syscalls (`wchar` of "
                 "`/proc/PID/io`: image writes plus the small FUSE replies) and its CPU time "
                 "(`/proc/PID/stat` utime+stime). Machine CPU is all busy time of all CPUs (fio included), per MiB written.")
        L.append("")
        L.append("| workload | jobs | fsyncs (u / b / x) | btrfs dev writes / fsync | XFS dev writes / fsync "
                 "| KiB written / fsync (ubtrfs / btrfs / XFS) | btrfs flushes / fsync | XFS flushes / fsync "
                 "| ubtrfs CPU ms / MiB | machine CPU ms / MiB (u / b / x) |")
        L.append("|" + "---|" * 10)
        for wl, _ in wls:
            for n in sorted({r["jobs"] for r in rows if r.get("sec") == "fsync" and r.get("wl") == wl}):
                rs = {t: get("fsync", wl, t, n) for t in ("ubtrfs", "btrfs", "xfs")}
                per = lambda r, k: (r[k] / r["fsyncs"]) if ok(r) and r.get("fsyncs") and k in r else None
                kib = lambda r: (per(r, "d_dsec") * 512 / 1024) if per(r, "d_dsec") is not None else None
                ukib = (per(rs["ubtrfs"], "d_wchar") / 1024) if per(rs["ubtrfs"], "d_wchar") is not None else None
                def cpu_per_mib(r, k):
                    if not ok(r) or k not in r or not r.get("io_bytes"):
                        return None
                    return r[k] / tick * 1e3 / (r["io_bytes"] / 2**20)
                L.append(f"| {wl} | {n} | " + " / ".join(fmt(val(rs[t], 'fsyncs')) for t in rs)
                         + f" | {fmt(per(rs['btrfs'], 'd_dw'), 1)} | {fmt(per(rs['xfs'], 'd_dw'), 1)}"
                         + f" | {fmt(ukib, 1)} / {fmt(kib(rs['btrfs']), 1)} / {fmt(kib(rs['xfs']), 1)}"
                         + f" | {fmt(per(rs['btrfs'], 'd_dfl'), 2)} | {fmt(per(rs['xfs'], 'd_dfl'), 2)}"
                         + f" | {fmt(cpu_per_mib(rs['ubtrfs'], 'd_ucpu'), 1)}"
                         + " | " + " / ".join(fmt(cpu_per_mib(rs[t], "d_busy"), 1) for t in rs) + " |")
        L.append("")

    # 2. sequential
    if any(r.get("sec") == "seq" for r in rows):
        L.append("### 2. Sequential 1 MiB writes and reads of one file")
        L.append("")
        L.append("MiB/s from the wall time of fio (write: `--rw=write --bs=1M --end_fsync=1`, the final fsync "
                 "included; read: `--rw=read --bs=1M` after unmount, remount and `drop_caches`). "
                 "Higher is better; ratios < 1 mean ubtrfs is slower.")
        L.append("")
        L.append("| workload | MiB | ubtrfs MiB/s | kernel btrfs MiB/s | XFS MiB/s | ubtrfs / kernel btrfs | ubtrfs / XFS | ubtrfs CPU ms / MiB | machine CPU ms / MiB (u / b / x) |")
        L.append("|" + "---|" * 9)
        for wl in ("write1m", "read1m"):
            rs = {t: get("seq", wl, t) for t in ("ubtrfs", "btrfs", "xfs")}
            if not any(rs.values()):
                continue
            mib = next((r["mib"] for r in rs.values() if r), None)
            bw = {t: (rs[t]["mib"] / rs[t]["wall_s"]) if ok(rs[t]) else None for t in rs}
            ucpu = (rs["ubtrfs"]["d_ucpu"] / tick * 1e3 / rs["ubtrfs"]["mib"]) if ok(rs["ubtrfs"]) and "d_ucpu" in rs["ubtrfs"] else None
            mc = " / ".join(fmt(rs[t]["d_busy"] / tick * 1e3 / rs[t]["mib"], 1) if ok(rs[t]) else "n/a" for t in rs)
            L.append(f"| {'write + fsync' if wl == 'write1m' else 'read, cold'} | {mib} | "
                     + " | ".join(fmt(bw[t], 0) for t in rs)
                     + f" | {ratio(bw['ubtrfs'], bw['btrfs'])} | {ratio(bw['ubtrfs'], bw['xfs'])} | {fmt(ucpu, 1)} | {mc} |")
        L.append("")

    # 3. metadata
    if any(r.get("sec") == "meta" for r in rows):
        r0 = next(r for r in rows if r.get("sec") == "meta")
        L.append("### 3. Metadata: extract a tarball, read every file, then `rm -rf` it")
        L.append("")
        L.append(f"{r0.get('files')} files in {r0.get('dirs')} directories, {r0.get('mb')} MB. "
                 "Seconds, lower is better; ratios > 1 mean ubtrfs is slower. "
                 "\"+ unmount\" adds the unmount that makes it durable (kernel: commit and flush; "
                 "ubtrfs: `fusermount3 -u` and the process' last commit). The reads (`find | xargs cat`) and `rm -rf` run on a fresh mount "
                 "after `drop_caches` (cold metadata).")
        L.append("")
        L.append("| step | ubtrfs s | kernel btrfs s | XFS s | ubtrfs / kernel btrfs | ubtrfs / XFS | ubtrfs CPU s |")
        L.append("|" + "---|" * 7)
        for step, what in (("extract", "`tar -xf`"), ("extract+umount", "`tar -xf` + unmount"),
                           ("read", "first read of each file, cold"),
                           ("rm", "`rm -rf`"), ("rm+umount", "`rm -rf` + unmount")):
            rs = {t: get("meta", step, t) for t in ("ubtrfs", "btrfs", "xfs")}
            s = {t: val(rs[t], "wall_s") for t in rs}
            uc = (rs["ubtrfs"]["d_ucpu"] / tick) if ok(rs["ubtrfs"]) and "d_ucpu" in rs["ubtrfs"] else None
            L.append(f"| {what} | " + " | ".join(fmt(s[t], 2) for t in rs)
                     + f" | {ratio(s['ubtrfs'], s['btrfs'])} | {ratio(s['ubtrfs'], s['xfs'])} | {fmt(uc, 2)} |")
        L.append("")
        chk = [r for r in rows if r.get("sec") == "check"]
        for r in chk:
            L.append(f"- {r['what']}: {r['result']}")
        if chk:
            L.append("")

    # 4. where the time goes
    if any(r.get("sec") == "where" for r in rows):
        L.append("### 4. Where the time goes: device requests per fsync")
        L.append("")
        L.append("Every target on a loop device over its image file (ubtrfs too, for this section: "
                 "`ubtrfs mount /dev/loopN`), counted from `/sys/block/loopN/stat` before and after the job: "
                 "write requests, KiB written and flush requests, divided by the number of fsyncs fio made. "
                 "Write amplification: device bytes / bytes fio wrote. With many jobs, one commit or log sync "
                 "can cover several fsyncs, so the per-fsync numbers fall.")
        L.append("")
        L.append("| workload | jobs | target | fsyncs | IOPS | fsync mean ms | writes / fsync | KiB / fsync | flushes / fsync | write amplification | process CPU ms / MiB | machine CPU ms / MiB |")
        L.append("|" + "---|" * 12)
        wjobs = sorted({r["jobs"] for r in rows if r.get("sec") == "where"})
        for wl, _ in wls:
          for n in wjobs:
            for t in ("ubtrfs-loop", "btrfs", "xfs"):
                r = get("where", wl, t, n)
                if r is None:
                    continue
                if not ok(r):
                    L.append(f"| {wl} | {n} | {NAMES[t]} | failed: {r.get('err', '?')} |" + " |" * 8)
                    continue
                f = r.get("fsyncs") or 0
                per = lambda k: (r[k] / f) if f and k in r else None
                kib = per("d_dsec") * 512 / 1024 if per("d_dsec") is not None else None
                amp = (r["d_dsec"] * 512 / r["io_bytes"]) if r.get("io_bytes") and "d_dsec" in r else None
                mib = r.get("io_bytes", 0) / 2**20
                pc = (r["d_ucpu"] / tick * 1e3 / mib) if mib and "d_ucpu" in r else None
                mc = (r["d_busy"] / tick * 1e3 / mib) if mib else None
                L.append(f"| {wl} | {n} | {NAMES[t]} | {fmt(r.get('fsyncs'))} | {fmt(r.get('iops'))} | "
                         f"{fmt(r.get('fsync_mean_us', 0) / 1e3, 2)} | {fmt(per('d_dw'), 1)} | {fmt(kib, 1)} | "
                         f"{fmt(per('d_dfl'), 2)} | {fmt(amp, 2)} | {fmt(pc, 1)} | {fmt(mc, 1)} |")
        L.append("")
        st = [r for r in rows if r.get("sec") == "strace"]
        if st:
            L.append("System calls of the ubtrfs process on its image file (`strace -c -f -p PID`, a separate "
                     "short job; strace slows it, so only the counts mean anything):")
            L.append("")
            L.append("| workload | fsyncs | pwrite64 / fsync | fdatasync / fsync | fsync / fsync | other write calls / fsync |")
            L.append("|---|---|---|---|---|---|")
            for r in st:
                c = r.get("syscalls", {})
                f = r.get("fsyncs") or 0
                if not ok(r) or not f:
                    L.append(f"| {r['wl']} | failed: {r.get('err', 'no fsyncs')} | | | | |")
                    continue
                other = sum(v for k, v in c.items() if k not in ("pwrite64", "fdatasync", "fsync"))
                L.append(f"| {r['wl']} | {f} | {fmt(c.get('pwrite64', 0) / f, 1)} | {fmt(c.get('fdatasync', 0) / f, 2)} "
                         f"| {fmt(c.get('fsync', 0) / f, 2)} | {fmt(other / f, 2)} |")
            L.append("")

    if failures:
        L.append("Failures:")
        L.append("")
        for r in failures:
            L.append(f"- {r.get('sec')} {r.get('wl')} {NAMES.get(r.get('tgt'), r.get('tgt'))}"
                     f"{' jobs ' + str(r['jobs']) if 'jobs' in r else ''}: {r.get('err', '?')}")
        L.append("")
    print("\n".join(L))

if __name__ == "__main__":
    {"row": cmd_row, "report": cmd_report}[sys.argv[1]](sys.argv[2:])
PYEOF

# --- fio ----------------------------------------------------------------------------
FIO_COMMON=(--ioengine=sync --direct=0 --fallocate=none --group_reporting=1 --output-format=json)

# run_fio target json fio-args...: fio against the mounted target; returns
# fio's status (124 on timeout).
run_fio() {
    local t=$1 json=$2 rc=0; shift 2
    timeout --kill-after=20 "$FIO_TIMEOUT" fio "${FIO_COMMON[@]}" --output="$json" "$@" \
        >"$W/log-fio.txt" 2>&1 || rc=$?
    if ((rc == 124 || rc == 137)) && [[ $t == ubtrfs* ]]; then
        abort_fuse "$t"
    fi
    if ((rc)); then
        log "  fio on $t failed (rc $rc): $(tail -n 3 "$W/log-fio.txt" | tr '\n' ' ')"
        [[ $t == ubtrfs* ]] && tail -n 5 "$ULOG" >&2
    fi
    return $rc
}

workload_args() { # workload jobs
    local per=$((FILE_TOTAL_MIB / $2))
    ((per >= 1)) || per=1
    case $1 in
        seq64k-fsync1) echo "--rw=write --bs=64k --fsync=1 --size=${per}M" ;;
        rand4k-fsync16) echo "--rw=randwrite --bs=4k --fsync=16 --size=${per}M" ;;
    esac
}

# One measured fio point on a fresh filesystem: mkfs, mount, drop caches,
# fio, unmount. sec wl target jobs runtime
fsync_point() {
    local sec=$1 wl=$2 t=$3 n=$4 rt=$5 json before after rc=0 err=
    json=$W/fio/$sec-$wl-$t-$n.json
    fresh_fs "$t"
    do_mount "$t"
    drop_caches
    before=$(snap "$t")
    # shellcheck disable=SC2046
    run_fio "$t" "$json" --name=writers --directory="$(mnt_of "$t")" --numjobs="$n" \
        --time_based --runtime="$rt" $(workload_args "$wl" "$n") || rc=$?
    after=$(snap "$t")
    ((rc)) && err="fio exit status $rc"
    do_umount "$t" || err="${err:+$err; }last commit failed"
    if [[ -n $err ]]; then
        row sec="$sec" wl="$wl" tgt="$t" jobs="$n" ok=0 err="${err// /_}" --fio "$json" --before "$before" --after "$after"
    else
        row sec="$sec" wl="$wl" tgt="$t" jobs="$n" --fio "$json" --before "$before" --after "$after"
    fi
    python3 - "$RAW" <<'EOF' >&2
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
f = r.get("fsyncs") or 0
extra = ""
if f and "d_dfl" in r:
    extra = f", {r['d_dw'] / f:.1f} dev writes and {r['d_dfl'] / f:.2f} flushes per fsync"
print(f"    {r['tgt']:<12} jobs {r.get('jobs', '-'):>2}: {r.get('iops', 0):8.0f} IOPS {r.get('mibs', 0):7.1f} MiB/s, "
      f"fsync {r.get('fsync_mean_us', 0) / 1e3:.2f} ms mean{extra}{'  FAILED ' + r.get('err', '') if r.get('ok', 1) != 1 else ''}")
EOF
}

# Other work on the machine skews every number (and `drop_caches` here
# disturbs other benchmarks): say so.
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$LOAD_START" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    log "WARNING: load average $LOAD_START on $(nproc) CPUs: other work is running; the numbers will be noisy"
    pgrep -a -f 'bench/(read|write|fsync-matrix)\.sh' | grep -v "^$$ " >&2 || true
fi
start=$SECONDS

# --- 1. seed 000 fsync jobs ------------------------------------------------------------
if section_on 1; then
    FIO_TIMEOUT=$((RUNTIME * 8 + 120))
    log "section 1: seed 000 fsync jobs, numjobs $JOBS, ${RUNTIME} s each, ${FILE_TOTAL_MIB} MiB of files in all"
    for n in $JOBS; do
        for wl in seq64k-fsync1 rand4k-fsync16; do
            log "  $wl, $n job(s)"
            for t in "${TARGETS[@]}"; do
                fsync_point fsync "$wl" "$t" "$n" "$RUNTIME"
            done
        done
    done
fi

# --- 2. sequential 1 MiB write and read ---------------------------------------------------------
if section_on 2; then
    FIO_TIMEOUT=$((SEQ_MIB + 300))
    log "section 2: sequential 1 MiB writes and reads of a $SEQ_MIB MiB file"
    for t in "${TARGETS[@]}"; do
        fresh_fs "$t"
        do_mount "$t"
        mnt=$(mnt_of "$t")
        drop_caches
        before=$(snap "$t") rc=0
        run_fio "$t" "$W/fio/seq-write-$t.json" --name=seq --filename="$mnt/seqfile" --rw=write --bs=1M \
            --size="${SEQ_MIB}M" --end_fsync=1 || rc=$?
        after=$(snap "$t")
        ok=1; ((rc)) && ok=0
        row sec=seq wl=write1m tgt="$t" mib="$SEQ_MIB" ok=$ok err="fio_exit_$rc" --before "$before" --after "$after"
        log "    $t write: $(awk -v m="$SEQ_MIB" -v s="$(last_row wall_s)" 'BEGIN { printf "%.0f MiB/s", m / s }')"
        do_umount "$t" || true
        do_mount "$t"
        drop_caches
        before=$(snap "$t") rc=0
        run_fio "$t" "$W/fio/seq-read-$t.json" --name=seq --filename="$mnt/seqfile" --rw=read --bs=1M \
            --size="${SEQ_MIB}M" || rc=$?
        after=$(snap "$t")
        ok=1; ((rc)) && ok=0
        row sec=seq wl=read1m tgt="$t" mib="$SEQ_MIB" ok=$ok err="fio_exit_$rc" --before "$before" --after "$after"
        log "    $t read: $(awk -v m="$SEQ_MIB" -v s="$(last_row wall_s)" 'BEGIN { printf "%.0f MiB/s", m / s }')"
        do_umount "$t" || true
    done
fi

# --- 3. metadata: tarball extract and rm -rf ------------------------------------------------------
if section_on 3; then
    TAR=$BENCH_DIR/tree-$TAR_FILES.tar
    tstamp="v1 seed=$SEED files=$TAR_FILES"
    if [[ ! -f $TAR.stamp || $(cat "$TAR.stamp") != "$tstamp" || ! -f $TAR ]]; then
        log "generating $TAR ($TAR_FILES files)"
        rm -f "$TAR" "$TAR.stamp" "$TAR.facts"
        # Deterministic: names, sizes, contents, modes and times come from one
        # seeded generator; contents are slices of a source-like text pool.
        python3 - "$TAR" "$TAR_FILES" "$SEED" >"$TAR.facts" <<'EOF'
import io, json, random, sys, tarfile
path, nfiles, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
words = ("fn let mut pub struct impl return if else match for while use mod self u8 u32 u64 "
         "Vec Option Some None Ok Err Result const static where trait enum break continue "
         "#include int char void unsigned long inode extent offset len buf key item node leaf "
         "root tree bytenr csum generation transaction device chunk stripe sector block").split()
pool, n = [], 0
while n < 4 << 20:
    line = "    " * rng.randrange(5) + " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12))) + ";\n"
    pool.append(line); n += len(line)
pool = "".join(pool).encode()
ndirs = max(1, nfiles // 15)
parent, depth = [None], [0]           # dir 0 is the root "src"
for d in range(1, ndirs):
    while True:
        p = rng.randrange(d)
        if depth[p] < 7:
            break
    parent.append(p); depth.append(depth[p] + 1)
def dpath(d):
    parts = []
    while d is not None:
        parts.append("src" if d == 0 else f"d{d:05d}")
        d = parent[d]
    return "/".join(reversed(parts))
files = {}
for i in range(nfiles):
    d = rng.randrange(ndirs)
    size = min(16384, int(rng.expovariate(1 / 3500)))
    files.setdefault(d, []).append((f"f{i:06d}.{rng.choice(['c', 'h', 'rs', 'txt', 'md'])}", size))
mtime = 1700000000
total = 0
with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
    for d in range(ndirs):
        ti = tarfile.TarInfo(dpath(d)); ti.type = tarfile.DIRTYPE; ti.mode = 0o755
        ti.mtime = mtime; ti.uname = ti.gname = "root"
        tar.addfile(ti)
        for name, size in files.get(d, []):
            off = rng.randrange(len(pool) - size)
            ti = tarfile.TarInfo(dpath(d) + "/" + name); ti.size = size; ti.mode = 0o644
            ti.mtime = mtime; ti.uname = ti.gname = "root"
            tar.addfile(ti, io.BytesIO(pool[off:off + size]))
            total += size
print(json.dumps({"files": nfiles, "dirs": ndirs, "bytes": total}))
EOF
        echo "$tstamp" >"$TAR.stamp"
    fi
    tfiles=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["files"])' "$TAR.facts")
    tdirs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dirs"])' "$TAR.facts")
    tmb=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["bytes"] / 1e6))' "$TAR.facts")
    log "section 3: extract $TAR ($tfiles files, $tdirs dirs, $tmb MB) and rm -rf it"
    for t in "${TARGETS[@]}"; do
        fresh_fs "$t"
        do_mount "$t"
        mnt=$(mnt_of "$t")
        drop_caches
        cat "$TAR" >/dev/null          # the tarball itself comes from the page cache
        before=$(snap "$t") rc=0
        tar -xf "$TAR" -C "$mnt" 2>"$W/log-tar.txt" || rc=$?
        after=$(snap "$t")
        ok=1 crc=0; ((rc)) && ok=0
        row sec=meta wl=extract tgt="$t" files="$tfiles" dirs="$tdirs" mb="$tmb" ok=$ok err="tar_exit_$rc" --before "$before" --after "$after"
        do_umount "$t" || crc=$?
        ok2=$ok; ((crc)) && ok2=0
        ext_s=$(last_row wall_s)
        ucpu=$(last_row d_ucpu 0)
        row sec=meta wl=extract+umount tgt="$t" ok=$ok2 err="last_commit_failed" wall_s="$(awk -v a="$ext_s" -v b="$UMOUNT_S" 'BEGIN { print a + b }')" d_ucpu="$ucpu"
        log "    $t: extract $ext_s s, unmount $UMOUNT_S s"
        # The first read of each file, cold, as grep -r or a build would:
        # its access time moves then (relatime; tar set it to the mtime).
        do_mount "$t"
        drop_caches
        before=$(snap "$t") rc=0
        find "$mnt/src" -type f -print0 | xargs -0 cat >/dev/null 2>"$W/log-read.txt" || rc=$?
        after=$(snap "$t")
        ok=1; ((rc)) && ok=0
        row sec=meta wl=read tgt="$t" ok=$ok err="read_exit_$rc" --before "$before" --after "$after"
        do_umount "$t" || true
        log "    $t: first read of every file $(last_row wall_s) s"
        if [[ $t == ubtrfs ]]; then
            # A fast wrong answer is no answer: btrfs check, and tar's own diff.
            if btrfs check --readonly "$(img_of "$t")" >"$W/log-check.txt" 2>&1; then
                row sec=check what="btrfs check --readonly of the ubtrfs image after the extract" result="clean"
            else
                row sec=check what="btrfs check --readonly of the ubtrfs image after the extract" result="**errors** (see $W/log-check.txt)"
            fi
            do_mount "$t"
            if tar -df "$TAR" -C "$mnt" >"$W/log-tar-diff.txt" 2>&1; then
                row sec=check what="tar --diff of the extracted tree on ubtrfs (after remount)" result="identical"
            else
                row sec=check what="tar --diff of the extracted tree on ubtrfs (after remount)" result="**differs**: $(wc -l <"$W/log-tar-diff.txt") lines (see $W/log-tar-diff.txt)"
            fi
            do_umount "$t" || true
        fi
        do_mount "$t"
        drop_caches
        before=$(snap "$t") rc=0
        rm -rf "${mnt:?}/src" 2>"$W/log-rm.txt" || rc=$?
        after=$(snap "$t")
        ok=1 crc=0; ((rc)) && ok=0
        row sec=meta wl=rm tgt="$t" ok=$ok err="rm_exit_$rc" --before "$before" --after "$after"
        do_umount "$t" || crc=$?
        ok2=$ok; ((crc)) && ok2=0
        rm_s=$(last_row wall_s)
        ucpu=$(last_row d_ucpu 0)
        row sec=meta wl=rm+umount tgt="$t" ok=$ok2 err="last_commit_failed" wall_s="$(awk -v a="$rm_s" -v b="$UMOUNT_S" 'BEGIN { print a + b }')" d_ucpu="$ucpu"
        log "    $t: rm -rf $rm_s s, unmount $UMOUNT_S s"
    done
fi

# --- 4. where the time goes ------------------------------------------------------------------
if section_on 4; then
    FIO_TIMEOUT=$((WHERE_RUNTIME * 8 + 120))
    log "section 4: device requests per fsync, numjobs $WHERE_JOBS, ${WHERE_RUNTIME} s each"
    for wl in seq64k-fsync1 rand4k-fsync16; do
        for n in $WHERE_JOBS; do
            for t in ubtrfs-loop btrfs xfs; do
                fsync_point where "$wl" "$t" "$n" "$WHERE_RUNTIME"
            done
        done
        # System calls of ubtrfs on the image file, counted by strace.
        t=ubtrfs
        fresh_fs "$t"
        do_mount "$t"
        drop_caches
        strace -c -f -e trace=pwrite64,pwritev,pwritev2,write,writev,fdatasync,fsync,sync_file_range \
            -o "$W/strace-$wl.txt" -p "${UPID[$t]}" 2>"$W/log-strace.txt" &
        spid=$!
        sleep 1
        rc=0
        # shellcheck disable=SC2046
        run_fio "$t" "$W/fio/strace-$wl.json" --name=writers --directory="$(mnt_of "$t")" --numjobs=1 \
            --time_based --runtime="$WHERE_RUNTIME" $(workload_args "$wl" 1) || rc=$?
        kill -INT "$spid" 2>/dev/null || true
        wait "$spid" || true
        do_umount "$t" || true
        ok=1; ((rc)) && ok=0
        row sec=strace wl="$wl" tgt=ubtrfs-strace ok=$ok err="fio_exit_$rc" --fio "$W/fio/strace-$wl.json" --strace "$W/strace-$wl.txt"
        log "    strace: $(grep -E 'pwrite64|fdatasync|fsync|writev?$' "$W/strace-$wl.txt" | awk '{ printf "%s %s  ", $NF, $4 }')"
    done
fi
elapsed=$((SECONDS - start))

# --- report ----------------------------------------------------------------------------------
host_facts
disk_facts

{
    echo "## Write benchmark ($name)"
    echo
    echo "$(date -u +%Y-%m-%d), ubtrfs $commit$dirty (binary $UBTRFS_ID), \`bench/write.sh$( ((QUICK)) && echo ' --quick') --runtime $RUNTIME --jobs \"$JOBS\" --sections $SECTIONS\`, ${elapsed} s of measuring."
    echo
    python3 "$HELPER" report "$RAW" "$TICK"
    echo "Setup:"
    echo
    echo "- Three targets, each a fresh $IMG_SIZE sparse image file in \`$W\`, made anew for every"
    echo "  measurement: **ubtrfs** (\`ubtrfs mount IMG MNT\`, FUSE, default options, on the image file),"
    echo "  **kernel btrfs** (\`losetup\` + \`mount\`, default options) of an image made with the same"
    echo "  \`mkfs.btrfs $MKFS_BTRFS_OPTS\`, and **XFS** (\`mkfs.xfs $MKFS_XFS_OPTS\`, loop device). Runs interleave the targets."
    echo "- fio $(fio --version | sed 's/^fio-//'), \`--ioengine=sync --direct=0 --fallocate=none\` as in seed 000; section 1 is"
    echo "  time-based ($RUNTIME s per point), each job writing its own file of $FILE_TOTAL_MIB MiB / numjobs."
    echo "- \`sync; echo 3 > /proc/sys/vm/drop_caches\` before every measurement."
    echo "- Load average at the start: $LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg) ($(nproc) CPUs); machine CPU includes any other work."
    echo "- Kernel CPU spent in kernel threads (loop worker, btrfs workers, writeback) shows only in"
    echo "  the machine CPU column; ubtrfs' process CPU is its own work, the FUSE kernel side is not in it."
    echo
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r), $(btrfs --version | head -1), $(mkfs.xfs -V | head -1);"
    echo "\`$BENCH_DIR\` is $backing (disk $disk, rotational=$rot, scheduler $sched, write_cache $wcache)."
} >"$results"

echo
cat "$results"
echo
log "saved to $results; every measurement in $RAW, fio output in $W/fio, ubtrfs log in $ULOG"

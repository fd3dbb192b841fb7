#!/usr/bin/env bash
# Issue 4: small-file rates (create, stat, readdir, unlink of 100,000 files,
# one process and several) and sequential 1 MiB write and cold read
# bandwidth: ubtrfs (FUSE) vs kernel btrfs vs XFS on image files of the
# same size on the same disk, in one run; plus where FUSE costs what: the
# same work through the ubtrfs library without FUSE (libbench), on a FUSE
# filesystem that does nothing (fuse_floor: the FUSE floor) and on tmpfs.
# Prints Markdown tables. See bench/README.md.
#
#   sudo bench/metadata.sh [--quick] [--files N] [--dirs N] [--procs N]
#        [--seq-mib N] [--targets LIST] [--sections meta,seq]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (default 4G),
# MKFS_BTRFS_OPTS (default "-m single -d single"), MKFS_XFS_OPTS.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=metadata.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
EXAMPLES=${EXAMPLES:-$(dirname "$UBTRFS")/examples}
IMG_SIZE=${IMG_SIZE:-4G}
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS--m single -d single}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
QUICK=0
FILES=
DIRS=
PROCS=
SEQ_MIB=
TARGETS="ubtrfs ubtrfs-dev btrfs xfs lib floor floor-dev tmpfs"
SECTIONS=meta,seq

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --quick          10,000 files, 256 MiB sequential file (about 3 minutes)
  --files N        small files (default 100000)
  --dirs N         directories they are spread over (default 100)
  --procs N        processes of the parallel variant (default 4; 1 is always run)
  --seq-mib N      size of the sequential file (default 1024)
  --targets LIST   any of: ubtrfs ubtrfs-dev btrfs xfs lib floor floor-dev tmpfs
                   (default: all)
                     ubtrfs: requests over io_uring (the script enables it)
                     ubtrfs-dev: requests through /dev/fuse (-o nouring)
                     lib:   the ubtrfs library without FUSE (examples/libbench)
                     floor: a FUSE filesystem doing nothing (examples/fuse_floor);
                            floor-dev: the same through /dev/fuse
  --sections LIST  meta (small files), seq (1 MiB streams) (default both)
EOF
}

parse_args "--files:FILES --dirs:DIRS --procs:PROCS --seq-mib:SEQ_MIB --targets:TARGETS --sections:SECTIONS" \
    "--quick:QUICK=1" "$@"

# --- prerequisites ---------------------------------------------------------
need_root "loop devices, mounts, drop_caches"
need_commands "fio btrfs-progs xfsprogs fuse3 python3 util-linux coreutils gcc" \
    fio mkfs.btrfs mkfs.xfs mount umount losetup fusermount3 findmnt python3 timeout cc flock
need_ubtrfs "cargo build --release -p ubtrfs-cli --bins --examples"
for t in $TARGETS; do
    [[ $t =~ ^(ubtrfs|ubtrfs-dev|btrfs|xfs|lib|floor|floor-dev|tmpfs)$ ]] || die "unknown target $t"
done
if [[ " $TARGETS " == *" lib "* || " $TARGETS " == *" floor"* ]]; then
    [[ -x $EXAMPLES/libbench && -x $EXAMPLES/fuse_floor ]] ||
        die "no $EXAMPLES/libbench or fuse_floor; build them: cargo build --release -p ubtrfs-cli --examples"
fi
[[ $SECTIONS =~ ^(meta|seq)(,(meta|seq))?$ ]] || die "--sections wants meta, seq or meta,seq"
section_on() { [[ ,$SECTIONS, == *,$1,* ]]; }
need_drop_caches
need_fuse
# FUSE over io_uring, which ubtrfs and the floor use when the kernel offers
# it (the "-dev" targets do not).
URING_PARAM=/sys/module/fuse/parameters/enable_uring
if [[ -e $URING_PARAM ]]; then
    echo Y >"$URING_PARAM" || die "cannot enable FUSE over io_uring ($URING_PARAM)"
    URING_STATE="enable_uring=Y"
else
    URING_STATE="not offered by this kernel: the ubtrfs and floor targets use /dev/fuse too"
    log "WARNING: $URING_STATE"
fi
need_kernel_fs btrfs xfs

if ((QUICK)); then
    name=quick; FILES=${FILES:-10000}; SEQ_MIB=${SEQ_MIB:-256}
else
    name=full; FILES=${FILES:-100000}; SEQ_MIB=${SEQ_MIB:-1024}
fi
DIRS=${DIRS:-100}; PROCS=${PROCS:-4}
for v in "$FILES" "$DIRS" "$PROCS" "$SEQ_MIB"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || die "numbers must be positive integers (got $v)"
done
VARIANTS="1"
((PROCS > 1)) && VARIANTS="1 $PROCS"

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/metadata
mkdir -p "$W"
RAW=$BENCH_DIR/metadata-runs-$name.jsonl
results=$BENCH_DIR/metadata-results$( ((QUICK)) && echo -quick || true).md
ULOG=$W/log-ubtrfs.txt
TICK=$(getconf CLK_TCK)

# One benchmark at a time on this work directory (and so on this disk).
bench_lock

# Private copies of the binaries: a rebuild during the run must not change
# what is measured half-way.
private_ubtrfs "$W"
if [[ -x $EXAMPLES/libbench ]]; then
    cp "$EXAMPLES/libbench" "$W/libbench.bin"
    cp "$EXAMPLES/fuse_floor" "$W/fuse_floor.bin"
fi
LIBBENCH=$W/libbench.bin
FLOOR=$W/fuse_floor.bin
cc -O2 -Wall -o "$W/smallfiles" "$here/smallfiles.c" || die "cannot build bench/smallfiles.c"
SMALL=$W/smallfiles
: >"$RAW"
: >"$ULOG"

SHOW=$W/.show.py
cat >"$SHOW" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
rate = r["ops"] / r["secs"] if r.get("secs") else 0
extra = f" (+ commit {r['commit_secs']:.2f} s)" if "commit_secs" in r else ""
print(f"    {sys.argv[2]:<6} {r.get('phase', '?'):<8} procs {sys.argv[3]}: {r['ops']:>7} ops in {r['secs']:7.2f} s = {rate:9.0f} ops/s{extra}")
EOF
IMG=$W/img
MNT=$W/mnt
mkdir -p "$MNT"
LOOP=
SPID=           # pid of a FUSE server we started (ubtrfs or fuse_floor)

cleanup() {
    if findmnt -rn -M "$MNT" >/dev/null 2>&1; then
        fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    fi
    if [[ -n $SPID ]]; then
        for _ in {1..100}; do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
        kill "$SPID" 2>/dev/null || true
    fi
    [[ -n $LOOP ]] && losetup -d "$LOOP" 2>/dev/null || true
    rm -f "$IMG"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", (b - a) / 1e9 }'; }
cpu_of() { # pid: utime + stime ticks of all its threads, 0 if gone
    [[ -n $1 && -r /proc/$1/stat ]] && awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" || echo 0
}

fresh_fs() { # target
    rm -f "$IMG"
    case $1 in
        ubtrfs|ubtrfs-dev|btrfs|lib) mkfs_image "$IMG" btrfs "$1" ;;
        xfs) mkfs_image "$IMG" xfs "$1" ;;
    esac
}

wait_fuse() {
    wait_fuse_mount "$MNT" "$SPID" && return 0
    tail -n 20 "$ULOG" >&2
    die "the FUSE server did not come up on $MNT"
}

do_mount() { # target
    case $1 in
        ubtrfs|ubtrfs-dev)
            echo "=== $(date +%T) mount $IMG ($1)" >>"$ULOG"
            local how=()
            [[ $1 == ubtrfs-dev ]] && how=(-o nouring)
            setsid -w "$UBTRFS" mount "${how[@]}" "$IMG" "$MNT" >>"$ULOG" 2>&1 &
            SPID=$!; wait_fuse ;;
        floor|floor-dev)
            echo "=== $(date +%T) fuse_floor ($1)" >>"$ULOG"
            local how=()
            [[ $1 == floor-dev ]] && how=(--nouring)
            setsid -w "$FLOOR" "${how[@]}" "$MNT" >>"$ULOG" 2>&1 &
            SPID=$!; wait_fuse ;;
        btrfs|xfs) LOOP=$(losetup -f --show "$IMG"); mount "$LOOP" "$MNT" ;;
        tmpfs) mount -t tmpfs -o size=8g tmpfs "$MNT" ;;
    esac
}

UMOUNT_S=0
do_umount() { # target: unmount, everything durable; sets UMOUNT_S
    local t0 rc=0
    t0=$(now_ns)
    case $1 in
        ubtrfs|ubtrfs-dev|floor|floor-dev)
            fusermount3 -u "$MNT" || fusermount3 -u -z "$MNT" || rc=$?
            wait "$SPID" || rc=$?
            SPID= ;;
        *) umount "$MNT"
           if [[ -n $LOOP ]]; then losetup -d "$LOOP"; LOOP=; fi ;;
    esac
    UMOUNT_S=$(secs "$t0" "$(now_ns)")
    if ((rc)); then
        log "WARNING: $1: unmount / last commit failed (rc $rc); see $ULOG"
        tail -n 5 "$ULOG" >&2
    fi
    return $rc
}

# row key=value ... : one JSON line into RAW (values numeric when they look it)
row() {
    python3 - "$@" >>"$RAW" <<'EOF'
import json, sys
r = {}
for a in sys.argv[1:]:
    k, _, v = a.partition("=")
    if v.startswith("{"):
        r.update(json.loads(v))
        continue
    try:
        r[k] = int(v)
    except ValueError:
        try:
            r[k] = float(v)
        except ValueError:
            r[k] = v
print(json.dumps(r))
EOF
}

# One small-file phase on a mounted target; prints the driver's JSON.
small_phase() { # target phase procs
    local out rc=0 c0 c1
    c0=$(cpu_of "$SPID")
    out=$(timeout --kill-after=20 3600 "$SMALL" "$2" "$MNT" "$FILES" "$DIRS" "$3" 2>>"$W/log-small.txt") || rc=$?
    c1=$(cpu_of "$SPID")
    [[ -n $out ]] || out='{"ops": 0, "secs": 0, "errors": -1}'
    row sec=meta tgt="$1" procs="$3" rc="$rc" "srv_cpu_s=$(awk -v a="$c0" -v b="$c1" -v t="$TICK" 'BEGIN { print (b - a) / t }')" "x=$out"
    ((rc == 0)) || log "    $1 $2 procs $3 failed (rc $rc): $out"
    python3 "$SHOW" "$out" "$1" "$3" >&2
}

lib_phase() { # phase procs [extra args]
    local out rc=0
    out=$(timeout --kill-after=20 3600 "$LIBBENCH" "$1" "$IMG" "$FILES" "$DIRS" "$2" 2>>"$W/log-lib.txt") || rc=$?
    [[ -n $out ]] || out='{"ops": 0, "secs": 0, "errors": -1}'
    row sec=meta tgt=lib procs="$2" rc="$rc" "x=$out"
    ((rc == 0)) || log "    lib $1 procs $2 failed (rc $rc): $(tail -n 2 "$W/log-lib.txt" | tr '\n' ' ')"
    python3 "$SHOW" "$out" lib "$2" >&2
}

LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$LOAD_START" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    log "WARNING: load average $LOAD_START on $(nproc) CPUs: other work is running; the numbers will be noisy"
fi
start=$SECONDS

# --- small files -------------------------------------------------------------
# Every phase but create starts cold: a fresh mount after drop_caches
# (tmpfs and the FUSE floor keep everything in memory: only drop_caches,
# which still empties the kernel's dentry and inode caches in front of the
# FUSE floor). The unmount after create and unlink is timed apart: it is
# when the work becomes durable.
if section_on meta; then
    log "small files: $FILES files in $DIRS directories, processes: $VARIANTS; targets: $TARGETS"
    for n in $VARIANTS; do
        for t in $TARGETS; do
            log "  $t, $n process(es)"
            fresh_fs "$t"
            if [[ $t == lib ]]; then
                for ph in create stat readdir unlink; do
                    drop_caches
                    lib_phase "$ph" "$n"
                done
                lib_phase rmdir 1 >/dev/null 2>&1 || true
                continue
            fi
            persistent=1
            [[ $t == floor* || $t == tmpfs ]] && persistent=0
            do_mount "$t"
            for ph in create stat readdir unlink; do
                if [[ $ph != create ]]; then
                    if ((persistent)); then do_mount "$t"; fi
                    drop_caches
                fi
                small_phase "$t" "$ph" "$n"
                if ((persistent)); then
                    do_umount "$t" || true
                    row sec=umount tgt="$t" procs="$n" phase="$ph" secs="$UMOUNT_S"
                fi
            done
            ((persistent)) || do_umount "$t" || true
        done
    done
fi

# --- sequential 1 MiB write and cold read -------------------------------------
if section_on seq; then
    log "sequential: $SEQ_MIB MiB in 1 MiB writes (fsync at the end), then a cold 1 MiB read"
    for t in $TARGETS; do
        fresh_fs "$t"
        if [[ $t == lib ]]; then
            drop_caches
            out=$("$LIBBENCH" write "$IMG" "$SEQ_MIB" 1 1 2>>"$W/log-lib.txt") || out='{"ops": 0, "secs": 0, "errors": -1}'
            row sec=seq tgt=lib wl=write mib="$SEQ_MIB" "x=$out"
            drop_caches
            out=$("$LIBBENCH" read "$IMG" "$SEQ_MIB" 1 1 2>>"$W/log-lib.txt") || out='{"ops": 0, "secs": 0, "errors": -1}'
            row sec=seq tgt=lib wl=read mib="$SEQ_MIB" "x=$out"
            log "    lib done"
            continue
        fi
        persistent=1
        [[ $t == floor* || $t == tmpfs ]] && persistent=0
        do_mount "$t"
        drop_caches
        c0=$(cpu_of "$SPID"); t0=$(now_ns); rc=0
        fio --name=seq --filename="$MNT/seqfile" --rw=write --bs=1M --size="${SEQ_MIB}M" --end_fsync=1 \
            --ioengine=psync --direct=0 --fallocate=none >"$W/log-fio.txt" 2>&1 || rc=$?
        t1=$(now_ns); c1=$(cpu_of "$SPID")
        row sec=seq tgt="$t" wl=write mib="$SEQ_MIB" rc=$rc secs="$(secs "$t0" "$t1")" "srv_cpu_s=$(awk -v a="$c0" -v b="$c1" -v t="$TICK" 'BEGIN { print (b - a) / t }')"
        if ((persistent)); then do_umount "$t" || true; do_mount "$t"; fi
        drop_caches
        c0=$(cpu_of "$SPID"); t0=$(now_ns); rc2=0
        fio --name=seq --filename="$MNT/seqfile" --rw=read --bs=1M --size="${SEQ_MIB}M" \
            --ioengine=psync --direct=0 >"$W/log-fio.txt" 2>&1 || rc2=$?
        t1=$(now_ns); c1=$(cpu_of "$SPID")
        row sec=seq tgt="$t" wl=read mib="$SEQ_MIB" rc=$rc2 secs="$(secs "$t0" "$t1")" "srv_cpu_s=$(awk -v a="$c0" -v b="$c1" -v t="$TICK" 'BEGIN { print (b - a) / t }')"
        do_umount "$t" || true
        log "    $t: write rc $rc, read rc $rc2"
    done
fi
elapsed=$((SECONDS - start))

# --- report ------------------------------------------------------------------------
host_facts
backing=$(df -T "$BENCH_DIR" | awk 'NR == 2 { print $2 " on " $1 }')
{
    echo "## Small files and 1 MiB streams ($name)"
    echo
    echo "$(date -u +%Y-%m-%d), ubtrfs $commit$dirty (binary $UBTRFS_ID), \`bench/metadata.sh$( ((QUICK)) && echo ' --quick') --files $FILES --dirs $DIRS --procs $PROCS --seq-mib $SEQ_MIB\`, ${elapsed} s."
    echo
    python3 - "$RAW" "$FILES" "$DIRS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
files, dirs = int(sys.argv[2]), int(sys.argv[3])
def get(**kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None
def rate(r):
    if not r or r.get("rc", 0) != 0 or r.get("errors", 0) != 0 or not r.get("secs"):
        return None
    return r["ops"] / r["secs"]
def f(x):
    return "n/a" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}")
def q(a, b, mark=False):
    if a is None or b is None or b == 0:
        return "n/a"
    x = a / b
    s = f"**{x:.2f}**"
    return s + (" ✗" if mark and x < 0.5 else "")
targets = [t for t in ["ubtrfs", "ubtrfs-dev", "btrfs", "xfs", "lib", "floor", "floor-dev", "tmpfs"] if any(r.get("tgt") == t for r in rows)]
name = {"ubtrfs": "ubtrfs (FUSE)", "ubtrfs-dev": "ubtrfs, /dev/fuse", "btrfs": "kernel btrfs", "xfs": "XFS",
        "lib": "ubtrfs library, no FUSE", "floor": "FUSE floor", "floor-dev": "FUSE floor, /dev/fuse", "tmpfs": "tmpfs"}
procs = sorted({r["procs"] for r in rows if r.get("sec") == "meta"})
phases = ["create", "stat", "readdir", "unlink"]
what = {"create": "create (empty files)", "stat": "stat (cold)", "readdir": "readdir (cold, names)", "unlink": "unlink (cold)"}
if procs:
    print(f"### Small files: {files:,} files in {dirs} directories, operations per second")
    print()
    print("Higher is better. ubtrfs / btrfs >= 0.5 is the aim of issue 4 (✗ marks a miss). Every phase but create")
    print("starts on a fresh mount after `drop_caches`; \"+ unmount\" rates include the unmount that makes the")
    print("work durable (kernel: commit and flush; ubtrfs: the last commit; library: `commit()`).")
    print()
    head = "| workload | procs | " + " | ".join(name[t] for t in targets) + " | ubtrfs / btrfs | ubtrfs / XFS |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for ph in phases:
        for n in procs:
            rs = {t: get(sec="meta", tgt=t, procs=n, phase=ph) for t in targets}
            rt = {t: rate(rs[t]) for t in targets}
            print(f"| {what[ph]} | {n} | " + " | ".join(f(rt[t]) for t in targets)
                  + f" | {q(rt.get('ubtrfs'), rt.get('btrfs'), True)} | {q(rt.get('ubtrfs'), rt.get('xfs'))} |")
            if ph in ("create", "unlink"):
                dur = {}
                for t in targets:
                    r = rs[t]
                    if rate(r) is None:
                        dur[t] = None
                    elif t == "lib":
                        dur[t] = r["ops"] / (r["secs"] + r.get("commit_secs", 0))
                    elif t in ("floor", "floor-dev", "tmpfs"):
                        dur[t] = None
                    else:
                        u = get(sec="umount", tgt=t, procs=n, phase=ph)
                        dur[t] = r["ops"] / (r["secs"] + u["secs"]) if u else None
                print(f"| {what[ph]} + unmount | {n} | " + " | ".join(f(dur[t]) for t in targets)
                      + f" | {q(dur.get('ubtrfs'), dur.get('btrfs'), True)} | {q(dur.get('ubtrfs'), dur.get('xfs'))} |")
    print()
    if "ubtrfs" in targets and ("lib" in targets or "floor" in targets):
        print("### Where FUSE costs what: microseconds per operation")
        print()
        print("Wall time over operations (with several processes, the inverse of the rate). *library* is the")
        print("same work through the ubtrfs library in one process (threads instead of processes), no kernel in")
        print("between; *FUSE share* = (ubtrfs - library) / ubtrfs: the part of ubtrfs' time not spent in the")
        print("library (FUSE requests, the kernel's FUSE client, the adapter). The *FUSE floor* is that cost for")
        print("a filesystem that does nothing; tmpfs is the kernel alone.")
        print()
        print("| workload | procs | ubtrfs µs | ubtrfs, /dev/fuse µs | library µs | ubtrfs - library µs | FUSE share | FUSE floor µs | floor, /dev/fuse µs | tmpfs µs | ubtrfs server CPU µs |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        us = lambda x: None if x is None else 1e6 / x
        for ph in phases:
            for n in procs:
                u = rate(get(sec="meta", tgt="ubtrfs", procs=n, phase=ph))
                l = rate(get(sec="meta", tgt="lib", procs=n, phase=ph))
                fl = rate(get(sec="meta", tgt="floor", procs=n, phase=ph))
                fd = rate(get(sec="meta", tgt="floor-dev", procs=n, phase=ph))
                ud = rate(get(sec="meta", tgt="ubtrfs-dev", procs=n, phase=ph))
                tm = rate(get(sec="meta", tgt="tmpfs", procs=n, phase=ph))
                ur = get(sec="meta", tgt="ubtrfs", procs=n, phase=ph)
                cpu = (ur["srv_cpu_s"] * 1e6 / ur["ops"]) if ur and ur.get("ops") and "srv_cpu_s" in ur else None
                diff = (us(u) - us(l)) if u and l else None
                share = f"{diff / us(u):.0%}" if diff is not None else "n/a"
                def g(x):
                    return "n/a" if x is None else f"{x:.1f}"
                print(f"| {what[ph]} | {n} | {g(us(u))} | {g(us(ud))} | {g(us(l))} | {g(diff)} | {share} | {g(us(fl))} | {g(us(fd))} | {g(us(tm))} | {g(cpu)} |")
        print()
seq = [r for r in rows if r.get("sec") == "seq"]
if seq:
    print("### Sequential 1 MiB streams, MiB/s")
    print()
    print("Write: 1 MiB `write`s and an fsync at the end (fio, `--end_fsync=1`; library: `write` calls then `commit()`),")
    print("MiB/s from the wall time. Read: after unmount, remount and `drop_caches` (cold), 1 MiB reads. The FUSE floor")
    print("discards data and reads zeros: it is the FUSE transfer cost alone. tmpfs reads are never cold.")
    print()
    head = "| stream | MiB | " + " | ".join(name[t] for t in targets) + " | ubtrfs / btrfs | ubtrfs / XFS | ubtrfs server CPU ms / MiB |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for wl in ("write", "read"):
        v = {}
        mib = None
        for t in targets:
            r = get(sec="seq", tgt=t, wl=wl)
            if not r or r.get("rc", 0) != 0 or r.get("errors", 0) != 0:
                v[t] = None
                continue
            mib = r["mib"]
            secs = r["secs"] + (r.get("commit_secs", 0) if t == "lib" else 0)
            v[t] = r["mib"] / secs if secs else None
        ur = get(sec="seq", tgt="ubtrfs", wl=wl)
        cpu = f"{ur['srv_cpu_s'] * 1e3 / ur['mib']:.1f}" if ur and "srv_cpu_s" in ur else "n/a"
        print(f"| {'write + fsync' if wl == 'write' else 'read, cold'} | {mib} | " + " | ".join(f(v[t]) for t in targets)
              + f" | {q(v.get('ubtrfs'), v.get('btrfs'), True)} | {q(v.get('ubtrfs'), v.get('xfs'))} | {cpu} |")
    print()
bad = [r for r in rows if r.get("rc", 0) != 0 or r.get("errors", 0) not in (0, None)]
if bad:
    print("Failures: " + "; ".join(f"{r.get('tgt')} {r.get('phase', r.get('wl'))} procs {r.get('procs', 1)}: rc {r.get('rc')}, errors {r.get('errors')} {r.get('first_error', '')}" for r in bad))
    print()
EOF
    echo "Setup: every target gets a fresh $IMG_SIZE sparse image file in \`$W\` (ubtrfs, library and kernel btrfs:"
    echo "\`mkfs.btrfs $MKFS_BTRFS_OPTS\`; XFS: \`mkfs.xfs $MKFS_XFS_OPTS\`), the kernel filesystems on a loop device;"
    echo "ubtrfs is \`ubtrfs mount IMG MNT\` with default options: requests over io_uring ($URING_STATE); \"/dev/fuse\" targets"
    echo "add \`-o nouring\` (the floor: \`--nouring\`). Small files: \`bench/smallfiles.c\` (open O_CREAT|O_EXCL"
    echo "+ close, lstat, opendir/readdir, unlink), file i in directory i % $DIRS, each of N processes owning every N-th"
    echo "directory; the library runs \`crates/ubtrfs-cli/examples/libbench.rs\` (lookup + stat, read_dir, create,"
    echo "unlink on one \`Filesystem\`, N threads). The FUSE floor is \`crates/ubtrfs-cli/examples/fuse_floor.rs\`: names and"
    echo "sizes in memory, the same FUSE crate, threads and capabilities as \`ubtrfs mount\`."
    echo "Load average at the start: $LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg) ($(nproc) CPUs)."
    echo
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r), $(btrfs --version | head -1), $(mkfs.xfs -V | head -1);"
    echo "\`$BENCH_DIR\` is $backing."
} >"$results"

echo
cat "$results"
echo
log "saved to $results; every measurement in $RAW, logs in $W"

#!/usr/bin/env bash
# Scrubbing: `ubtrfs scrub` of an unmounted image and of a ubtrfs mount vs
# the kernel's `btrfs scrub start -B` of the same image, and `xfs_repair
# -n` of an unmounted XFS image holding the same files (a check of its
# metadata only: XFS has no data checksums, and kernels without online
# scrub have no `xfs_scrub`; for scale). The btrfs image is filled once
# by the kernel: SIZE MiB of random data in 64 MiB files and FILES small
# files. Each scrub starts with cold caches; the median of RUNS runs is
# reported, in seconds and in MiB/s of the bytes the kernel's scrub says
# it read (every copy, data and tree blocks: the same work for the three
# btrfs rows), with ubtrfs' speed over the kernel's.
#
#   sudo bench/scrub.sh [--size MiB] [--files N] [--runs N]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (default 4G),
# MKFS_BTRFS_OPTS (default: mkfs.btrfs's, DUP metadata), MKFS_XFS_OPTS.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=scrub.sh
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-4G}
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS-}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
SIZE=1024
FILES=20000
RUNS=3

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --size MiB    random data in 64 MiB files (default 1024)
  --files N     small files of 1-8 KiB (default 20000)
  --runs N      cold runs of each scrub; the median is shown (default 3)
EOF
}

parse_args "--size:SIZE --files:FILES --runs:RUNS" "" "$@"
[[ $SIZE =~ ^[1-9][0-9]*$ ]] || die "--size wants a number of MiB"
[[ $FILES =~ ^[0-9]+$ ]] || die "--files wants a number"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs wants a number"

need_root "loop devices, mounts, drop_caches"
need_commands "btrfs-progs xfsprogs fuse3 python3 util-linux" \
    mkfs.btrfs btrfs mkfs.xfs xfs_repair mount umount fusermount3 findmnt python3 flock
need_ubtrfs
need_fuse
need_drop_caches
need_kernel_fs btrfs xfs

mkdir -p "$BENCH_DIR"
bench_lock
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/scrub
mkdir -p "$W/mnt"
private_ubtrfs "$W"
MNT=$W/mnt
BTRFS_IMG=$W/btrfs.img
XFS_IMG=$W/xfs.img
results=$BENCH_DIR/scrub-results.md

cleanup() {
    if mountpoint -q "$MNT"; then
        umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# The same files on a mounted filesystem.
fill() { # dir
    local i
    for ((i = 0; i < SIZE / 64; i++)); do
        head -c $((64 << 20)) /dev/urandom >"$1/big-$i"
    done
    python3 - "$1" "$FILES" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
for d in range(100):
    os.makedirs(f"{root}/small/{d}", exist_ok=True)
for i in range(n):
    with open(f"{root}/small/{i % 100}/f{i}", "wb") as f:
        f.write(os.urandom(rng.randint(1024, 8192)))
PY
    sync
}

log "filling a btrfs image (kernel) and an XFS image: $SIZE MiB, $FILES small files"
IMG=$BTRFS_IMG mkfs_image "$BTRFS_IMG" btrfs btrfs
mount -o loop "$BTRFS_IMG" "$MNT"
fill "$MNT"
umount "$MNT"
IMG=$XFS_IMG mkfs_image "$XFS_IMG" xfs xfs
mount -o loop "$XFS_IMG" "$MNT"
fill "$MNT"
umount "$MNT"

# Seconds of one cold run of `target`; its "checked" MiB go to $W/mib.
run_once() { # target
    local t0 t1 out pid
    drop_caches
    case $1 in
        btrfs)
            mount -o loop "$BTRFS_IMG" "$MNT"
            drop_caches
            t0=$(now_ns)
            out=$(btrfs scrub start -B -R "$MNT")
            t1=$(now_ns)
            umount "$MNT"
            grep -Eq "(csum|read|verify|uncorrectable)_errors: [1-9]" <<<"$out" && die "kernel scrub: $out"
            awk '/(data|tree)_bytes_scrubbed/ { n += $2 } END { printf "%.0f\n", n / 1048576 }' \
                <<<"$out" >"$W/mib"
            ;;
        ubtrfs)
            t0=$(now_ns)
            out=$("$UBTRFS" scrub --quiet "$BTRFS_IMG")
            t1=$(now_ns)
            ;;
        ubtrfs-mount)
            setsid -w "$UBTRFS" mount "$BTRFS_IMG" "$MNT" 2>"$W/log-ubtrfs.txt" &
            pid=$!
            wait_fuse_mount "$MNT" "$pid" || die "ubtrfs mount failed: $(tail -n 3 "$W/log-ubtrfs.txt")"
            drop_caches
            t0=$(now_ns)
            out=$("$UBTRFS" scrub --quiet "$MNT")
            t1=$(now_ns)
            "$UBTRFS" umount "$MNT"
            wait "$pid" || die "ubtrfs mount exited non-zero"
            ;;
        xfs)
            t0=$(now_ns)
            xfs_repair -n "$XFS_IMG" >"$W/log-xfs_repair.txt" 2>&1 ||
                die "xfs_repair -n: $(tail -n 3 "$W/log-xfs_repair.txt")"
            t1=$(now_ns)
            echo 0 >"$W/mib"
            ;;
    esac
    if [[ $1 == ubtrfs* ]]; then
        grep -q "no errors found" <<<"$out" || die "ubtrfs scrub: $out"
    fi
    python3 -c 'import sys; a, b = map(int, sys.argv[1:]); print("%.2f" % ((b - a) / 1e9))' "$t0" "$t1"
}

declare -A SECS MIB
for t in btrfs ubtrfs ubtrfs-mount xfs; do
    times=()
    for ((r = 0; r < RUNS; r++)); do
        log "$t: run $((r + 1)) of $RUNS"
        times+=("$(run_once "$t")")
    done
    SECS[$t]=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")
    # The kernel's count of the bytes read stands for the btrfs rows.
    [[ $t == ubtrfs* ]] || MIB[$t]=$(cat "$W/mib")
    [[ $t != ubtrfs* ]] || MIB[$t]=${MIB[btrfs]}
done

host_facts
disk_facts
{
    echo "bench/scrub.sh: $SIZE MiB in 64 MiB files and $FILES small files; image $IMG_SIZE" \
        "(mkfs.btrfs ${MKFS_BTRFS_OPTS:-defaults}); median of $RUNS cold runs"
    echo "ubtrfs $UBTRFS_ID; commit $commit$dirty; $cpu, $mem; $backing ($sched, write cache $wcache)"
    echo
    echo "| scrub | seconds | read (MiB, every copy) | MiB/s | speed / kernel btrfs |"
    echo "|---|---|---|---|---|"
    for t in btrfs ubtrfs ubtrfs-mount xfs; do
        rate=$(python3 -c 'import sys; s, m = map(float, sys.argv[1:]); print("%.0f" % (m / s) if s and m else "n/a")' \
            "${SECS[$t]}" "${MIB[$t]}")
        speed=$(ratio "${SECS[btrfs]}" "${SECS[$t]}")
        case $t in
            btrfs) name="kernel btrfs (\`btrfs scrub start -B\`)" ;;
            ubtrfs) name="ubtrfs, image (\`ubtrfs scrub IMG\`)" ;;
            ubtrfs-mount) name="ubtrfs, mount (\`ubtrfs scrub MNT\`)" ;;
            xfs) name="XFS (\`xfs_repair -n\`, metadata only)"; speed="n/a" ;;
        esac
        echo "| $name | ${SECS[$t]} | ${MIB[$t]} | $rate | $speed |"
    done
} | tee "$results"
rm -f "$BTRFS_IMG" "$XFS_IMG"

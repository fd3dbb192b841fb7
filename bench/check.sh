#!/usr/bin/env bash
# Checking: `ubtrfs check` of an unmounted image vs `btrfs check
# --readonly` of the same image, and `xfs_repair -n` of an XFS image
# holding the same files (for scale). The btrfs image is filled once by
# the kernel: SIZE MiB of random data in 64 MiB files, FILES small files
# in 100 directories, then a snapshot of the whole with a tenth of the
# small files changed in it (shared and full-backref blocks). Each check
# starts with cold caches; the median of RUNS runs is reported, in seconds,
# with ubtrfs' speed over btrfs-progs'. Both checks must find nothing.
#
#   sudo bench/check.sh [--size MiB] [--files N] [--runs N]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (default 4G),
# MKFS_BTRFS_OPTS (default: mkfs.btrfs's, DUP metadata), MKFS_XFS_OPTS.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=check.sh
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-4G}
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS-}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
SIZE=256
FILES=100000
RUNS=3

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --size MiB    random data in 64 MiB files (default 256)
  --files N     small files of 1-8 KiB (default 100000)
  --runs N      cold runs of each check; the median is shown (default 3)
EOF
}

parse_args "--size:SIZE --files:FILES --runs:RUNS" "" "$@"
[[ $SIZE =~ ^[0-9]+$ ]] || die "--size wants a number of MiB"
[[ $FILES =~ ^[0-9]+$ ]] || die "--files wants a number"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs wants a number"

need_root "loop devices, mounts, drop_caches"
need_commands "btrfs-progs xfsprogs python3 util-linux" \
    mkfs.btrfs btrfs mkfs.xfs xfs_repair mount umount python3 flock
need_ubtrfs
need_drop_caches
need_kernel_fs btrfs xfs

mkdir -p "$BENCH_DIR"
bench_lock
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/check
mkdir -p "$W/mnt"
private_ubtrfs "$W"
MNT=$W/mnt
BTRFS_IMG=$W/btrfs.img
XFS_IMG=$W/xfs.img
results=$BENCH_DIR/check-results.md

cleanup() {
    if mountpoint -q "$MNT"; then
        umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
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

# A tenth of the small files changed (in the snapshot, on btrfs).
change() { # dir
    python3 - "$1" "$FILES" <<'PY'
import sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(0, n, 10):
    with open(f"{root}/small/{i % 100}/f{i}", "ab") as f:
        f.write(b"changed")
PY
    sync
}

log "filling a btrfs image (kernel) and an XFS image: $SIZE MiB, $FILES small files"
IMG=$BTRFS_IMG mkfs_image "$BTRFS_IMG" btrfs btrfs
mount -o loop "$BTRFS_IMG" "$MNT"
btrfs subvolume create "$MNT/vol" >/dev/null
fill "$MNT/vol"
btrfs subvolume snapshot "$MNT/vol" "$MNT/snap" >/dev/null
change "$MNT/snap"
umount "$MNT"
IMG=$XFS_IMG mkfs_image "$XFS_IMG" xfs xfs
mount -o loop "$XFS_IMG" "$MNT"
fill "$MNT"
change "$MNT"
umount "$MNT"

# Seconds of one cold run of `target`.
run_once() { # target
    local t0 t1
    drop_caches
    t0=$(now_ns)
    case $1 in
        btrfs)
            btrfs check --readonly "$BTRFS_IMG" >"$W/log-btrfs.txt" 2>&1 ||
                die "btrfs check: $(tail -n 5 "$W/log-btrfs.txt")"
            ;;
        ubtrfs)
            "$UBTRFS" check --quiet "$BTRFS_IMG" >"$W/log-ubtrfs.txt" 2>&1 ||
                die "ubtrfs check: $(tail -n 5 "$W/log-ubtrfs.txt")"
            ;;
        xfs)
            xfs_repair -n "$XFS_IMG" >"$W/log-xfs_repair.txt" 2>&1 ||
                die "xfs_repair -n: $(tail -n 3 "$W/log-xfs_repair.txt")"
            ;;
    esac
    t1=$(now_ns)
    python3 -c 'import sys; a, b = map(int, sys.argv[1:]); print("%.2f" % ((b - a) / 1e9))' "$t0" "$t1"
}

declare -A SECS
for t in btrfs ubtrfs xfs; do
    times=()
    for ((r = 0; r < RUNS; r++)); do
        log "$t: run $((r + 1)) of $RUNS"
        times+=("$(run_once "$t")")
    done
    SECS[$t]=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")
done
grep -q "no errors found" "$W/log-ubtrfs.txt" || die "ubtrfs check: $(cat "$W/log-ubtrfs.txt")"

host_facts
disk_facts
{
    echo "bench/check.sh: $SIZE MiB in 64 MiB files and $FILES small files, a snapshot with a tenth changed;" \
        "image $IMG_SIZE (mkfs.btrfs ${MKFS_BTRFS_OPTS:-defaults}); median of $RUNS cold runs"
    echo "ubtrfs $UBTRFS_ID; commit $commit$dirty; $cpu, $mem; $backing ($sched, write cache $wcache)"
    echo
    head -n 1 "$W/log-ubtrfs.txt"
    echo
    echo "| check | seconds | speed / btrfs check |"
    echo "|---|---|---|"
    for t in btrfs ubtrfs xfs; do
        speed=$(ratio "${SECS[btrfs]}" "${SECS[$t]}")
        case $t in
            btrfs) name="btrfs-progs (\`btrfs check --readonly\`)" ;;
            ubtrfs) name="ubtrfs (\`ubtrfs check\`)" ;;
            xfs) name="XFS (\`xfs_repair -n\`, for scale)"; speed="n/a" ;;
        esac
        echo "| $name | ${SECS[$t]} | $speed |"
    done
} | tee "$results"
rm -f "$BTRFS_IMG" "$XFS_IMG"

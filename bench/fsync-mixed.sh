#!/usr/bin/env bash
# fsync of small writes, alone and while another file streams (the case
# the log tree is for: one file's fsync should not wait for everybody's
# data). One fio job does 4 KiB random writes with an fsync after each into
# an existing 64 MiB file for RUNTIME seconds; then again while another job
# streams 1 MiB writes into a second file; then again while another
# process creates CREATES empty files (should an fsync shut out every other
# change while the device flushes, the creates crawl): ubtrfs (FUSE) vs
# kernel btrfs vs XFS on image files of the same size on the same disk, in
# one run. Prints a Markdown table.
#
#   sudo bench/fsync-mixed.sh [--runtime S] [--targets LIST]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (default 4G),
# MKFS_BTRFS_OPTS (default "-m single -d single"), MKFS_XFS_OPTS.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=fsync-mixed.sh
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-4G}
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS--m single -d single}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
RUNTIME=15
CREATES=20000
TARGETS="ubtrfs btrfs xfs"

usage() {
    sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --runtime S      seconds each target runs (default 15)
  --creates N      files created beside the fsync job (default 20000)
  --targets LIST   any of: ubtrfs btrfs xfs (default: all)
EOF
}

parse_args "--runtime:RUNTIME --creates:CREATES --targets:TARGETS" "" "$@"
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "--runtime wants a number of seconds"
[[ $CREATES =~ ^[1-9][0-9]*$ ]] || die "--creates wants a number of files"
for t in $TARGETS; do
    [[ $t =~ ^(ubtrfs|btrfs|xfs)$ ]] || die "unknown target $t"
done

need_root "loop devices and mounts"
need_commands "fio btrfs-progs xfsprogs fuse3 python3 util-linux gcc" \
    fio mkfs.btrfs mkfs.xfs mount umount losetup fusermount3 findmnt python3 flock cc
[[ " $TARGETS " != *" ubtrfs "* ]] || { need_ubtrfs; need_fuse; }
need_kernel_fs btrfs xfs

mkdir -p "$BENCH_DIR"
bench_lock
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/fsync-mixed
mkdir -p "$W/mnt"
[[ " $TARGETS " != *" ubtrfs "* ]] || private_ubtrfs "$W"
MNT=$W/mnt
IMG=$W/disk.img
cc -O2 -Wall -o "$W/smallfiles" "$here/smallfiles.c" || die "cannot build bench/smallfiles.c"
SMALL=$W/smallfiles
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
results=$BENCH_DIR/fsync-mixed-results.md
declare -A ROW

cleanup() {
    if mountpoint -q "$MNT"; then
        umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# On the mounted target: the fsync job alone, then with the stream
# alongside, then with the creates; prints "alone_iops alone_mean
# alone_p99 iops mean_ms p99_ms stream_mbs creates_iops creates_per_s".
measure() {
    fio --name=prep --directory="$MNT" --filename=small --size=64M --rw=write --bs=1M \
        --end_fsync=1 >/dev/null
    sync
    fio --output-format=json --directory="$MNT" --time_based --runtime="$RUNTIME" \
        --name=sync --filename=small --size=64M --rw=randwrite --bs=4k --fsync=1 --ioengine=psync \
        >"$W/fio-$1-alone.json"
    sync
    fio --output-format=json --directory="$MNT" --time_based --runtime="$RUNTIME" \
        --name=sync --filename=small --size=64M --rw=randwrite --bs=4k --fsync=1 --ioengine=psync \
        --name=stream --filename=big --size=1G --rw=write --bs=1M --ioengine=psync \
        >"$W/fio-$1.json"
    rm -f "$MNT/big"
    sync
    fio --output-format=json --directory="$MNT" --time_based --runtime="$RUNTIME" \
        --name=sync --filename=small --size=64M --rw=randwrite --bs=4k --fsync=1 --ioengine=psync \
        >"$W/fio-$1-creates.json" &
    local fio_pid=$!
    sleep 1
    mkdir -p "$MNT/c"
    "$SMALL" create "$MNT/c" "$CREATES" 100 1 >"$W/creates-$1.json" ||
        { kill "$fio_pid"; die "$1: the creates failed"; }
    wait "$fio_pid" || die "$1: the fsync job beside the creates failed"
    python3 - "$W/fio-$1-alone.json" "$W/fio-$1.json" "$W/fio-$1-creates.json" "$W/creates-$1.json" <<'PY'
import json, sys
def sync_job(path):
    jobs = {j["jobname"]: j for j in json.load(open(path))["jobs"]}
    s = jobs["sync"]
    if s.get("error"):
        sys.exit("fio sync job failed with error %d" % s["error"])
    lat = s["sync"]["lat_ns"]
    p99 = lat.get("percentile", {}).get("99.000000", 0)
    return jobs, "%.0f %.2f %.2f" % (s["write"]["iops"], lat["mean"] / 1e6, p99 / 1e6)
_, alone = sync_job(sys.argv[1])
jobs, mixed = sync_job(sys.argv[2])
beside, _ = sync_job(sys.argv[3])
c = json.load(open(sys.argv[4]))
if c["errors"]:
    sys.exit("creates failed: %s" % c["first_error"])
print(alone, mixed, "%.0f" % (jobs["stream"]["write"]["bw"] / 1024),
      "%.0f" % beside["sync"]["write"]["iops"], "%.0f" % (c["ops"] / c["secs"]))
PY
}

for t in $TARGETS; do
    log "$t: new image"
    mount_target "$t"
    log "$t: fio for $RUNTIME s"
    ROW[$t]=$(measure "$t")
    unmount_target "$t"
done

host_facts
{
    echo "## fsync of 4 KiB random writes, alone and while another file streams ($RUNTIME s each)"
    echo
    echo "| target | alone: IOPS | alone: fsync mean ms | alone: p99 ms | with stream: IOPS | mean ms | p99 ms | stream MB/s | with creates: IOPS | creates/s |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for t in $TARGETS; do
        read -r ai am ap iops mean p99 mbs ci cps <<<"${ROW[$t]}"
        echo "| $t | $ai | $am | $ap | $iops | $mean | $p99 | $mbs | $ci | $cps |"
    done
    if [[ -n ${ROW[ubtrfs]:-} ]]; then
        read -r uai _ _ ui _ _ us uci ucps <<<"${ROW[ubtrfs]}"
        for t in btrfs xfs; do
            [[ -n ${ROW[$t]:-} ]] || continue
            read -r oai _ _ oi _ _ os oci ocps <<<"${ROW[$t]}"
            echo
            echo "ubtrfs / $t: fsync IOPS alone $(ratio "$uai" "$oai"), with the stream $(ratio "$ui" "$oi"), stream $(ratio "$us" "$os"), fsync IOPS beside the creates $(ratio "$uci" "$oci"), creates $(ratio "$ucps" "$ocps")"
        done
    fi
    echo
    echo "Creates: bench/smallfiles.c, $CREATES empty files in 100 directories by one process, while the fsync job runs."
    echo
    echo "Images: $IMG_SIZE sparse files in \`$W\` (btrfs: \`mkfs.btrfs $MKFS_BTRFS_OPTS\`), kernel"
    echo "filesystems on loop devices, ubtrfs with \`ubtrfs mount\` defaults (fsync logs the file)."
    echo "Commit $commit$dirty; ubtrfs ${UBTRFS_ID:-not run}."
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r). Load average at the start:"
    echo "$LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg)."
} >"$results"
echo
cat "$results"
log "saved to $results"

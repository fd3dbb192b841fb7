#!/usr/bin/env bash
# Writing with compression: ubtrfs (FUSE, -o compress=ALGO) vs the kernel's
# btrfs (-o compress=ALGO) vs XFS (no compression, for scale), each on an
# image file of the same size on the same disk, in one run:
#   stream: SIZE MiB of half-compressible data (every other 128 KiB is
#           text, the rest random) in 1 MiB writes, then fsync: MiB/s,
#           and the space it took;
#   fsync:  4 KiB random writes + fsync into a 64 MiB file for RUNTIME
#           seconds while another process streams that data: IOPS and
#           p99 latency (does compressing the stream hold up the others?).
# Prints a Markdown table with ratios.
#
#   sudo bench/compress.sh [--size MiB] [--runtime S] [--algo zstd|lzo|zlib] [--targets LIST]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (default 4G),
# MKFS_BTRFS_OPTS (default "-m single -d single"), MKFS_XFS_OPTS.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=compress.sh
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-4G}
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS--m single -d single}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
SIZE=512
RUNTIME=10
ALGO=zstd
TARGETS="ubtrfs btrfs xfs"

usage() {
    sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --size MiB       size of the streamed file (default 512)
  --runtime S      seconds of the fsync workload (default 10)
  --algo A         zstd, lzo or zlib (default zstd)
  --targets LIST   any of: ubtrfs btrfs xfs (default: all)
EOF
}

parse_args "--size:SIZE --runtime:RUNTIME --algo:ALGO --targets:TARGETS" "" "$@"
[[ $SIZE =~ ^[1-9][0-9]*$ ]] || die "--size wants a number of MiB"
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "--runtime wants a number of seconds"
[[ $ALGO =~ ^(zstd|lzo|zlib)$ ]] || die "--algo wants zstd, lzo or zlib"
for t in $TARGETS; do
    [[ $t =~ ^(ubtrfs|btrfs|xfs)$ ]] || die "unknown target $t"
done

need_root "loop devices, mounts, drop_caches"
need_commands "btrfs-progs xfsprogs fuse3 python3 util-linux" \
    mkfs.btrfs mkfs.xfs mount umount losetup fusermount3 findmnt python3 flock
[[ " $TARGETS " != *" ubtrfs "* ]] || { need_ubtrfs; need_fuse; }
need_drop_caches
need_kernel_fs btrfs xfs

mkdir -p "$BENCH_DIR"
bench_lock
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/compress
mkdir -p "$W/mnt"
[[ " $TARGETS " != *" ubtrfs "* ]] || private_ubtrfs "$W"
MNT=$W/mnt
IMG=$W/disk.img
DATA=$W/data-$SIZE
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
results=$BENCH_DIR/compress-results.md
declare -A ROW

cleanup() {
    if mountpoint -q "$MNT"; then
        umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# The streamed data, made once: words drawn from a small vocabulary
# (compresses about 2.5:1 with zstd) alternating with random bytes.
if [[ ! -s $DATA ]]; then
    log "making $SIZE MiB of half-compressible data"
    python3 - "$DATA" "$SIZE" <<'PY'
import os, random, sys
path, size = sys.argv[1], int(sys.argv[2]) << 20
rng = random.Random(1)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
         for _ in range(5000)]
piece = 128 << 10
with open(path + ".tmp", "wb") as f:
    done = 0
    while done < size:
        if (done // piece) % 2 == 0:
            text = " ".join(rng.choice(words) for _ in range(30000)).encode()
            f.write(text[:piece])
        else:
            f.write(os.urandom(piece))
        done += piece
os.rename(path + ".tmp", path)
PY
fi

# On the mounted target: prints "stream_MiB/s used_MiB iops p99_ms".
measure() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    cat "$DATA" >/dev/null
    local before after t0 t1
    before=$(df -k --output=used "$MNT" | tail -n 1)
    t0=$(now_ns)
    dd if="$DATA" of="$MNT/stream" bs=1M conv=fsync status=none
    t1=$(now_ns)
    sync
    after=$(df -k --output=used "$MNT" | tail -n 1)
    rm -f "$MNT/stream"
    sync
    python3 -c 'import sys; n, a, b = map(int, sys.argv[1:]); print("%.0f" % (n / ((b - a) / 1e9)), end=" ")' \
        "$SIZE" "$t0" "$t1"
    echo -n "$(((after - before) / 1024)) "
    # The fsync workload, with the stream running alongside.
    python3 -c '
import sys
data = open(sys.argv[1], "rb").read()
while True:
    with open(sys.argv[2], "wb") as f:
        for i in range(0, len(data), 1 << 20):
            f.write(data[i:i + (1 << 20)])
' "$DATA" "$MNT/stream" &
    local streamer=$!
    python3 - "$MNT/small" "$RUNTIME" <<'PY'
import os, random, sys, time
path, runtime = sys.argv[1], float(sys.argv[2])
size = 64 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
block = os.urandom(1 << 20)
for i in range(0, size, 1 << 20):
    os.pwrite(fd, block, i)
os.fsync(fd)
rng = random.Random(3)
page = os.urandom(4096)
lat = []
start = time.monotonic()
while time.monotonic() - start < runtime:
    t0 = time.monotonic()
    os.pwrite(fd, page, rng.randrange(size // 4096) * 4096)
    os.fsync(fd)
    lat.append(time.monotonic() - t0)
took = time.monotonic() - start
lat.sort()
print("%.0f %.1f" % (len(lat) / took, lat[int(len(lat) * 0.99)] * 1000))
os.close(fd)
PY
    kill "$streamer" 2>/dev/null || true
    wait "$streamer" 2>/dev/null || true
}

for t in $TARGETS; do
    log "$t: new image"
    mount_target "$t" "$([[ $t == xfs ]] || echo "compress=$ALGO")"
    log "$t: stream of $SIZE MiB, then $RUNTIME s of fsyncs beside a stream"
    ROW[$t]=$(measure)
    unmount_target "$t"
done

host_facts
{
    echo "## Writing with compress=$ALGO (XFS: no compression)"
    echo
    ratio_table "%s" "stream (MiB/s)" "space used (MiB)" "4 KiB write + fsync beside a stream (IOPS)" "fsync p99 (ms)"
    echo
    echo "stream: $SIZE MiB (every other 128 KiB text, the rest random) in 1 MiB writes + fsync,"
    echo "from the page cache; fsync: 4 KiB random writes + fsync into a 64 MiB file for $RUNTIME s"
    echo "while another process rewrites the same data in 1 MiB writes."
    echo "Images: $IMG_SIZE sparse files in \`$W\` (btrfs: \`mkfs.btrfs $MKFS_BTRFS_OPTS\`), kernel"
    echo "filesystems on loop devices."
    echo "Commit $commit$dirty; ubtrfs ${UBTRFS_ID:-not run}."
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r). Load average at the start:"
    echo "$LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg)."
} >"$results"
echo
cat "$results"
log "saved to $results"

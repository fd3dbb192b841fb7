#!/usr/bin/env bash
# fsync after changes of names: what editors, package managers and mail
# servers do to make a file's new version or a new file durable. One
# process, for RUNTIME seconds each, in a directory of 2,000 files:
#   replace: write a 4 KiB temporary file, fsync it, rename it over one
#            of the files, fsync the directory (atomic replace);
#   create:  create a 4 KiB file, fsync it, fsync the directory;
#   move:    create a 4 KiB file in tmp/, fsync it, rename it into new/,
#            fsync new/ (maildir delivery);
#   unlink:  unlink one of the files, fsync the directory.
# ubtrfs (FUSE) vs kernel btrfs vs XFS on image files of the same size on
# the same disk, in one run. Prints a Markdown table with ratios.
#
#   sudo bench/fsync-names.sh [--runtime S] [--targets LIST] [--stream]
#
# With --stream, another process writes a file sequentially in 1 MiB
# writes all along (what makes committing for each fsync expensive).
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (default 4G),
# MKFS_BTRFS_OPTS (default "-m single -d single"), MKFS_XFS_OPTS.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=fsync-names.sh
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-4G}
MKFS_BTRFS_OPTS=${MKFS_BTRFS_OPTS--m single -d single}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
RUNTIME=10
TARGETS="ubtrfs btrfs xfs"
WORKLOADS="replace create move unlink"

usage() {
    sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --runtime S      seconds each workload runs on each target (default 10)
  --targets LIST   any of: ubtrfs btrfs xfs (default: all)
  --stream         stream 1 MiB writes into another file meanwhile
EOF
}

STREAM=0
parse_args "--runtime:RUNTIME --targets:TARGETS" "--stream:STREAM=1" "$@"
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "--runtime wants a number of seconds"
for t in $TARGETS; do
    [[ $t =~ ^(ubtrfs|btrfs|xfs)$ ]] || die "unknown target $t"
done

need_root "loop devices and mounts"
need_commands "btrfs-progs xfsprogs fuse3 python3 util-linux" \
    mkfs.btrfs mkfs.xfs mount umount losetup fusermount3 findmnt python3 flock
[[ " $TARGETS " != *" ubtrfs "* ]] || { need_ubtrfs; need_fuse; }
need_kernel_fs btrfs xfs

mkdir -p "$BENCH_DIR"
bench_lock
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
W=$BENCH_DIR/fsync-names
mkdir -p "$W/mnt"
[[ " $TARGETS " != *" ubtrfs "* ]] || private_ubtrfs "$W"
MNT=$W/mnt
IMG=$W/disk.img
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
results=$BENCH_DIR/fsync-names-results.md
declare -A ROW

cleanup() {
    if mountpoint -q "$MNT"; then
        umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# On the mounted target: each workload for RUNTIME seconds; prints
# "ops/s p99_ms" per workload, in the order of WORKLOADS.
measure() {
    local streamer=
    if ((STREAM)); then
        # Rewrites a 1 GiB file over and over in 1 MiB writes.
        python3 -c '
import os, sys
buf = b"\x5a" * (1 << 20)
while True:
    with open(sys.argv[1], "wb") as f:
        for _ in range(1024):
            f.write(buf)
' "$MNT/stream" &
        streamer=$!
    fi
    python3 - "$MNT" "$RUNTIME" $WORKLOADS <<'PY'
import os, sys, time
mnt, runtime, workloads = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
block = os.urandom(4096)
d = os.path.join(mnt, "d")
tmp, new = os.path.join(mnt, "tmp"), os.path.join(mnt, "new")
for p in (d, tmp, new):
    os.mkdir(p)
for i in range(2000):
    with open(os.path.join(d, "f%d" % i), "wb") as f:
        f.write(block)
os.sync()

def fsync_path(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

def write_new(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)

n = [0]
def replace():
    t = os.path.join(d, ".tmp%d" % n[0])
    write_new(t)
    os.rename(t, os.path.join(d, "f%d" % (n[0] % 2000)))
    fsync_path(d)

def create():
    write_new(os.path.join(d, "c%d" % n[0]))
    fsync_path(d)

def move():
    name = "m%d" % n[0]
    write_new(os.path.join(tmp, name))
    os.rename(os.path.join(tmp, name), os.path.join(new, name))
    fsync_path(new)

def unlink():
    os.unlink(os.path.join(d, "f%d" % n[0]))
    fsync_path(d)

out = []
for w in workloads:
    op = {"replace": replace, "create": create, "move": move, "unlink": unlink}[w]
    lat = []
    n[0] = 0
    start = time.monotonic()
    while time.monotonic() - start < runtime and not (w == "unlink" and n[0] >= 2000):
        t0 = time.monotonic()
        op()
        lat.append(time.monotonic() - t0)
        n[0] += 1
    took = time.monotonic() - start
    lat.sort()
    out.append("%.0f %.2f" % (len(lat) / took, lat[int(len(lat) * 0.99)] * 1000))
    os.sync()
print(" ".join(out))
PY
    if [[ -n $streamer ]]; then
        kill "$streamer" 2>/dev/null || true
        wait "$streamer" 2>/dev/null || true
    fi
}

for t in $TARGETS; do
    log "$t: new image"
    mount_target "$t"
    log "$t: $WORKLOADS, $RUNTIME s each"
    ROW[$t]=$(measure)
    unmount_target "$t"
done

host_facts
{
    echo "## fsync after changes of names (ops/s, p99 in ms; $RUNTIME s each$( ((STREAM)) && echo ", another file streaming"))"
    echo
    # shellcheck disable=SC2086 # one label per workload
    ratio_table "%s ops/s|%s p99 ms" $WORKLOADS
    echo
    echo "One op: replace = write + fsync + rename + directory fsync; create = create + write +"
    echo "fsync + directory fsync; move = create + write + fsync in tmp/, rename into new/,"
    echo "fsync of new/; unlink = unlink + directory fsync (stops after the 2,000 files)."
    echo "Images: $IMG_SIZE sparse files in \`$W\` (btrfs: \`mkfs.btrfs $MKFS_BTRFS_OPTS\`), kernel"
    echo "filesystems on loop devices, ubtrfs with \`ubtrfs mount\` defaults."
    echo "Commit $commit$dirty; ubtrfs ${UBTRFS_ID:-not run}."
    echo "Machine: $(nproc) CPUs ($cpu), $mem RAM, Linux $(uname -r). Load average at the start:"
    echo "$LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg)."
} >"$results"
echo
cat "$results"
log "saved to $results"

#!/usr/bin/env bash
# Writing to RAID5 and RAID6: ubtrfs (FUSE) vs the kernel's btrfs on the
# same image files (3 for RAID5, 4 for RAID6; data and metadata both the
# parity profile), and XFS on one image of the same size for scale (XFS
# has no parity of its own), in one run:
#   seq:  SIZE MiB in 1 MiB writes, then fsync: MiB/s;
#   rand: 4 KiB random writes into a 64 MiB file, fsync every 16, for
#         RUNTIME seconds: IOPS (a write inside a row reads the rest of
#         the row's columns and rewrites its parity).
# Prints a Markdown table per profile with ratios.
#
#   sudo bench/raid56.sh [--size MiB] [--runtime S] [--profiles "raid5 raid6"] [--targets LIST]
#
# Environment: BENCH_DIR (work dir, default /var/tmp/ubtrfs-bench), UBTRFS
# (the binary, default target/release/ubtrfs), IMG_SIZE (each image,
# default 3G).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
BENCH_SCRIPT=raid56.sh
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

BENCH_DIR=${BENCH_DIR:-/var/tmp/ubtrfs-bench}
UBTRFS=${UBTRFS:-$repo/target/release/ubtrfs}
IMG_SIZE=${IMG_SIZE:-3G}
MKFS_XFS_OPTS=${MKFS_XFS_OPTS-}
SIZE=1024
RUNTIME=10
PROFILES="raid5 raid6"
TARGETS="ubtrfs btrfs xfs"

usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

  --size MiB       size of the streamed file (default 1024)
  --runtime S      seconds of random writes (default 10)
  --profiles LIST  raid5 and/or raid6 (default both)
  --targets LIST   any of: ubtrfs btrfs xfs (default all)
EOF
}

parse_args "--size:SIZE --runtime:RUNTIME --profiles:PROFILES --targets:TARGETS" "" "$@"

need_root "loop devices, mounts, drop_caches"
need_commands "btrfs-progs xfsprogs fio fuse3" mkfs.btrfs "mkfs.xfs (xfsprogs)" fio losetup "fusermount3 (fuse3)"
need_ubtrfs
need_fuse
need_drop_caches
need_kernel_fs btrfs xfs
mkdir -p "$BENCH_DIR"
bench_lock
W=$BENCH_DIR/raid56
rm -rf "$W"
mkdir -p "$W/mnt"
MNT=$W/mnt
IMG=$W/xfs.img
private_ubtrfs "$W"
LOOPS=()

cleanup() {
    findmnt -rn -M "$MNT" >/dev/null 2>&1 && { "$UBTRFS" umount "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null || true; }
    local l
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
}
trap cleanup EXIT

# Mount `target` on MNT for profile `p`: the btrfs targets on fresh
# images made by mkfs.btrfs, XFS on one image.
mount_raid() { # target profile
    local t=$1 p=$2 n=3 i
    [[ $p == raid6 ]] && n=4
    DEVS=()
    for ((i = 0; i < n; i++)); do
        rm -f "$W/d$i.img"
        truncate -s "$IMG_SIZE" "$W/d$i.img"
        DEVS+=("$W/d$i.img")
    done
    case $t in
        xfs) mount_target xfs ;;
        *)
            mkfs.btrfs -f -d "$p" -m "$p" "${DEVS[@]}" >"$W/log-mkfs.txt" 2>&1 ||
                { cat "$W/log-mkfs.txt" >&2; die "mkfs.btrfs $p failed"; }
            if [[ $t == ubtrfs ]]; then
                setsid -w "$UBTRFS" mount "${DEVS[@]}" "$MNT" 2>"$W/log-ubtrfs.txt" &
                UBTRFS_PID=$!
                wait_fuse_mount "$MNT" "$UBTRFS_PID" || die "ubtrfs mount failed: $(tail -n 3 "$W/log-ubtrfs.txt")"
            else
                LOOPS=()
                local opts="" d l
                for d in "${DEVS[@]}"; do
                    l=$(losetup -f --show "$d")
                    LOOPS+=("$l")
                    opts+=",device=$l"
                done
                mount -t btrfs -o "${opts#,}" "${LOOPS[0]}" "$MNT"
            fi
            ;;
    esac
}

unmount_raid() { # target
    case $1 in
        xfs) unmount_target xfs ;;
        ubtrfs) unmount_target ubtrfs ;;
        *)
            umount "$MNT"
            local l
            for l in "${LOOPS[@]}"; do losetup -d "$l"; done
            LOOPS=()
            ;;
    esac
    rm -f "$W"/d*.img
}

fio_value() { # what(bw_mib|iops) fio-args...
    local what=$1
    shift
    fio --output-format=json "$@" 2>>"$W/log-fio.txt" | python3 -c '
import json, sys
w = json.load(sys.stdin)["jobs"][0]["write"]
print(round(w["bw"] / 1024) if sys.argv[1] == "bw_mib" else round(w["iops"]))' "$what"
}

host_facts
disk_facts
for p in $PROFILES; do
    declare -A ROW=()
    for t in $TARGETS; do
        log "$p: $t"
        mount_raid "$t" "$p"
        drop_caches
        seq=$(fio_value bw_mib --name=seq --filename="$MNT/seq" --rw=write --bs=1M --size="${SIZE}M" \
            --end_fsync=1 --ioengine=psync)
        rnd=$(fio_value iops --name=rnd --filename="$MNT/rnd" --rw=randwrite --bs=4k --size=64M \
            --fsync=16 --runtime="$RUNTIME" --time_based --ioengine=psync)
        unmount_raid "$t"
        ROW[$t]="$seq $rnd"
        log "  seq $seq MiB/s, rand $rnd IOPS"
    done
    echo
    echo "### $p"
    echo
    ratio_table "%s" "1 MiB writes + fsync (MiB/s)" "4 KiB random writes, fsync every 16 (IOPS)"
    unset ROW
done
echo
echo "ubtrfs $UBTRFS_ID (checkout $commit$dirty); $(nproc) CPUs ($cpu), $mem RAM, $(uname -r)."
echo "Images: $IMG_SIZE each in $BENCH_DIR ($backing; disk $disk, rotational $rot, scheduler $sched, write cache $wcache)."
echo "RAID5 on 3 images, RAID6 on 4 (mkfs.btrfs -d P -m P); XFS on one image for scale."

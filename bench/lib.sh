# Shared by the benchmark scripts, sourced after they set BENCH_SCRIPT (their
# name, for messages): messages, prerequisite checks, the lock on BENCH_DIR,
# a private copy of the binary, dropping caches, waiting for a FUSE mount,
# and the facts every report starts with. Not a script of its own.

die() { echo "$BENCH_SCRIPT: $*" >&2; exit 1; }
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
now_ns() { date +%s%N; }

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

need_root() { # why
    (( EUID == 0 )) || die "needs root ($1); run with sudo"
}

# Every command is looked up; those missing are named in one message. An
# entry may carry a note after a space ("mkfs.xfs (xfsprogs)"), shown too.
need_commands() { # debian-packages command...
    local pkgs=$1 c missing=()
    shift
    for c in "$@"; do
        command -v "${c%% *}" >/dev/null || missing+=("$c")
    done
    ((${#missing[@]} == 0)) || die "missing: ${missing[*]} (Debian: apt-get install $pkgs)"
}

need_ubtrfs() { # [how to build it]
    [[ -x $UBTRFS ]] ||
        die "no ubtrfs binary at $UBTRFS; build it: ${1:-cargo build --release -p ubtrfs-cli (or set UBTRFS=)}"
}

need_drop_caches() { # [why it matters]
    [[ -w /proc/sys/vm/drop_caches ]] || die "cannot write /proc/sys/vm/drop_caches${1:+ $1}"
}

need_fuse() {
    [[ -e /dev/fuse ]] || die "no /dev/fuse (modprobe fuse)"
}

need_kernel_fs() { # fstype...
    local fs
    for fs in "$@"; do
        grep -qw "$fs" /proc/filesystems || modprobe "$fs" 2>/dev/null || die "the kernel has no $fs"
    done
}

# Benchmarks sharing BENCH_DIR (and so the disk) take turns: hold
# BENCH_DIR/.lock on fd 9 until the script exits.
bench_lock() {
    exec 9>"$BENCH_DIR/.lock"
    if ! flock -n 9; then
        log "waiting for another benchmark that holds $BENCH_DIR/.lock"
        flock 9
    fi
}

# Run a private copy of the binary: a rebuild during the run must not change
# what is measured half-way. Sets UBTRFS (the copy) and UBTRFS_ID.
private_ubtrfs() { # dir
    cp "$UBTRFS" "$1/ubtrfs.bin"
    UBTRFS_ID="$(sha256sum "$UBTRFS" | cut -c1-12), built $(date -r "$UBTRFS" '+%F %T')"
    UBTRFS=$1/ubtrfs.bin
}

# Wait up to 30 s for a FUSE filesystem on `mnt`; fails at once if its
# server `pid` has exited.
wait_fuse_mount() { # mnt pid
    local i
    for ((i = 0; i < 300; i++)); do
        [[ $(findmnt -rn -M "$1" -o FSTYPE 2>/dev/null) == fuse* ]] && return 0
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}

# For the report: sets commit and dirty (this checkout), mem and cpu.
host_facts() {
    commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
    dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "+dirty" || true)
    mem=$(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
    cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)
}

# For the report: sets backing (filesystem and device of BENCH_DIR), dev,
# disk (the whole disk under it), rot, sched, wcache and ra (its queue
# settings, '?' where unknown).
disk_facts() {
    backing=$(df -T "$BENCH_DIR" | awk 'NR == 2 { print $2 " on " $1 }')
    dev=$(findmnt -no SOURCE --target "$BENCH_DIR" | sed 's|^/dev/||; s|\[.*||')
    disk=$(lsblk -ndo PKNAME "/dev/$dev" 2>/dev/null || true); disk=${disk:-$dev}
    rot=$(cat "/sys/block/$disk/queue/rotational" 2>/dev/null || echo '?')
    sched=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "/sys/block/$disk/queue/scheduler" 2>/dev/null || echo '?')
    wcache=$(cat "/sys/block/$disk/queue/write_cache" 2>/dev/null || echo '?')
    ra=$(cat "/sys/block/$disk/queue/read_ahead_kb" 2>/dev/null || echo '?')
}

# The command line: `parse_args "VALUE_OPTS" "FLAGS" "$@"`. VALUE_OPTS maps
# each option with a value to its variable ("--runs:RUNS --jobs:JOBS": both
# `--runs N` and `--runs=N`); FLAGS maps each flag to an assignment
# ("--quick:QUICK=1 --no-kernel:KERNEL=0"). -h/--help prints `usage` and
# exits 0; anything else is an error (exit 2).
parse_args() { # value_opts flags arg...
    local values=$1 flags=$2 spec opt
    shift 2
    while (($#)); do
        case $1 in
            -h|--help) usage; exit 0 ;;
        esac
        opt=${1%%=*}
        for spec in $values; do
            [[ $opt == "${spec%%:*}" ]] || continue
            if [[ $1 == *=* ]]; then
                printf -v "${spec#*:}" '%s' "${1#*=}"
            else
                (($# >= 2)) || { echo "$BENCH_SCRIPT: $1 wants a value" >&2; usage >&2; exit 2; }
                printf -v "${spec#*:}" '%s' "$2"
                shift
            fi
            shift
            continue 2
        done
        for spec in $flags; do
            [[ $1 == "${spec%%:*}" ]] || continue
            spec=${spec#*:}
            printf -v "${spec%%=*}" '%s' "${spec#*=}"
            shift
            continue 2
        done
        echo "$BENCH_SCRIPT: unknown argument $1" >&2
        usage >&2
        exit 2
    done
}

# A new sparse image `img` of IMG_SIZE holding a new btrfs (MKFS_BTRFS_OPTS)
# or xfs (MKFS_XFS_OPTS); mkfs's output goes to $W/log-mkfs.txt, shown if
# it fails. `target` names it in that message.
mkfs_image() { # img btrfs|xfs target
    rm -f "$1"
    truncate -s "$IMG_SIZE" "$1"
    case $2 in
        xfs) mkfs.xfs -q -f $MKFS_XFS_OPTS "$1" >"$W/log-mkfs.txt" 2>&1 ;;
        *) mkfs.btrfs -f $MKFS_BTRFS_OPTS "$1" >"$W/log-mkfs.txt" 2>&1 ;;
    esac || { cat "$W/log-mkfs.txt" >&2; die "mkfs for $3 failed"; }
}

# Make a new image IMG for `target` (ubtrfs, btrfs or xfs) and mount it on
# MNT; `options` go to the btrfs targets' mount (kernel: `-o`, ubtrfs:
# `-o` too). ubtrfs logs to $W/log-ubtrfs.txt; its pid is in UBTRFS_PID.
mount_target() { # target [options]
    local t=$1 o=${2:-}
    case $t in
        xfs) mkfs_image "$IMG" xfs "$t" ;;
        *) mkfs_image "$IMG" btrfs "$t" ;;
    esac
    case $t in
        ubtrfs)
            setsid -w "$UBTRFS" mount "$IMG" "$MNT" ${o:+-o "$o"} 2>"$W/log-ubtrfs.txt" &
            UBTRFS_PID=$!
            wait_fuse_mount "$MNT" "$UBTRFS_PID" || die "ubtrfs mount failed: $(tail -n 3 "$W/log-ubtrfs.txt")"
            ;;
        btrfs) mount -o "loop${o:+,$o}" "$IMG" "$MNT" ;;
        *) mount -o loop "$IMG" "$MNT" ;;
    esac
}

# Unmount what mount_target mounted (ubtrfs: its last commit must
# succeed) and remove the image.
unmount_target() { # target
    case $1 in
        ubtrfs)
            "$UBTRFS" umount "$MNT" || die "ubtrfs umount failed"
            wait "$UBTRFS_PID" || die "ubtrfs mount exited non-zero: $(tail -n 3 "$W/log-ubtrfs.txt")"
            ;;
        *) umount "$MNT" ;;
    esac
    rm -f "$IMG"
}

# ubtrfs' value over another target's, to two places ("n/a" over 0).
ratio() { # ubtrfs-value other-value
    python3 -c 'import sys; a, b = map(float, sys.argv[1:]); print("%.2f" % (a / b) if b else "n/a")' "$1" "$2"
}

# A Markdown table of per-target results with ubtrfs' ratios to btrfs and
# xfs. ROW (an associative array the caller declares) maps each target in
# TARGETS to its values, space-separated: COLS per workload, workload
# after workload. The first argument names those COLS columns, split by
# "|" ("%s" stands for the target); the ratio compares each workload's
# first value.
ratio_table() { # "heading|heading..." workload-label...
    local -a columns
    IFS='|' read -r -a columns <<<"$1"
    shift
    local cols=${#columns[@]} header="| workload |" rule="|---|" line t c i=0
    local -a u v
    for t in $TARGETS; do
        for c in "${columns[@]}"; do
            header+=" ${c//%s/$t} |"
            rule+="---|"
        done
    done
    for t in btrfs xfs; do
        [[ -n ${ROW[ubtrfs]:-} && -n ${ROW[$t]:-} ]] || continue
        header+=" ubtrfs / $t |"
        rule+="---|"
    done
    echo "$header"
    echo "$rule"
    for w in "$@"; do
        line="| $w |"
        for t in $TARGETS; do
            read -r -a v <<<"${ROW[$t]}"
            for ((c = 0; c < cols; c++)); do
                line+=" ${v[$((cols * i + c))]} |"
            done
        done
        for t in btrfs xfs; do
            [[ -n ${ROW[ubtrfs]:-} && -n ${ROW[$t]:-} ]] || continue
            read -r -a u <<<"${ROW[ubtrfs]}"
            read -r -a v <<<"${ROW[$t]}"
            line+=" $(ratio "${u[$((cols * i))]}" "${v[$((cols * i))]}") |"
        done
        echo "$line"
        i=$((i + 1))
    done
}

#!/usr/bin/env bash
# Run fstests (xfstests) against a ubtrfs FUSE mount, then `btrfs check`
# both of its images.
#
#   scripts/fstests.sh FSTESTS_DIR [check arguments, e.g. -g quick]
#
# FSTESTS_DIR is a built fstests tree (`make` in a clone of
# git://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git or a mirror of it;
# Debian does not package it, so CI does not run this). Needs root,
# btrfs-progs, fuse3, gawk and fstests' own build dependencies. It makes
# fstests' users (fsgqa, fsgqa2, 123456-fsgqa) if missing, two 8 GiB
# sparse images under $UBTRFS_FSTESTS_WORK (default /var/tmp/ubtrfs-fstests)
# and installs /sbin/mount.fuse.ubtrfs, the helper mount(8) runs for
# `mount -t fuse.ubtrfs`. fstests itself checks nothing on FUSE, hence the
# `btrfs check` at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 FSTESTS_DIR [check arguments]"
FSTESTS=$(cd "$1" && pwd); shift
[ -x "$FSTESTS/check" ] || die "$FSTESTS has no ./check: not an fstests tree"
[ -x "$FSTESTS/src/fsstress" ] || [ -x "$FSTESTS/ltp/fsstress" ] || die "build fstests first (make -C $FSTESTS)"
[ "$(id -u)" = 0 ] || die "fstests needs root"
export PATH=$PATH:/usr/sbin:/sbin
command -v gawk >/dev/null || die "fstests needs gawk (apt-get install gawk)"

cargo build --release -p ubtrfs-cli
# Where cargo put it (CARGO_TARGET_DIR, if set, as an absolute path).
BIN=$(realpath "${CARGO_TARGET_DIR:-target}")/release/ubtrfs
WORK=${UBTRFS_FSTESTS_WORK:-/var/tmp/ubtrfs-fstests}
mkdir -p "$WORK/test" "$WORK/scratch"

for u in fsgqa fsgqa2 123456-fsgqa; do
    id "$u" >/dev/null 2>&1 || useradd -m "$u"
done
getent group fsgqa >/dev/null || groupadd fsgqa

for n in test scratch; do
    mountpoint -q "$WORK/$n" && umount "$WORK/$n"
    rm -f "$WORK/$n.img"
    truncate -s 8G "$WORK/$n.img"
    mkfs.btrfs -q -f "$WORK/$n.img" >/dev/null
done

# mount(8) runs this as `mount.fuse.ubtrfs SOURCE MOUNTPOINT -o OPTIONS`.
# Options ubtrfs does not take (fstests adds a few) are dropped; a remount
# is the kernel's (mount -i); a mount right after an unmount waits for the
# previous process's last commit to let go of the image.
cat > /sbin/mount.fuse.ubtrfs <<EOF
#!/bin/bash
src=\$1; mnt=\$2; shift 2
opts=""
while [ \$# -gt 0 ]; do
  case \$1 in -o) opts=\$2; shift 2;; *) shift;; esac
done
case ",\$opts," in *,remount,*) exec mount -i -o "\$opts" "\$mnt";; esac
keep=(dev suid)
IFS=, read -ra parts <<< "\$opts"
for o in "\${parts[@]}"; do
  case \$o in
    rw|ro|allow_other|default_permissions|nodev|dev|nosuid|suid|exec|noexec|sync|async|dirsync|noatime|atime|relatime|strictatime|diratime|nodiratime|commit=*|compress*|nodatacow|nodatasum|datacow|datasum|subvol=*|subvolid=*|uring|nouring|norecovery|nologreplay|rescue=nologreplay) keep+=("\$o");;
  esac
done
o=\$(IFS=,; echo "\${keep[*]}")
for i in \$(seq 300); do
  out=\$("$BIN" mount -d -o "\$o" "\$src" "\$mnt" 2>&1) && exit 0
  case \$out in *"already in use"*) sleep 0.1;; *) echo "\$out" >&2; exit 1;; esac
done
echo "\$out" >&2; exit 1
EOF
chmod +x /sbin/mount.fuse.ubtrfs

cat > "$WORK/local.config" <<EOF
export TEST_DEV=$WORK/test.img
export TEST_DIR=$WORK/test
export SCRATCH_DEV=$WORK/scratch.img
export SCRATCH_MNT=$WORK/scratch
export FSTYP=fuse
export FUSE_SUBTYP=.ubtrfs
export MOUNT_OPTIONS="-oallow_other,default_permissions"
export TEST_FS_MOUNT_OPTS="-oallow_other,default_permissions"
EOF

status=0
(cd "$FSTESTS" && HOST_OPTIONS="$WORK/local.config" ./check "$@") || status=$?

for n in test scratch; do
    if mountpoint -q "$WORK/$n"; then
        umount "$WORK/$n"
    fi
done
# The last commit runs after the unmount returns: wait for the image.
for n in test scratch; do
    for _ in $(seq 300); do
        flock -n "$WORK/$n.img" true && break
        sleep 0.1
    done
    if btrfs check --readonly "$WORK/$n.img" >"$WORK/$n.check" 2>&1; then
        echo "btrfs check $n.img: clean"
    else
        echo "btrfs check $n.img: ERRORS (see $WORK/$n.check)"
        status=1
    fi
done
exit $status

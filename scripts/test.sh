#!/usr/bin/env bash
# The test command of ubtrfs (CI runs it through .ci/run).
#
# Installs the test dependencies from Debian's packages when missing, makes
# sure the btrfs kernel module is there, then runs, failing on the first
# error: rustfmt check, clippy with warnings denied, and the whole
# workspace's tests in release mode (the corpus tests read big images).
#
# Needs root: the tests attach loop devices and mount btrfs with the
# kernel. No test skips itself: one that cannot run fails.
#
# Environment: UBTRFS_TEST_TIMEOUT (seconds for `cargo test`, default
# 1800); UBTRFS_TEST_DIR (where tests put images and mounts; default: a
# fresh directory under $TMPDIR, removed at the end).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || die "cargo not found (install Rust with rustup; see scripts/setup.sh)"

root=0
[ "$(id -u)" = 0 ] && root=1

# --- test dependencies -----------------------------------------------------
PACKAGES=(btrfs-progs fuse3 xfsprogs fio attr acl e2fsprogs util-linux kmod build-essential pkg-config)
installed() {
    dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'
}
missing=()
for p in "${PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done
if ((${#missing[@]})); then
    if ((root)); then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        die "missing packages: ${missing[*]}; run as root so they can be installed"
    fi
fi

# --- external test suites: pjdfstest and fsx ------------------------------
# crates/ubtrfs-cli/tests/{pjdfstest,fsx}.rs run these programs, built from
# crates.io (pinned versions) into the target directory, where the tests
# look for them; a machine that has them already does not rebuild them.
TOOLS_DIR="${CARGO_TARGET_DIR:-$PWD/target}/test-tools"
install_tool() { # CRATE VERSION
    local crate=$1 version=$2 have
    have=$("$TOOLS_DIR/bin/$crate" --version 2>/dev/null || true)
    [ "$have" = "$crate $version" ] && return
    log "installing $crate $version into $TOOLS_DIR"
    cargo install --quiet --locked --force "$crate" --version "=$version" --root "$TOOLS_DIR"
}
install_tool pjdfstest 0.2.2
install_tool fsx 0.3.2
export UBTRFS_TOOLS_DIR="$TOOLS_DIR"
# --- end of external test suites -------------------------------------------

# --- kernel ----------------------------------------------------------------
if ((root)); then
    if command -v modprobe >/dev/null; then modprobe btrfs 2>/dev/null || true; fi
    grep -qw btrfs /proc/filesystems ||
        die "the btrfs kernel module is not available (not in /proc/filesystems); the tests need it"
    [ -e /dev/loop-control ] || die "/dev/loop-control is missing; the tests need loop devices"
    # FUSE over io_uring (Linux 6.14+): mounts take their requests over it
    # when the kernel offers it; tests that want /dev/fuse say nouring.
    if command -v modprobe >/dev/null; then modprobe fuse 2>/dev/null || true; fi
    uring=/sys/module/fuse/parameters/enable_uring
    [ -e "$uring" ] || die "$uring is missing: the kernel has no FUSE over io_uring, which the tests need"
    echo Y >"$uring"
    export UBTRFS_REQUIRE_PRIVILEGED=1
else
    die "run as root: the tests attach loop devices and mount btrfs"
fi

# --- a private directory for test images and mounts ------------------------
own_test_dir=0
if [ -z "${UBTRFS_TEST_DIR:-}" ]; then
    UBTRFS_TEST_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ubtrfs-test.XXXXXX")
    # Tests act as other users too (ownership, permissions): let them in.
    chmod 755 "$UBTRFS_TEST_DIR"
    own_test_dir=1
fi
export UBTRFS_TEST_DIR
cleanup() {
    local rc=$?
    set +e +o pipefail
    # Whatever a killed or crashed test left behind: mounts first (deepest
    # first), then loop devices backed by files in the test dir.
    if command -v findmnt >/dev/null; then
        findmnt -rn -o TARGET | grep -F "$UBTRFS_TEST_DIR" | sort -r | while read -r m; do
            printf 'cleanup: unmounting %s\n' "$m" >&2
            umount -l "$m" 2>/dev/null || true
        done
    fi
    if ((root)) && command -v losetup >/dev/null; then
        losetup -n -O NAME,BACK-FILE -l 2>/dev/null | while read -r dev file; do
            case "$file" in
            "$UBTRFS_TEST_DIR"/*)
                printf 'cleanup: detaching %s\n' "$dev" >&2
                losetup -d "$dev" 2>/dev/null || true
                ;;
            esac
        done
    fi
    if ((own_test_dir)); then
        rm -rf --one-file-system "$UBTRFS_TEST_DIR" 2>/dev/null || true
    fi
    exit "$rc"
}
trap cleanup EXIT

# --- checks ----------------------------------------------------------------
start=$SECONDS
step() {
    local t0=$SECONDS
    log "$*"
    "$@"
    printf '    (%ss)\n' "$((SECONDS - t0))"
}

step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets -- -D warnings
step timeout --signal=INT --kill-after=60 "${UBTRFS_TEST_TIMEOUT:-1800}" \
    cargo test --workspace --release

log "all checks passed in $((SECONDS - start))s"

#!/usr/bin/env bash
# Set up a Debian machine to build and run ubtrfs, then build it.
#
# Installs what running ubtrfs needs (fuse3, for fusermount3) and what
# building it needs (a C compiler and linker, pkg-config) from Debian's
# packages, skipping packages already installed, then runs
# `cargo build --release`. Rust itself must already be installed with
# rustup. Safe to run again: the second run installs nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

PACKAGES=(fuse3 build-essential pkg-config)

installed() {
    dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for p in "${PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done

if ((${#missing[@]})); then
    command -v apt-get >/dev/null || die "apt-get not found: this script is for Debian; install ${missing[*]} by hand"
    if [ "$(id -u)" = 0 ]; then
        SUDO=()
    elif command -v sudo >/dev/null; then
        SUDO=(sudo)
    else
        die "need root (or sudo) to install: ${missing[*]}"
    fi
    log "installing ${missing[*]}"
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    log "system packages present (${PACKAGES[*]})"
fi

if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || die "cargo not found. Install Rust with rustup (stable toolchain, 1.85 or newer), make sure ~/.cargo/bin is on PATH, then run scripts/setup.sh again."

log "building (cargo build --release)"
cargo build --release

bin="$PWD/target/release/ubtrfs"
[ -x "$bin" ] || die "build finished but $bin is missing"
[ -e /dev/fuse ] || printf 'warning: /dev/fuse is missing; load the fuse module (modprobe fuse) to use "ubtrfs mount"\n' >&2

printf '\nubtrfs is built: %s\n\n' "$bin"
printf '  %-44s %s\n' \
    "$bin --help" "list the commands" \
    "$bin mount disk.img /mnt" "mount a btrfs image through FUSE" \
    "fusermount3 -u /mnt" "unmount it"
cat <<'USAGE'

Copy or link the binary onto your PATH to call it as "ubtrfs".
Run the tests with scripts/test.sh (as root: the tests use loop devices).
USAGE

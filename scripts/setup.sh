#!/usr/bin/env bash
# Installs what cowspace's build, tests and benchmarks need on a fresh Debian machine.
# Safe to run again. Needs root (or sudo) for apt.
set -euo pipefail

pkgs=(git tar zstd gzip xz-utils fuse3 fuse-overlayfs btrfs-progs xfsprogs bubblewrap
      iproute2 iputils-ping kmod procps psmisc util-linux python3 gcc make pkg-config libssl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The test user pjdfstest-style suites switch to (harmless when present already).
if ! id tests >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  echo 'tests:x:::cowspace test dummy:/:/usr/sbin/nologin' | newusers || true
fi
command -v cargo >/dev/null || { echo "setup: cargo is not installed (install Rust with rustup)" >&2; exit 1; }

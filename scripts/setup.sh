#!/usr/bin/env bash
# Installs what cowspace's build, tests and benchmarks need on a fresh Debian machine.
# Safe to run again. Needs root (or sudo) for apt.
set -euo pipefail

pkgs=(git tar zstd gzip xz-utils fuse3 fuse-overlayfs btrfs-progs xfsprogs bubblewrap
      iproute2 iputils-ping kmod procps psmisc util-linux python3 python3-pip gcc make pkg-config libssl-dev
      curl        # the bench network section's download client (bench/tests/quick.rs runs it)
      qemu-system-x86 busybox-static libcap-ng-dev libseccomp-dev
      libc6-dev   # libc.a: sandbox-helper's build links the guest agent statically
      docker-registry umoci skopeo  # image tests: a real registry on 127.0.0.1, images built and pushed
      openssl     # the bench inject section makes its TLS origin's CA with it
      nodejs)     # the Node client's tests (clients/typescript) need node >= 20
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
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "setup: node $node_major is older than 20: the Node client's test will skip (fail under CI=true); install Node >= 20 (Debian trixie's nodejs, or NodeSource)" >&2
fi
command -v cargo >/dev/null || { echo "setup: cargo is not installed (install Rust with rustup)" >&2; exit 1; }

# The guest kernel of `mountctl run --vm` (docs/sandbox.md, "VM placement"): Debian's
# cloud kernel package, downloaded (not installed) and unpacked into
# /var/cache/cowspace/vm/kernel (boot/vmlinuz-<version>, lib/modules/<version>/); the
# runtime finds it there (or where $COWSPACE_VM_KERNEL points). Skipped when unpacked
# already. About 27 MB.
vm_dir=${COWSPACE_VM_DIR:-/var/cache/cowspace/vm/kernel}
if ! ls "$vm_dir"/boot/vmlinuz-* >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  abi=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$abi" ]; then
    apt-get update -qq
    abi=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  fi
  debs=$(dirname "$vm_dir")
  mkdir -p "$debs"
  (cd "$debs" && apt-get download -q "$abi" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  rm -rf "$vm_dir.tmp"
  dpkg-deb -x "$debs/${abi}"_*.deb "$vm_dir.tmp"
  rm -rf "$vm_dir" && mv "$vm_dir.tmp" "$vm_dir"
fi

# The wheels the egress tests install with pip inside a sandbox, from a package index the
# test serves on 127.0.0.1 (tests/tests/e2e/egress.rs): downloaded once from PyPI here,
# so no test needs the internet. Pure-Python, a few hundred KB.
wheels=${COWSPACE_TEST_WHEELS:-/var/cache/cowspace/test-wheels}
if ! ls "$wheels"/six-*.whl "$wheels"/idna-*.whl >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  mkdir -p "$wheels"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$wheels" six==1.16.0 idna==3.7
fi

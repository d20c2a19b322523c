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
      mmdebstrap  # image tests: a real Debian root (below), made once and cached
      libnfs-utils  # NFS tests: libnfs's client (nfs-ls, nfs-cat, nfs-cp) against the daemon's server
      openssl     # the bench inject section makes its TLS origin's CA with it
      python3-dev python3-setuptools  # the soak's project builds a C extension (Python.h)
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

# A real distribution root for the image tests and the bench images section
# (tests/tests/e2e/image_distro.rs): Debian 13 (trixie, not the host's release, so its
# files and versions differ from the host's) made by `mmdebstrap --variant=minbase` with
# python3 and pip, as an OCI image layout (tag `trixie`) built with umoci, once; the tests
# push it to their own registry on 127.0.0.1 and need no network. `expect` holds what the
# image's own binaries report, read in a chroot of the tree when it was made. About 60 MB.
images=${COWSPACE_TEST_IMAGES:-/var/cache/cowspace/test-images}
if ! [ -f "$images/debian-minbase/expect" ] && [ "$(id -u)" -eq 0 ]; then
  work=$images/debian-minbase.tmp
  rm -rf "$work" && mkdir -p "$work"
  # mmdebstrap checks trixie's Release file with the host's keyring: the newest
  # bookworm debian-archive-keyring has trixie's keys (an older one may lack them).
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    debian-archive-keyring
  mmdebstrap --quiet --variant=minbase --include=python3,python3-pip \
    --customize-hook="chroot \"\$1\" python3 --version > '$work/python3-version'" \
    --customize-hook="cp \"\$1/etc/debian_version\" '$work/debian-version'" \
    trixie "$work/rootfs.tar" http://deb.debian.org/debian
  umoci init --layout "$work/layout"
  umoci new --image "$work/layout:trixie"
  umoci raw add-layer --image "$work/layout:trixie" "$work/rootfs.tar"
  umoci config --image "$work/layout:trixie" --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.env LANG=C.UTF-8 --config.workingdir /root
  printf 'debian_version=%s\npython3=%s\n' "$(cat "$work/debian-version")" \
    "$(cat "$work/python3-version")" > "$work/layout/expect"
  rm -rf "$images/debian-minbase"
  mv "$work/layout" "$images/debian-minbase"
  rm -rf "$work"
fi

# The project the soak's sandboxes build and test (`cargo xtask soak`, xtask/src/soak.rs):
# simplejson's source release from PyPI (a C extension and its own unittest suite), once,
# so no soak needs the network. About 90 KB.
soak_src=${COWSPACE_SOAK_SOURCE:-/var/cache/cowspace/soak/simplejson-3.19.3.tar.gz}
if ! [ -f "$soak_src" ] && [ "$(id -u)" -eq 0 ]; then
  mkdir -p "$(dirname "$soak_src")"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary=:all: \
    --dest "$(dirname "$soak_src")" simplejson==3.19.3
fi

#!/usr/bin/env bash
# The test command: set up a fresh machine, then run every check CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# pjdfstest for the POSIX conformance gate (tests/tests/conformance.rs,
# docs/CONFORMANCE.md), built into ~/.cargo/bin once (about 3 minutes on 2 cores); a
# second run finds it there and builds nothing. Without it the gate skips (fails under
# CI=true), so the test command installs it, as CI does.
pjdfstest_version=0.2.2
if ! "${CARGO_HOME:-$HOME/.cargo}/bin/pjdfstest" --version 2>/dev/null \
    | grep -qx "pjdfstest $pjdfstest_version"; then
  cargo install pjdfstest --version "$pjdfstest_version" --locked
fi
# virtiofsd, which shares a workspace into a `run --vm` guest (not packaged by Debian
# 12): built into ~/.cargo/bin once (about 2 minutes on 2 cores), like pjdfstest.
virtiofsd_version=1.14.0
if ! "${CARGO_HOME:-$HOME/.cargo}/bin/virtiofsd" --version 2>/dev/null \
    | grep -q "virtiofsd $virtiofsd_version\b"; then
  cargo install virtiofsd --version "$virtiofsd_version" --locked
fi
# moto's S3 server, the real S3-compatible server the remote tests run on 127.0.0.1
# (tests/tests/e2e/remote.rs): from PyPI, once.
moto_version=5.2.1
if ! python3 -c "import moto.server, moto; assert moto.__version__ == '$moto_version'" 2>/dev/null; then
  # A Debian python3 is "externally managed": there pip needs --break-system-packages.
  python3 -m pip install --quiet --disable-pip-version-check "moto[server]==$moto_version" \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
         "moto[server]==$moto_version"
fi
# s3s-fs, the second S3 server the remote tests run on (it checks SigV4 signatures and
# keeps objects as files across restarts): built into ~/.cargo/bin once, like pjdfstest.
# 0.14.1 is the newest release that builds with this toolchain.
s3s_version=0.14.1
if ! "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" --version 2>/dev/null | grep -q "$s3s_version"; then
  cargo install s3s-fs --version "$s3s_version" --features binary --locked
fi
cargo xtask check
# The short soak (about 4 minutes on 2 cores): 16 workspaces, 8 sandboxes building and
# testing a real project under every kind of injected fault, checked after each
# (`cargo xtask soak --help`; the hour-long form and its figures: docs/BENCHMARKS.md, "Soak").
cargo xtask soak

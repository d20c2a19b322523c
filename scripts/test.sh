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
cargo xtask check

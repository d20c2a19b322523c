#!/usr/bin/env bash
# The test command: set up a fresh machine, then run every check CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo xtask check

#!/usr/bin/env bash
# The main job on an embedded default: a store in a temporary root, this repository's
# own source imported into it, then what was stored and how well it deduplicates.
# Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release -q -p mountctl
mc="$PWD/target/release/mountctl"
work=$(mktemp -d /tmp/cowspace-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/root"
run() { echo "\$ mountctl $*" >&2; "$mc" --root "$root" "$@"; }

run init
echo "== import of this repository (default exclusions leave out target/)" >&2
run import . --ref demo/main --message "first import"
echo "== the same tree again: the stat cache means no file is read" >&2
run import . --ref demo/main --message "unchanged"
echo "== a copy with one file changed: only its chunks are new" >&2
mkdir "$work/copy"
tar --exclude=./target -cf - . | tar -xf - -C "$work/copy"
echo "// changed" >> "$work/copy/README.md"
run import "$work/copy" --ref demo/copy --message "one change"
run diff demo/main demo/copy
run snapshots
run show demo/main
run stats
run fsck
run export demo/copy "$work/export"
diff -r "$work/copy" "$work/export" >/dev/null && echo "export is identical to the imported tree" >&2

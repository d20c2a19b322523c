#!/usr/bin/env bash
# The main job on an embedded default: a store in a temporary runtime root, this
# repository's own source imported into it, workspaces made, written, diffed and
# committed, then everything removed. Needs root for the mounts (as CI has); without
# root it shows the store part only and says why. Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
echo "== building mountctl and fsd (release; a first build takes several minutes on 2 cores)" >&2
cargo build --release -p mountctl -p cowspace-fsd
mc="$PWD/target/release/mountctl"
# git in workspaces of this checkout asks cowspace what changed through its fsmonitor
# hook, which runs this mountctl on this root (docs/git.md).
export COWSPACE_MOUNTCTL="$mc"
work=$(mktemp -d /tmp/cowspace-demo.XXXXXX)
root="$work/root"
cleanup() {
  if [ -f "$root/registry.db" ]; then
    for ws in $("$mc" --root "$root" list 2>/dev/null | awk '{print $1}'); do
      "$mc" --root "$root" remove --force "$ws" >/dev/null 2>&1 || true
    done
    "$mc" --root "$root" daemon stop --force >/dev/null 2>&1 || true
  fi
  grep -F " $work/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
run() { echo "\$ mountctl $*" >&2; "$mc" --root "$root" "$@"; }
json() { "$mc" --root "$root" --json "$@"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

run init
echo "== import of this repository (default exclusions leave out target/)" >&2
run import . --ref demo/main --message "first import"
echo "== the same tree again: the stat cache means no file is read" >&2
run import . --ref demo/main --message "unchanged"
echo "== an older version of the same repository, from git: only what changed is stored again" >&2
older=""
for back in 20 5 1; do
  if git rev-parse -q --verify "HEAD~$back" >/dev/null 2>&1; then older="HEAD~$back"; break; fi
done
if [ -n "$older" ]; then
  run import . --git "$older" --ref demo/older --message "$older"
  json stats > "$work/stats.json"
  json snapshots > "$work/snapshots.json"
  json refs > "$work/refs.json"
  python3 - "$work" "$older" <<'PY' >&2
import json, sys
work, older = sys.argv[1], sys.argv[2]
stats = json.load(open(f"{work}/stats.json"))
refs = json.load(open(f"{work}/refs.json"))
sizes = {s["snapshot"]: s["bytes"] for s in json.load(open(f"{work}/snapshots.json"))}
files = sizes[refs["demo/main"]] + sizes[refs["demo/older"]]
mib = lambda n: n / 2**20
print(f"this tree and {older} from git: {mib(files):.1f} MiB of files in the two, "
      f"{mib(stats['stored_bytes']):.1f} MiB stored for everything imported so far "
      f"({files / max(stats['stored_bytes'], 1):.2f}x smaller)")
print("  (that ratio: the files of the two different versions over the bytes stored: "
      "what keeping both costs, shared chunks stored once and compressed)")
PY
else
  echo "(no git history here: the older version is left out)" >&2
fi
echo "== the store's totals; overall: the files of every snapshot (the unchanged re-import" >&2
echo "   counted again, so it is higher than the ratio above) over the bytes stored, i.e. dedup x compression" >&2
run stats

if [ "$(id -u)" -ne 0 ] || [ ! -e /dev/fuse ]; then
  echo "== workspaces need root and /dev/fuse here (overlay and FUSE mounts); stopping after the store part" >&2
  exit 0
fi

echo "== three workspaces of demo/main (the first also prepares what every workspace of the" >&2
echo "   snapshot shares: its lower layer, and the blob cache its files are read from)" >&2
for i in 1 2 3; do
  ms=$(json create demo/main --name "w$i" | field '["elapsed_ms"]')
  printf 'created w%s in %.1f ms\n' "$i" "$ms" >&2
done
lower=$(json status w1 | field '["lower_kind"]')
echo "(their lower: $lower; \`mountctl doctor\` says why)" >&2
run list
w1=$(json status w1 | field '["path"]')
echo "== what one more workspace costs on disk, beside a full copy and a git worktree of the same tree" >&2
bytes() { du -sx --block-size=1 "$1" | cut -f1; }
private=$(json status w1 | field '["private_dir"]')
ws_bytes=$(bytes "$private")
shared=$(( $(bytes "$root/cache") ))
"$mc" --root "$root" export demo/main "$work/export" >/dev/null
cp -a "$work/export" "$work/cp-a"
cp_bytes=$(bytes "$work/cp-a")
wt_bytes=""
if git rev-parse -q --verify HEAD >/dev/null 2>&1; then
  git clone -q --shared . "$work/repo"
  git -C "$work/repo" worktree add -q --detach "$work/worktree" HEAD
  wt_bytes=$(( $(bytes "$work/worktree") ))
fi
python3 - "$ws_bytes" "$shared" "$cp_bytes" "$wt_bytes" <<'PY' >&2
import sys
ws, shared, cp, wt = (int(x) if x else None for x in sys.argv[1:])
k = lambda n: f"{n/1024:,.0f} KiB"
print(f"one workspace adds {k(ws)} (its private directory; the snapshot's shared lower and "
      f"blob cache, {k(shared)}, are paid once for every workspace of it)")
print(f"a full copy (cp -a) of the same tree: {k(cp)} ({cp/max(ws,1):,.0f}x one workspace)")
if wt is not None:
    print(f"a git worktree of HEAD: {k(wt)} ({wt/max(ws,1):,.0f}x one workspace)")
PY
rm -rf "$work/export" "$work/cp-a" "$work/worktree" "$work/repo"
echo "== a worker writes in w1 only" >&2
echo "hello from w1" > "$w1/HELLO.txt"
echo "// edited in w1" >> "$w1/README.md"
rm -f "$w1/rustfmt.toml"
w2=$(json status w2 | field '["path"]')
[ ! -e "$w2/HELLO.txt" ] && echo "w2 does not see w1's file" >&2
run diff w1
run diff w1 --patch | head -20
echo "== git status in a fresh workspace reads no file (its index agrees with the view)" >&2
( cd "$w2" && time git status --short | head -5 )
echo "== commit w1 as demo/main's successor, then a fresh workspace of it" >&2
run commit w1 --ref demo/main --message "work from w1"
ms=$(json create demo/main --name w4 | field '["elapsed_ms"]')
printf 'created w4 in %.1f ms\n' "$ms" >&2
w4=$(json status w4 | field '["path"]')
cat "$w4/HELLO.txt"
echo "== remove everything" >&2
for ws in w1 w2 w3 w4; do
  ms=$(json remove "$ws" | field '["elapsed_ms"]')
  printf 'removed %s in %.1f ms\n' "$ws" "$ms" >&2
done
run daemon stop
run sweep
run fsck
left=$(grep -cF " $work/" /proc/self/mounts || true)
echo "mounts left under the demo root: $left" >&2

#!/usr/bin/env bash
# The first native workspace of a freshly imported tree (it writes every blob of the
# snapshot and its image), timed for each mountctl binary given, in the order given.
#
# Usage (root): scripts/ab-first-native.sh TREE MOUNTCTL [MOUNTCTL...]
#   e.g. scripts/ab-first-native.sh TREE /tmp/a/mountctl /tmp/b/mountctl /tmp/a/mountctl /tmp/b/mountctl
#
# Each run gets a fresh ext4 (an 8 GiB sparse loop file under /var/tmp): on one
# filesystem, repeated runs slow down as ext4 allocates inodes where as many were just
# deleted. The import is not timed; the `create --lower native` is (/usr/bin/time).
# Everything is unmounted and removed at the end of each run, also after an error.
set -euo pipefail
tree=$1; shift
img=$(mktemp /var/tmp/ab-first-native.XXXXXX.img)
mnt=$(mktemp -d /tmp/ab-first-native.XXXXXX)
cleanup() {
  grep " $mnt/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
  mountpoint -q "$mnt" && umount "$mnt" || true
}
trap 'cleanup; rm -f "$img"; rmdir "$mnt"' EXIT
for m in "$@"; do
  truncate -s 8G "$img"
  mkfs.ext4 -q -F "$img"
  mount -o loop "$img" "$mnt"
  root=$mnt/root
  "$m" --root "$root" init -q >/dev/null
  "$m" --root "$root" import "$tree" --ref main -q >/dev/null
  sync
  /usr/bin/time -f "$m: first native create %e s wall, %U s user, %S s sys" \
    "$m" --root "$root" create main --lower native -q >/dev/null
  for w in "$root"/workspaces/*; do
    [ -e "$w" ] && "$m" --root "$root" remove "$(basename "$w")" -q >/dev/null || true
  done
  cleanup
  rm -f "$img"
done

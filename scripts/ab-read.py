#!/usr/bin/env python3
"""Read every file: a fresh native workspace against overlayfs over the plain tree.

Usage (root): scripts/ab-read.py TREE [--rounds 5] [--mountctl target/release/mountctl]

Imports TREE into a temporary runtime root (untimed) and makes its first native
workspace (timed: it writes the snapshot's blobs and image; printed). Then, for ROUNDS
rounds, alternating which goes first: a fresh `--lower native` workspace (after one
other workspace of the round read every file, so the blobs' pages are warm), and a
fresh kernel overlayfs mount over TREE itself; each time every regular file is opened
and read to its end (Python, 1 MiB reads) and the wall time is recorded. Prints the
medians and every time. Everything is unmounted and removed at the end, also after an
error or Ctrl-C.
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time


def read_all(top):
    t = time.perf_counter()
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                while fh.read(1 << 20):
                    pass
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mountctl", default="target/release/mountctl")
    a = ap.parse_args()
    mc_bin = os.path.abspath(a.mountctl)
    tmp = tempfile.mkdtemp(dir="/var/tmp", prefix="cowspace-ab-read-")
    root = os.path.join(tmp, "root")

    def mc(*args):
        out = subprocess.run([mc_bin, "--root", root, "--json", *args],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout) if out.stdout.strip() else {}

    def native():
        w = mc("create", "s", "--lower", "native")
        return w["id"], w["path"]

    try:
        mc("init")
        mc("import", a.tree, "--ref", "s", "--no-default-excludes")
        t = time.perf_counter()
        first, _ = native()
        print("first native workspace: %.2f s" % (time.perf_counter() - t))
        mc("remove", first, "--force")
        read_all(a.tree)
        times = {"native": [], "overlayfs": []}
        for r in range(a.rounds):
            for m in (("native", "overlayfs") if r % 2 == 0 else ("overlayfs", "native")):
                if m == "native":
                    warm, p = native()
                    read_all(p)
                    mc("remove", warm, "--force")
                    ws, p = native()
                    times[m].append(read_all(p))
                    mc("remove", ws, "--force")
                else:
                    d = tempfile.mkdtemp(dir=tmp)
                    for x in ("u", "w", "m"):
                        os.mkdir(os.path.join(d, x))
                    opts = f"lowerdir={a.tree},upperdir={d}/u,workdir={d}/w"
                    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, d + "/m"], check=True)
                    try:
                        times[m].append(read_all(d + "/m"))
                    finally:
                        subprocess.run(["umount", d + "/m"], check=True)
        med = {}
        for m, v in times.items():
            v.sort()
            med[m] = v[len(v) // 2]
            print("%-9s median %.3f s  %s" % (m, med[m], " ".join("%.3f" % x for x in v)))
        print("native / overlayfs: %.2fx" % (med["native"] / med["overlayfs"]))
    finally:
        left = [l.split()[4] for l in open("/proc/self/mountinfo") if tmp in l.split()[4]]
        for m in sorted(left, reverse=True):
            subprocess.run(["umount", "-l", m])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

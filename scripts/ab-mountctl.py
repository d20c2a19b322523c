#!/usr/bin/env python3
"""Same-run A/B of two mountctl builds: create, run -- /bin/true and remove of a default
workspace (overlay, view lower) of TREE, alternating build by build, medians.

    scripts/ab-mountctl.py OLD/mountctl NEW/mountctl TREE [ROUNDS]

Each build gets its own runtime root under /var/tmp (removed at the end) and finds its
fsd and sandbox-helper beside itself. Root only (overlay mounts, sandboxes).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

old, new, tree = sys.argv[1:4]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 30
bins = {"old": old, "new": new}
roots = {k: f"/var/tmp/ab-mountctl-{k}-{os.getpid()}" for k in bins}
res = {k: {"create": [], "run": [], "remove": []} for k in bins}


def mc(k, *args):
    return subprocess.run([bins[k], "--root", roots[k], *args], check=True,
                          capture_output=True, text=True).stdout


try:
    for k in bins:
        mc(k, "init")
        mc(k, "import", tree, "--ref", "t", "--no-default-excludes")
    for i in range(rounds):
        for k in (["old", "new"] if i % 2 == 0 else ["new", "old"]):
            a = time.perf_counter()
            ws = json.loads(mc(k, "--json", "create", "t"))["workspace"]
            res[k]["create"].append(time.perf_counter() - a)
            a = time.perf_counter()
            mc(k, "run", ws, "--", "/bin/true")
            res[k]["run"].append(time.perf_counter() - a)
            a = time.perf_counter()
            mc(k, "remove", ws)
            res[k]["remove"].append(time.perf_counter() - a)
    for op in ["create", "run", "remove"]:
        o = statistics.median(res["old"][op]) * 1000
        n = statistics.median(res["new"][op]) * 1000
        print(f"{op:7} old {o:6.2f} ms  new {n:6.2f} ms  new/old {n / o:.2f}")
finally:
    for k in bins:
        subprocess.run([bins[k], "--root", roots[k], "daemon", "stop", "--force"],
                       capture_output=True)
        shutil.rmtree(roots[k], ignore_errors=True)

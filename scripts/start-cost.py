#!/usr/bin/env python3
"""What starting a program costs, beside what `mountctl` adds to the request it sends.

Usage (root, a daemon running for ROOT, WS one of its workspaces):
  scripts/start-cost.py ROOT WS [--mountctl PATH] [--baseline PATH] [--hello PATH]
                        [--rounds 200] [--batches 7]

Times, from Python `subprocess` as scripts/cli-latency.py starts `mountctl`, each way once
per round in turn: `/bin/true`, a hello-world program (--hello, e.g. one built with
`rustc -O`), `mountctl --version` and `mountctl --json status WS` (--mountctl, and
--baseline when given), and the same `status` request on the control socket; medians and
90th percentiles in ms. Then 64 starts at once from a thread pool of 64 (`/bin/true`, the
hello-world program, `mountctl --version`): the medians of BATCHES batches. One JSON
object on stdout.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import socket_call  # noqa: E402


def timed(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("ws")
    p.add_argument("--mountctl", default=os.path.join(here, "../target/release/mountctl"))
    p.add_argument("--baseline")
    p.add_argument("--hello")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--batches", type=int, default=7)
    a = p.parse_args()
    ways = {"/bin/true": ["/bin/true"]}
    if a.hello:
        ways["hello"] = [a.hello]
    progs = {"mountctl": a.mountctl}
    if a.baseline:
        progs["baseline"] = a.baseline
    for name, prog in progs.items():
        ways[f"{name} --version"] = [prog, "--version"]
        ways[f"{name} status"] = [prog, "--root", a.root, "--json", "status", a.ws]
    times = {k: [] for k in ways}
    times["socket status"] = []
    for _ in range(a.rounds):
        for k, cmd in ways.items():
            times[k].append(timed(lambda: subprocess.run(cmd, capture_output=True, check=True)))
        times["socket status"].append(
            timed(lambda: socket_call(a.root, "status", {"workspace": a.ws})))
    out = {}
    for k, xs in times.items():
        xs.sort()
        out[k] = {"median_ms": round(statistics.median(xs), 2),
                  "p90_ms": round(xs[int(0.9 * (len(xs) - 1))], 2)}

    def batch(cmd):
        with concurrent.futures.ThreadPoolExecutor(64) as ex:
            return timed(lambda: list(ex.map(
                lambda _: subprocess.run(cmd, capture_output=True), range(64))))

    conc = {k: [] for k in ways if "status" not in k}
    for _ in range(a.batches):
        for k in conc:
            conc[k].append(batch(ways[k]))
    out["concurrent-64"] = {k: round(statistics.median(v), 1) for k, v in conc.items()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

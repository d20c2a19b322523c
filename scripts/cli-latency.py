#!/usr/bin/env python3
"""What a workspace's create and remove cost through `mountctl`, against the control socket.

Usage (root): scripts/cli-latency.py TREE [--rounds 30] [--concurrent 64] [--lower native]
             [--mountctl PATH] [--baseline PATH] [--batches 1]

Imports TREE into a temporary runtime root (untimed, with an empty configuration), then,
in one run, times `create` + `remove` of one workspace ROUNDS times each way:
  - `cli-in-process`: `mountctl` with no daemon running (it opens the store and the
    registry itself);
  - `cli-through-daemon`: `mountctl` while the daemon runs (it sends the request there);
  - `socket`: one request on a new connection to the daemon's socket.
Then CONCURRENT creates at once, through `mountctl` and through the socket (wall time of
the batch), and their removals. Medians and 90th percentiles in ms; one JSON object on
stdout. Everything is removed at the end, also after an error.

With --baseline PATH (another build of `mountctl`, say main's), every round times that
one too, in alternation with --mountctl and the socket (keys `baseline-in-process`,
`baseline-through-daemon`, `concurrent-N.baseline_wall_ms`), so the two builds meet the
same load on a noisy machine; --batches repeats the concurrent batches (alternating)
and gives the median of each.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


# The same helpers as scale.py's (one place for how a script calls mountctl and the socket).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import run, socket_call  # noqa: E402


def timed(f):
    t = time.perf_counter()
    v = f()
    return (time.perf_counter() - t) * 1e3, v


def summary(xs):
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs), 2),
            "p90_ms": round(xs[int(0.9 * (len(xs) - 1))], 2), "n": len(xs)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tree")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--concurrent", type=int, default=64)
    p.add_argument("--lower", default="native")
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--mountctl", default=os.path.join(here, "../target/release/mountctl"))
    p.add_argument("--baseline", help="another mountctl, timed in alternation")
    p.add_argument("--batches", type=int, default=1)
    a = p.parse_args()
    mc = os.path.abspath(a.mountctl)
    base_mc = os.path.abspath(a.baseline) if a.baseline else None
    tmp = tempfile.mkdtemp(prefix="cowspace-cli-latency-")
    root = os.path.join(tmp, "root")
    conf = os.path.join(tmp, "config.toml")
    with open(conf, "w") as f:
        f.write("# empty: the built-in defaults\n")
    os.environ["COWSPACE_CONFIG"] = conf
    os.environ.pop("COWSPACE_ROOT", None)
    out = {"tree": a.tree, "lower": a.lower, "rounds": a.rounds}
    made = []
    try:
        run(mc, root, "init")
        run(mc, root, "import", a.tree, "--ref", "base")
        # The first workspace builds what later ones share (the image, the checkout).
        first = run(mc, root, "create", "base", "--lower", a.lower)
        run(mc, root, "remove", first["id"])

        def cli_round(m):
            c, v = timed(lambda: run(m, root, "create", "base", "--lower", a.lower))
            made.append(v["id"])
            r, _ = timed(lambda: run(m, root, "remove", v["id"]))
            made.remove(v["id"])
            return c, r

        def sock_round():
            c, v = timed(lambda: socket_call(root, "create", {"snapshot": "base", "lower": a.lower}))
            made.append(v["id"])
            r, _ = timed(lambda: socket_call(root, "remove", {"workspace": v["id"]}))
            made.remove(v["id"])
            return c, r

        def phase(ways):
            """ROUNDS rounds of each (name, round) in `ways`, alternating."""
            rounds = {name: [] for name, _ in ways}
            for _ in range(a.rounds):
                for name, f in ways:
                    rounds[name].append(f())
            for name, rs in rounds.items():
                out[name] = {"create": summary([c for c, _ in rs]),
                             "remove": summary([r for _, r in rs])}

        def clis(mode):
            ways = [(f"cli-{mode}", lambda: cli_round(mc))]
            if base_mc:
                ways.append((f"baseline-{mode}", lambda: cli_round(base_mc)))
            return ways

        phase(clis("in-process"))
        run(mc, root, "daemon", "start")
        phase(clis("through-daemon") + [("socket", sock_round)])

        def batch(create):
            with concurrent.futures.ThreadPoolExecutor(a.concurrent) as ex:
                t = time.perf_counter()
                ids = list(ex.map(lambda _: create(), range(a.concurrent)))
                wall = (time.perf_counter() - t) * 1e3
            made.extend(ids)
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: run(mc, root, "remove", i), ids))
            for i in ids:
                made.remove(i)
            return wall

        batches = [("cli_wall_ms", lambda: run(mc, root, "create", "base", "--lower", a.lower)["id"])]
        if base_mc:
            batches.append(("baseline_wall_ms",
                            lambda: run(base_mc, root, "create", "base", "--lower", a.lower)["id"]))
        batches.append(("socket_wall_ms",
                        lambda: socket_call(root, "create", {"snapshot": "base", "lower": a.lower})["id"]))
        walls = {name: [] for name, _ in batches}
        for _ in range(a.batches):
            for name, create in batches:
                walls[name].append(batch(create))
        c = out[f"concurrent-{a.concurrent}"] = {
            name: round(statistics.median(ws), 1) for name, ws in walls.items()}
        c["ratio"] = round(c["cli_wall_ms"] / c["socket_wall_ms"], 2)
        if base_mc:
            c["baseline_ratio"] = round(c["baseline_wall_ms"] / c["socket_wall_ms"], 2)
    finally:
        for ws in made:
            subprocess.run([mc, "--root", root, "remove", "--force", ws], capture_output=True)
        subprocess.run([mc, "--root", root, "daemon", "stop", "--force"], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", tmp])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

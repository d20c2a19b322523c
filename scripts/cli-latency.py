#!/usr/bin/env python3
"""What a workspace's create and remove cost through `mountctl`, against the control socket.

Usage (root): scripts/cli-latency.py TREE [--rounds 30] [--concurrent 64] [--lower native]
             [--mountctl PATH]

Imports TREE into a temporary runtime root (untimed, with an empty configuration), then,
in one run, times `create` + `remove` of one workspace ROUNDS times each way:
  - `cli-in-process`: `mountctl` with no daemon running (it opens the store and the
    registry itself);
  - `cli-through-daemon`: `mountctl` while the daemon runs (it sends the request there);
  - `socket`: one request on a new connection to the daemon's socket.
Then CONCURRENT creates at once, through `mountctl` and through the socket (wall time of
the batch), and their removals. Medians and 90th percentiles in ms; one JSON object on
stdout. Everything is removed at the end, also after an error.
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
    a = p.parse_args()
    mc = os.path.abspath(a.mountctl)
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

        def cli_round():
            c, v = timed(lambda: run(mc, root, "create", "base", "--lower", a.lower))
            made.append(v["id"])
            r, _ = timed(lambda: run(mc, root, "remove", v["id"]))
            made.remove(v["id"])
            return c, r

        def sock_round():
            c, v = timed(lambda: socket_call(root, "create", {"snapshot": "base", "lower": a.lower}))
            made.append(v["id"])
            r, _ = timed(lambda: socket_call(root, "remove", {"workspace": v["id"]}))
            made.remove(v["id"])
            return c, r

        for name, f in [("cli-in-process", cli_round), (None, None),
                        ("cli-through-daemon", cli_round), ("socket", sock_round)]:
            if name is None:
                run(mc, root, "daemon", "start")
                continue
            rounds = [f() for _ in range(a.rounds)]
            out[name] = {"create": summary([c for c, _ in rounds]),
                         "remove": summary([r for _, r in rounds])}

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
            return round(wall, 1)

        out[f"concurrent-{a.concurrent}"] = {
            "cli_wall_ms": batch(lambda: run(mc, root, "create", "base", "--lower", a.lower)["id"]),
            "socket_wall_ms": batch(lambda: socket_call(root, "create", {"snapshot": "base", "lower": a.lower})["id"]),
        }
        c = out[f"concurrent-{a.concurrent}"]
        c["ratio"] = round(c["cli_wall_ms"] / c["socket_wall_ms"], 2)
    finally:
        for ws in made:
            subprocess.run([mc, "--root", root, "remove", "--force", ws], capture_output=True)
        subprocess.run([mc, "--root", root, "daemon", "stop", "--force"], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", tmp])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

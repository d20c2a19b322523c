#!/usr/bin/env python3
"""Many workspaces of one snapshot alive at once: what the 1st and the Nth cost.

Usage (root): scripts/scale.py TREE [--count 1000] [--lower native] [--mountctl PATH]
             [--socket] [--read-dir SUBDIR]

Imports TREE into a temporary runtime root (untimed), then creates COUNT workspaces of
it one after another, all kept alive, and reports: the create time of the first ten and
of the last ten (medians), `list` and `sweep` with all of them alive, the time to read
every file under SUBDIR (default: the whole tree) in the first and in the last
workspace (warm: each read twice, the second timed), the daemon's RSS when one runs,
and the mount table's size. Everything is removed at the end, also after Ctrl-C or an
error. Prints one JSON object.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def run(mc, root, *args):
    out = subprocess.run([mc, "--root", root, "--json", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"mountctl {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout) if out.stdout.strip() else {}


def socket_call(root, op, args):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(root, "run/fsd.sock"))
    s.sendall((json.dumps({"op": op, "args": args}) + "\n").encode())
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    v = json.loads(buf)
    if not v.get("ok", True) or v.get("error"):
        raise RuntimeError(f"{op}: {v.get('error')}")
    return v.get("result", v)


def read_all(top):
    n = 0
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                while fh.read(1 << 20):
                    pass
            n += 1
    return n


def timed_read(top):
    read_all(top)
    t = time.perf_counter()
    n = read_all(top)
    return time.perf_counter() - t, n


def daemon_rss(root):
    try:
        pid = int(open(os.path.join(root, "run/fsd.pid")).read().split()[0])
    except (OSError, ValueError):
        out = subprocess.run(["pgrep", "-f", f"fsd.*{root}"], capture_output=True, text=True)
        pids = out.stdout.split()
        if not pids:
            return None
        pid = int(pids[0])
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--lower", default="native")
    ap.add_argument("--mountctl", default="target/release/mountctl")
    ap.add_argument("--socket", action="store_true", help="create and remove through the daemon")
    ap.add_argument("--read-dir", default="")
    a = ap.parse_args()
    mc = os.path.abspath(a.mountctl)
    tmp = tempfile.mkdtemp(prefix="cowspace-scale-", dir="/var/tmp")
    root = os.path.join(tmp, "root")
    ids = []
    result = {"count": a.count, "lower": a.lower, "socket": a.socket}
    try:
        run(mc, root, "init")
        run(mc, root, "import", a.tree, "--ref", "scale", "--no-default-excludes")
        if a.socket:
            run(mc, root, "daemon", "start")
        times = []
        first_path = None
        for i in range(a.count):
            t = time.perf_counter()
            if a.socket:
                rec = socket_call(root, "create", {"snapshot": "scale", "materializer": "overlay", "lower": a.lower})
            else:
                rec = run(mc, root, "create", "scale", "--materializer", "overlay", "--lower", a.lower)
            times.append(time.perf_counter() - t)
            rec = rec.get("workspace", rec) if isinstance(rec.get("workspace"), dict) else rec
            ids.append(rec.get("id") or rec.get("workspace"))
            if first_path is None:
                first_path = rec["path"]
                # The first workspace's first create builds what later ones share.
                result["first_create_s"] = times[0]
                result["first_read_s"], result["files_read"] = timed_read(os.path.join(first_path, a.read_dir))
        last_path = rec["path"]
        result["create_first10_median_ms"] = statistics.median(times[1:11]) * 1e3
        result["create_last10_median_ms"] = statistics.median(times[-10:]) * 1e3
        t = time.perf_counter()
        run(mc, root, "list")
        result["list_ms"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        run(mc, root, "sweep")
        result["sweep_ms"] = (time.perf_counter() - t) * 1e3
        result["last_read_s"], _ = timed_read(os.path.join(last_path, a.read_dir))
        result["first_read_again_s"], _ = timed_read(os.path.join(first_path, a.read_dir))
        result["daemon_rss_bytes"] = daemon_rss(root)
        result["mounts"] = sum(1 for _ in open("/proc/self/mountinfo"))
    finally:
        for i in reversed(ids):
            subprocess.run([mc, "--root", root, "remove", "--force", i], capture_output=True)
        subprocess.run([mc, "--root", root, "daemon", "stop", "--force"], capture_output=True)
        subprocess.run([mc, "--root", root, "gc", "--grace", "0"], capture_output=True)
        subprocess.run(["rm", "-rf", tmp])
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a remote costs: push, a lazy workspace on a fresh host, a full pull, beside
moving the same tree as one `tar | zstd` object through the same S3 server.

Usage (root): scripts/remote-bench.py TREE [--files 20] [--mountctl PATH]

Starts moto's S3 server on a free port of 127.0.0.1 (`pip install 'moto[server]'`) and,
in one run, on three fresh runtime roots standing for three hosts:
  - host A imports TREE (untimed) and pushes it (time, bytes uploaded, index size);
    baseline: `tar -C TREE -cf - . | zstd -T0 -3` uploaded as one object (time, bytes);
  - host B, empty: `create` of the remote ref (ms, the metadata fetch is the index),
    the first `git status` in it (when TREE is a git checkout), reading FILES files, and
    the bytes fetched for all that, beside the zstd -3 size of the files read;
  - host D, empty: `fetch` (the metadata fetch alone), then `create` twice (the first
    starts the daemon);
  - host C, empty: `pull` of the ref (time), beside downloading the one tar.zst object.
One JSON object on stdout. Everything is removed at the end, also after an error.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import run  # noqa: E402

BUCKET = "bench"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def timed(f):
    t = time.perf_counter()
    v = f()
    return (time.perf_counter() - t) * 1e3, v


def boto(endpoint):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--mountctl", default=os.path.join(os.path.dirname(__file__), "../target/release/mountctl"))
    a = ap.parse_args()
    mc = os.path.abspath(a.mountctl)
    tree = os.path.abspath(a.tree)
    os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "COWSPACE_CONFIG": os.path.join(os.path.dirname(__file__), "../tests/empty-config.toml")})
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    tmp = tempfile.mkdtemp(prefix="cowspace-remote-bench-", dir="/var/tmp")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    roots = []
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")).read()

        def host(name):
            r = os.path.join(tmp, name)
            run(mc, r, "init")
            run(mc, r, "remote", "add", "origin", f"s3://{BUCKET}/fleet", "--endpoint", endpoint)
            roots.append(r)
            return r

        A = host("A")
        imp = run(mc, A, "import", tree, "--ref", "bench/main")
        push_ms, push = timed(lambda: run(mc, A, "push", "bench/main"))

        tarzst = os.path.join(tmp, "tree.tar.zst")
        tar_ms, _ = timed(lambda: subprocess.run(
            f"tar -C {tree} -cf - . | zstd -q -T0 -3 -o {tarzst}", shell=True, check=True))
        s3 = boto(endpoint)
        put_ms, _ = timed(lambda: s3.upload_file(tarzst, BUCKET, "baseline/tree.tar.zst"))
        tar_bytes = os.path.getsize(tarzst)

        B = host("B")
        create_ms, ws = timed(lambda: run(mc, B, "create", "bench/main"))
        path = ws["path"]
        git = None
        if os.path.isdir(os.path.join(path, ".git")):
            git_ms, out = timed(lambda: subprocess.run(["git", "-C", path, "status", "--porcelain"],
                                                       capture_output=True, text=True))
            git = {"ms": git_ms, "clean": out.returncode == 0 and out.stdout == ""}
        after_git = run(mc, B, "remote", "list")[0]["fetched"]
        files = []
        for d, dirs, names in os.walk(os.path.join(tree)):
            dirs[:] = [x for x in sorted(dirs) if x != ".git"]
            for n in sorted(names):
                p = os.path.join(d, n)
                if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) > 0:
                    files.append(os.path.relpath(p, tree))
            if len(files) >= a.files * 50:
                break
        chosen = files[:: max(1, len(files) // a.files)][: a.files]
        read_ms, read_bytes = timed(lambda: sum(len(open(os.path.join(path, f), "rb").read()) for f in chosen))
        fetched = run(mc, B, "remote", "list")[0]["fetched"]
        zst = subprocess.run(["sh", "-c", "cat \"$@\" | zstd -q -3 -c | wc -c", "sh",
                              *[os.path.join(tree, f) for f in chosen]],
                             capture_output=True, text=True, check=True)
        read_zst = int(zst.stdout.strip())

        # The same on another fresh host, in two steps: the metadata fetch, then the create.
        D = host("D")
        fetch_ms, _ = timed(lambda: run(mc, D, "fetch"))
        dcreate_ms, dws = timed(lambda: run(mc, D, "create", "origin/bench/main"))
        dcreate2_ms, dws2 = timed(lambda: run(mc, D, "create", "origin/bench/main"))

        C = host("C")
        pull_ms, pull = timed(lambda: run(mc, C, "pull", "bench/main"))
        got = os.path.join(tmp, "got.tar.zst")
        get_ms, _ = timed(lambda: s3.download_file(BUCKET, "baseline/tree.tar.zst", got))

        print(json.dumps({
            "tree": tree, "files": imp.get("files"), "bytes": imp.get("bytes"),
            "push": {"ms": push_ms, "bytes_uploaded": push["bytes_uploaded"], "packs": push["packs_uploaded"],
                     "index_bytes": push["index_bytes"]},
            "baseline_tar_zstd": {"tar_zstd_ms": tar_ms, "put_ms": put_ms, "ms": tar_ms + put_ms, "bytes": tar_bytes},
            "push_ratio": push_ms / (tar_ms + put_ms),
            "lazy": {"create_ms": ws.get("ms"), "create_wall_ms": create_ms, "index_bytes": push["index_bytes"],
                     "git_status": git, "fetched_after_git_status": after_git,
                     "files_read": len(chosen), "read_ms": read_ms, "read_bytes": read_bytes,
                     "read_zstd3_bytes": read_zst, "fetched": fetched,
                     "fetched_for_reads_bytes": fetched["bytes"] - after_git["bytes"],
                     "fetched_for_reads_ratio": (fetched["bytes"] - after_git["bytes"]) / max(1, read_zst)},
            "two_steps": {"fetch_ms": fetch_ms, "create_ms": dws.get("ms"), "create_wall_ms": dcreate_ms,
                          "second_create_ms": dws2.get("ms"), "second_create_wall_ms": dcreate2_ms},
            "pull": {"ms": pull_ms, "fetched": pull["fetched"]},
            "baseline_get_one_object_ms": get_ms,
            "pull_ratio": pull_ms / get_ms,
        }, indent=1))
    finally:
        for r in roots:
            subprocess.run([mc, "--root", r, "daemon", "stop", "--force"], capture_output=True)
            for line in open("/proc/self/mounts"):
                mnt = line.split()[1]
                if mnt.startswith(r):
                    subprocess.run(["umount", "-l", mnt], capture_output=True)
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The cowspace Python client against a real daemon.

Run by the project's e2e test (tests/tests/e2e/workspaces/clients.rs), which starts a
daemon of a fresh runtime root and runs ``python3 -m unittest`` here with the package
on ``PYTHONPATH`` and:

- ``COWSPACE_TEST_ROOT``: the runtime root (its daemon running);
- ``COWSPACE_TEST_TMP``: a scratch directory the test may fill (removed afterwards).

Without ``COWSPACE_TEST_ROOT`` the tests that need a daemon are skipped; the version
handshake is checked against a fake daemon whatever the machine.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import cowspace  # noqa: E402
from cowspace import errors  # noqa: E402

ROOT = os.environ.get("COWSPACE_TEST_ROOT")
TMP = os.environ.get("COWSPACE_TEST_TMP") or tempfile.gettempdir()
NEEDS_DAEMON = unittest.skipUnless(ROOT, "COWSPACE_TEST_ROOT is not set (run by tests/tests/e2e/workspaces/clients.rs)")

# -- the seed-000 project -----------------------------------------------------------

MIGRATE = """import sqlite3, sys
db = sqlite3.connect('/workspace/app.db')
db.execute('create table who (name text)')
db.execute('insert into who values (?)', (sys.argv[1],))
db.commit()
(name,) = db.execute('select name from who').fetchone()
open('/workspace/whoami.txt', 'w').write(name)
"""

TEST_APP = """import unittest
import greet

class TestApp(unittest.TestCase):
    def test_greet(self):
        self.assertEqual(greet.hello('cow'), 'hello cow')

    def test_migrated(self):
        self.assertEqual(open('/workspace/whoami.txt').read(), 'py-seed')

if __name__ == '__main__':
    unittest.main()
"""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: str) -> None:
    """A one-module wheel (``greet``), the dependency the chain installs with pip."""
    files = {
        "greet/__init__.py": b"def hello(name):\n    return 'hello ' + name\n",
        "greet-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: greet\nVersion: 1.0\n",
        "greet-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: cowspace-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},sha256={_b64(d)},{len(d)}\n" for n, d in files.items())
    record += "greet-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("greet-1.0.dist-info/RECORD", record)


def make_project(base: str) -> tuple:
    src = os.path.join(base, "src")
    deps = os.path.join(base, "deps")
    os.makedirs(os.path.join(src, "tests"), exist_ok=True)
    os.makedirs(deps, exist_ok=True)
    with open(os.path.join(src, "migrate.py"), "w") as f:
        f.write(MIGRATE)
    with open(os.path.join(src, "tests", "test_app.py"), "w") as f:
        f.write(TEST_APP)
    with open(os.path.join(src, "README.md"), "w") as f:
        f.write("# the seed app\n")
    for i in range(400):  # enough files for a progress event or more
        d = os.path.join(src, "data", str(i % 10))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.txt"), "w") as f:
            f.write(f"row {i}\n")
    make_wheel(os.path.join(deps, "greet-1.0-py3-none-any.whl"))
    return src, deps


def http_get(port: int, path: str, seconds: float = 60.0) -> str:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


PIP = [
    "python3", "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
    "--disable-pip-version-check", "--target", "vendor", "/deps/greet-1.0-py3-none-any.whl",
]


@NEEDS_DAEMON
class SeedChain(unittest.TestCase):
    """import, create, sandbox with a published port, exec of an install and of tests,
    a background server reached through its published port, commit, remove."""

    def test_seed_chain_sync(self) -> None:
        base = tempfile.mkdtemp(prefix="py-sync-", dir=TMP)
        src, deps = make_project(base)
        with cowspace.Client(ROOT) as c:
            self.assertTrue(c.daemon and c.daemon["pong"])
            events = []
            rep = c.import_(src, ref="py/seed", message="seed app", on_progress=events.append)
            self.assertEqual(len(rep["snapshot"]), 64)
            self.assertGreater(rep["files"], 400)
            self.assertTrue(events and events[-1]["event"] == "progress", events)
            self.assertEqual(c.refs()["py/seed"], rep["snapshot"])
            self.assertIn(rep["snapshot"], [s["snapshot"] for s in c.snapshots()])

            ws = c.create("py/seed", name="py-seed", worker="python-tests")
            wid = ws["id"]
            print(json.dumps({"workspace": wid}), flush=True)
            try:
                self.assertEqual(ws["status"], "active")
                self.assertTrue(os.path.isdir(ws["path"]))
                self.assertIn(wid, [w["id"] for w in c.list()])
                self.assertEqual(c.status("py-seed")["id"], wid)

                sb = c.sandbox_start(wid, publish=[3000], ro_bind={deps: "/deps"}, memory="1g", pids=512)
                port = int(sb["ports"]["3000"])
                self.assertIn(wid, [s["workspace"] for s in c.sandbox_list()])

                # The dependency install, its output streamed to a callback.
                out: list = []
                r = c.exec(wid, PIP, on_stdout=out.append, timeout=300)
                self.assertEqual(r.exit_code, 0, r.stdout + r.stderr)
                self.assertIn("Successfully installed greet", "".join(out))
                # The migration, then the tests (env and stderr streamed).
                c.exec(wid, ["python3", "migrate.py", "py-seed"], check=True)
                err: list = []
                r = c.exec(
                    wid,
                    ["python3", "-m", "unittest", "discover", "-s", "tests", "-v"],
                    env={"PYTHONPATH": "/workspace/vendor"},
                    on_stderr=err.append,
                    timeout=300,
                )
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertIn("Ran 2 tests", "".join(err))
                self.assertIn("OK", r.stderr)

                # A server in the background, reached through the published port.
                server = c.exec(wid, ["python3", "-m", "http.server", "3000"], background=True)
                self.assertIsInstance(server, cowspace.Command)
                self.assertTrue(server.running and server.pid)
                self.assertEqual(http_get(port, "/whoami.txt"), "py-seed")
                self.assertEqual(c.sandbox_status(wid)["state"], "running")
                server.kill()
                done = server.wait(60)
                self.assertEqual(done.exit_code, 137)
                self.assertIn("GET /whoami.txt", done.stderr)

                # One that outlives its exec (a shell's background job) lives on.
                c.exec(wid, "nohup python3 -m http.server 3001 >/dev/null 2>&1 </dev/null &", check=True)
                pub = c.sandbox_publish(wid, 3001)
                self.assertEqual(pub["port"], 3001)
                self.assertIn("the seed app", http_get(pub["host_port"], "/README.md"))
                with self.assertRaises(errors.Exists):
                    c.sandbox_publish(wid, 3001)
                self.assertTrue(c.sandbox_unpublish(wid, 3001)["unpublished"])
                with self.assertRaises(errors.NotFound):
                    c.sandbox_unpublish(wid, 3001)
                # Policy changes need --net egress.
                with self.assertRaises(errors.InvalidInput):
                    c.sandbox_policy(wid, allow_host=["example.com"])

                self.exec_features(c, wid)

                stopped = c.sandbox_stop(wid)
                self.assertTrue(stopped["stopped"])
                with self.assertRaises(errors.NotFound):
                    c.sandbox_status(wid)

                d = c.diff(wid)
                paths = {ch["path"] for ch in d["changes"]}
                self.assertIn("whoami.txt", paths)
                self.assertIn("vendor", paths)
                cm = c.commit(wid, ref="py/seed", message="installed and tested")
                self.assertEqual(cm["parents"], [rep["snapshot"]])
                self.assertEqual(c.refs()["py/seed"], cm["snapshot"])
                shown = c.show(cm["snapshot"], "whoami.txt")
                self.assertEqual(shown["entry"]["size"], len("py-seed"))
            finally:
                removed = c.remove(wid, force=True)
            self.assertEqual(removed["status"], "removed")
            self.assertFalse(os.path.exists(ws["path"]))
            self.assertNotIn(wid, [w["id"] for w in c.list()])

    def exec_features(self, c: cowspace.Client, wid: str) -> None:
        r = c.exec(wid, "echo out; echo err >&2; exit 7")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (7, "out\n", "err\n"))
        with self.assertRaises(errors.CommandFailed):
            c.exec(wid, "exit 3", check=True)
        missing = c.exec(wid, ["no-such-command"])
        self.assertEqual(missing.exit_code, 127)
        self.assertIn("no-such-command", missing.error or "")
        self.assertEqual(c.exec(wid, ["cat"], stdin=b"fed\n").stdout, "fed\n")
        self.assertEqual(c.exec(wid, ["pwd"], workdir="vendor").stdout, "/workspace/vendor\n")
        merged = c.exec(wid, "echo a; echo b >&2", stdout=cowspace.PIPE, stderr=cowspace.STDOUT)
        self.assertEqual(merged.exit_code, 0)
        # Output as it arrives: an iterator of lines.
        cmd = c.spawn(wid, "for i in 1 2 3; do echo line$i; sleep 0.05; done; echo bye >&2")
        lines = list(cmd.lines())
        self.assertEqual(lines, [("stdout", "line1"), ("stdout", "line2"), ("stdout", "line3"), ("stderr", "bye")])
        self.assertEqual(cmd.wait().exit_code, 0)
        # stdin through a pipe, written while it runs.
        cat = c.spawn(wid, ["cat"], stdin=cowspace.PIPE)
        cat.write("piped\n")
        cat.close_stdin()
        self.assertEqual(cat.wait(60).stdout, "piped\n")
        # A signal.
        sl = c.exec(wid, ["sleep", "60"], background=True)
        sl.signal(15)
        self.assertEqual(sl.wait(60).exit_code, 143)
        # A timeout kills it.
        t0 = time.monotonic()
        with self.assertRaises(errors.ExecTimeout) as te:
            c.exec(wid, "echo started; sleep 60", timeout=1)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertEqual(te.exception.result.exit_code, 137)
        self.assertEqual(te.exception.result.stdout, "started\n")
        # A pseudo-terminal of the sandbox, its size and a resize.
        r = c.exec(wid, "tty; stty size", pty=(30, 100), timeout=60)
        self.assertEqual(r.exit_code, 0, r.stdout)
        self.assertIn("/dev/pts/", r.stdout)
        self.assertIn("30 100", r.stdout)
        term = c.spawn(wid, ["sh", "-c", "read x; stty size; echo got-$x"], pty=(24, 80))
        term.resize(40, 120)
        term.write("hi\n")
        r = term.wait(60)
        self.assertIn("40 120", r.stdout)
        self.assertIn("got-hi", r.stdout)
        # Output written straight to a file of ours.
        with tempfile.TemporaryFile() as f:
            self.assertEqual(c.exec(wid, "echo direct", stdout=f).exit_code, 0)
            f.seek(0)
            self.assertEqual(f.read(), b"direct\n")

    def test_seed_chain_async(self) -> None:
        base = tempfile.mkdtemp(prefix="py-async-", dir=TMP)
        src, deps = make_project(base)
        asyncio.run(self._async_chain(src, deps))

    async def _async_chain(self, src: str, deps: str) -> None:
        async with await cowspace.AsyncClient.connect(ROOT) as c:
            seen = []

            async def progress(e: dict) -> None:
                seen.append(e)

            rep = await c.import_(src, ref="py/aseed", on_progress=progress)
            self.assertTrue(seen)
            ws = await c.create("py/aseed", name="py-aseed")
            wid = ws["id"]
            print(json.dumps({"workspace": wid}), flush=True)
            try:
                sb = await c.sandbox_start(wid, publish=[3000], ro_bind=[f"{deps}:/deps"], net="loopback")
                port = int(sb["ports"]["3000"])
                r = await c.exec(wid, PIP, timeout=300)
                self.assertEqual(r.exit_code, 0, r.stderr)
                await c.exec(wid, ["python3", "migrate.py", "py-seed"], check=True)
                got: list = []

                async def on_err(t: str) -> None:
                    got.append(t)

                r = await c.exec(
                    wid,
                    ["python3", "-m", "unittest", "discover", "-s", "tests"],
                    env={"PYTHONPATH": "/workspace/vendor"},
                    on_stderr=on_err,
                )
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertIn("Ran 2 tests", "".join(got))
                server = await c.exec(wid, ["python3", "-m", "http.server", "3000"], background=True)
                body = await asyncio.get_running_loop().run_in_executor(None, http_get, port, "/whoami.txt")
                self.assertEqual(body, "py-seed")
                server.kill()
                self.assertEqual((await server.wait(60)).exit_code, 137)
                cmd = await c.spawn(wid, "for i in 1 2 3; do echo n$i; done")
                lines = [line async for line in cmd.lines()]
                self.assertEqual(lines, [("stdout", "n1"), ("stdout", "n2"), ("stdout", "n3")])
                with self.assertRaises(errors.ExecTimeout):
                    await c.exec(wid, ["sleep", "60"], timeout=0.5)
                r = await c.exec(wid, "stty size", pty=(33, 77))
                self.assertIn("33 77", r.stdout)
                self.assertEqual((await c.exec(wid, ["no-such-command"])).exit_code, 127)
                await c.sandbox_stop(wid)
                cm = await c.commit(wid, message="async chain")
                self.assertEqual(cm["parents"], [rep["snapshot"]])
            finally:
                removed = await c.remove(wid, force=True)
            self.assertEqual(removed["status"], "removed")


@NEEDS_DAEMON
class ErrorPaths(unittest.TestCase):
    def test_missing_workspace(self) -> None:
        with cowspace.Client(ROOT) as c:
            with self.assertRaises(errors.NotFound) as e:
                c.status("no-such-workspace")
            self.assertEqual(e.exception.kind, "not_found")
            self.assertEqual(e.exception.exit_code, 3)
            self.assertIn("no-such-workspace", e.exception.message)
            self.assertIsInstance(e.exception, errors.CowspaceError)
            with self.assertRaises(errors.NotFound):
                c.remove("no-such-workspace")

    def test_exec_without_sandbox_and_bad_arguments(self) -> None:
        base = tempfile.mkdtemp(prefix="py-err-", dir=TMP)
        src = os.path.join(base, "src")
        os.makedirs(src)
        with open(os.path.join(src, "a.txt"), "w") as f:
            f.write("a\n")
        with cowspace.Client(ROOT) as c:
            c.import_(src, ref="py/err")
            ws = c.create("py/err")
            print(json.dumps({"workspace": ws["id"]}), flush=True)
            try:
                with self.assertRaises(errors.NotFound):
                    c.exec(ws["id"], ["true"])
                # An unknown argument key is refused, naming it; nothing starts.
                with self.assertRaises(errors.InvalidInput) as e:
                    c.request("sandbox_start", {"workspace": ws["id"], "memroy": "1g"})
                self.assertIn("memroy", e.exception.message)
                with self.assertRaises(errors.NotFound):
                    c.sandbox_status(ws["id"])
                with self.assertRaises(errors.InvalidInput) as e:
                    c.request("frobnicate")
                self.assertIn("frobnicate", e.exception.message)
                with self.assertRaises(errors.InvalidInput):
                    c.sandbox_start(ws["id"], net="bogus")
                with self.assertRaises(errors.Conflict):
                    c.ref_set("py/err", "py/err")  # exists: expect must name what it holds
            finally:
                c.remove(ws["id"], force=True)

    def test_async_errors(self) -> None:
        async def go() -> None:
            async with await cowspace.AsyncClient.connect(ROOT) as c:
                with self.assertRaises(errors.NotFound):
                    await c.status("no-such-workspace")
                with self.assertRaises(errors.NotFound):
                    await c.exec("no-such-workspace", ["true"])
                with self.assertRaises(errors.InvalidInput) as e:
                    await c.request("list", {"al": True})
                self.assertIn("al", e.exception.message)

        asyncio.run(go())


def small_project(prefix: str) -> str:
    src = os.path.join(tempfile.mkdtemp(prefix=prefix, dir=TMP), "src")
    os.makedirs(os.path.join(src, "lib"))
    with open(os.path.join(src, "README.md"), "w") as f:
        f.write("# files\n")
    with open(os.path.join(src, "lib", "a.py"), "w") as f:
        f.write("A = 1\n")
    return src


def collect(w: cowspace.Watch, want: set, seconds: float = 60.0) -> list:
    """Events of ``w`` until every path of ``want`` was seen (or the time is up)."""
    seen: list = []
    deadline = time.monotonic() + seconds
    while not want <= {e.get("path") for e in seen}:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ev = w.get(left)
        if ev is None and w.ended is not None:
            break
        if ev is not None:
            seen.append(ev)
    return seen


@NEEDS_DAEMON
class FilesForkPause(unittest.TestCase):
    """The files operations while a sandbox runs, watch, fork, pause and resume."""

    def test_files_watch_fork_pause_sync(self) -> None:
        src = small_project("py-files-")
        with cowspace.Client(ROOT) as c:
            c.import_(src, ref="py/files")
            ws = c.create("py/files", name="py-files")
            wid = ws["id"]
            print(json.dumps({"workspace": wid}), flush=True)
            fork_ids: list = []
            try:
                c.sandbox_start(wid)
                # A file written by the client while the sandbox runs, read from inside:
                # it belongs to root inside.
                self.assertEqual(c.files_mkdir(wid, "notes/deep", parents=True)["kind"], "dir")
                info = c.files_write(wid, "notes/hello.txt", "hello from the host\n", mode=0o640)
                self.assertEqual((info["kind"], info["size"], info["mode"]), ("file", 20, 0o640))
                r = c.exec(wid, "cat notes/hello.txt; ls -ln notes/hello.txt", check=True)
                lines = r.stdout.splitlines()
                self.assertEqual(lines[0], "hello from the host")
                self.assertEqual(lines[1].split()[2:4], ["0", "0"], r.stdout)
                st = c.files_stat(wid, "/notes/hello.txt")
                self.assertEqual((st["uid"], st["gid"], st["size"]), (0, 0, 20))
                self.assertEqual(c.files_read(wid, "notes/hello.txt"), b"hello from the host\n")
                self.assertEqual(c.files_read(wid, "notes/hello.txt", offset=6, length=4), b"from")
                # Written inside, read by the client.
                c.exec(wid, "printf inside > notes/deep/in.txt", check=True)
                self.assertEqual(c.files_read(wid, "notes/deep/in.txt"), b"inside")

                # Large contents go in ranges and appends (small ranges here).
                blob = os.urandom(10_000)
                self.assertEqual(c.files_write(wid, "notes/blob.bin", blob, chunk_size=3000)["size"], 10_000)
                pieces = list(c.files_read_chunks(wid, "notes/blob.bin", chunk_size=4096))
                self.assertEqual([len(p) for p in pieces], [4096, 4096, 1808])
                self.assertEqual(b"".join(pieces), blob)
                self.assertEqual(c.files_read(wid, "notes/blob.bin"), blob)
                self.assertEqual(c.files_write(wid, "notes/blob.bin", b"tail", append=True)["size"], 10_004)
                r = c.exec(wid, ["sha256sum", "notes/blob.bin"], check=True)
                self.assertEqual(r.stdout.split()[0], hashlib.sha256(blob + b"tail").hexdigest())

                # Listings.
                top = {e["path"]: e for e in c.files_list(wid)}
                self.assertIn("README.md", top)
                self.assertEqual(top["notes"]["kind"], "dir")
                self.assertNotIn("notes/hello.txt", top)
                every = {e["path"] for e in c.files_list(wid, ".", recursive=True)}
                self.assertTrue(
                    {"lib/a.py", "notes/hello.txt", "notes/deep/in.txt", "notes/blob.bin"} <= every, every
                )
                self.assertEqual({e["path"] for e in c.files_list(wid, "notes/deep")}, {"notes/deep/in.txt"})

                # A path climbing above the root is refused before anything is resolved.
                for call in (
                    lambda: c.files_read(wid, "../../etc/passwd"),
                    lambda: c.files_write(wid, "notes/../../escape.txt", b"x"),
                    lambda: c.files_list(wid, ".."),
                ):
                    with self.assertRaises(errors.InvalidInput) as e:
                        call()
                    self.assertEqual(e.exception.exit_code, 9)
                with self.assertRaises(errors.NotFound):
                    c.files_stat(wid, "no/such/file")

                # Rename, symlink, remove.
                moved = c.files_rename(wid, "notes/hello.txt", "notes/renamed.txt")
                self.assertEqual(moved["path"], "notes/renamed.txt")
                with self.assertRaises(errors.NotFound):
                    c.files_stat(wid, "notes/hello.txt")
                self.assertEqual(c.exec(wid, "cat notes/renamed.txt").stdout, "hello from the host\n")
                link = c.files_symlink(wid, "notes/link", "renamed.txt")
                self.assertEqual((link["kind"], link["target"]), ("symlink", "renamed.txt"))
                self.assertEqual(c.exec(wid, "cat notes/link").stdout, "hello from the host\n")
                c.files_remove(wid, "notes/link")
                self.assertTrue(c.files(wid).exists("notes/renamed.txt"))
                with self.assertRaises(errors.CowspaceError):
                    c.files_remove(wid, "notes")  # not empty
                c.files_remove(wid, "notes", recursive=True)
                self.assertFalse(c.files(wid).exists("notes"))
                self.assertEqual(c.exec(wid, "test -e notes || echo gone").stdout, "gone\n")

                # A watch sees a file made inside the sandbox and one the client writes.
                with c.watch(wid) as w:
                    self.assertEqual(w.watching.get("event"), "watching")
                    c.exec(wid, "echo made > from-inside.txt", check=True)
                    c.files_write(wid, "from-client.txt", b"written\n")
                    seen = collect(w, {"from-inside.txt", "from-client.txt"})
                self.assertTrue({"from-inside.txt", "from-client.txt"} <= {e["path"] for e in seen}, seen)
                # A write is atomic: a temporary file renamed over the target.
                events = {e["path"]: e["event"] for e in seen}
                self.assertIn(events["from-inside.txt"], ("created", "modified"), seen)
                self.assertIn(events["from-client.txt"], ("created", "modified", "renamed"), seen)
                self.assertIsNotNone(w.ended)

                # Pause: exec is refused as busy until resumed.
                p = c.sandbox_pause(wid)
                self.assertTrue(p["paused"])
                self.assertEqual(p["paused_by"], "request")
                self.assertEqual(c.sandbox_status(wid)["state"], "paused")
                with self.assertRaises(errors.Busy) as e:
                    c.exec(wid, ["true"])
                self.assertEqual(e.exception.exit_code, 5)
                with self.assertRaises(errors.InvalidInput):
                    c.sandbox_pause(wid)
                self.assertTrue(c.sandbox_resume(wid)["resumed"])
                self.assertEqual(c.sandbox_status(wid)["state"], "running")
                self.assertEqual(c.exec(wid, "cat from-client.txt").stdout, "written\n")
                with self.assertRaises(errors.InvalidInput):
                    c.sandbox_resume(wid)

                # A fork shows the parent's change; removing either needs force now.
                f = c.fork(wid, name="py-files-fork")
                fork_ids = [x["id"] for x in f["forks"]]
                print(json.dumps({"forks": fork_ids}), flush=True)
                self.assertEqual(f["parent"], wid)
                self.assertEqual(len(fork_ids), 1)
                self.assertEqual(f["forks"][0]["parent"], wid)
                self.assertEqual(c.files_read(fork_ids[0], "from-client.txt"), b"written\n")
                self.assertEqual(c.files_read(fork_ids[0], "from-inside.txt"), b"made\n")
                c.files_write(fork_ids[0], "fork-only.txt", b"f")
                self.assertFalse(c.files(wid).exists("fork-only.txt"))
                with self.assertRaises(errors.Busy):
                    c.remove(fork_ids[0])
            finally:
                for fid in fork_ids:
                    self.assertEqual(c.remove(fid, force=True)["status"], "removed")
                c.remove(wid, force=True)

    def test_files_watch_fork_pause_async(self) -> None:
        src = small_project("py-afiles-")
        asyncio.run(self._async(src))

    async def _async(self, src: str) -> None:
        async with await cowspace.AsyncClient.connect(ROOT) as c:
            await c.import_(src, ref="py/afiles")
            ws = await c.create("py/afiles", name="py-afiles")
            wid = ws["id"]
            print(json.dumps({"workspace": wid}), flush=True)
            fork_ids: list = []
            try:
                await c.sandbox_start(wid, idle_timeout="10m")
                files = c.files(wid)
                await files.make_dir("out/sub")
                await files.write("out/sub/a.txt", "from the host")
                r = await c.exec(wid, "cat out/sub/a.txt; echo; ls -ln out/sub/a.txt")
                self.assertTrue(r.stdout.startswith("from the host"), r.stdout)
                self.assertEqual(r.stdout.splitlines()[1].split()[2:4], ["0", "0"])
                self.assertEqual(await files.read("out/sub/a.txt"), "from the host")
                self.assertEqual(await files.read("out/sub/a.txt", format="bytes"), b"from the host")
                pieces = [p async for p in c.files_read_chunks(wid, "out/sub/a.txt", chunk_size=5)]
                self.assertEqual(pieces, [b"from ", b"the h", b"ost"])
                every = {e["path"] for e in await files.list(".", recursive=True)}
                self.assertTrue({"out/sub/a.txt", "lib/a.py"} <= every, every)
                with self.assertRaises(errors.InvalidInput):
                    await files.read("../x")
                await files.rename("out/sub/a.txt", "out/b.txt")
                self.assertFalse(await files.exists("out/sub/a.txt"))
                await files.remove("out/sub")
                self.assertEqual({e["path"] for e in await files.list("out")}, {"out/b.txt"})

                w = await files.watch_dir(".")
                try:
                    await c.exec(wid, "echo x > inside.txt", check=True)
                    await files.write("client.txt", b"y")
                    seen: list = []
                    deadline = time.monotonic() + 60
                    while not {"inside.txt", "client.txt"} <= {e["path"] for e in seen}:
                        ev = await w.get(max(0.0, deadline - time.monotonic()))
                        if ev is None:
                            break
                        seen.append(ev)
                    self.assertTrue({"inside.txt", "client.txt"} <= {e["path"] for e in seen}, seen)
                finally:
                    await w.close()

                self.assertEqual((await c.sandbox_status(wid)).get("idle_timeout_ms"), 600_000)
                await c.sandbox_pause(wid)
                self.assertEqual((await c.sandbox_status(wid))["state"], "paused")
                with self.assertRaises(errors.Busy):
                    await c.exec(wid, ["true"])
                await c.sandbox_resume(wid)
                self.assertEqual((await c.exec(wid, "cat client.txt")).stdout, "y")

                f = await c.fork(wid, count=2)
                fork_ids = [x["id"] for x in f["forks"]]
                print(json.dumps({"forks": fork_ids}), flush=True)
                self.assertEqual(len(fork_ids), 2)
                for fid in fork_ids:
                    self.assertEqual(await c.files_read(fid, "out/b.txt"), b"from the host")
            finally:
                for fid in fork_ids:
                    await c.remove(fid, force=True)
                await c.remove(wid, force=True)


class FakeDaemon:
    """A socket answering every request with ``answer`` (the version handshake)."""

    def __init__(self, answer: dict) -> None:
        self.dir = tempfile.mkdtemp(prefix="fake-fsd-", dir=TMP)
        self.path = os.path.join(self.dir, "fsd.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        self.answer = answer
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as f:
                for _line in f:
                    conn.sendall(json.dumps({"ok": True, "result": self.answer}).encode() + b"\n")

    def close(self) -> None:
        self.sock.close()


class VersionHandshake(unittest.TestCase):
    def test_other_protocol_is_refused_naming_both(self) -> None:
        d = FakeDaemon({"pong": True, "version": "9.0.0", "protocol": 99})
        try:
            with self.assertRaises(errors.IncompatibleDaemon) as e:
                cowspace.Client(socket=d.path)
            m = str(e.exception)
            self.assertIn("99", m)
            self.assertIn(str(cowspace.PROTOCOL_VERSION), m)
            self.assertEqual(e.exception.kind, "unsupported")
            with self.assertRaises(errors.IncompatibleDaemon):
                asyncio.run(cowspace.AsyncClient.connect(socket=d.path))
        finally:
            d.close()

    def test_same_or_absent_protocol_is_accepted(self) -> None:
        for answer in (
            {"pong": True, "version": "0.1.0"},
            {"pong": True, "version": "0.1.0", "protocol": cowspace.PROTOCOL_VERSION},
        ):
            d = FakeDaemon(answer)
            try:
                with cowspace.Client(socket=d.path) as c:
                    self.assertEqual(c.daemon, answer)
            finally:
                d.close()

    def test_no_daemon_is_an_io_error_with_a_hint(self) -> None:
        with self.assertRaises(errors.IoError) as e:
            cowspace.Client(socket=os.path.join(TMP, "no-such-dir", "fsd.sock"))
        self.assertIn("mountctl daemon start", e.exception.hint or "")


if __name__ == "__main__":
    unittest.main()

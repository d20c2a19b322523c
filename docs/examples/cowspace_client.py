#!/usr/bin/env python3
"""A small client of the cowspace control socket (Python 3 standard library only).

The protocol is in docs/control-protocol.md: one JSON object per line on the Unix
socket <root>/run/fsd.sock, a request ``{"op": ..., "args": {...}}`` answered by
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"kind", "message", "hint"}}``.
The daemon must be running (``mountctl daemon start``); only root and the owner of the
runtime root may connect.

As a library::

    from cowspace_client import Client, CowspaceError
    with Client("/var/lib/cowspace") as c:
        ws = c.create("myrepo/main", name="w1")
        ...
        print(c.diff(ws["id"])["changes"])
        print(c.commit(ws["id"], message="done")["snapshot"])
        c.remove(ws["id"])

As a demo (run by the project's tests)::

    python3 cowspace_client.py ROOT SOURCE_DIR

imports SOURCE_DIR (with progress events) under the ref ``python/demo``, creates a
workspace of it, writes a file in it, diffs, commits and removes it, lists snapshots
and refs, and prints what each step answered as one JSON object.
"""

import json
import os
import socket
import sys

__all__ = ["Client", "CowspaceError"]


class CowspaceError(Exception):
    """An error answered by the daemon: ``kind`` (``not_found``, ``exists``, ``busy``,
    ``conflict``, ``unsupported``, ``corrupt``, ``invalid_input`` or ``io``),
    ``message`` and ``hint`` (may be None)."""

    def __init__(self, kind, message, hint=None):
        super().__init__(f"{kind}: {message}" + (f" (hint: {hint})" if hint else ""))
        self.kind = kind
        self.message = message
        self.hint = hint


class Client:
    """One connection to the daemon of a runtime root; requests are answered in order."""

    def __init__(self, root, timeout=120.0):
        self.root = root
        self.path = os.path.join(root, "run", "fsd.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
        except OSError:
            self._sock.close()
            raise
        self._file = self._sock.makefile("rb")

    def close(self):
        self._file.close()
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, op, on_event=None, **args):
        """Sends one request; gives its result or raises CowspaceError. Arguments that
        are None are left out (the daemon applies its defaults). Lines with an "event"
        the daemon sends before the answer (an import's progress) go to on_event."""
        req = {"op": op, "args": {k: v for k, v in args.items() if v is not None}}
        self._sock.sendall(json.dumps(req).encode("utf-8") + b"\n")
        while True:
            line = self._file.readline()
            if not line:
                raise CowspaceError("io", "the daemon closed the connection", None)
            resp = json.loads(line)
            if "event" not in resp:
                break
            if on_event is not None:
                on_event(resp)
        if resp.get("ok"):
            return resp.get("result")
        err = resp.get("error") or {}
        raise CowspaceError(err.get("kind", "io"), err.get("message", ""), err.get("hint"))

    def import_(self, source, git=None, ref=None, message=None, excludes=None,
                on_progress=None):
        """Imports a directory, tar archive or (with ``git``, a revision) git repository
        at the absolute path ``source``; gives the import report (``snapshot``,
        ``files``, ...). ``on_progress`` gets ``{"event": "progress", "files_done",
        "files_total", "bytes_done"}`` while it runs."""
        return self.request("import", on_event=on_progress, source=source, git=git,
                            ref=ref, message=message, excludes=excludes,
                            progress=on_progress is not None)

    def snapshots(self):
        """Every snapshot, newest first: ``snapshot``, ``files``, ``bytes``, ``refs``, ..."""
        return self.request("snapshots")

    def refs(self):
        """``{name: snapshot}``."""
        return self.request("refs")

    def ref_set(self, name, snapshot, expect=None, force=False):
        """Moves ref ``name`` to ``snapshot`` by compare-and-swap (``expect``: what it
        must hold; none: it must not exist)."""
        return self.request("ref_set", name=name, snapshot=snapshot, expect=expect,
                            force=force)

    def show(self, snapshot, path=None):
        """A snapshot's metadata (``meta``) and what ``path`` holds (``entry``,
        ``entries``)."""
        return self.request("show", snapshot=snapshot, path=path)

    def stats(self):
        """What the store holds, and its dedup and compression ratios."""
        return self.request("stats")

    def gc(self, dry_run=False):
        """Collects garbage (``dry_run``: says what would go)."""
        return self.request("gc", dry_run=dry_run)

    def export(self, snapshot, dest, tar=False):
        """Exports a snapshot to the new directory (or tar archive) ``dest``."""
        return self.request("export", snapshot=snapshot, dest=dest, tar=tar)

    def ping(self):
        """``{"pong": true, "version": ...}``."""
        return self.request("ping")

    def create(self, snapshot, name=None, materializer=None, lower=None, path=None,
               worker=None, disk=None):
        """Creates a workspace of a snapshot (id, unique prefix or ref); gives its record.
        ``disk``: a quota on what it writes ("20g" or bytes), refused where it cannot
        be enforced."""
        return self.request("create", snapshot=snapshot, name=name,
                            materializer=materializer, lower=lower, path=path,
                            worker=worker, disk=disk)

    def list(self, all=False):
        """Live workspace records (``all``: also removed and failed ones)."""
        return self.request("list", all=all)

    def status(self, workspace):
        """The record of a workspace (id or name)."""
        return self.request("status", workspace=workspace)

    def diff(self, workspace, patch=False):
        """``{"changes": [{"path", "change", "old_kind", "new_kind"}...], "patch": ...}``."""
        return self.request("diff", workspace=workspace, patch=patch)

    def commit(self, workspace, ref=None, expect=None, message=None):
        """Captures the workspace as a new snapshot; gives the import report
        (``snapshot``, ``files``, ``new_bytes_stored``, ...)."""
        return self.request("commit", workspace=workspace, ref=ref, expect=expect,
                            message=message)

    def remove(self, workspace, force=False):
        """Unmounts and deletes the workspace; gives its final record."""
        return self.request("remove", workspace=workspace, force=force)

    def sandbox_start(self, workspace, net=None, memory=None, pids=None, cpus=None,
                      publish=None, env=None, ro_bind=None, secret=None, io_max=None):
        """Starts a long-lived sandbox for the workspace; gives its status once ready
        (``ports``: internal -> host port on 127.0.0.1). ``io_max``: "20m" or
        "rbps=20m,wbps=10m"."""
        return self.request("sandbox_start", workspace=workspace, net=net,
                            memory=memory, pids=pids, cpus=cpus, publish=publish,
                            env=env, ro_bind=ro_bind, secret=secret, io_max=io_max)

    def sandbox_status(self, workspace):
        """The running sandbox's status (processes, memory, OOM kills, ports, ...)."""
        return self.request("sandbox_status", workspace=workspace)

    def sandbox_stop(self, workspace):
        """Stops the sandbox: every process killed, its cgroups and ports freed."""
        return self.request("sandbox_stop", workspace=workspace)

    def exec(self, workspace, argv, env=None, workdir=None, stdin=None, stdout=None,
             stderr=None):
        """Runs ``argv`` in the workspace's running sandbox and gives its exit status
        (127: no such command). ``stdin``/``stdout``/``stderr`` are file objects or
        descriptors (default: /dev/null, this process's stdout and stderr); they are
        passed to the command itself (``SCM_RIGHTS``), so output goes straight there."""
        where = self.request("exec", workspace=workspace)
        def fd(f, default):
            if f is None:
                return default
            return f if isinstance(f, int) else f.fileno()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            fds = [fd(stdin, null), fd(stdout, 1), fd(stderr, 2)]
            req = {"op": "exec", "request": {
                "argv": list(argv),
                "env": [[k, v] for k, v in (env or {}).items()],
                "workdir": workdir,
            }}
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as k:
                k.connect(where["socket"])
                socket.send_fds(k, [json.dumps(req).encode()], fds)
                first = json.loads(k.recv(1 << 16))
                if "started" not in first:
                    err = first.get("error", {})
                    if first.get("exit") in (126, 127):
                        return first["exit"]
                    raise CowspaceError(err.get("kind", "io"), err.get("message", "exec failed"))
                done = json.loads(k.recv(1 << 16))
                return done["exit"]
        finally:
            os.close(null)


def demo(root, source):
    out = {}
    with Client(root) as c:
        out["ping"] = c.ping()
        events = []
        out["import"] = c.import_(os.path.abspath(source), ref="python/demo",
                                  message="imported by the python demo",
                                  on_progress=events.append)
        out["progress_events"] = events
        snapshot = out["import"]["snapshot"]
        out["base"] = snapshot
        ws = c.create("python/demo", worker="python-demo")
        out["workspace"] = ws["id"]
        out["path"] = ws["path"]
        try:
            with open(os.path.join(ws["path"], "hello-from-python.txt"), "w") as f:
                f.write("hello from python\n")
            out["diff"] = c.diff(ws["id"])["changes"]
            out["commit"] = c.commit(ws["id"], message="written by the python demo")
            out["snapshot"] = out["commit"]["snapshot"]
            out["listed"] = [w["id"] for w in c.list()]
            if os.geteuid() == 0:
                # A long-lived sandbox: two commands, the second sees the first's file.
                c.sandbox_start(ws["id"])
                try:
                    r, w = os.pipe()
                    out["exec_write"] = c.exec(ws["id"], ["sh", "-c", "echo from-exec > made-inside"])
                    out["exec_read"] = c.exec(ws["id"], ["cat", "made-inside"], stdout=w)
                    os.close(w)
                    out["exec_stdout"] = os.read(r, 4096).decode()
                    os.close(r)
                    out["exec_missing"] = c.exec(ws["id"], ["no-such-command"])
                finally:
                    out["sandbox_stop"] = c.sandbox_stop(ws["id"])
        finally:
            # Forced: what the sandbox wrote after the commit is thrown away (without
            # force the removal is refused, busy, while a workspace holds changes no
            # commit took).
            out["removed"] = c.remove(ws["id"], force=True)
        out["refs"] = c.refs()
        out["snapshots"] = c.snapshots()
        out["show"] = c.show(out["snapshot"], "hello-from-python.txt")
        out["stats"] = c.stats()
        out["gc_dry_run"] = c.gc(dry_run=True)
        try:
            c.status("no-such-workspace")
        except CowspaceError as e:
            out["error"] = {"kind": e.kind, "message": e.message, "hint": e.hint}
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} ROOT SOURCE_DIR")
    try:
        print(json.dumps(demo(sys.argv[1], sys.argv[2]), indent=2))
    except CowspaceError as e:
        print(json.dumps({"error": {"kind": e.kind, "message": e.message, "hint": e.hint}}))
        sys.exit(1)

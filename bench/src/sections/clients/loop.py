"""One method of bench's clients section: N create+remove and N `exec -- /bin/true`
through the Python client (`client`) or the raw control socket (`raw`), timed one by
one inside this process (so interpreter start-up is not counted). Prints one JSON line:
{"create_remove": [s, ...], "exec": [s, ...]}.

argv: MODE ROOT SNAPSHOT WORKSPACE ITERATIONS WARMUP CLIENT_SRC
"""

import json
import os
import socket
import sys
import time

mode, root, snapshot, workspace = sys.argv[1:5]
iterations, warmup = int(sys.argv[5]), int(sys.argv[6])
client_src = sys.argv[7]
sock_path = os.path.join(root, "run", "fsd.sock")
MAX_KEEPER_MSG_BYTES = 64 * 1024


class Raw:
    """A few lines of socket code, as a runtime without the client would write."""

    def __init__(self):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock_path)
        self.f = self.s.makefile("rb")
        self.null_r = os.open(os.devnull, os.O_RDONLY)
        self.null_w = os.open(os.devnull, os.O_WRONLY)

    def request(self, op, args):
        self.s.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
        v = json.loads(self.f.readline())
        if not v.get("ok"):
            raise RuntimeError(f"{op}: {v.get('error')}")
        return v["result"]

    def create_remove(self):
        ws = self.request("create", {"snapshot": snapshot})
        self.request("remove", {"workspace": ws["id"], "force": True})

    def exec_true(self):
        keeper = self.request("exec", {"workspace": workspace})["socket"]
        k = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            k.connect(keeper)
            msg = {"op": "exec", "request": {"argv": ["/bin/true"], "env": [], "workdir": None, "tty": None}}
            socket.send_fds(k, [json.dumps(msg).encode()], [self.null_r, self.null_w, self.null_w])
            while True:
                m = k.recv(MAX_KEEPER_MSG_BYTES)
                if not m:
                    raise RuntimeError("the keeper closed the connection")
                v = json.loads(m)
                if "exit" in v:
                    if v["exit"] != 0:
                        raise RuntimeError(f"/bin/true exited {v}")
                    return
        finally:
            k.close()


class WithClient:
    def __init__(self):
        sys.path.insert(0, client_src)
        import cowspace

        self.c = cowspace.Client(root)

    def create_remove(self):
        ws = self.c.create(snapshot)
        self.c.remove(ws["id"], force=True)

    def exec_true(self):
        r = self.c.exec(workspace, ["/bin/true"])
        if r.exit_code != 0:
            raise RuntimeError(f"/bin/true exited {r.exit_code}")


m = WithClient() if mode == "client" else Raw()
out = {"create_remove": [], "exec": []}
for name, f in (("create_remove", m.create_remove), ("exec", m.exec_true)):
    for i in range(warmup + iterations):
        t0 = time.perf_counter()
        f()
        t = time.perf_counter() - t0
        if i >= warmup:
            out[name].append(t)
print(json.dumps(out))

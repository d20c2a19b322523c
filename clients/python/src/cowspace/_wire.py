"""What the synchronous and the asyncio clients share: where the socket is, how a
request is encoded and an answer decoded, the version check, the keeper's messages."""

from __future__ import annotations

import base64
import json
import os
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import IncompatibleDaemon, IoError, error_from

#: The control protocol this client speaks. A daemon whose ``ping`` answers another
#: ``protocol`` is refused (:class:`~cowspace.errors.IncompatibleDaemon`); one that
#: answers none (before the field existed) is accepted.
PROTOCOL_VERSION = 1

#: Longest line read from the control socket (a snapshot list of a large store).
MAX_LINE_BYTES = 256 * 1024 * 1024
#: Most bytes one ``files_read`` or ``files_write`` moves (the daemon's bound): larger
#: reads are made in ranges, larger writes as a first write plus appends.
MAX_IO_BYTES = 64 << 20
#: Largest message read from a keeper socket.
MAX_KEEPER_MSG_BYTES = 64 * 1024
#: How long output still buffered in a pipe is read after the command ended (a
#: background process that inherited the pipe may keep it open for ever).
DRAIN_AFTER_EXIT_S = 0.2

Argv = Union[str, Sequence[str]]


def default_root() -> str:
    """``$COWSPACE_ROOT``, else ``/var/lib/cowspace`` for root, else
    ``$XDG_DATA_HOME/cowspace`` (``~/.local/share/cowspace``)."""
    env = os.environ.get("COWSPACE_ROOT")
    if env:
        return env
    if os.geteuid() == 0:
        return "/var/lib/cowspace"
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "cowspace")


def socket_path(root: Optional[str], socket: Optional[str]) -> str:
    if socket:
        return socket
    return os.path.join(root or default_root(), "run", "fsd.sock")


def args(**kw: Any) -> Dict[str, Any]:
    """The arguments that were given (``None`` is left out: the daemon's default)."""
    out: Dict[str, Any] = {}
    for k, v in kw.items():
        if v is None:
            continue
        if k.endswith("_") and k != "_":
            k = k[:-1]  # ref_ -> ref
        if isinstance(v, (tuple, set, frozenset)):
            v = list(v)
        out[k] = v
    return out


def encode(op: str, a: Optional[Mapping[str, Any]]) -> bytes:
    req: Dict[str, Any] = {"op": op}
    if a:
        req["args"] = dict(a)
    return json.dumps(req, separators=(",", ":")).encode("utf-8") + b"\n"


def decode(line: bytes) -> Dict[str, Any]:
    if not line:
        raise IoError("the daemon closed the connection before answering")
    v = json.loads(line)
    if not isinstance(v, dict):
        raise IoError(f"the daemon answered something that is not an object: {line[:200]!r}")
    return v


def result(resp: Mapping[str, Any]) -> Any:
    if resp.get("ok") is True:
        return resp.get("result")
    raise error_from(resp.get("error"))


def check_version(ping: Mapping[str, Any], path: str) -> None:
    proto = ping.get("protocol")
    if proto is None:
        return
    if proto != PROTOCOL_VERSION:
        raise IncompatibleDaemon(PROTOCOL_VERSION, proto, ping.get("version"), path)


def sandbox_args(
    workspace: str,
    *,
    vm: Optional[bool],
    accept_emulation: Optional[bool],
    net: Optional[str],
    allow_host: Optional[Iterable[str]],
    deny_host: Optional[Iterable[str]],
    add_host: Optional[Union[Iterable[str], Mapping[str, str]]],
    memory: Optional[Union[int, str]],
    pids: Optional[int],
    cpus: Optional[float],
    cpuset_cpus: Optional[str],
    publish: Optional[Iterable[int]],
    env: Optional[Union[Iterable[str], Mapping[str, str]]],
    ro_bind: Optional[Union[Iterable[str], Mapping[str, str]]],
    secret: Optional[Union[Iterable[str], Mapping[str, str]]],
    idle_timeout: Optional[Union[int, float, str]] = None,
    inject: Optional[Iterable[str]] = None,
    inject_methods: Optional[Iterable[str]] = None,
    upstream_ca: Optional[str] = None,
    image: Optional[str] = None,
    workdir: Optional[str] = None,
    image_workdir: Optional[bool] = None,
) -> Dict[str, Any]:
    """``sandbox_start``'s arguments; mappings are accepted where the protocol takes
    ``"K=V"`` / ``"NAME:ADDR"`` / ``"SRC:DST"`` strings."""

    def pairs(v: Any, sep: str) -> Optional[List[str]]:
        if v is None:
            return None
        if isinstance(v, Mapping):
            return [f"{k}{sep}{x}" for k, x in v.items()]
        if isinstance(v, str):
            return [v]
        return [str(x) for x in v]

    def strs(v: Any) -> Optional[List[str]]:
        if v is None:
            return None
        return [v] if isinstance(v, str) else [str(x) for x in v]

    return args(
        workspace=workspace,
        vm=vm,
        accept_emulation=accept_emulation,
        net=net,
        allow_host=strs(allow_host),
        deny_host=strs(deny_host),
        add_host=pairs(add_host, ":"),
        memory=memory,
        pids=pids,
        cpus=cpus,
        cpuset_cpus=cpuset_cpus,
        publish=None if publish is None else [int(p) for p in ([publish] if isinstance(publish, int) else publish)],
        env=pairs(env, "="),
        ro_bind=pairs(ro_bind, ":"),
        secret=pairs(secret, "="),
        idle_timeout=idle_timeout_arg(idle_timeout),
        inject=strs(inject),
        inject_methods=strs(inject_methods),
        upstream_ca=upstream_ca,
        image=image,
        workdir=workdir,
        image_workdir=image_workdir,
    )


def idle_timeout_arg(v: Optional[Union[int, float, str]]) -> Optional[str]:
    """``idle_timeout``: a duration string (``"30s"``, ``"5m"``) as is, seconds as
    ``"Ns"``."""
    if v is None or isinstance(v, str):
        return v
    if v <= 0:
        raise ValueError(f"idle_timeout {v!r}: a positive number of seconds")
    return f"{max(1, round(float(v)))}s"


Path = Union[str, bytes, "os.PathLike[str]"]


def files_args(workspace: str, path: Path, **kw: Any) -> Dict[str, Any]:
    """A ``files_*`` / ``watch`` request's arguments: a ``bytes`` path that is not UTF-8
    goes as ``path_hex`` (its exact bytes), as listings report such names."""
    p = os.fspath(path)
    if isinstance(p, bytes):
        try:
            return args(workspace=workspace, path=p.decode("utf-8"), **kw)
        except UnicodeDecodeError:
            return args(workspace=workspace, path_hex=p.hex(), **kw)
    return args(workspace=workspace, path=p, **kw)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(s: Optional[str]) -> bytes:
    return base64.b64decode(s or "")


def read_ranges(offset: int, length: Optional[int], chunk: int) -> Iterator[Tuple[int, int]]:
    """``(offset, length)`` of the reads that cover ``length`` bytes from ``offset``
    (all of the file with ``None``: until a read comes back short)."""
    chunk = max(1, min(int(chunk), MAX_IO_BYTES))
    pos = int(offset)
    left = length
    while left is None or left > 0:
        n = chunk if left is None else min(chunk, left)
        yield pos, n
        pos += n
        if left is not None:
            left -= n


def write_chunks(data: Any, size: int = MAX_IO_BYTES) -> Iterator[bytes]:
    """``data`` (bytes, str, a binary file, or an iterable of bytes) in pieces of at most
    ``size`` (at most :data:`MAX_IO_BYTES`); at least one piece (empty for empty data)."""
    size = max(1, min(int(size), MAX_IO_BYTES))
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        mv = memoryview(data).cast("B")
        if len(mv) == 0:
            yield b""
        for i in range(0, len(mv), size):
            yield bytes(mv[i : i + size])
        return
    if hasattr(data, "read"):
        first = True
        while True:
            piece = data.read(size)
            if isinstance(piece, str):
                piece = piece.encode("utf-8")
            if not piece:
                if first:
                    yield b""
                return
            first = False
            yield from write_chunks(bytes(piece), size)
        return
    first = True
    for piece in data:
        for p in write_chunks(piece, size):
            if p or first:
                yield p
                first = False
    if first:
        yield b""


def argv_of(cmd: Argv) -> List[str]:
    """A string is run by ``sh -c``; a sequence is the argv itself."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    argv = [str(a) for a in cmd]
    if not argv:
        raise ValueError("no command given")
    return argv


def keeper_exec(
    argv: List[str],
    env: Optional[Mapping[str, str]],
    workdir: Optional[str],
    tty: Optional[Tuple[int, int]],
) -> bytes:
    """The keeper's exec message (sandbox-helper/src/keeper.rs)."""
    if workdir is not None and not workdir.startswith("/"):
        workdir = "/workspace/" + workdir
    req = {
        "op": "exec",
        "request": {
            "argv": argv,
            "env": [[str(k), str(v)] for k, v in (env or {}).items()],
            "workdir": workdir,
            "tty": list(tty) if tty else None,
        },
    }
    return json.dumps(req).encode("utf-8")


def pty_size(pty: Any) -> Optional[Tuple[int, int]]:
    if pty is None or pty is False:
        return None
    if pty is True:
        return (24, 80)
    rows, cols = pty
    return (int(rows), int(cols))

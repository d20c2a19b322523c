"""cowspace: a client of the cowspace daemon's control socket (docs/control-protocol.md).

Copy-on-write workspaces of stored snapshots, long-lived sandboxes around them, and
commands run inside, from Python (standard library only, Python >= 3.9)::

    import cowspace

    with cowspace.Client("/var/lib/cowspace") as c:
        c.import_("/src/app", ref="app/main")
        ws = c.create("app/main", name="w1")
        c.sandbox_start(ws["id"], publish=[3000], memory="1g")
        r = c.exec(ws["id"], "make test", on_stdout=print, timeout=600)
        c.commit(ws["id"], ref="app/main", message="tests pass")
        c.remove(ws["id"])

:class:`AsyncClient` is the same for asyncio. Errors are the
:class:`~cowspace.errors.CowspaceError` subclass of the answered kind.
"""

from ._aexec import AsyncCommand
from ._exec import DEVNULL, PIPE, STDOUT, Command
from ._watch import AsyncWatch, Watch
from ._wire import MAX_IO_BYTES, PROTOCOL_VERSION, default_root
from .aio import AsyncClient, AsyncFiles
from .client import Client, Files
from .errors import (
    Busy,
    CommandFailed,
    Conflict,
    Corrupt,
    CowspaceError,
    ExecTimeout,
    Exists,
    IncompatibleDaemon,
    InvalidInput,
    IoError,
    NotFound,
    Unsupported,
)
from .records import ExecResult, FileInfo, ForkResult, Output, WatchEvent

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncCommand",
    "AsyncFiles",
    "AsyncWatch",
    "Busy",
    "Client",
    "Command",
    "CommandFailed",
    "Conflict",
    "Corrupt",
    "CowspaceError",
    "DEVNULL",
    "ExecResult",
    "ExecTimeout",
    "Exists",
    "FileInfo",
    "Files",
    "ForkResult",
    "IncompatibleDaemon",
    "InvalidInput",
    "IoError",
    "MAX_IO_BYTES",
    "NotFound",
    "Output",
    "PIPE",
    "PROTOCOL_VERSION",
    "STDOUT",
    "Unsupported",
    "Watch",
    "WatchEvent",
    "default_root",
]

"""Errors: one class per kind of the control protocol (docs/control-protocol.md).

Every error the daemon (or a sandbox's keeper) answers is raised as the subclass of
:class:`CowspaceError` for its ``kind``, carrying ``kind``, ``message`` and ``hint``
(``None`` when the daemon gave none) and the command line's ``exit_code`` for it.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "CowspaceError",
    "IoError",
    "NotFound",
    "Exists",
    "Busy",
    "Conflict",
    "Unsupported",
    "Corrupt",
    "InvalidInput",
    "IncompatibleDaemon",
    "ExecTimeout",
    "CommandFailed",
    "error_from",
]


class CowspaceError(Exception):
    """An error answered by the daemon or a sandbox's keeper."""

    kind: str = "io"
    exit_code: int = 1

    def __init__(self, message: str, hint: Optional[str] = None, kind: Optional[str] = None):
        if kind is not None:
            self.kind = kind
        super().__init__(f"{self.kind}: {message}" + (f" (hint: {hint})" if hint else ""))
        self.message = message
        self.hint = hint


class IoError(CowspaceError):
    """``io`` (exit code 1): a failure of the system, named with its cause."""

    kind = "io"
    exit_code = 1


class NotFound(CowspaceError):
    """``not_found`` (3): no such workspace, snapshot, ref or sandbox."""

    kind = "not_found"
    exit_code = 3


class Exists(CowspaceError):
    """``exists`` (4): it exists already (a sandbox running, a port published)."""

    kind = "exists"
    exit_code = 4


class Busy(CowspaceError):
    """``busy`` (5): in use (a workspace with a sandbox, a daemon serving workspaces)."""

    kind = "busy"
    exit_code = 5


class Conflict(CowspaceError):
    """``conflict`` (6): a compare-and-swap lost, or a state that does not allow it."""

    kind = "conflict"
    exit_code = 6


class Unsupported(CowspaceError):
    """``unsupported`` (7): the host cannot do what was asked (nothing was done)."""

    kind = "unsupported"
    exit_code = 7


class Corrupt(CowspaceError):
    """``corrupt`` (8): stored data failed its check."""

    kind = "corrupt"
    exit_code = 8


class InvalidInput(CowspaceError):
    """``invalid_input`` (9): a bad or unknown argument (the message names it)."""

    kind = "invalid_input"
    exit_code = 9


class IncompatibleDaemon(Unsupported):
    """The daemon speaks a protocol version this client does not (both are named)."""

    def __init__(self, client: int, daemon: Any, version: Any, path: str):
        super().__init__(
            f"the daemon at {path} speaks control protocol {daemon} (cowspace {version}); "
            f"this client speaks protocol {client}",
            "install the client released with that daemon, or upgrade the daemon",
        )
        self.client_protocol = client
        self.daemon_protocol = daemon
        self.daemon_version = version


class ExecTimeout(TimeoutError):
    """A command ran past its timeout; ``result`` holds what it wrote until then (and,
    when :meth:`~cowspace.Client.exec` killed it, its exit status)."""

    def __init__(self, timeout: float, result: Any):
        super().__init__(f"the command did not end within {timeout} s")
        self.timeout = timeout
        self.result = result


class CommandFailed(Exception):
    """``check=True`` and the command exited with a status other than 0."""

    def __init__(self, result: Any):
        super().__init__(
            f"the command exited with status {result.exit_code}"
            + (f": {result.stderr.strip()[-500:]}" if result.stderr.strip() else "")
        )
        self.result = result


_BY_KIND: Dict[str, Type[CowspaceError]] = {
    c.kind: c for c in (IoError, NotFound, Exists, Busy, Conflict, Unsupported, Corrupt, InvalidInput)
}


def error_from(body: Optional[Mapping[str, Any]]) -> CowspaceError:
    """The exception for an answered ``{"kind", "message", "hint"}`` (an unknown kind is
    kept, raised as :class:`CowspaceError`)."""
    body = body or {}
    kind = str(body.get("kind") or "io")
    cls = _BY_KIND.get(kind)
    message = str(body.get("message") or "")
    hint = body.get("hint")
    if cls is None:
        return CowspaceError(message, hint, kind=kind)
    return cls(message, hint)

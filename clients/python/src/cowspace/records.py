"""The records the daemon answers, as ``TypedDict`` s (docs/control-protocol.md).

They are the JSON objects as answered (plain ``dict`` s at run time), typed for editors
and checkers; keys the daemon adds later are kept. ``total=False``: an older or newer
daemon may leave a key out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

try:  # Python >= 3.8
    from typing import TypedDict
except ImportError:  # pragma: no cover
    from typing_extensions import TypedDict  # type: ignore

__all__ = [
    "Ping",
    "Workspace",
    "Created",
    "Removed",
    "Change",
    "Diff",
    "ImportReport",
    "CommitReport",
    "ProgressEvent",
    "SnapshotInfo",
    "RefSet",
    "SandboxStatus",
    "SandboxList",
    "EgressPolicy",
    "PolicyResult",
    "PortResult",
    "Decision",
    "SandboxLog",
    "Stopped",
    "FileInfo",
    "WatchEvent",
    "ForkResult",
    "Paused",
    "Resumed",
    "ExecResult",
    "Output",
]


class Ping(TypedDict, total=False):
    pong: bool
    version: str
    program: Optional[str]
    protocol: int


class Workspace(TypedDict, total=False):
    """A workspace record."""

    id: str
    name: Optional[str]
    worker: Optional[str]
    snapshot: str
    materializer: str
    lower_kind: str
    lower: str
    path: str
    private_dir: str
    status: str
    created_at: int
    updated_at: int
    stopped_at: Optional[int]
    policies: Dict[str, Any]
    diagnostics: List[str]
    ports: Dict[str, int]
    commits: List[str]
    create_ms: float
    disk: Dict[str, int]


class Created(Workspace, total=False):
    """``create``'s answer: the record plus the create's time."""

    elapsed_ms: float


class Removed(Workspace, total=False):
    """``remove``'s answer: the final record (``status: "removed"``)."""

    removed: bool
    elapsed_ms: float


class Change(TypedDict, total=False):
    path: str
    change: str  # added, modified, deleted, type_changed
    old_kind: str
    new_kind: str
    path_hex: str


class Diff(TypedDict, total=False):
    workspace: str
    changes: List[Change]
    patch: Optional[str]


class ImportReport(TypedDict, total=False):
    snapshot: str
    root: str
    files: int
    bytes: int
    files_read: int
    new_bytes_stored: int
    parents: List[str]
    elapsed_ms: float
    notes: List[str]


class CommitReport(ImportReport, total=False):
    unchanged: bool
    pinned_by: str
    retention: Dict[str, Any]


class ProgressEvent(TypedDict, total=False):
    event: str  # "progress"
    files_done: int
    files_total: int
    bytes_done: int


class SnapshotInfo(TypedDict, total=False):
    snapshot: str
    created_at: int
    message: Optional[str]
    parents: List[str]
    source: Any
    files: int
    bytes: int
    refs: List[str]


class RefSet(TypedDict, total=False):
    ref: str
    snapshot: str
    deleted: bool


class SandboxStatus(TypedDict, total=False):
    """A sandbox's status (``sandbox_start`` answers the static part; ``sandbox_status``
    adds the live one)."""

    name: str
    provider: str
    isolation: Any
    keeper_pid: int
    init_pid: int
    host_uid_base: int
    ports: Dict[str, int]
    net: str
    limits: Dict[str, Any]
    cgroups: List[str]
    started_at: int
    host_mount: str
    workspace: str
    path: str
    state: str
    processes: int
    memory_bytes: Optional[int]
    oom_kills: Optional[int]
    execs_running: int
    paused_at: Optional[int]
    paused_by: Optional[str]
    idle_timeout_ms: Optional[int]
    uptime_s: float
    egress: Dict[str, Any]


class SandboxList(TypedDict, total=False):
    sandboxes: List[SandboxStatus]


class EgressPolicy(TypedDict, total=False):
    allow: List[str]
    deny: List[str]
    add_hosts: List[str]


class PolicyResult(TypedDict, total=False):
    policy: EgressPolicy
    allows_nothing: bool
    workspace: str


class PortResult(TypedDict, total=False):
    port: int
    host_port: int
    unpublished: bool
    workspace: str


class Decision(TypedDict, total=False):
    time: Any
    host: str
    port: int
    via: str
    verdict: str
    rule: Optional[str]


class SandboxLog(TypedDict, total=False):
    decisions: List[Decision]


class Stopped(TypedDict, total=False):
    """``sandbox_stop``'s answer; ``host_processes``: host processes that entered the
    workspace while the sandbox ran and still use its mount (``pid``, ``command``)."""

    stopped: bool
    was_running: bool
    oom_kills: int
    host_processes: List[Dict[str, Any]]
    workspace: str


class FileInfo(TypedDict, total=False):
    """An entry of a workspace's tree (``files_stat``, ``files_list``, ...): ``path``
    relative to the workspace's root (``path_hex``: its exact bytes when not UTF-8),
    ``kind`` (``file``, ``dir``, ``symlink``, ``fifo``, ``socket``, ``char_device``,
    ``block_device``), ``uid`` / ``gid`` as seen inside the sandbox when one runs."""

    path: str
    path_hex: str
    kind: str
    size: int
    mode: int
    mtime: int
    uid: int
    gid: int
    target: str


class WatchEvent(TypedDict, total=False):
    """A change seen by ``watch``: ``event`` is ``created``, ``modified``, ``removed``,
    ``renamed`` (with ``from``) or ``rescan`` (events were lost: look again)."""

    event: str
    path: str
    # "from" (a rename's old path) is a keyword: read it as ev["from"] / ev.get("from").


class ForkResult(TypedDict, total=False):
    """``fork``'s answer: the new workspaces (each record with ``parent``)."""

    parent: str
    forks: List[Workspace]
    frozen_ms: float
    elapsed_ms: float


class Paused(TypedDict, total=False):
    paused: bool
    paused_at: int
    paused_by: str
    elapsed_ms: float
    workspace: str


class Resumed(TypedDict, total=False):
    resumed: bool
    paused_ms: float
    paused_by: str
    elapsed_ms: float
    workspace: str


@dataclass
class Output:
    """A piece of a command's output as it arrived: ``stream`` is ``"stdout"`` or
    ``"stderr"`` (a pseudo-terminal's output is ``"stdout"``)."""

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass
class ExecResult:
    """How a command ended: ``exit_code`` is its status (128 + N when killed by signal N;
    127: no such command, 126: not executable, with ``error`` saying so), with what it
    wrote on the streams this client captured."""

    exit_code: int
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    pid: Optional[int] = None
    error: Optional[str] = None
    elapsed_ms: float = 0.0
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

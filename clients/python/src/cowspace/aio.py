"""The asyncio client of the control socket: the same operations as
:class:`cowspace.Client`, as coroutines.

::

    async with await AsyncClient.connect(root) as c:
        ws = await c.create("app/main", name="w1")
        ...
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

from . import _aexec, _wire
from ._aexec import AsyncCommand
from ._watch import AsyncWatch
from ._exec import Stdio
from .errors import CommandFailed, ExecTimeout, IoError
from .records import (
    CommitReport,
    Created,
    Diff,
    FileInfo,
    ForkResult,
    ImportReport,
    Paused,
    Ping,
    PolicyResult,
    PortResult,
    ProgressEvent,
    RefSet,
    Removed,
    Resumed,
    SandboxList,
    SandboxLog,
    SandboxStatus,
    SnapshotInfo,
    Stopped,
    Workspace,
)

__all__ = ["AsyncClient", "AsyncFiles"]

Pairs = Union[Iterable[str], Mapping[str, str]]


class AsyncClient:
    """One connection to the daemon, for asyncio: made by :meth:`connect` (same
    arguments as :class:`cowspace.Client`). Requests on one client are sent one at a
    time, in order."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.path = path
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self.daemon: Optional[Ping] = None

    @classmethod
    async def connect(
        cls,
        root: Optional[str] = None,
        *,
        socket: Optional[str] = None,
        check_version: bool = True,
    ) -> "AsyncClient":
        path = _wire.socket_path(root, socket)
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=_wire.MAX_LINE_BYTES)
        except OSError as e:
            raise IoError(
                f"cannot connect to the daemon's socket {path}: {e.strerror or e}",
                "start the daemon (`mountctl daemon start`), or name the runtime root",
            ) from e
        c = cls(path, reader, writer)
        if check_version:
            try:
                c.daemon = await c.ping()
                _wire.check_version(c.daemon, path)
            except BaseException:
                await c.close()
                raise
        return c

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def request(
        self,
        op: str,
        args: Optional[Mapping[str, Any]] = None,
        on_event: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ) -> Any:
        """Sends one request and gives its result; event lines before the answer go to
        ``on_event`` (a function or a coroutine function)."""
        async with self._lock:
            self._writer.write(_wire.encode(op, args))
            await self._writer.drain()
            while True:
                resp = _wire.decode(await self._reader.readline())
                if "event" not in resp:
                    break
                if on_event is not None:
                    r = on_event(resp)
                    if asyncio.iscoroutine(r):
                        await r
        return _wire.result(resp)

    # -- the daemon ------------------------------------------------------------------

    async def ping(self) -> Ping:
        """``{"pong": true, "version", "program"[, "protocol"]}``."""
        return cast(Ping, await self.request("ping"))

    async def shutdown(self, force: Optional[bool] = None) -> Dict[str, Any]:
        """Stops the daemon (``busy`` while workspaces use it, unless ``force``)."""
        return cast(Dict[str, Any], await self.request("shutdown", _wire.args(force=force)))

    async def stats(self) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("stats"))

    async def gc(
        self,
        dry_run: Optional[bool] = None,
        grace_secs: Optional[int] = None,
        wait: Optional[bool] = None,
        blob_cache_max: Optional[int] = None,
    ) -> Dict[str, Any]:
        return cast(
            Dict[str, Any],
            await self.request(
                "gc", _wire.args(dry_run=dry_run, grace_secs=grace_secs, wait=wait, blob_cache_max=blob_cache_max)
            ),
        )

    async def sweep(self) -> Dict[str, List[str]]:
        return cast(Dict[str, List[str]], await self.request("sweep"))

    # -- snapshots and refs ----------------------------------------------------------

    async def import_(
        self,
        source: str,
        *,
        git: Optional[str] = None,
        ref: Optional[str] = None,
        message: Optional[str] = None,
        excludes: Optional[Sequence[str]] = None,
        no_default_excludes: Optional[bool] = None,
        allow_devices: Optional[bool] = None,
        allow_external_symlinks: Optional[bool] = None,
        zstd_level: Optional[int] = None,
        threads: Optional[int] = None,
        no_git_fsmonitor: Optional[bool] = None,
        on_progress: Optional[Callable[[ProgressEvent], Any]] = None,
    ) -> ImportReport:
        """Imports the directory, tar archive or (with ``git``, a revision) git
        repository at the absolute path ``source``. ``on_progress`` gets the progress
        events (at most one per 100 ms, the last one always)."""
        a = _wire.args(
            source=source,
            git=git,
            ref_=ref,
            message=message,
            excludes=excludes,
            no_default_excludes=no_default_excludes,
            allow_devices=allow_devices,
            allow_external_symlinks=allow_external_symlinks,
            zstd_level=zstd_level,
            threads=threads,
            no_git_fsmonitor=no_git_fsmonitor,
            progress=True if on_progress is not None else None,
        )
        return cast(ImportReport, await self.request("import", a, on_event=cast(Any, on_progress)))

    async def snapshots(self) -> List[SnapshotInfo]:
        """Every snapshot, newest first."""
        return cast(List[SnapshotInfo], await self.request("snapshots"))

    async def refs(self) -> Dict[str, str]:
        """``{name: snapshot}``."""
        return cast(Dict[str, str], await self.request("refs"))

    async def ref_set(
        self, name: str, snapshot: str, *, expect: Optional[str] = None, force: Optional[bool] = None
    ) -> RefSet:
        """Moves ``name`` to ``snapshot`` by compare-and-swap (``expect``: what it must
        hold; none: it must not exist; ``force``: whatever it holds)."""
        return cast(RefSet, await self.request("ref_set", _wire.args(name=name, snapshot=snapshot, expect=expect, force=force)))

    async def ref_delete(self, name: str, expect: str) -> RefSet:
        return cast(RefSet, await self.request("ref_delete", _wire.args(name=name, expect=expect)))

    async def show(self, snapshot: str, path: Optional[str] = None) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("show", _wire.args(snapshot=snapshot, path=path)))

    async def export(self, snapshot: str, dest: str, *, tar: Optional[bool] = None) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("export", _wire.args(snapshot=snapshot, dest=dest, tar=tar)))

    async def prepare_native(self, snapshot: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("prepare_native", _wire.args(snapshot=snapshot)))

    # -- remotes ---------------------------------------------------------------------

    async def remotes(self) -> Any:
        return await self.request("remotes")

    async def push(self, snapshot: str, remote: Optional[str] = None, *, force: Optional[bool] = None) -> Any:
        return await self.request("push", _wire.args(snapshot=snapshot, remote=remote, force=force))

    async def pull(self, snapshot: str, remote: Optional[str] = None) -> Any:
        return await self.request("pull", _wire.args(snapshot=snapshot, remote=remote))

    async def fetch(self, remote: Optional[str] = None) -> Any:
        return await self.request("fetch", _wire.args(remote=remote))

    async def remote_gc(
        self, remote: Optional[str] = None, *, dry_run: Optional[bool] = None, grace: Optional[int] = None
    ) -> Any:
        return await self.request("remote_gc", _wire.args(remote=remote, dry_run=dry_run, grace=grace))

    # -- workspaces ------------------------------------------------------------------

    async def create(
        self,
        snapshot: str,
        *,
        name: Optional[str] = None,
        materializer: Optional[str] = None,
        lower: Optional[str] = None,
        path: Optional[str] = None,
        worker: Optional[str] = None,
        disk: Optional[Union[str, int]] = None,
    ) -> Created:
        """A new workspace of ``snapshot`` (id, unique prefix or ref); ``disk``: a quota
        on what it writes (``"20g"`` or bytes), refused where it cannot be enforced."""
        a = _wire.args(snapshot=snapshot, name=name, materializer=materializer, lower=lower, path=path, worker=worker, disk=disk)
        return cast(Created, await self.request("create", a))

    async def list(self, all: Optional[bool] = None) -> List[Workspace]:
        """Live workspaces (``all``: also removed and failed ones)."""
        return cast(List[Workspace], await self.request("list", _wire.args(all=all)))

    async def status(self, workspace: str) -> Workspace:
        return cast(Workspace, await self.request("status", _wire.args(workspace=workspace)))

    async def diff(
        self, workspace: str, *, patch: Optional[bool] = None, include_excluded: Optional[bool] = None
    ) -> Diff:
        a = _wire.args(workspace=workspace, patch=patch, include_excluded=include_excluded)
        return cast(Diff, await self.request("diff", a))

    async def commit(
        self,
        workspace: str,
        *,
        ref: Optional[str] = None,
        expect: Optional[str] = None,
        message: Optional[str] = None,
        allow_empty: Optional[bool] = None,
        include_excluded: Optional[bool] = None,
    ) -> CommitReport:
        """Captures the workspace as a snapshot whose parent is its base (``ref``:
        moved to it by compare-and-swap)."""
        a = _wire.args(
            workspace=workspace,
            ref_=ref,
            expect=expect,
            message=message,
            allow_empty=allow_empty,
            include_excluded=include_excluded,
        )
        return cast(CommitReport, await self.request("commit", a))

    async def remove(self, workspace: str, *, force: Optional[bool] = None) -> Removed:
        """See :meth:`cowspace.Client.remove` (``busy`` with changes, unless ``force``)."""
        return cast(Removed, await self.request("remove", _wire.args(workspace=workspace, force=force)))

    async def fork(
        self,
        workspace: str,
        *,
        name: Optional[str] = None,
        count: Optional[int] = None,
        sandbox: Optional[bool] = None,
    ) -> ForkResult:
        """See :meth:`cowspace.Client.fork`."""
        a = _wire.args(workspace=workspace, name=name, count=count, sandbox=sandbox)
        return cast(ForkResult, await self.request("fork", a))

    async def recover(self, workspace: str) -> Workspace:
        return cast(Workspace, await self.request("recover", _wire.args(workspace=workspace)))

    async def mount_workspace(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("mount_workspace", _wire.args(workspace=workspace)))

    async def unmount_workspace(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("unmount_workspace", _wire.args(workspace=workspace)))

    async def finish_copies(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("finish_copies", _wire.args(workspace=workspace)))

    # -- sandboxes -------------------------------------------------------------------

    async def sandbox_start(
        self,
        workspace: str,
        *,
        net: Optional[str] = None,
        allow_host: Optional[Iterable[str]] = None,
        deny_host: Optional[Iterable[str]] = None,
        add_host: Optional[Pairs] = None,
        memory: Optional[Union[int, str]] = None,
        pids: Optional[int] = None,
        cpus: Optional[float] = None,
        cpuset_cpus: Optional[str] = None,
        publish: Optional[Iterable[int]] = None,
        env: Optional[Pairs] = None,
        ro_bind: Optional[Pairs] = None,
        secret: Optional[Pairs] = None,
        vm: Optional[bool] = None,
        accept_emulation: Optional[bool] = None,
        idle_timeout: Optional[Union[int, float, str]] = None,
        inject: Optional[Iterable[str]] = None,
        inject_methods: Optional[Iterable[str]] = None,
        upstream_ca: Optional[str] = None,
        image: Optional[str] = None,
        workdir: Optional[str] = None,
        image_workdir: Optional[bool] = None,
    ) -> SandboxStatus:
        """Starts the workspace's long-lived sandbox; gives its status once ready
        (``ports``: internal port -> host port on 127.0.0.1). ``net``: ``none``,
        ``loopback`` or ``egress``; mappings are accepted for ``env`` (K -> V),
        ``add_host`` (NAME -> ADDR), ``ro_bind`` (SRC -> DST) and ``secret`` (NAME ->
        FILE)."""
        a = _wire.sandbox_args(
            workspace,
            vm=vm,
            accept_emulation=accept_emulation,
            net=net,
            allow_host=allow_host,
            deny_host=deny_host,
            add_host=add_host,
            memory=memory,
            pids=pids,
            cpus=cpus,
            cpuset_cpus=cpuset_cpus,
            publish=publish,
            env=env,
            ro_bind=ro_bind,
            secret=secret,
            idle_timeout=idle_timeout,
            inject=inject,
            inject_methods=inject_methods,
            upstream_ca=upstream_ca,
            image=image,
            workdir=workdir,
            image_workdir=image_workdir,
        )
        return cast(SandboxStatus, await self.request("sandbox_start", a))

    async def sandbox_status(self, workspace: str) -> SandboxStatus:
        return cast(SandboxStatus, await self.request("sandbox_status", _wire.args(workspace=workspace)))

    async def sandbox_list(self) -> List[SandboxStatus]:
        return cast(SandboxList, await self.request("sandbox_list")).get("sandboxes", [])

    async def sandbox_stop(self, workspace: str) -> Stopped:
        return cast(Stopped, await self.request("sandbox_stop", _wire.args(workspace=workspace)))

    async def sandbox_policy(
        self,
        workspace: str,
        *,
        allow_host: Optional[Iterable[str]] = None,
        deny_host: Optional[Iterable[str]] = None,
        remove_host: Optional[Iterable[str]] = None,
        reset: Optional[bool] = None,
        inject: Optional[Iterable[str]] = None,
        remove_inject: Optional[Iterable[str]] = None,
    ) -> PolicyResult:
        """Changes a ``net="egress"`` sandbox's policy (reset, removals, allows, denies)."""
        a = _wire.args(
            workspace=workspace,
            allow_host=_list(allow_host),
            deny_host=_list(deny_host),
            remove_host=_list(remove_host),
            reset=reset,
            inject=_list(inject),
            remove_inject=_list(remove_inject),
        )
        return cast(PolicyResult, await self.request("sandbox_policy", a))

    async def sandbox_publish(self, workspace: str, port: int) -> PortResult:
        return cast(PortResult, await self.request("sandbox_publish", _wire.args(workspace=workspace, port=port)))

    async def sandbox_unpublish(self, workspace: str, port: int) -> PortResult:
        return cast(PortResult, await self.request("sandbox_unpublish", _wire.args(workspace=workspace, port=port)))

    async def sandbox_log(self, workspace: str, tail: Optional[int] = None) -> SandboxLog:
        return cast(SandboxLog, await self.request("sandbox_log", _wire.args(workspace=workspace, tail=tail)))

    async def sandbox_pause(self, workspace: str) -> Paused:
        """See :meth:`cowspace.Client.sandbox_pause`."""
        return cast(Paused, await self.request("sandbox_pause", _wire.args(workspace=workspace)))

    async def sandbox_resume(self, workspace: str) -> Resumed:
        return cast(Resumed, await self.request("sandbox_resume", _wire.args(workspace=workspace)))

    async def sandbox_suspend(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self.request("sandbox_suspend", _wire.args(workspace=workspace)))

    # -- files -----------------------------------------------------------------------

    def files(self, workspace: str) -> "AsyncFiles":
        """The workspace's files, E2B-like (``await c.files(ws).write("a.txt", b"...")``)."""
        return AsyncFiles(self, workspace)

    async def files_stat(self, workspace: str, path: _wire.Path) -> FileInfo:
        """See :meth:`cowspace.Client.files_stat`."""
        return cast(FileInfo, await self.request("files_stat", _wire.files_args(workspace, path)))

    async def files_list(
        self, workspace: str, path: _wire.Path = ".", *, recursive: Optional[bool] = None
    ) -> List[FileInfo]:
        r = await self.request("files_list", _wire.files_args(workspace, path, recursive=recursive))
        return cast(List[FileInfo], r.get("entries", []))

    async def files_read_chunks(
        self,
        workspace: str,
        path: _wire.Path,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        chunk_size: int = _wire.MAX_IO_BYTES,
    ) -> AsyncIterator[bytes]:
        """``async for`` over the file's bytes in pieces of ``chunk_size`` (at most 64
        MiB), one request each."""
        for off, n in _wire.read_ranges(offset, length, chunk_size):
            r = await self.request("files_read", _wire.files_args(workspace, path, offset=off, length=n))
            data = _wire.unb64(r.get("data"))
            if data:
                yield data
            if len(data) < n:
                return

    async def files_read(
        self, workspace: str, path: _wire.Path, *, offset: int = 0, length: Optional[int] = None
    ) -> bytes:
        return b"".join([p async for p in self.files_read_chunks(workspace, path, offset=offset, length=length)])

    async def files_write(
        self,
        workspace: str,
        path: _wire.Path,
        data: Any,
        *,
        mode: Optional[int] = None,
        append: Optional[bool] = None,
        chunk_size: int = _wire.MAX_IO_BYTES,
    ) -> FileInfo:
        """See :meth:`cowspace.Client.files_write` (a first write plus appends of 64 MiB
        for more)."""
        info: Optional[FileInfo] = None
        for i, piece in enumerate(_wire.write_chunks(data, chunk_size)):
            a = _wire.files_args(
                workspace, path, data=_wire.b64(piece), mode=mode, append=True if (append or i > 0) else None
            )
            info = cast(FileInfo, await self.request("files_write", a))
        assert info is not None
        return info

    async def files_mkdir(
        self, workspace: str, path: _wire.Path, *, parents: Optional[bool] = None, mode: Optional[int] = None
    ) -> FileInfo:
        a = _wire.files_args(workspace, path, parents=parents, mode=mode)
        return cast(FileInfo, await self.request("files_mkdir", a))

    async def files_remove(
        self, workspace: str, path: _wire.Path, *, recursive: Optional[bool] = None
    ) -> Dict[str, Any]:
        a = _wire.files_args(workspace, path, recursive=recursive)
        return cast(Dict[str, Any], await self.request("files_remove", a))

    async def files_rename(self, workspace: str, path: _wire.Path, to: str) -> FileInfo:
        return cast(FileInfo, await self.request("files_rename", _wire.files_args(workspace, path, to=to)))

    async def files_symlink(self, workspace: str, path: _wire.Path, target: str) -> FileInfo:
        return cast(FileInfo, await self.request("files_symlink", _wire.files_args(workspace, path, to=target)))

    async def watch(self, workspace: str, path: _wire.Path = ".") -> AsyncWatch:
        """Watches the tree below ``path`` on a connection of its own: an
        :class:`~cowspace.AsyncWatch` (``async for``, ``await get(timeout)``; close it
        when done). The watch is in place when this returns."""
        return await AsyncWatch.open(self.path, _wire.files_args(workspace, path))

    # -- exec ------------------------------------------------------------------------

    async def keeper_socket(self, workspace: str) -> str:
        """The ``exec`` operation: the keeper socket of the running sandbox."""
        return str((await self.request("exec", _wire.args(workspace=workspace)))["socket"])

    async def spawn(
        self,
        workspace: str,
        cmd: _wire.Argv,
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        stdin: Any = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
        pty: Union[None, bool, Tuple[int, int]] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
    ) -> AsyncCommand:
        """Starts ``cmd`` and gives the running :class:`~cowspace.AsyncCommand`."""
        keeper = await self.keeper_socket(workspace)
        return await _aexec.start(
            keeper,
            _wire.argv_of(cmd),
            env=dict(env) if env else None,
            workdir=workdir,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pty=_wire.pty_size(pty),
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )

    async def exec(
        self,
        workspace: str,
        cmd: _wire.Argv,
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        stdin: Any = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
        pty: Union[None, bool, Tuple[int, int]] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        timeout: Optional[float] = None,
        background: bool = False,
        check: bool = False,
    ) -> Any:
        """As :meth:`cowspace.Client.exec`: an :class:`~cowspace.records.ExecResult`,
        or with ``background`` the running :class:`~cowspace.AsyncCommand`."""
        c = await self.spawn(
            workspace,
            cmd,
            env=env,
            workdir=workdir,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pty=pty,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )
        if background:
            return c
        async with c:
            try:
                res = await c.wait(timeout)
            except ExecTimeout:
                c.kill()
                raise ExecTimeout(timeout or 0.0, await c.wait()) from None
        if check and res.exit_code != 0:
            raise CommandFailed(res)
        return res


class AsyncFiles:
    """:class:`cowspace.client.Files` for asyncio (``AsyncClient.files(ws)``)."""

    def __init__(self, client: AsyncClient, workspace: str) -> None:
        self.client = client
        self.workspace = workspace

    async def read(self, path: _wire.Path, format: str = "text") -> Any:
        data = await self.client.files_read(self.workspace, path)
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def read_chunks(self, path: _wire.Path, chunk_size: int = _wire.MAX_IO_BYTES) -> AsyncIterator[bytes]:
        return self.client.files_read_chunks(self.workspace, path, chunk_size=chunk_size)

    async def write(self, path: _wire.Path, data: Any, *, mode: Optional[int] = None) -> FileInfo:
        return await self.client.files_write(self.workspace, path, data, mode=mode)

    async def append(self, path: _wire.Path, data: Any) -> FileInfo:
        return await self.client.files_write(self.workspace, path, data, append=True)

    async def list(self, path: _wire.Path = ".", *, recursive: bool = False) -> List[FileInfo]:
        return await self.client.files_list(self.workspace, path, recursive=recursive or None)

    async def get_info(self, path: _wire.Path) -> FileInfo:
        return await self.client.files_stat(self.workspace, path)

    stat = get_info

    async def exists(self, path: _wire.Path) -> bool:
        from .errors import NotFound

        try:
            await self.client.files_stat(self.workspace, path)
            return True
        except NotFound:
            return False

    async def make_dir(self, path: _wire.Path, *, mode: Optional[int] = None) -> FileInfo:
        return await self.client.files_mkdir(self.workspace, path, parents=True, mode=mode)

    async def remove(self, path: _wire.Path) -> None:
        await self.client.files_remove(self.workspace, path, recursive=True)

    async def rename(self, old_path: _wire.Path, new_path: str) -> FileInfo:
        return await self.client.files_rename(self.workspace, old_path, new_path)

    async def symlink(self, path: _wire.Path, target: str) -> FileInfo:
        return await self.client.files_symlink(self.workspace, path, target)

    async def watch_dir(self, path: _wire.Path = ".") -> AsyncWatch:
        return await self.client.watch(self.workspace, path)


def _list(v: Optional[Iterable[str]]) -> Optional[List[str]]:
    if v is None:
        return None
    return [v] if isinstance(v, str) else list(v)


_ = (Sequence, ProgressEvent)

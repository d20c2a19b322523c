"""The synchronous client of the control socket."""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, cast

from . import _exec, _wire
from ._exec import Command, Stdio
from ._watch import Watch
from .errors import CommandFailed, ExecTimeout, IoError
from .records import (
    CommitReport,
    Created,
    Diff,
    ExecResult,
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

__all__ = ["Client", "Files"]

Pairs = Union[Iterable[str], Mapping[str, str]]


class Client:
    """One connection to the daemon of a runtime root (``root``; default
    ``$COWSPACE_ROOT``, else ``/var/lib/cowspace`` for root, else
    ``$XDG_DATA_HOME/cowspace``), or to the socket at ``socket``. Requests are answered
    in order; a client may be shared by threads (one request at a time). ``timeout``
    bounds each socket read (seconds; ``None``: no bound). Unless ``check_version`` is
    false, the daemon is pinged first and refused when it speaks another protocol
    (:class:`~cowspace.errors.IncompatibleDaemon`).

    Every method raises the :class:`~cowspace.errors.CowspaceError` subclass of the
    answered kind. Arguments left ``None`` take the daemon's default.
    """

    def __init__(
        self,
        root: Optional[str] = None,
        *,
        socket: Optional[str] = None,
        timeout: Optional[float] = None,
        check_version: bool = True,
    ) -> None:
        self.path = _wire.socket_path(root, socket)
        self._lock = threading.Lock()
        self._sock = _socket_connect(self.path, timeout)
        self._file = self._sock.makefile("rb")
        self.daemon: Optional[Ping] = None
        if check_version:
            try:
                self.daemon = self.ping()
                _wire.check_version(self.daemon, self.path)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the wire --------------------------------------------------------------------

    def request(
        self,
        op: str,
        args: Optional[Mapping[str, Any]] = None,
        on_event: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ) -> Any:
        """Sends one request (``args`` as given) and gives its result; event lines sent
        before the answer (an import's progress) go to ``on_event``."""
        with self._lock:
            self._sock.sendall(_wire.encode(op, args))
            while True:
                resp = _wire.decode(self._file.readline(_wire.MAX_LINE_BYTES))
                if "event" not in resp:
                    break
                if on_event is not None:
                    on_event(resp)
        return _wire.result(resp)

    # -- the daemon ------------------------------------------------------------------

    def ping(self) -> Ping:
        """``{"pong": true, "version", "program"[, "protocol"]}``."""
        return cast(Ping, self.request("ping"))

    def shutdown(self, force: Optional[bool] = None) -> Dict[str, Any]:
        """Stops the daemon (``busy`` while workspaces use it, unless ``force``)."""
        return cast(Dict[str, Any], self.request("shutdown", _wire.args(force=force)))

    def stats(self) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("stats"))

    def gc(
        self,
        dry_run: Optional[bool] = None,
        grace_secs: Optional[int] = None,
        wait: Optional[bool] = None,
        blob_cache_max: Optional[int] = None,
    ) -> Dict[str, Any]:
        return cast(
            Dict[str, Any],
            self.request(
                "gc", _wire.args(dry_run=dry_run, grace_secs=grace_secs, wait=wait, blob_cache_max=blob_cache_max)
            ),
        )

    def sweep(self) -> Dict[str, List[str]]:
        return cast(Dict[str, List[str]], self.request("sweep"))

    # -- snapshots and refs ----------------------------------------------------------

    def import_(
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
        return cast(ImportReport, self.request("import", a, on_event=cast(Any, on_progress)))

    def snapshots(self) -> List[SnapshotInfo]:
        """Every snapshot, newest first."""
        return cast(List[SnapshotInfo], self.request("snapshots"))

    def refs(self) -> Dict[str, str]:
        """``{name: snapshot}``."""
        return cast(Dict[str, str], self.request("refs"))

    def ref_set(
        self, name: str, snapshot: str, *, expect: Optional[str] = None, force: Optional[bool] = None
    ) -> RefSet:
        """Moves ``name`` to ``snapshot`` by compare-and-swap (``expect``: what it must
        hold; none: it must not exist; ``force``: whatever it holds)."""
        return cast(RefSet, self.request("ref_set", _wire.args(name=name, snapshot=snapshot, expect=expect, force=force)))

    def ref_delete(self, name: str, expect: str) -> RefSet:
        return cast(RefSet, self.request("ref_delete", _wire.args(name=name, expect=expect)))

    def show(self, snapshot: str, path: Optional[str] = None) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("show", _wire.args(snapshot=snapshot, path=path)))

    def export(self, snapshot: str, dest: str, *, tar: Optional[bool] = None) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("export", _wire.args(snapshot=snapshot, dest=dest, tar=tar)))

    def prepare_native(self, snapshot: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("prepare_native", _wire.args(snapshot=snapshot)))

    # -- remotes ---------------------------------------------------------------------

    def remotes(self) -> Any:
        return self.request("remotes")

    def push(self, snapshot: str, remote: Optional[str] = None, *, force: Optional[bool] = None) -> Any:
        return self.request("push", _wire.args(snapshot=snapshot, remote=remote, force=force))

    def pull(self, snapshot: str, remote: Optional[str] = None) -> Any:
        return self.request("pull", _wire.args(snapshot=snapshot, remote=remote))

    def fetch(self, remote: Optional[str] = None) -> Any:
        return self.request("fetch", _wire.args(remote=remote))

    def remote_gc(
        self, remote: Optional[str] = None, *, dry_run: Optional[bool] = None, grace: Optional[int] = None
    ) -> Any:
        return self.request("remote_gc", _wire.args(remote=remote, dry_run=dry_run, grace=grace))

    # -- workspaces ------------------------------------------------------------------

    def create(
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
        return cast(Created, self.request("create", a))

    def list(self, all: Optional[bool] = None) -> List[Workspace]:
        """Live workspaces (``all``: also removed and failed ones)."""
        return cast(List[Workspace], self.request("list", _wire.args(all=all)))

    def status(self, workspace: str) -> Workspace:
        return cast(Workspace, self.request("status", _wire.args(workspace=workspace)))

    def diff(
        self, workspace: str, *, patch: Optional[bool] = None, include_excluded: Optional[bool] = None
    ) -> Diff:
        a = _wire.args(workspace=workspace, patch=patch, include_excluded=include_excluded)
        return cast(Diff, self.request("diff", a))

    def commit(
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
        return cast(CommitReport, self.request("commit", a))

    def remove(self, workspace: str, *, force: Optional[bool] = None) -> Removed:
        """Removes the workspace; without ``force``, ``busy`` while a sandbox runs in it
        or while it has changes since its last commit (or its base)."""
        return cast(Removed, self.request("remove", _wire.args(workspace=workspace, force=force)))

    def fork(
        self,
        workspace: str,
        *,
        name: Optional[str] = None,
        count: Optional[int] = None,
        sandbox: Optional[bool] = None,
    ) -> ForkResult:
        """New workspaces holding what ``workspace`` shows now (its base and a copy of
        its changes): ``count`` of them (1 to 64; with a ``name``, NAME-1 ... NAME-N),
        each with a sandbox started with the parent's controls when ``sandbox``. A
        running sandbox of the parent is frozen for the copy (``frozen_ms``)."""
        a = _wire.args(workspace=workspace, name=name, count=count, sandbox=sandbox)
        return cast(ForkResult, self.request("fork", a))

    def recover(self, workspace: str) -> Workspace:
        return cast(Workspace, self.request("recover", _wire.args(workspace=workspace)))

    def mount_workspace(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("mount_workspace", _wire.args(workspace=workspace)))

    def unmount_workspace(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("unmount_workspace", _wire.args(workspace=workspace)))

    def finish_copies(self, workspace: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.request("finish_copies", _wire.args(workspace=workspace)))

    # -- sandboxes -------------------------------------------------------------------

    def sandbox_start(
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
        FILE). ``idle_timeout`` (``"30s"``, ``"5m"``, or seconds): paused after that
        long without an exec or published-port traffic, resumed by the next.
        ``inject`` (``"HOST=HEADER:@FILE"``, with ``net="egress"``): the egress proxy sets
        HEADER to FILE's contents on requests to HOST, read host-side; the value never
        enters the sandbox (``inject_methods``: ``"HOST=GET,HEAD"``; ``upstream_ca``: a
        PEM file of roots for upstream hosts). ``image`` (a ref or snapshot id of an
        image in the store): the sandbox's root filesystem. ``workdir``: the working
        directory of every exec (default ``/workspace``); ``image_workdir=True``: the
        image's ``WorkingDir`` instead."""
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
        return cast(SandboxStatus, self.request("sandbox_start", a))

    def sandbox_status(self, workspace: str) -> SandboxStatus:
        return cast(SandboxStatus, self.request("sandbox_status", _wire.args(workspace=workspace)))

    def sandbox_list(self) -> List[SandboxStatus]:
        return cast(SandboxList, self.request("sandbox_list")).get("sandboxes", [])

    def sandbox_stop(self, workspace: str) -> Stopped:
        return cast(Stopped, self.request("sandbox_stop", _wire.args(workspace=workspace)))

    def sandbox_policy(
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
        return cast(PolicyResult, self.request("sandbox_policy", a))

    def sandbox_publish(self, workspace: str, port: int) -> PortResult:
        return cast(PortResult, self.request("sandbox_publish", _wire.args(workspace=workspace, port=port)))

    def sandbox_unpublish(self, workspace: str, port: int) -> PortResult:
        return cast(PortResult, self.request("sandbox_unpublish", _wire.args(workspace=workspace, port=port)))

    def sandbox_log(self, workspace: str, tail: Optional[int] = None) -> SandboxLog:
        return cast(SandboxLog, self.request("sandbox_log", _wire.args(workspace=workspace, tail=tail)))

    def sandbox_pause(self, workspace: str) -> Paused:
        """Stops every process of the sandbox, its memory kept (cgroup freezer); until
        :meth:`sandbox_resume`, ``exec`` is refused as ``busy``. ``invalid_input`` when
        paused already; ``unsupported`` without a cgroup freezer."""
        return cast(Paused, self.request("sandbox_pause", _wire.args(workspace=workspace)))

    def sandbox_resume(self, workspace: str) -> Resumed:
        """Lets a paused sandbox run again (``invalid_input`` when it is not paused)."""
        return cast(Resumed, self.request("sandbox_resume", _wire.args(workspace=workspace)))

    def sandbox_suspend(self, workspace: str) -> Dict[str, Any]:
        """Suspends the sandbox to disk (``unsupported`` where the host cannot, with the
        reason)."""
        return cast(Dict[str, Any], self.request("sandbox_suspend", _wire.args(workspace=workspace)))

    # -- files -----------------------------------------------------------------------

    def files(self, workspace: str) -> "Files":
        """The workspace's files, E2B-like (``c.files(ws).write("a.txt", b"...")``)."""
        return Files(self, workspace)

    def files_stat(self, workspace: str, path: _wire.Path) -> FileInfo:
        """The entry at ``path`` (inside the workspace; ``not_found`` when missing). Paths
        are resolved within the workspace (a link as it would resolve inside the
        sandbox; ``..`` above the root is ``invalid_input``); while a sandbox runs, as
        its root. A ``bytes`` path that is not UTF-8 is sent by its exact bytes."""
        return cast(FileInfo, self.request("files_stat", _wire.files_args(workspace, path)))

    def files_list(
        self, workspace: str, path: _wire.Path = ".", *, recursive: Optional[bool] = None
    ) -> List[FileInfo]:
        """The entries of the directory ``path`` (``recursive``: every entry below, links
        not followed), paths relative to the workspace's root."""
        r = self.request("files_list", _wire.files_args(workspace, path, recursive=recursive))
        return cast(List[FileInfo], r.get("entries", []))

    def files_read_chunks(
        self,
        workspace: str,
        path: _wire.Path,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        chunk_size: int = _wire.MAX_IO_BYTES,
    ) -> Iterator[bytes]:
        """The file's bytes from ``offset`` (``length`` of them at most; all by default)
        as pieces of ``chunk_size`` (at most 64 MiB), one request each."""
        for off, n in _wire.read_ranges(offset, length, chunk_size):
            r = self.request("files_read", _wire.files_args(workspace, path, offset=off, length=n))
            data = _wire.unb64(r.get("data"))
            if data:
                yield data
            if len(data) < n:
                return

    def files_read(
        self, workspace: str, path: _wire.Path, *, offset: int = 0, length: Optional[int] = None
    ) -> bytes:
        """The file's bytes from ``offset`` (``length`` at most; all by default), read in
        ranges of 64 MiB."""
        return b"".join(self.files_read_chunks(workspace, path, offset=offset, length=length))

    def files_write(
        self,
        workspace: str,
        path: _wire.Path,
        data: Any,
        *,
        mode: Optional[int] = None,
        append: Optional[bool] = None,
        chunk_size: int = _wire.MAX_IO_BYTES,
    ) -> FileInfo:
        """Writes ``data`` (bytes, str as UTF-8, a binary file, or an iterable of bytes)
        to the file ``path`` (its parent must exist), replacing it (atomically: a
        temporary file renamed over it) or, with ``append``, adding to it; ``mode``:
        permission bits of a new file. More than 64 MiB goes as a first write plus
        appends of 64 MiB (a reader may see the file grow). Gives the final entry."""
        info: Optional[FileInfo] = None
        for i, piece in enumerate(_wire.write_chunks(data, chunk_size)):
            a = _wire.files_args(
                workspace, path, data=_wire.b64(piece), mode=mode, append=True if (append or i > 0) else None
            )
            info = cast(FileInfo, self.request("files_write", a))
        assert info is not None
        return info

    def files_mkdir(
        self, workspace: str, path: _wire.Path, *, parents: Optional[bool] = None, mode: Optional[int] = None
    ) -> FileInfo:
        """Makes the directory ``path`` (``parents``: missing parents too, no error when
        it exists)."""
        a = _wire.files_args(workspace, path, parents=parents, mode=mode)
        return cast(FileInfo, self.request("files_mkdir", a))

    def files_remove(self, workspace: str, path: _wire.Path, *, recursive: Optional[bool] = None) -> Dict[str, Any]:
        """Removes the file, link or empty directory ``path`` (``recursive``: a directory
        and everything below; links are removed, never followed)."""
        return cast(Dict[str, Any], self.request("files_remove", _wire.files_args(workspace, path, recursive=recursive)))

    def files_rename(self, workspace: str, path: _wire.Path, to: str) -> FileInfo:
        """Renames ``path`` to ``to`` (both inside the workspace); gives the new entry."""
        return cast(FileInfo, self.request("files_rename", _wire.files_args(workspace, path, to=to)))

    def files_symlink(self, workspace: str, path: _wire.Path, target: str) -> FileInfo:
        """Makes ``path`` a symbolic link to ``target`` (as given; resolved inside)."""
        return cast(FileInfo, self.request("files_symlink", _wire.files_args(workspace, path, to=target)))

    def watch(self, workspace: str, path: _wire.Path = ".") -> Watch:
        """Watches the tree below ``path`` on a connection of its own: a
        :class:`~cowspace.Watch` (iterate it, or ``get(timeout)``; close it when done)
        of ``created``, ``modified``, ``removed``, ``renamed`` (``from``) and
        ``rescan`` events, from the sandbox and the host alike. The watch is in place
        when this returns."""
        return Watch(self.path, _wire.files_args(workspace, path), self._sock.gettimeout())

    # -- exec ------------------------------------------------------------------------

    def keeper_socket(self, workspace: str) -> str:
        """The ``exec`` operation: the keeper socket of the running sandbox
        (``not_found`` when none runs)."""
        return str(self.request("exec", _wire.args(workspace=workspace))["socket"])

    def spawn(
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
    ) -> Command:
        """Starts ``cmd`` in the workspace's running sandbox and gives the running
        :class:`~cowspace.Command` (see :meth:`exec` for the arguments)."""
        keeper = self.keeper_socket(workspace)
        return _exec.start(
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

    def exec(
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
        """Runs ``cmd`` (an argv, or a string run by ``sh -c``) in the workspace's
        running sandbox (``not_found`` when none runs), working directory
        ``/workspace`` or ``workdir``, with ``env`` added.

        - ``stdin``: ``None`` (``/dev/null``), bytes or str (fed to it), ``PIPE``
          (:meth:`Command.write`), or a file / descriptor passed as is.
        - ``stdout``, ``stderr``: ``None`` (captured: streamed to ``on_stdout`` /
          ``on_stderr`` as text, kept in the result), ``DEVNULL``, ``STDOUT`` (stderr
          only), or a file / descriptor the command writes to directly.
        - ``pty``: ``True`` or ``(rows, cols)``: a pseudo-terminal of the sandbox
          instead (its output is ``stdout``; :meth:`Command.resize`).
        - ``timeout``: seconds; the command is killed when it runs longer and
          :class:`~cowspace.errors.ExecTimeout` is raised with what it wrote.
        - ``background``: give the running :class:`~cowspace.Command` at once
          (closing it kills the command; a process the command leaves in the
          background itself, ``sh -c 'server &'``, lives until the sandbox stops).
        - ``check``: raise :class:`~cowspace.errors.CommandFailed` on a status other
          than 0.

        Gives an :class:`~cowspace.records.ExecResult` (127: no such command).
        """
        c = self.spawn(
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
        with c:
            try:
                res = c.wait(timeout)
            except ExecTimeout:
                c.kill()
                raise ExecTimeout(timeout or 0.0, c.wait())
        if check and res.exit_code != 0:
            raise CommandFailed(res)
        return res


class Files:
    """A workspace's files, shaped as E2B's ``sandbox.files`` (``Client.files(ws)``);
    each method is the ``files_*`` one of the client."""

    def __init__(self, client: Client, workspace: str) -> None:
        self.client = client
        self.workspace = workspace

    def read(self, path: _wire.Path, format: str = "text") -> Any:
        """The file's contents: ``str`` (``format="text"``, UTF-8) or ``bytes``
        (``"bytes"``)."""
        data = self.client.files_read(self.workspace, path)
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def read_chunks(self, path: _wire.Path, chunk_size: int = _wire.MAX_IO_BYTES) -> Iterator[bytes]:
        return self.client.files_read_chunks(self.workspace, path, chunk_size=chunk_size)

    def write(self, path: _wire.Path, data: Any, *, mode: Optional[int] = None) -> FileInfo:
        return self.client.files_write(self.workspace, path, data, mode=mode)

    def append(self, path: _wire.Path, data: Any) -> FileInfo:
        return self.client.files_write(self.workspace, path, data, append=True)

    def list(self, path: _wire.Path = ".", *, recursive: bool = False) -> List[FileInfo]:
        return self.client.files_list(self.workspace, path, recursive=recursive or None)

    def get_info(self, path: _wire.Path) -> FileInfo:
        return self.client.files_stat(self.workspace, path)

    stat = get_info

    def exists(self, path: _wire.Path) -> bool:
        from .errors import NotFound

        try:
            self.client.files_stat(self.workspace, path)
            return True
        except NotFound:
            return False

    def make_dir(self, path: _wire.Path, *, mode: Optional[int] = None) -> FileInfo:
        """Makes the directory and its missing parents (no error when it exists)."""
        return self.client.files_mkdir(self.workspace, path, parents=True, mode=mode)

    def remove(self, path: _wire.Path) -> None:
        """Removes the file, link or directory (with what it holds)."""
        self.client.files_remove(self.workspace, path, recursive=True)

    def rename(self, old_path: _wire.Path, new_path: str) -> FileInfo:
        return self.client.files_rename(self.workspace, old_path, new_path)

    def symlink(self, path: _wire.Path, target: str) -> FileInfo:
        return self.client.files_symlink(self.workspace, path, target)

    def watch_dir(self, path: _wire.Path = ".") -> Watch:
        return self.client.watch(self.workspace, path)


def _list(v: Optional[Iterable[str]]) -> Optional[List[str]]:
    if v is None:
        return None
    return [v] if isinstance(v, str) else list(v)


def _socket_connect(path: str, timeout: Optional[float]) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise IoError(
            f"cannot connect to the daemon's socket {path}: {e.strerror or e}",
            "start the daemon (`mountctl daemon start`), or name the runtime root",
        ) from e
    return s


# ExecResult is re-exported for annotations of callers.
_ = ExecResult

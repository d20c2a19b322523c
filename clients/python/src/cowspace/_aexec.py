"""``exec`` through a sandbox's keeper socket (asyncio): the same messages and
descriptors as :mod:`cowspace._exec`, read by the event loop."""

from __future__ import annotations

import asyncio
import codecs
import errno
import inspect
import json
import os
import socket
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, Union

from . import _wire
from ._exec import Plan, Stdio, _close, parse_first, plan, refused, set_winsize
from .errors import CowspaceError, ExecTimeout
from .records import ExecResult, Output

__all__ = ["AsyncCommand"]

Callback = Callable[[str], Any]


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


class AsyncCommand:
    """A command running in a sandbox (:meth:`cowspace.AsyncClient.exec` with
    ``background=True``, or :meth:`~cowspace.AsyncClient.spawn`): ``async for`` gives
    its :class:`~cowspace.records.Output` as it arrives, :meth:`lines` its lines,
    ``on_stdout`` / ``on_stderr`` (plain functions or coroutine functions) get decoded
    text, :meth:`wait` its :class:`~cowspace.records.ExecResult`. Closing it before it
    ended kills it."""

    def __init__(
        self,
        conn: Optional[socket.socket],
        pid: Optional[int],
        p: Plan,
        master: Optional[int] = None,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
        finished: Optional[ExecResult] = None,
    ) -> None:
        self.pid = pid
        self._conn = conn
        self._master = master
        self._stdin_w = master if master is not None else p.stdin_w
        self._own_stdin = p.stdin_w
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in ("stdout", "stderr")}
        self._chunks: List[Output] = []
        self._changed = asyncio.Event()
        self._done = asyncio.Event()
        self._exit: Optional[int] = None
        self._error: Optional[str] = None
        self._callback_error: Optional[BaseException] = None
        self._started = time.monotonic()
        self._elapsed = 0.0
        self._task: Optional[asyncio.Task] = None
        if finished is not None:
            self._exit = finished.exit_code
            self._error = finished.error
            self._done.set()
            return
        readers = list(p.readers)
        if master is not None:
            readers.append((master, "stdout"))
        for fd, _ in readers:
            os.set_blocking(fd, False)
        if p.feed is not None:
            asyncio.get_running_loop().run_in_executor(None, self._feed, p.feed)
        self._task = asyncio.ensure_future(self._pump(readers))

    def _feed(self, data: bytes) -> None:
        try:
            self.write(data)
        except OSError:
            pass
        finally:
            if self._master is None:
                self.close_stdin()

    async def _pump(self, readers: List[Tuple[int, str]]) -> None:
        loop = asyncio.get_running_loop()
        q: "asyncio.Queue[Tuple[str, int, bytes]]" = asyncio.Queue()
        names: Dict[int, str] = {}

        def on_read(fd: int, name: str) -> None:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                loop.remove_reader(fd)
            q.put_nowait((name, fd, data))

        assert self._conn is not None
        conn = self._conn
        conn.setblocking(False)

        def on_keeper() -> None:
            try:
                msg = conn.recv(_wire.MAX_KEEPER_MSG_BYTES)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:
                loop.remove_reader(conn.fileno())
            q.put_nowait(("keeper", -1, msg))

        for fd, name in readers:
            names[fd] = name
            loop.add_reader(fd, on_read, fd, name)
        loop.add_reader(conn.fileno(), on_keeper)
        keeper_open = True
        deadline: Optional[float] = None
        try:
            while True:
                if self._exit is not None and not names:
                    break
                timeout = None
                if deadline is not None:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break
                try:
                    name, fd, data = await asyncio.wait_for(q.get(), timeout)
                except asyncio.TimeoutError:
                    break
                if name == "keeper":
                    v: Dict[str, Any] = {}
                    if data:
                        try:
                            v = json.loads(data)
                        except ValueError:
                            continue
                        if "exit" not in v:
                            continue
                    self._exit = int(v.get("exit", 137))
                    if not data:
                        self._error = "the sandbox's keeper went away"
                    elif v.get("error"):
                        self._error = str(v["error"].get("message"))
                    self._elapsed = (time.monotonic() - self._started) * 1e3
                    if keeper_open:
                        loop.remove_reader(conn.fileno())
                        keeper_open = False
                    deadline = time.monotonic() + _wire.DRAIN_AFTER_EXIT_S
                    continue
                if not data:
                    names.pop(fd, None)
                    continue
                await self._emit(name, data)
        finally:
            for fd, _ in readers:
                loop.remove_reader(fd)
                if fd != self._master:
                    _close(fd)
            if keeper_open:
                loop.remove_reader(conn.fileno())
            for name, cb in self._callbacks.items():
                tail = self._decoders[name].decode(b"", True)
                if cb is not None and tail:
                    await self._call(cb, tail)
            if self._exit is None:
                self._exit = 137
            self._close_conn()
            self._done.set()
            self._changed.set()

    async def _call(self, cb: Callback, text: str) -> None:
        try:
            r = cb(text)
            if inspect.isawaitable(r):
                await r
        except Exception as e:
            if self._callback_error is None:
                self._callback_error = e

    async def _emit(self, name: str, data: bytes) -> None:
        self._chunks.append(Output(name, data))
        self._changed.set()
        cb = self._callbacks[name]
        if cb is not None:
            text = self._decoders[name].decode(data)
            if text:
                await self._call(cb, text)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._master is not None:
            _close(self._master)
            self._master = None
            self._stdin_w = None
        if self._own_stdin is not None:
            _close(self._own_stdin)
            self._own_stdin = None
            self._stdin_w = None

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def exit_code(self) -> Optional[int]:
        return self._exit if self._done.is_set() else None

    def _result(self) -> ExecResult:
        return ExecResult(
            exit_code=self._exit if self._exit is not None else -1,
            stdout_bytes=b"".join(c.data for c in self._chunks if c.stream == "stdout"),
            stderr_bytes=b"".join(c.data for c in self._chunks if c.stream == "stderr"),
            pid=self.pid,
            error=self._error,
            elapsed_ms=self._elapsed or (time.monotonic() - self._started) * 1e3,
        )

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the end; ``timeout`` raises :class:`~cowspace.errors.ExecTimeout`
        (without killing it)."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            raise ExecTimeout(timeout or 0.0, self._result()) from None
        if self._callback_error is not None:
            e, self._callback_error = self._callback_error, None
            raise e
        return self._result()

    async def __aiter__(self) -> AsyncIterator[Output]:
        i = 0
        while True:
            while i >= len(self._chunks) and not self._done.is_set():
                self._changed.clear()
                await self._changed.wait()
            if i >= len(self._chunks):
                return
            yield self._chunks[i]
            i += 1

    async def lines(self) -> AsyncIterator[Tuple[str, str]]:
        """``(stream, line)`` pairs as lines arrive."""
        dec = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in ("stdout", "stderr")}
        buf = {"stdout": "", "stderr": ""}
        async for c in self:
            buf[c.stream] += dec[c.stream].decode(c.data)
            *full, buf[c.stream] = buf[c.stream].split("\n")
            for line in full:
                yield c.stream, line
        for name in ("stdout", "stderr"):
            rest = buf[name] + dec[name].decode(b"", True)
            if rest:
                yield name, rest

    def signal(self, sig: int) -> None:
        if self._conn is None or self._done.is_set():
            return
        try:
            self._conn.send(json.dumps({"signal": int(sig)}).encode())
        except OSError:
            pass

    def kill(self) -> None:
        self.signal(9)

    def write(self, data: Union[bytes, str]) -> None:
        """Writes to stdin (``stdin=PIPE``) or the pseudo-terminal (may block briefly
        when the pipe is full)."""
        fd = self._stdin_w
        if fd is None:
            raise ValueError("the command's stdin is not a pipe of this client (give stdin=PIPE or pty)")
        view = memoryview(data.encode() if isinstance(data, str) else bytes(data))
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            view = view[n:]

    def close_stdin(self) -> None:
        if self._master is not None:
            self.write(b"\x04")
            return
        if self._own_stdin is not None:
            _close(self._own_stdin)
            self._own_stdin = None
            self._stdin_w = None

    def resize(self, rows: int, cols: int) -> None:
        if self._master is None:
            raise ValueError("the command has no pseudo-terminal (give pty=(rows, cols))")
        set_winsize(self._master, rows, cols)

    async def close(self) -> None:
        """Kills the command if it still runs, and frees what the client holds."""
        if not self._done.is_set():
            self.kill()
            try:
                await asyncio.wait_for(self._done.wait(), 10)
            except asyncio.TimeoutError:
                pass
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._close_conn()

    async def __aenter__(self) -> "AsyncCommand":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def start(
    keeper: str,
    argv: List[str],
    *,
    env: Optional[Dict[str, str]],
    workdir: Optional[str],
    stdin: Any,
    stdout: Stdio,
    stderr: Stdio,
    pty: Optional[Tuple[int, int]],
    on_stdout: Optional[Callback],
    on_stderr: Optional[Callback],
) -> AsyncCommand:
    p = plan(stdin, stdout, stderr, pty is not None)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(keeper)
        socket.send_fds(conn, [_wire.keeper_exec(argv, env, workdir, pty)], p.send)
        p.sent()
        await _readable(conn.fileno())
        msg, fds, _flags, _addr = socket.recv_fds(conn, _wire.MAX_KEEPER_MSG_BYTES, 1)
        first = parse_first(msg)
    except BaseException:
        conn.close()
        p.close_all()
        raise
    if "started" not in first:
        conn.close()
        for fd in fds:
            _close(fd)
        try:
            res = refused(first)
        finally:
            p.close_all()
        return AsyncCommand(None, None, p, finished=res)
    master = fds[0] if fds else None
    if pty is not None and master is None:
        conn.close()
        p.close_all()
        raise CowspaceError("the sandbox gave no pseudo-terminal")
    return AsyncCommand(conn, int(first["started"]), p, master, on_stdout, on_stderr)

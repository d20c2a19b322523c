"""``exec`` through a sandbox's keeper socket (synchronous).

The daemon's ``exec`` operation answers the keeper socket of the workspace's running
sandbox; the command goes there on a ``SOCK_SEQPACKET`` connection with its stdin,
stdout and stderr as ``SCM_RIGHTS`` descriptors (docs/control-protocol.md,
docs/sandbox.md). The command writes straight into the pipes this client made; a
thread reads them. Closing the connection before the command ended kills it (its
background children stay: they are processes of the sandbox).
"""

from __future__ import annotations

import codecs
import errno
import fcntl
import json
import os
import selectors
import socket
import struct
import termios
import threading
import time
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _wire
from .errors import CowspaceError, ExecTimeout, error_from
from .records import ExecResult, Output

__all__ = ["Command", "PIPE", "DEVNULL", "STDOUT", "Stdio"]

#: ``stdin=PIPE``: write to the command with :meth:`Command.write`;
#: ``stdout=PIPE`` / ``stderr=PIPE`` (the default): captured and streamed.
PIPE = -1
#: ``/dev/null``.
DEVNULL = -3
#: ``stderr=STDOUT``: stderr goes where stdout goes.
STDOUT = -2

Stdio = Union[None, int, IO[Any]]
Callback = Callable[[str], Any]


class Plan:
    """The descriptors of one exec: those passed to the keeper (closed here once sent)
    and the ends this client keeps."""

    def __init__(self) -> None:
        self.send: List[int] = []
        self.close_after_send: List[int] = []
        self.readers: List[Tuple[int, str]] = []
        self.stdin_w: Optional[int] = None
        self.feed: Optional[bytes] = None

    def close_all(self) -> None:
        for fd in self.close_after_send + [r for r, _ in self.readers]:
            _close(fd)
        if self.stdin_w is not None:
            _close(self.stdin_w)
        self.close_after_send, self.readers, self.stdin_w = [], [], None

    def sent(self) -> None:
        for fd in self.close_after_send:
            _close(fd)
        self.close_after_send = []


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _fileno(f: Any) -> int:
    return f if isinstance(f, int) else f.fileno()


def plan(stdin: Any, stdout: Stdio, stderr: Stdio, tty: bool) -> Plan:
    """Makes the pipes for an exec (nothing for a pseudo-terminal: the sandbox makes
    it and hands back its master)."""
    p = Plan()
    if tty:
        if stdin is not None and stdin != PIPE:
            p.feed = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        return p
    try:
        # stdin
        if stdin is None or stdin == DEVNULL:
            fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            p.send.append(fd)
            p.close_after_send.append(fd)
        elif stdin == PIPE or isinstance(stdin, (bytes, bytearray, memoryview, str)):
            r, w = os.pipe()
            p.send.append(r)
            p.close_after_send.append(r)
            p.stdin_w = w
            if stdin != PIPE:
                p.feed = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        else:
            p.send.append(_fileno(stdin))
        # stdout, stderr
        out_fd = None
        for name, spec in (("stdout", stdout), ("stderr", stderr)):
            if name == "stderr" and spec == STDOUT:
                if out_fd is None:
                    raise ValueError("stderr=STDOUT needs stdout to be given")
                p.send.append(out_fd)
                continue
            if spec is None or spec == PIPE:
                r, w = os.pipe()
                p.readers.append((r, name))
                p.send.append(w)
                p.close_after_send.append(w)
                fd = w
            elif spec == DEVNULL:
                fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                p.send.append(fd)
                p.close_after_send.append(fd)
            else:
                fd = _fileno(spec)
                p.send.append(fd)
            if name == "stdout":
                out_fd = fd
    except BaseException:
        p.close_all()
        raise
    return p


def parse_first(msg: bytes) -> Dict[str, Any]:
    if not msg:
        raise CowspaceError("the sandbox's keeper closed the connection before starting the command")
    v = json.loads(msg)
    if not isinstance(v, dict):
        raise CowspaceError(f"the keeper answered {msg[:200]!r}")
    return v


def refused(first: Dict[str, Any]) -> Optional[ExecResult]:
    """For a command that did not start: its result when it is a status a shell would
    give (127: not found, 126: not executable), else raises the error's kind."""
    err = first.get("error") or {}
    code = first.get("exit")
    if code in (126, 127):
        return ExecResult(exit_code=int(code), error=str(err.get("message") or ""))
    raise error_from(err or {"kind": "io", "message": f"the keeper answered {first}"})


def set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _Stream:
    """Incremental UTF-8 decoding and line splitting of one stream."""

    def __init__(self) -> None:
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def text(self, data: bytes, final: bool = False) -> str:
        return self.dec.decode(data, final)


class Command:
    """A command running in a sandbox (:meth:`cowspace.Client.exec` with
    ``background=True``, or :meth:`cowspace.Client.spawn`).

    Its output is captured and can be read as it arrives: iterate over the command
    (:class:`~cowspace.records.Output` pieces) or over :meth:`lines`, or give
    ``on_stdout`` / ``on_stderr`` callbacks (called on this client's reader thread with
    decoded text). :meth:`wait` gives the :class:`~cowspace.records.ExecResult`.
    Closing the command (or leaving its ``with`` block) before it ended kills it.
    """

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
        self._streams = {"stdout": _Stream(), "stderr": _Stream()}
        self._chunks: List[Output] = []
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._exit: Optional[int] = None
        self._error: Optional[str] = None
        self._callback_error: Optional[BaseException] = None
        self._started = time.monotonic()
        self._elapsed = 0.0
        self._lock = threading.Lock()
        readers = list(p.readers)
        if master is not None:
            readers.append((master, "stdout"))
        if finished is not None:
            self._exit = finished.exit_code
            self._error = finished.error
            self._done.set()
            return
        if p.feed is not None:
            threading.Thread(target=self._feed, args=(p.feed,), daemon=True, name="cowspace-stdin").start()
        self._thread = threading.Thread(target=self._pump, args=(readers,), daemon=True, name="cowspace-exec")
        self._thread.start()

    # -- running ---------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        try:
            self.write(data)
        except OSError:
            pass
        finally:
            if self._master is None:
                self.close_stdin()

    def _pump(self, readers: List[Tuple[int, str]]) -> None:
        sel = selectors.DefaultSelector()
        names = {}
        for fd, name in readers:
            sel.register(fd, selectors.EVENT_READ, name)
            names[fd] = name
        assert self._conn is not None
        sel.register(self._conn, selectors.EVENT_READ, "keeper")
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
                for key, _ in sel.select(timeout):
                    if key.data == "keeper":
                        try:
                            msg = self._conn.recv(_wire.MAX_KEEPER_MSG_BYTES)
                        except OSError:
                            msg = b""
                        v: Dict[str, Any] = {}
                        if msg:
                            try:
                                v = json.loads(msg)
                            except ValueError:
                                continue
                            if "exit" not in v:
                                continue
                        self._exit = int(v.get("exit", 137))
                        if not msg:
                            self._error = "the sandbox's keeper went away"
                        elif v.get("error"):
                            self._error = str(v["error"].get("message"))
                        self._elapsed = (time.monotonic() - self._started) * 1e3
                        sel.unregister(self._conn)
                        deadline = time.monotonic() + _wire.DRAIN_AFTER_EXIT_S
                        continue
                    fd = key.fd
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError as e:
                        if e.errno != errno.EIO:  # EIO: a pseudo-terminal whose other side closed
                            raise
                        data = b""
                    if not data:
                        sel.unregister(fd)
                        del names[fd]
                        continue
                    self._emit(key.data, data)
        finally:
            sel.close()
            for fd, name in readers:
                if fd != self._master:
                    _close(fd)
            for name, cb in self._callbacks.items():
                tail = self._streams[name].text(b"", True)
                if cb is not None and tail:
                    self._call(cb, tail)
            if self._exit is None:
                self._exit = 137
            self._close_conn()
            with self._cond:
                self._done.set()
                self._cond.notify_all()

    def _call(self, cb: Callback, text: str) -> None:
        try:
            cb(text)
        except BaseException as e:  # kept for wait(): the reader must go on reading
            if self._callback_error is None:
                self._callback_error = e

    def _emit(self, name: str, data: bytes) -> None:
        with self._cond:
            self._chunks.append(Output(name, data))
            self._cond.notify_all()
        cb = self._callbacks[name]
        if cb is not None:
            text = self._streams[name].text(data)
            if text:
                self._call(cb, text)

    def _close_conn(self) -> None:
        with self._lock:
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

    # -- the public surface ----------------------------------------------------------

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def exit_code(self) -> Optional[int]:
        """The status once it ended, else ``None``."""
        return self._exit if self._done.is_set() else None

    def _result(self) -> ExecResult:
        with self._cond:
            out = b"".join(c.data for c in self._chunks if c.stream == "stdout")
            err = b"".join(c.data for c in self._chunks if c.stream == "stderr")
        return ExecResult(
            exit_code=self._exit if self._exit is not None else -1,
            stdout_bytes=out,
            stderr_bytes=err,
            pid=self.pid,
            error=self._error,
            elapsed_ms=self._elapsed or (time.monotonic() - self._started) * 1e3,
        )

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the command to end and gives its result. With ``timeout`` (seconds)
        raises :class:`~cowspace.errors.ExecTimeout` when it runs on (it is not
        killed: :meth:`kill` does that)."""
        if not self._done.wait(timeout):
            raise ExecTimeout(timeout or 0.0, self._result())
        if self._callback_error is not None:
            e, self._callback_error = self._callback_error, None
            raise e
        return self._result()

    def __iter__(self) -> Iterator[Output]:
        """The output as it arrives (both streams, in order), until the command ended
        and its pipes are drained."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self._chunks) and not self._done.is_set():
                    self._cond.wait()
                if i >= len(self._chunks):
                    return
                chunk = self._chunks[i]
            i += 1
            yield chunk

    def lines(self) -> Iterator[Tuple[str, str]]:
        """``(stream, line)`` pairs as lines arrive (without their ``\\n``)."""
        pending = {"stdout": _Stream(), "stderr": _Stream()}
        buf = {"stdout": "", "stderr": ""}
        for c in self:
            buf[c.stream] += pending[c.stream].text(c.data)
            *full, buf[c.stream] = buf[c.stream].split("\n")
            for line in full:
                yield c.stream, line
        for name in ("stdout", "stderr"):
            rest = buf[name] + pending[name].text(b"", True)
            if rest:
                yield name, rest

    def signal(self, sig: int) -> None:
        """Sends signal ``sig`` to the command (nothing once it ended)."""
        with self._lock:
            if self._conn is None or self._done.is_set():
                return
            try:
                self._conn.send(json.dumps({"signal": int(sig)}).encode())
            except OSError:
                pass

    def kill(self) -> None:
        """``SIGKILL`` to the command."""
        self.signal(9)

    def write(self, data: Union[bytes, str]) -> None:
        """Writes to the command's stdin (``stdin=PIPE``) or its pseudo-terminal."""
        fd = self._stdin_w
        if fd is None:
            raise ValueError("the command's stdin is not a pipe of this client (give stdin=PIPE or pty)")
        b = data.encode() if isinstance(data, str) else bytes(data)
        view = memoryview(b)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def close_stdin(self) -> None:
        """Closes the command's stdin (it reads end of file); a pseudo-terminal gets
        ``^D``."""
        if self._master is not None:
            self.write(b"\x04")
            return
        with self._lock:
            if self._own_stdin is not None:
                _close(self._own_stdin)
                self._own_stdin = None
                self._stdin_w = None

    def resize(self, rows: int, cols: int) -> None:
        """Sets the pseudo-terminal's size (its foreground process gets ``SIGWINCH``)."""
        if self._master is None:
            raise ValueError("the command has no pseudo-terminal (give pty=(rows, cols))")
        set_winsize(self._master, rows, cols)

    def close(self) -> None:
        """Kills the command if it still runs, and frees what the client holds."""
        if not self._done.is_set():
            self.kill()
            self._done.wait(10)
        self._close_conn()

    def __enter__(self) -> "Command":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start(
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
) -> Command:
    p = plan(stdin, stdout, stderr, pty is not None)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(keeper)
        socket.send_fds(conn, [_wire.keeper_exec(argv, env, workdir, pty)], p.send)
        p.sent()
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
        return Command(None, None, p, finished=res)
    master = fds[0] if fds else None
    if pty is not None and master is None:
        conn.close()
        p.close_all()
        raise CowspaceError("the sandbox gave no pseudo-terminal")
    return Command(conn, int(first["started"]), p, master, on_stdout, on_stderr)

"""``watch``: a connection of its own to the daemon on which change events arrive until
the caller closes it (docs/files.md). :class:`Watch` is the synchronous iterator,
:class:`AsyncWatch` the asyncio one."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any, Dict, Mapping, Optional, cast

from . import _wire
from .errors import IoError
from .records import WatchEvent

__all__ = ["Watch", "AsyncWatch"]


def _parse(line: bytes) -> Dict[str, Any]:
    if not line:
        raise IoError("the daemon closed the watch's connection")
    v = json.loads(line)
    if not isinstance(v, dict):
        raise IoError(f"the daemon answered something that is not an object: {line[:200]!r}")
    return v


class Watch:
    """Changes below a path of a workspace as they happen (``Client.watch``):
    iterate it (``for ev in w``: blocks until the next change, ends when the daemon ends
    the watch), or :meth:`get` with a timeout. :meth:`close` (or ``with``) ends it; the
    daemon stops watching when the connection closes. ``ended`` is the daemon's last
    word (``{"ended": true, "why"}``) once it ended."""

    def __init__(self, path: str, a: Mapping[str, Any], connect_timeout: Optional[float] = None) -> None:
        from .client import _socket_connect

        self._sock = _socket_connect(path, connect_timeout)
        self._buf = bytearray()
        self.ended: Optional[Dict[str, Any]] = None
        try:
            self._sock.settimeout(connect_timeout)
            self._sock.sendall(_wire.encode("watch", a))
            first = self._line(connect_timeout)
            if first is None:
                raise IoError("the daemon did not start the watch in time")
            v = _parse(first)
            if "event" not in v:
                self.ended = cast(Dict[str, Any], _wire.result(v))
            self.watching: Dict[str, Any] = v
        except BaseException:
            self.close()
            raise

    def _line(self, timeout: Optional[float]) -> Optional[bytes]:
        """The next line; ``None`` when none came within ``timeout``; ``b""`` at the end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                return line
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._sock.settimeout(left)
            else:
                self._sock.settimeout(None)
            try:
                data = self._sock.recv(1 << 16)
            except socket.timeout:
                return None
            except OSError:
                data = b""
            if not data:
                return b""
            self._buf += data

    def get(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The next change; ``None`` when none came within ``timeout`` seconds or when the
        watch ended (then ``ended`` is set)."""
        if self.ended is not None:
            return None
        line = self._line(timeout)
        if line is None:
            return None
        if not line:
            self.ended = {"ended": True, "why": "the connection closed"}
            return None
        v = _parse(line)
        if "event" in v:
            return cast(WatchEvent, v)
        self.ended = cast(Dict[str, Any], _wire.result(v) or {"ended": True})
        return None

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchEvent:
        ev = self.get()
        if ev is None:
            raise StopIteration
        return ev

    def close(self) -> None:
        """Ends the watch (the daemon stops watching)."""
        if self.ended is None:
            self.ended = {"ended": True, "why": "closed by the client"}
        try:
            self._sock.close()
        except OSError:
            pass

    stop = close

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncWatch:
    """:class:`Watch` for asyncio (``AsyncClient.watch``): ``async for ev in w``,
    ``await w.get(timeout)``, ``await w.close()`` / ``async with``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.ended: Optional[Dict[str, Any]] = None
        self.watching: Dict[str, Any] = {}

    @classmethod
    async def open(cls, path: str, a: Mapping[str, Any]) -> "AsyncWatch":
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=_wire.MAX_LINE_BYTES)
        except OSError as e:
            raise IoError(
                f"cannot connect to the daemon's socket {path}: {e.strerror or e}",
                "start the daemon (`mountctl daemon start`), or name the runtime root",
            ) from e
        w = cls(reader, writer)
        try:
            writer.write(_wire.encode("watch", a))
            await writer.drain()
            v = _parse(await reader.readline())
            if "event" not in v:
                w.ended = cast(Dict[str, Any], _wire.result(v))
            w.watching = v
        except BaseException:
            await w.close()
            raise
        return w

    async def get(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The next change; ``None`` when none came within ``timeout`` seconds or when the
        watch ended (then ``ended`` is set)."""
        if self.ended is not None:
            return None
        try:
            line = await asyncio.wait_for(self._reader.readline(), timeout)
        except asyncio.TimeoutError:
            return None
        except OSError:
            line = b""
        if not line:
            self.ended = {"ended": True, "why": "the connection closed"}
            return None
        v = _parse(line)
        if "event" in v:
            return cast(WatchEvent, v)
        self.ended = cast(Dict[str, Any], _wire.result(v) or {"ended": True})
        return None

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        ev = await self.get()
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def close(self) -> None:
        """Ends the watch (the daemon stops watching)."""
        if self.ended is None:
            self.ended = {"ended": True, "why": "closed by the client"}
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    stop = close
    aclose = close

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


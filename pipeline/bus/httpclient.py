"""A small pooled HTTP/1.1 client for bus-to-bus POSTs over plain ``http://``.

The bus sends one small JSON body per request, to a handful of peers, many at
once. A general client (aiohttp's) spends more CPU per request than the rest
of the bus's work on it; this one does only what the bus needs: keep-alive
connections pooled per peer (bounded), ``Content-Length`` bodies, a total
deadline per request. Anything else in a response (chunked bodies, an
oversized header block) closes that connection and reads as a failure.
``https://`` peers go through aiohttp instead (see :mod:`pipeline.bus.forward`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

MAX_HEADER = 16 * 1024
MAX_BODY = 64 * 1024
#: Parsed URLs kept (a few per peer); the cache starts over past this.
MAX_TARGETS = 4096


class HttpError(OSError):
    """The request failed before a complete response arrived (the sender may retry)."""


class _StaleConnection(Exception):
    """A pooled connection turned out closed before any response byte: use another."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def shut(self) -> None:
        self.writer.close()


class _Host:
    def __init__(self, limit: int) -> None:
        self.idle: deque[_Conn] = deque()
        self.slots = asyncio.Semaphore(limit)


class HttpPool:
    def __init__(self, *, per_host: int = 128, deadline_s: float = 10.0) -> None:
        self._per_host = per_host
        self._deadline_s = deadline_s
        self._hosts: dict[tuple[str, int], _Host] = {}
        self._targets: dict[str, tuple[tuple[str, int], str]] = {}  # url -> (host, first lines)

    def _target(self, url: str) -> tuple[tuple[str, int], str]:
        """``((hostname, port), request line + Host header)`` of ``url``, parsed once."""
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"HttpPool speaks plain http only: {url!r}")
            port = parts.port or 80
            first = f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.hostname}:{port}"
            if len(self._targets) >= MAX_TARGETS:
                self._targets.clear()
            target = self._targets[url] = ((parts.hostname, port), first)
        return target

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """POST ``body``; return (status, response body). Raises :class:`HttpError`."""
        key, first = self._target(url)
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = _Host(self._per_host)
        head = [first]
        head += [f"{name}: {value}" for name, value in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        async with host.slots:
            try:
                async with asyncio.timeout(self._deadline_s):
                    return await self._exchange(host, key, request)
            except TimeoutError as exc:
                raise HttpError(f"no response from {url} in {self._deadline_s}s") from exc

    async def _exchange(
        self, host: _Host, key: tuple[str, int], request: bytes
    ) -> tuple[int, bytes]:
        while host.idle:
            conn = host.idle.pop()
            try:
                return await self._once(host, conn, request)
            except _StaleConnection:
                continue  # the peer closed it while it was idle: try the next one
        try:
            reader, writer = await asyncio.open_connection(*key)
        except OSError as exc:
            raise HttpError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from exc
        try:
            return await self._once(host, _Conn(reader, writer), request)
        except _StaleConnection as exc:
            raise HttpError("connection closed by the peer") from exc

    async def _once(self, host: _Host, conn: _Conn, request: bytes) -> tuple[int, bytes]:
        keep = False
        header = b""
        try:
            conn.writer.write(request)
            await conn.writer.drain()
            header = await conn.reader.readuntil(b"\r\n\r\n")
            status, length, close = _parse_head(header)
            body = await conn.reader.readexactly(length) if length else b""
            keep = not close
            return status, body
        except asyncio.LimitOverrunError as exc:
            raise HttpError("response header too large") from exc
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            if not header and not getattr(exc, "partial", b""):
                raise _StaleConnection from exc
            raise HttpError(f"connection failed: {exc!r}") from exc
        finally:
            if keep:
                host.idle.append(conn)
            else:
                conn.shut()

    def close(self) -> None:
        for host in self._hosts.values():
            while host.idle:
                host.idle.pop().shut()
        self._hosts.clear()


def _parse_head(header: bytes) -> tuple[int, int, bool]:
    if len(header) > MAX_HEADER:
        raise HttpError("response header too large")
    lines = header.decode("latin-1").split("\r\n")
    first = lines[0].split(" ", 2)
    if len(first) < 2 or not first[0].startswith("HTTP/1.") or not first[1].isdigit():
        raise HttpError(f"bad status line {lines[0]!r}")
    length = 0
    close = first[0] == "HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            if not value.strip().isdigit():
                raise HttpError("bad Content-Length")
            length = int(value)
        elif name == "transfer-encoding":
            raise HttpError("chunked responses are not supported")
        elif name == "connection":
            close = value.strip().lower() == "close"
    if length > MAX_BODY:
        raise HttpError("response body too large")
    return int(first[1]), length, close

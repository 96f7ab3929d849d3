"""How the resumption server writes websocket text frames: the one place that knows aiohttp's internals.

Two writers with one interface (:class:`FrameWriter`):

- :class:`PublicWriter` uses only aiohttp's public API
  (``WebSocketResponse.send_frame``): one frame and one ``transport.write``
  per text, aiohttp's own flow control, and no synchronous direct path (live
  texts always go through the connection's writer task).
- :class:`RawWriter` is the shortcut. It writes a burst of whole, unmasked,
  uncompressed text frames (RFC 6455 5.2; uncompressed frames stay valid when
  permessage-deflate was negotiated, RFC 7692 6) in one ``transport.write``,
  writes live texts synchronously when nothing is queued (no task wake-up
  per subscriber), and waits for a paused transport through aiohttp's
  private ``BaseProtocol._drain_helper`` (and reads its ``writing_paused``).
  aiohttp's own control frames (pings, close) are whole frames written the
  same way, so they interleave safely.

The shortcut is kept because ``make bench B=resume`` shows it pays: see
:data:`MEASURED`. It is used only on the aiohttp versions in
:data:`SUPPORTED` (``tests/unit/chain/test_aiohttp_contract.py`` fails loudly
on any other and checks every internal used here); elsewhere, or with
``SLUICE_WS_PUBLIC=1`` in the environment (the benchmark's comparison run),
the server uses :class:`PublicWriter`.
"""

from __future__ import annotations

import os
from typing import Protocol

import aiohttp
from aiohttp import WSMsgType, web

#: aiohttp releases (major, minor) whose internals RawWriter was checked against.
SUPPORTED = frozenset({(3, 14)})
#: ``make bench B=resume`` on a loaded 2-core machine, medians of interleaved runs
#: (RawWriter vs PublicWriter): filled in by the commit that measured it.
MEASURED = "see the commit message and tests/bench/bench_resume.py"


def _version() -> tuple[int, int]:
    major, minor = aiohttp.__version__.split(".")[:2]
    return int(major), int(minor)


def raw_supported() -> bool:
    """Whether this aiohttp is one RawWriter was checked against (and not disabled by env)."""
    return _version() in SUPPORTED and os.environ.get("SLUICE_WS_PUBLIC", "") in ("", "0")


def text_frame(data: bytes) -> bytes:
    """One unmasked, final websocket text frame (server to client, RFC 6455 5.2)."""
    n = len(data)
    if n < 126:
        return bytes((0x81, n)) + data
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big") + data
    return b"\x81\x7f" + n.to_bytes(8, "big") + data


class FrameCache:
    """Frames of texts written directly, per server (live texts are shared by subscribers).

    Bounded: cleared when full, and texts longer than ``max_chars`` are never
    kept (at most ``limit * max_chars`` characters of frames).
    """

    __slots__ = ("_frames", "limit", "max_chars")

    def __init__(self, limit: int = 1024, max_chars: int = 8192) -> None:
        self._frames: dict[str, bytes] = {}
        self.limit = limit
        self.max_chars = max_chars

    def __len__(self) -> int:
        return len(self._frames)

    def __contains__(self, text: object) -> bool:
        return text in self._frames

    def frame(self, text: str) -> bytes:
        if len(text) > self.max_chars:
            return text_frame(text.encode())
        frame = self._frames.get(text)
        if frame is None:
            frame = text_frame(text.encode())
            if len(self._frames) >= self.limit:
                self._frames.clear()
            self._frames[text] = frame
        return frame


class FrameWriter(Protocol):
    """Writes a connection's text messages in order; only one task calls :meth:`write`."""

    def closed(self) -> bool:
        """The peer or the transport is gone: nothing more can be written."""

    async def write(self, texts: list[str]) -> None:
        """Write ``texts`` in order, then wait while the transport is paused."""

    def write_now(self, texts: list[str]) -> bool:
        """Write at once if that can be done without waiting; False when it cannot."""


class PublicWriter:
    """:class:`FrameWriter` over aiohttp's public websocket API only."""

    __slots__ = ("_ws",)

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws

    def closed(self) -> bool:
        return self._ws.closed

    async def write(self, texts: list[str]) -> None:
        ws = self._ws
        for text in texts:
            await ws.send_frame(text.encode(), WSMsgType.TEXT)

    def write_now(self, texts: list[str]) -> bool:
        return False  # no public synchronous write: the writer task sends them


class RawWriter:
    """:class:`FrameWriter` writing whole frames to aiohttp's transport (see the module doc)."""

    __slots__ = ("_cache", "_protocol", "_request", "_ws")

    def __init__(
        self, ws: web.WebSocketResponse, request: web.BaseRequest, cache: FrameCache
    ) -> None:
        self._ws = ws
        self._request = request
        self._protocol = request.protocol
        self._cache = cache

    def closed(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing() or self._ws.closed

    async def write(self, texts: list[str]) -> None:
        transport = self._request.transport
        if transport is None:
            raise ConnectionResetError("websocket closed")
        transport.write(b"".join([text_frame(t.encode()) for t in texts]))
        protocol = self._protocol
        if protocol.writing_paused:
            await protocol._drain_helper()  # aiohttp internal: its flow-control wait

    def write_now(self, texts: list[str]) -> bool:
        transport = self._request.transport
        if (
            transport is None
            or transport.is_closing()
            or self._ws.closed
            or self._protocol.writing_paused
        ):
            return False
        frame = self._cache.frame
        if len(texts) == 1:
            transport.write(frame(texts[0]))
        else:
            transport.write(b"".join([frame(t) for t in texts]))
        return True


def frame_writer(
    ws: web.WebSocketResponse, request: web.BaseRequest, cache: FrameCache
) -> FrameWriter:
    """The shortcut writer on a checked aiohttp, else the public one."""
    if raw_supported():
        return RawWriter(ws, request, cache)
    return PublicWriter(ws)


__all__ = [
    "SUPPORTED",
    "FrameCache",
    "FrameWriter",
    "PublicWriter",
    "RawWriter",
    "frame_writer",
    "raw_supported",
    "text_frame",
]

"""How one websocket connection of ``sluice serve`` writes: its outbox and every way out of it.

:class:`Sending` is the sending half of a
:class:`~pipeline.chain.serve.wsconn.Connection`: the one bounded
:class:`~pipeline.chain.outbox.Outbox`, the writer task that drains it (bursts
written corked), and the live fan-out's two sends that need no task switch:
the inline send of queued texts and the direct write of frames shared by every
subscriber. A send that fails ends this connection only (:meth:`Sending.fail`).

It also runs the connection's heartbeat (aiohttp's is off: its unanswered ping
cut a subscriber that reads too slowly with a bare EOF, no reason, nothing
counted): after ``heartbeat_s`` without a frame from the peer a ping goes out;
no frame within half as long, and the connection is closed. While something
sent to the peer is not taken (queued here, in the transport's buffer, or in
the kernel's send queue), the peer is a subscriber too slow: closed with 1008
and the reason, like one whose send buffer filled up (:meth:`Sending._slow`),
counted in ``sluice_serve_slow_disconnects_total`` and logged once per
condition (:class:`~pipeline.loggate.LogGate`). Otherwise it is gone: 1011
``keepalive ping timeout``, counted in ``sluice_serve_heartbeat_timeouts_total``.
A slow subscriber's queued texts are dropped and its close frame goes after
what was already written: it reads them and the 1008 if it reads at all within
:data:`SLOW_CLOSE_S`, after which the connection is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import struct
import termios
import weakref
from collections.abc import Iterator
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from pipeline.chain.burst import burst_end, frame_texts
from pipeline.chain.metrics import Metrics
from pipeline.chain.outbox import FanoutBatch, Outbox
from pipeline.loggate import LogGate

log = logging.getLogger(__name__)
#: Slow subscribers closed, per server (its metrics): one line per condition, then one
#: per 10 s (every one counted).
_GATES: weakref.WeakKeyDictionary[Metrics, LogGate] = weakref.WeakKeyDictionary()
#: Seconds a subscriber closed for being too slow has to read what was written and the 1008.
SLOW_CLOSE_S = 10.0
#: Linux's SIOCOUTQ (bytes in a socket's send queue not yet acknowledged); None elsewhere.
_OUTQ: int | None = getattr(termios, "TIOCOUTQ", None)

_WRITE_BATCH = 512
#: The longest websocket frame header a server writes (no mask): 2 + 8 bytes.
_FRAME_HEADER = 10
_TCP = (socket.AF_INET, socket.AF_INET6)
#: Linux's TCP_CORK (None elsewhere: bursts are then written uncorked).
_CORK: int | None = getattr(socket, "TCP_CORK", None)


@contextlib.contextmanager
def _corked(sock: Any) -> Iterator[None]:
    """Hold a burst of frames in the kernel until it ends (``TCP_CORK``), where there is one."""
    if sock is None or _CORK is None:
        yield
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)


def _unsent(sock: Any) -> int:
    """Bytes in ``sock``'s kernel send queue not acknowledged by the peer (0: unknown)."""
    if sock is None or _OUTQ is None:
        return 0
    try:
        out = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
    except OSError:
        return 0
    value: int = struct.unpack("i", out)[0]
    return value


class Sending:
    """The sending half of one websocket connection; :meth:`fail` ends the connection.

    The connection (its subclass) runs :meth:`_write` as its writer task and
    waits for ``_failure``: the close code and reason of the first failure.
    """

    def __init__(
        self,
        ws: web.WebSocketResponse,
        transport: asyncio.Transport | None,
        metrics: Metrics,
        *,
        send_buffer: int,
        batch: FanoutBatch | None,
        stall_s: float | None,
        heartbeat_s: float = 0.0,
    ) -> None:
        self.ws = ws
        self.metrics = metrics
        gate = _GATES.get(metrics)
        self._gate = gate if gate is not None else _GATES.setdefault(metrics, LogGate(log))
        self.outbox = Outbox(
            send_buffer,
            batch=batch,
            inline=self._send_inline,
            direct=self._write_direct,
            stall_s=stall_s,
        )
        #: A sender (the writer task or the fan-out's inline send) holds texts it popped.
        self._writing = False
        #: The connection's transport (None: already gone), for the inline send's checks,
        #: and the longest frame it sends inline: below the high-water mark, never paused.
        self._transport = transport
        self._inline_max = (
            transport.get_write_buffer_limits()[1] - _FRAME_HEADER if transport is not None else 0
        )
        sock = transport.get_extra_info("socket") if transport is not None else None
        #: The TCP socket, to cork bursts (None: not TCP, nothing to cork).
        self._sock = sock if sock is not None and sock.family in _TCP else None
        loop = asyncio.get_running_loop()
        self._failure: asyncio.Future[tuple[int, str]] = loop.create_future()
        #: Seconds between pings of a silent peer (0: none), and when it was last heard.
        self._heartbeat_s = heartbeat_s
        self._heard_at = loop.time()
        #: How long the close may take (None: the connection's default; longer for a slow reader).
        self.linger_s: float | None = None

    def fail(self, code: int, reason: str) -> None:
        if not self._failure.done():
            self._failure.set_result((code, reason))

    def _slow(self, reason: str = "") -> None:
        """Close a subscriber too slow with 1008 and ``reason`` (default: its buffer is full)."""
        if self._failure.done():
            return  # one disconnect, however many of its subscriptions found it too slow
        reason = reason or f"subscriber too slow: send buffer of {self.outbox.limit} messages full"
        self.metrics.inc("sluice_serve_slow_disconnects_total")
        peer = self._transport.get_extra_info("peername") if self._transport is not None else None
        self._gate.failed(
            reason.split("(")[0],
            "closing a subscriber with 1008, %s (%s); sluice_serve_slow_disconnects_total counts them",
            reason,
            peer,
        )
        self.outbox.clear()  # what it has not been sent is dropped: the close goes next
        self.linger_s = SLOW_CLOSE_S
        self.fail(WSCloseCode.POLICY_VIOLATION, reason)

    async def heard(self, msg: Any) -> bool:
        """A frame came from the peer (for the heartbeat); True when it was a ping (answered
        here) or a pong, which the caller then ignores."""
        self._heard_at = asyncio.get_running_loop().time()
        if msg.type is WSMsgType.PING:
            await self.ws.pong(msg.data)
            return True
        return msg.type is WSMsgType.PONG

    def _backed_up(self) -> bool:
        """Whether something sent to the peer is not taken yet (see the module doc)."""
        transport = self._transport
        if len(self.outbox) or (transport is not None and transport.get_write_buffer_size()):
            return True
        return _unsent(self._sock) > 0

    async def _beat(self, every_s: float) -> None:
        """The heartbeat (see the module doc): a ping after ``every_s`` of silence, then the
        verdict ``every_s / 2`` later unless the peer was heard meanwhile."""
        loop = asyncio.get_running_loop()
        while True:
            quiet = loop.time() - self._heard_at
            if quiet < every_s:
                await asyncio.sleep(every_s - quiet)
                continue
            pinged = loop.time()
            deadline = pinged + every_s / 2
            try:
                async with asyncio.timeout_at(deadline):
                    await self.ws.ping()  # waits only while the transport is paused
            except TimeoutError:
                pass
            except ConnectionError:
                return  # closing: the reader or the writer says why
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if self._heard_at >= pinged:
                continue
            if self._backed_up():
                self._slow(f"subscriber too slow: not reading (no pong within {every_s / 2:g}s)")
            else:
                self.metrics.inc("sluice_serve_heartbeat_timeouts_total")
                self.fail(WSCloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            return

    async def _write(self) -> None:
        """The writer task: :meth:`_send_all`, with the heartbeat beside it while it runs."""
        beat = None
        if self._heartbeat_s > 0:
            beat = asyncio.create_task(self._beat(self._heartbeat_s), name="ws-heartbeat")
            beat.add_done_callback(self._beat_ended)
        try:
            await self._send_all()
        finally:
            if beat is not None:
                beat.cancel()
                await asyncio.wait([beat])

    def _beat_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("heartbeat failed", exc_info=task.exception())
            self.metrics.inc("sluice_serve_internal_errors_total")
            self.fail(WSCloseCode.INTERNAL_ERROR, "internal error")

    async def _send_all(self) -> None:
        """The one writer of the connection: every text in outbox order, aiohttp's public API only.

        Live fan-out only appends shared frames to the outbox
        (:mod:`pipeline.chain.serve.frames`); this task wakes once per batch and
        sends what it finds. ``send_frame`` writes each frame and waits while
        the transport is paused (aiohttp's flow control), so a subscriber that
        does not read lets its outbox fill up and is closed with 1008 by the
        fan-out, which never waits for it. A burst of frames is written corked
        (``TCP_CORK``) so the kernel sends it in full segments: the frames of
        catch-up cost one small copy each, not one packet each
        (``catchup_blocks_per_s`` of ``make bench B=resume``).
        """
        ws, outbox, metrics = self.ws, self.outbox, self.metrics
        send, text_op = ws.send_frame, WSMsgType.TEXT
        sock = self._sock
        try:
            while True:
                await outbox.wait()
                if self._writing:  # the fan-out's inline send holds texts: it wakes us after
                    await outbox.wait(fresh=True)
                    continue
                texts = outbox.pop_many(_WRITE_BATCH)
                if not texts:
                    continue
                if ws.closed:
                    raise ConnectionResetError("websocket closed")
                self._writing = True
                try:
                    if len(texts) == 1:  # one live text: no cork to set up
                        await send(texts[0], text_op)
                    else:
                        with _corked(sock):
                            await self._send_many(texts)
                finally:
                    self._writing = False
                metrics.inc("sluice_serve_messages_sent_total", len(texts))
        except ConnectionError:
            self.fail(WSCloseCode.GOING_AWAY, "connection lost")
        except Exception:
            # Anything else ends this connection as the fan-out's own sends do (1011, logged
            # once, counted); before, the writer task died with it and the connection was
            # closed as if all were well (1000), with nothing logged or counted.
            if not self._failure.done():
                log.exception("send failed")
                metrics.inc("sluice_serve_internal_errors_total")
                self.fail(WSCloseCode.INTERNAL_ERROR, "internal error")

    async def _send_many(self, texts: list[bytes]) -> None:
        """Send ``texts`` in order: runs of them as one burst (:mod:`pipeline.chain.burst`)
        while the transport's buffer is empty, the rest through aiohttp's ``send_frame``.

        A burst is written only when nothing is buffered, and is at most
        ``BURST_BYTES``: what it leaves in the buffer then goes out before the
        next frame, which aiohttp's flow control makes wait while the transport
        is paused (it checks after each ``writer_limit`` bytes it wrote itself).
        """
        ws, transport = self.ws, self._transport
        send, text_op = ws.send_frame, WSMsgType.TEXT
        i, count = 0, len(texts)
        while i < count:
            if transport is not None and not transport.get_write_buffer_size():
                end = burst_end(texts, i)
                if end - i > 1:
                    if ws.closed or transport.is_closing():
                        raise ConnectionResetError("websocket closed")
                    transport.write(frame_texts(texts[i:end]))
                    i = end
                    continue
            await send(texts[i], text_op)
            i += 1

    def _write_direct(self, wire: bytes, count: int) -> bool:
        """Write ``count`` live frames, ``wire`` (built once for every subscriber that shares
        them, :class:`~pipeline.chain.burst.SharedFrames`), now if nothing else can go first.

        Called by the outbox for an offer made while nothing is queued: writes only
        while neither sender holds texts, the transport's buffer is empty and ``wire``
        is smaller than its high-water mark, so the transport is not paused after it
        (what aiohttp's flow control waits for) and nothing sent before is still
        waiting to go; False (nothing written: queue them) otherwise. One
        ``transport.write`` and no coroutine per subscriber and block: the frames are
        the bytes aiohttp's ``send_frame`` writes for each text (the server's
        websockets are uncompressed), and a websocket that is closing gets nothing.
        """
        transport = self._transport
        if (
            self._writing
            or transport is None
            or len(wire) > self._inline_max
            or transport.get_write_buffer_size()
            or transport.is_closing()
            or self.ws.closed
        ):
            return False
        try:
            transport.write(wire)
        except Exception:
            # Runs in the hub's publisher: as in _send_inline, whatever one connection
            # raises ends that connection, logged once, never the live feed of the others.
            if not self._failure.done():
                log.exception("live send failed")
                self.metrics.inc("sluice_serve_internal_errors_total")
                self.fail(WSCloseCode.INTERNAL_ERROR, "internal error")
            return True  # (nothing to queue: the connection is closing)
        self.metrics.inc("sluice_serve_messages_sent_total", count)
        return True

    async def _send_inline(self) -> None:
        """The live fan-out's send (:class:`~pipeline.chain.outbox.FanoutBatch`): no task switch.

        Runs in the hub's task, so it must never wait: it sends only while the
        writer task holds nothing, the transport's write buffer is empty and
        the frame is smaller than its high-water mark. Then the protocol is not
        paused (asyncio pauses it only above the high-water mark) and aiohttp's
        ``send_frame``, which waits only for a paused protocol, completes at
        once. Anything else is left queued for the writer task, in order
        (``fanout_cpu_us_per_message`` of ``make bench B=resume``: a task
        wake-up per subscriber and block was about a fifth of the fan-out's CPU).
        """
        transport = self._transport
        if self._writing or transport is None or transport.get_write_buffer_size():
            return
        room, outbox, ws, sent = self._inline_max, self.outbox, self.ws, 0
        send, text_op = ws.send_frame, WSMsgType.TEXT
        self._writing = True
        try:
            while (text := outbox.peek()) is not None and len(text) < room and not ws.closed:
                outbox.pop()
                await send(text, text_op)
                sent += 1
                if transport.get_write_buffer_size():
                    break
        except ConnectionError:
            self.fail(WSCloseCode.GOING_AWAY, "connection lost")
        except Exception:
            # Runs in the hub's publisher: whatever one connection raises ends that
            # connection, logged, never the live feed of the others.
            log.exception("live send failed")
            self.metrics.inc("sluice_serve_internal_errors_total")
            self.fail(WSCloseCode.INTERNAL_ERROR, "internal error")
        finally:
            self._writing = False
        if sent:
            self.metrics.inc("sluice_serve_messages_sent_total", sent)


__all__ = ["Sending"]

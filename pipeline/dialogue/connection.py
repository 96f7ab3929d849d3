"""The asyncio layer of Dialogue: a :class:`Connection` over a byte channel.

It drives a :class:`pipeline.dialogue.protocol.Dialogue` machine with three
owned tasks: a reader (bytes in, events dispatched synchronously), a writer
(the one path every byte goes out through: it batches whatever the machine
produced since its last turn into one write, and drains), and, for async
message handlers, a message dispatcher. Request and duplex handlers run as
owned tasks, bounded in number; every task is awaited (or cancelled and
awaited) by :meth:`Connection.close`.

Handlers of incoming traffic are called as :mod:`pipeline.dialogue.handlers` says
(plain functions inline, coroutine functions in owned, bounded tasks).

Who does what: the machine alone changes the dialogue's state; this class
feeds it, turns its events into futures and handler calls (one table, keyed by
event type) and owns the tasks. The pieces it wires together: the reader and
writer task bodies (:mod:`~pipeline.dialogue.reader`,
:mod:`~pipeline.dialogue.writer`), our requests and duplexes in flight
(:mod:`~pipeline.dialogue.inflight`), the machine's deadline timer
(:mod:`~pipeline.dialogue.timer`) and the bounds
(:class:`~pipeline.dialogue.limits.ConnectionLimits`).
:class:`~pipeline.dialogue.duplex.Duplex` and
:class:`~pipeline.dialogue.handlers.HandlerRunner` reach the connection only
through the narrow ``DuplexHost`` / ``RunnerHost`` interfaces (the methods
under "for Duplex and HandlerRunner") and import nothing from here; the read
deadlines are the pure :class:`~pipeline.dialogue.readclock.ReadClock`.

Everything is bounded: the machine's output buffer (senders wait above
``write_high``), the message queue, the number of handler tasks and each
duplex's receive queue (above their bounds the reader stops reading the
transport until they drain), and :meth:`close` by its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Unpack

from pipeline.dialogue import events as ev
from pipeline.dialogue.channel import Channel, StreamChannel, WebSocket, WebSocketChannel
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.handlers import (
    HANDLER_FAILED,
    NO_HANDLER,
    DuplexHandler,
    HandlerRunner,
    MessageHandler,
    RequestHandler,
)
from pipeline.dialogue.inflight import InFlight, closed_error
from pipeline.dialogue.limits import DEFAULT_LIMITS, ConnectionLimits, LimitOptions
from pipeline.dialogue.protocol import Dialogue, Role, State
from pipeline.dialogue.readclock import ReadClock
from pipeline.dialogue.reader import Reader
from pipeline.dialogue.timer import DeadlineTimer
from pipeline.dialogue.writer import Writer
from pipeline.errors import (
    DialogueClosed,
    InternalProtocolError,
    ProtocolError,
)

log = logging.getLogger(__name__)


class Connection:
    """One Dialogue connection. Use ``async with`` or call :meth:`start` and :meth:`close`.

    Its bounds are ``limits`` (:class:`~pipeline.dialogue.limits.ConnectionLimits`).
    For compatibility, their fields are also accepted as keyword arguments
    (``Connection(ch, role, window=65536)``), applied over ``limits``; a bound
    that is not positive raises :class:`~pipeline.errors.ConfigError`.
    """

    def __init__(
        self,
        channel: Channel,
        role: Role,
        *,
        on_message: MessageHandler | None = None,
        on_request: RequestHandler | None = None,
        on_duplex: DuplexHandler | None = None,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        name: str = "dialogue",
        **options: Unpack[LimitOptions],
    ) -> None:
        self.limits = limits = limits.replace(**options) if options else limits
        self.channel = channel
        self.name = name
        self.close_timeout = limits.close_timeout
        self.end_timeout = limits.end_timeout
        self._proto = Dialogue(role, max_frame=limits.max_frame, window=limits.window)
        self._loop = asyncio.get_running_loop()
        self._inflight = InFlight(self._proto, self)
        self._runner = HandlerRunner(
            self,
            on_message=on_message,
            on_request=on_request,
            on_duplex=on_duplex,
            max_queued_messages=limits.max_queued_messages,
            max_handlers=limits.max_handlers,
            max_queued_bytes=limits.max_queued_bytes,
        )
        self._pressure: set[object] = set()
        self._read_allowed = asyncio.Event()
        self._read_allowed.set()
        self._timer = DeadlineTimer(self._proto, self._after)
        self._closed = asyncio.Event()
        self._dispatching = False
        self._on_event = self._event_table()
        self._tasks: list[asyncio.Task[None]] = []
        self._shutdown_task: asyncio.Future[None] | None = None
        #: Set when the dialogue ended: why, and the protocol error if it was one.
        #: Both are local (logs, callers); a peer is told only ``_wire_close``.
        self.close_reason: str | None = None
        self.error: ProtocolError | None = None
        self._wire_close: tuple[int, str] = (ev.CloseCode.GOING_AWAY, "going away")
        self._clock, self._reader, self._writer = self._io(limits)

    def _io(self, limits: ConnectionLimits) -> tuple[ReadClock, Reader, Writer]:
        """The read deadlines' clock, and the bodies of the reader and writer tasks."""
        clock = ReadClock(
            first_frame_timeout=limits.first_frame_timeout,
            frame_timeout=limits.frame_timeout,
            idle_timeout=limits.idle_timeout,
            started_at=self._loop.time(),
        )
        reader = Reader(
            self._proto,
            self.channel,
            clock,
            allowed=self._read_allowed,
            after=self._after,
            close_timeout=limits.close_timeout,
            name=self.name,
        )
        writer = Writer(self._proto, self.channel, clock, high=limits.write_high, after=self._after)
        return clock, reader, writer

    def _event_table(self) -> dict[type[ev.Event], Callable[[Any], None]]:
        """Event dispatch (see :meth:`_after`), by event type."""
        return {
            ev.ResponseReceived: self._inflight.on_response,
            ev.MessageReceived: self._runner.message_received,
            ev.RequestReceived: self._runner.request_received,
            ev.DuplexData: self._inflight.on_duplex_data,
            ev.RequestDeclined: self._inflight.on_request_failed,
            ev.RequestTimedOut: self._inflight.on_request_failed,
            ev.RequestAborted: self._inflight.on_request_failed,
            ev.PeerCancelledRequest: self._runner.request_cancelled,
            ev.DuplexOpened: self._runner.duplex_opened,
            ev.DuplexEnded: self._inflight.on_duplex_ended,
            ev.DuplexClosed: self._inflight.on_duplex_closed,
            ev.DuplexWritable: self._inflight.on_duplex_writable,
            ev.CloseRequested: self._on_close_requested,
            ev.PeerClosing: self._on_peer_closing,
            ev.ConnectionClosed: self._connection_closed,
        }

    # ---------------------------------------------------------------- factories

    @classmethod
    async def connect(cls, host: str, port: int, **options: Any) -> Connection:
        """Open a TCP connection as the client and start it."""
        reader, writer = await asyncio.open_connection(host, port)
        conn = cls(StreamChannel(reader, writer), Role.CLIENT, **options)
        conn.start()
        return conn

    @classmethod
    def over_streams(
        cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, role: Role, **options: Any
    ) -> Connection:
        return cls(StreamChannel(reader, writer), role, **options)

    @classmethod
    def over_websocket(cls, ws: WebSocket, role: Role, **options: Any) -> Connection:
        return cls(WebSocketChannel(ws), role, **options)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._tasks:
            return
        self._tasks.append(self._loop.create_task(self._reader.run(), name=f"{self.name}-reader"))
        self._tasks.append(self._loop.create_task(self._write(), name=f"{self.name}-writer"))
        if self._runner.messages_async:
            self._tasks.append(
                self._loop.create_task(
                    self._runner.dispatch_messages(), name=f"{self.name}-messages"
                )
            )
        self._after()  # a flow-control HELLO may be waiting

    async def __aenter__(self) -> Connection:
        self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def role(self) -> Role:
        return self._proto.role

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def reading(self) -> bool:
        return self._read_allowed.is_set()  # False while backpressure holds the reading

    @property
    def protocol(self) -> Dialogue:
        """The state machine (read-only use: statistics, state)."""
        return self._proto

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (a machine deadline)
        """Close as the seed says for our role, bounded by ``timeout``; then stop every task.

        Safe to call twice and from several tasks.
        """
        timeout = self.close_timeout if timeout is None else timeout
        if not self.closed and self._tasks:
            self._proto.close(deadline=self._loop.time() + timeout)
            self._after()
            try:
                async with asyncio.timeout(timeout + 0.5):
                    await self._closed.wait()
            except TimeoutError:
                self._proto.abort("close timed out")
                self._after()
        if self._shutdown_task is None:
            self._shutdown_task = self._loop.create_future()
            try:
                await self._shutdown()
            finally:
                self._shutdown_task.set_result(None)
        else:
            await asyncio.shield(self._shutdown_task)

    async def _shutdown(self) -> None:
        self._proto.abort("closed")
        self._after()
        writer = self._tasks[1] if len(self._tasks) > 1 else None
        if writer is not None:
            try:
                async with asyncio.timeout(self.close_timeout):
                    await asyncio.shield(writer)
            except TimeoutError:
                self.channel.abort()
        handlers = self._runner.tasks()
        for task in [*self._tasks, *handlers]:
            task.cancel()
        results = await asyncio.gather(*self._tasks, *handlers, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("%s: task failed", self.name, exc_info=result)
        try:
            async with asyncio.timeout(self.close_timeout):
                await self.channel.close(*self._wire_close)
        except TimeoutError:
            self.channel.abort()
        self._timer.cancel()

    # -------------------------------------------------------------- operations

    async def send_message(self, data: bytes) -> None:
        """Send one message (waits only when the output buffer is over its bound)."""
        self._proto.send_message(data)
        self._after()
        if self._proto.bytes_to_send > self.limits.write_high:
            await self._wait_flushed()

    async def request(self, data: bytes, *, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        """Send a request and return the response data.

        Raises :class:`RequestCancelled` if the peer declined, ``TimeoutError``
        after ``timeout`` (the request is then cancelled on the wire) and
        :class:`DialogueClosed` if the dialogue ended first. Cancelling the
        caller cancels the request on the wire.
        """
        deadline = None if timeout is None else self._loop.time() + timeout
        pid = self._proto.send_request(data, deadline=deadline)
        future = self._inflight.expect_response(pid)
        try:
            self._after()
            if self._proto.bytes_to_send > self.limits.write_high:
                await self._wait_flushed()
            return await future
        except asyncio.CancelledError:
            if self._proto.cancel_request(pid):
                self._after()
            raise
        finally:
            self._inflight.forget_request(pid)

    def duplex(self, data: bytes | None = None) -> Duplex:
        """Open a duplex: ``async with conn.duplex() as d:`` (DuplexInitial carries ``data``)."""
        duplex = self._new_duplex(self._proto.open_duplex(data), True, None)
        self._after()
        return duplex

    # ------------------------------------------- for Duplex and HandlerRunner
    # The narrow interfaces those two use (DuplexHost, RunnerHost); nothing else
    # of the connection is theirs to touch.

    def send_credit(self, duplex: Duplex) -> int | None:
        return self._proto.send_credit(duplex.id, duplex.local)

    async def duplex_send(self, duplex: Duplex, data: bytes) -> None:
        self._proto.duplex_send(duplex.id, duplex.local, data)
        self._after()
        if self._proto.bytes_to_send > self.limits.write_high:
            await self._wait_flushed()

    async def duplex_end(self, duplex: Duplex, error: bytes | None) -> None:
        if duplex.failed or self._proto.state is State.CLOSED:
            return
        deadline = self._loop.time() + self.end_timeout
        self._proto.duplex_end(duplex.id, duplex.local, error, deadline=deadline)
        self._after()
        if self._proto.bytes_to_send > self.limits.write_high:
            await self._wait_flushed()

    def duplex_consumed(self, duplex: Duplex, nbytes: int, low: bool) -> None:
        if nbytes:
            self._proto.consumed(duplex.id, duplex.local, nbytes)
        if low:
            self.resume_reading(duplex)
        self._after()

    def respond(self, pid: int, data: bytes | None) -> None:
        if self._proto.respond(pid, data):
            self._after()

    def accept_duplex(self, pid: int, data: bytes | None) -> Duplex:
        duplex = self._new_duplex(pid, False, data)
        duplex.sending = self._proto.can_send(pid, False)
        return duplex

    def refuse_duplex(self, duplex: Duplex, error: bytes) -> None:
        if duplex.sending:
            duplex.sending = False
            self._proto.duplex_end(duplex.id, duplex.local, error)
            self._after()

    def pause_reading(self, key: object) -> None:
        self._pressure.add(key)
        self._read_allowed.clear()

    def resume_reading(self, key: object) -> None:
        if key in self._pressure:
            self._pressure.discard(key)
            if not self._pressure:
                self._read_allowed.set()

    # ------------------------------------------------------------------ engine

    def _after(self) -> None:
        """Dispatch new events, wake the writer, keep the deadline timer right.

        Called after every input to the machine. A call made while events are
        being dispatched (a handler answering inline) returns at once: the
        outer call dispatches what it produced, in order.
        """
        if self._dispatching:
            return
        proto = self._proto
        events = proto.events_received()
        if events:
            self._dispatching = True
            try:
                on_event = self._on_event
                while events:
                    for event in events:
                        on_event[type(event)](event)
                    events = proto.events_received()
            finally:
                self._dispatching = False
        self._writer.wake()
        self._timer.update()

    @property
    def frames_received(self) -> int:
        """Complete frames the peer sent so far (0: it has not proved it speaks Dialogue)."""
        return self._proto.stats.frames_in

    def abort(self, reason: str) -> None:
        """End the dialogue at once (no close exchange); :meth:`close` still cleans up."""
        self._proto.abort(reason)
        self._after()

    @property
    def started_at(self) -> float:
        """Loop time of the start."""
        return self._clock.started_at

    @property
    def last_activity(self) -> float:
        """Loop time of the last byte read or written."""
        return self._clock.last_activity

    async def _write(self) -> None:
        """The writer task: write until the dialogue is over, then close the channel."""
        await self._writer.run()
        await self.channel.close(*self._wire_close)

    async def _wait_flushed(self) -> None:
        """Wait while more than ``write_high`` bytes are unwritten (DialogueClosed if never)."""
        if not await self._writer.flushed():
            raise DialogueClosed(self.close_reason or "dialogue closed")

    # ---------------------------------------------------------- event dispatch

    def _on_close_requested(self, event: ev.CloseRequested) -> None:
        # The server wants to close: as the client we start the close ourselves.
        self._proto.close(deadline=self._loop.time() + self.close_timeout)

    def _on_peer_closing(self, event: ev.PeerClosing) -> None:
        """(server) Nothing to do: the machine answers once outstanding work is done."""

    def _connection_closed(self, event: ev.ConnectionClosed) -> None:
        self.close_reason = event.reason
        self.error = event.error
        self._wire_close = event.public()
        if isinstance(event.error, InternalProtocolError):
            log.error("%s: internal error, closing", self.name, exc_info=event.error.__cause__)
        elif event.error is not None:
            log.warning("%s: protocol error, closing: %s", self.name, event.error)
        self._inflight.fail_all(closed_error(self._proto))
        self._runner.connection_closed()
        self._pressure.clear()
        self._read_allowed.set()
        self._closed.set()

    def _new_duplex(self, pid: int, local: bool, data: bytes | None) -> Duplex:
        return self._inflight.add_duplex(Duplex(self, pid, local, data, self.limits.duplex_high))


__all__ = ["HANDLER_FAILED", "NO_HANDLER", "Connection", "Duplex", "Role"]

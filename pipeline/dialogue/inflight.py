"""Our work in flight on a connection: request futures and duplexes, settled by the machine's events.

A :class:`InFlight` holds the future of every request we sent and is waiting
on, and every open :class:`~pipeline.dialogue.duplex.Duplex` (ours and the
peer's), by id. The connection's event table sends it the events about them
(a response, a declined, timed-out or aborted request, duplex data, ends and
closes); it resolves the futures and drives the duplexes, and when the
dialogue ends, :meth:`InFlight.fail_all` fails whatever is left with
:func:`closed_error`. Backpressure (a duplex's queue over its bound) goes back
to the connection through the narrow :class:`Backpressure` interface.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from pipeline.dialogue import events as ev
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.protocol import Dialogue
from pipeline.dialogue.states import State
from pipeline.errors import DialogueClosed, DialogueError, RequestCancelled


class Backpressure(Protocol):
    """What :class:`InFlight` needs from its connection: stopping and resuming its reading."""

    def pause_reading(self, key: object) -> None: ...

    def resume_reading(self, key: object) -> None: ...


def closed_error(proto: Dialogue) -> DialogueError:
    """The error for work the ended dialogue cut short (caused by its protocol error, if any)."""
    error = proto.error
    if error is not None:
        exc = DialogueClosed(f"dialogue closed: {error}")
        exc.__cause__ = error
        return exc
    return DialogueClosed(f"dialogue closed: {proto.close_reason}")


class InFlight:
    """The futures of our pending requests and the open duplexes of one connection."""

    def __init__(self, proto: Dialogue, reading: Backpressure) -> None:
        self._proto = proto
        self._reading = reading
        self._loop = asyncio.get_running_loop()
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._duplexes: dict[tuple[int, bool], Duplex] = {}

    def expect_response(self, pid: int) -> asyncio.Future[bytes]:
        """The future of our request ``pid``'s answer; call :meth:`forget_request` when done."""
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._pending[pid] = future
        return future

    def forget_request(self, pid: int) -> None:
        del self._pending[pid]

    def add_duplex(self, duplex: Duplex) -> Duplex:
        self._duplexes[(duplex.id, duplex.local)] = duplex
        return duplex

    def fail_all(self, error: DialogueError) -> None:
        """The dialogue ended: every pending request and open duplex fails with ``error``."""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for duplex in self._duplexes.values():
            duplex.fail(error)
        self._duplexes.clear()

    # ------------------------------------------------------------------ events

    def on_response(self, event: ev.ResponseReceived) -> None:
        future = self._pending.get(event.id)
        if future is not None and not future.done():
            future.set_result(event.data)

    def on_request_failed(
        self, event: ev.RequestDeclined | ev.RequestTimedOut | ev.RequestAborted
    ) -> None:
        future = self._pending.get(event.id)
        if future is None or future.done():
            return
        if isinstance(event, ev.RequestDeclined):
            future.set_exception(RequestCancelled("the peer declined the request"))
        elif isinstance(event, ev.RequestTimedOut):
            future.set_exception(TimeoutError("request timed out"))
        else:
            future.set_exception(closed_error(self._proto))

    def on_duplex_data(self, event: ev.DuplexData) -> None:
        duplex = self._duplexes.get((event.id, event.local))
        if duplex is not None and duplex.feed(event.data):
            self._reading.pause_reading(duplex)

    def on_duplex_ended(self, event: ev.DuplexEnded) -> None:
        duplex = self._duplexes.get((event.id, event.local))
        if duplex is not None:
            duplex.peer_end(event.error)

    def on_duplex_closed(self, event: ev.DuplexClosed) -> None:
        duplex = self._duplexes.pop((event.id, event.local), None)
        if duplex is not None:
            self._reading.resume_reading(duplex)
            if event.abandoned and not duplex.peer_ended:
                closing = self._proto.state is State.CLOSED
                duplex.fail(
                    closed_error(self._proto) if closing else TimeoutError("peer never ended")
                )
            duplex.sending = False

    def on_duplex_writable(self, event: ev.DuplexWritable) -> None:
        duplex = self._duplexes.get((event.id, event.local))
        if duplex is not None:
            duplex.wake_writer()


__all__ = ["Backpressure", "InFlight", "closed_error"]

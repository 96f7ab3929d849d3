"""The reading side of a connection: the channel's bytes into the machine, within the read deadlines.

A :class:`Reader` is the body of a connection's reader task. It waits while
the connection's backpressure holds it (``allowed`` clear), and acts on a
missed read deadline itself (:class:`~pipeline.dialogue.readclock.ReadClock`):
an idle connection with nothing outstanding starts its close, a peer too slow
to send a frame is dropped. Whatever ends the reading (the machine closed, the
transport failed, a bug) ends the dialogue through the machine, never by
raising: after every input it calls ``after``, which dispatches the events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pipeline.dialogue.channel import Channel
from pipeline.dialogue.protocol import Dialogue
from pipeline.dialogue.readclock import Overdue, ReadClock
from pipeline.dialogue.states import State
from pipeline.errors import RemoteProtocolError

log = logging.getLogger(__name__)

#: Seconds between two looks at the channel while reading is paused (has the peer left?).
PAUSED_LOOK_S = 1.0


class Reader:
    """Feeds the channel to the machine until the dialogue is closed."""

    def __init__(
        self,
        proto: Dialogue,
        channel: Channel,
        clock: ReadClock,
        *,
        allowed: asyncio.Event,
        after: Callable[[], None],
        close_timeout: float,
        name: str,
    ) -> None:
        self._proto = proto
        self._channel = channel
        self._clock = clock
        self._allowed = allowed
        self._after = after
        self._close_timeout = close_timeout
        self._name = name
        self._loop = asyncio.get_running_loop()

    async def run(self) -> None:
        """Read until the machine is closed; a failure closes the dialogue instead of raising."""
        proto = self._proto
        clock = self._clock
        try:
            while proto.state is not State.CLOSED:
                if not self._allowed.is_set():
                    if not await self._paused():
                        return
                    clock.resumed(self._loop.time())
                data = await self._read()
                if data is None:
                    self._after()
                    continue
                if data:
                    before = proto.stats.frames_in
                    proto.receive_data(data)
                    clock.received(
                        self._loop.time(),
                        completed=proto.stats.frames_in != before,
                        buffered=proto.buffered,
                    )
                else:
                    proto.receive_eof()
                self._after()
        except (ConnectionError, OSError) as exc:
            proto.abort(f"read failed: {exc!r}")
            self._after()
        except RemoteProtocolError as exc:  # the channel's own check (a websocket text message)
            proto.peer_failed(exc)
            self._after()
        except Exception as exc:  # noqa: BLE001 - a bug must end this connection, not leave it half alive
            # (logged with its traceback when the close is dispatched; the peer
            # is told "internal error" only)
            proto.internal_error(exc)
            self._after()

    async def _paused(self) -> bool:
        """Wait while backpressure holds the reading; False when the peer left meanwhile.

        A peer that leaves is not seen by a reader that does not read: its
        duplexes and requests went on being served (RSS rising for minutes
        after it closed). The channel is looked at every :data:`PAUSED_LOOK_S`.
        """
        while not self._allowed.is_set():
            try:
                async with asyncio.timeout(PAUSED_LOOK_S):
                    await self._allowed.wait()
            except TimeoutError:
                if self._channel.peer_gone():
                    log.info("%s: the peer left while reading was paused", self._name)
                    self._proto.abort("the peer left while reading was paused")
                    self._after()
                    return False
        return True

    async def _read(self) -> bytes | None:
        """The next chunk from the channel; None when a read deadline passed (already acted on)."""
        clock = self._clock
        due = clock.deadline(self._proto.stats.frames_in)
        if due is None:
            return await self._channel.read()
        deadline, what = due
        try:
            async with asyncio.timeout_at(deadline):
                return await self._channel.read()
        except TimeoutError:
            if self._loop.time() < deadline:
                raise  # the channel's own timeout, not ours
        if what is Overdue.IDLE:
            # Writes may have moved it, and outstanding work defers it.
            if clock.deadline(self._proto.stats.frames_in) == due and not any(
                self._proto.outstanding()
            ):
                clock.idle_closing = True
                log.info("%s: idle for %.0fs, closing", self._name, clock.idle_timeout)
                self._proto.close(deadline=self._loop.time() + self._close_timeout)
        else:
            log.warning("%s: %s in time, dropping the connection", self._name, what.value)
            error = RemoteProtocolError(f"{what.value} in time", public="timeout")
            self._proto.peer_failed(error)
        return None


__all__ = ["Reader"]

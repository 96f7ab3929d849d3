"""The bounds of one Dialogue connection, as one frozen settings object checked when built.

``Connection(channel, role, limits=ConnectionLimits(window=65536))`` takes
them; a :class:`ConnectionLimits` that exists is valid (every bound given is
positive), so a connection never starts with a bound that cannot hold.

The same names are still accepted as keyword arguments of ``Connection``
(:class:`LimitOptions`, the compatibility path): they are applied over
``limits`` with :meth:`ConnectionLimits.replace`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypedDict, Unpack

from pipeline.dialogue.packets import DEFAULT_MAX_FRAME
from pipeline.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """Every bound of a :class:`~pipeline.dialogue.connection.Connection`; the defaults are the
    connection's. ``None`` turns an optional bound off. Sizes are bytes, times seconds."""

    #: The largest frame sent or accepted (a larger one from the peer is a protocol error).
    max_frame: int = DEFAULT_MAX_FRAME
    #: The flow-control window offered to the peer (None: the seed's wire, no flow control).
    window: int | None = None
    #: Bytes one duplex's receive queue holds before the connection stops reading.
    duplex_queue_bytes: int = 1 << 20
    #: Messages waiting for an async message handler before the connection stops reading.
    max_queued_messages: int = 1024
    #: Their bytes, likewise.
    max_queued_bytes: int = 8 << 20
    #: Async request handlers, and duplex handlers, running at once (each).
    max_handlers: int = 256
    #: Bytes the machine may hold unwritten before senders wait.
    write_high: int = 1 << 18
    #: How long :meth:`Connection.close` waits for the seed's close exchange.
    close_timeout: float = 5.0
    #: How long a duplex we opened and ended waits for the peer's end.
    end_timeout: float = 10.0
    #: The peer must complete its first frame this long after the start.
    first_frame_timeout: float | None = None
    #: The peer must complete any frame this long after its first byte.
    frame_timeout: float | None = None
    #: The connection closes itself after this long with no byte either way and nothing outstanding.
    idle_timeout: float | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            # `not value > 0` also refuses NaN.
            if value is not None and not value > 0:
                raise ConfigError(f"ConnectionLimits.{field.name} must be positive, not {value!r}")

    def replace(self, **changes: Unpack[LimitOptions]) -> ConnectionLimits:
        """A copy with ``changes`` applied, checked like a new one."""
        return dataclasses.replace(self, **changes)

    @property
    def duplex_high(self) -> int:
        """The receive-queue bound one duplex is given.

        Flow control grants back half a window at a time, so the queue must
        hold a whole window (plus one frame) before the fallback pauses reading.
        """
        if self.window is None:
            return self.duplex_queue_bytes
        return max(self.duplex_queue_bytes, self.window + self.max_frame)


#: The connection's bounds when none are given.
DEFAULT_LIMITS = ConnectionLimits()


class LimitOptions(TypedDict, total=False):
    """The fields of :class:`ConnectionLimits` as keyword arguments (the compatibility path)."""

    max_frame: int
    window: int | None
    duplex_queue_bytes: int
    max_queued_messages: int
    max_queued_bytes: int
    max_handlers: int
    write_high: int
    close_timeout: float
    end_timeout: float
    first_frame_timeout: float | None
    frame_timeout: float | None
    idle_timeout: float | None


__all__ = ["DEFAULT_LIMITS", "ConnectionLimits", "LimitOptions"]

"""Events the Dialogue state machine reports to its I/O layer.

Frozen, slotted, keyword-only dataclasses (h11's style). A duplex is named by
``(id, local)``: ``local`` is True for a duplex this side opened, because the
two peers pick duplex ids independently.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pipeline.errors import (
    InternalProtocolError,
    PayloadTooLarge,
    ProtocolError,
    RemoteProtocolError,
)

#: A websocket close frame's reason holds at most 123 bytes (RFC 6455, 5.5).
MAX_CLOSE_REASON = 123


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every Dialogue event."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageReceived(Event):
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReceived(Event):
    """The peer asks; answer with ``Dialogue.respond(id, data)``."""

    id: int
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerCancelledRequest(Event):
    """The peer cancelled a request it sent us: answering is now optional.

    (Not :class:`pipeline.errors.RequestCancelled`, which our own caller gets.)
    """

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseReceived(Event):
    id: int
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDeclined(Event):
    """The peer answered our request with an empty response."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTimedOut(Event):
    """Our request passed its deadline; the machine sent the cancellation."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestAborted(Event):
    """Our request can no longer be answered (the dialogue is closing or closed)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplexOpened(Event):
    """The peer opened a duplex (``local`` is always False); ``data`` from DuplexInitial."""

    id: int
    data: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplexData(Event):
    id: int
    local: bool
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplexEnded(Event):
    """The peer will send no more on this duplex; ``error`` is its error data, if any."""

    id: int
    local: bool
    error: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplexClosed(Event):
    """Both halves are done (or we stopped waiting for the peer's end): the id is forgotten."""

    id: int
    local: bool
    abandoned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplexWritable(Event):
    """Flow control: the peer granted credit again for our sending half."""

    id: int
    local: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseRequested(Event):
    """(client) The server signalled it wants to close: call ``close()``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerClosing(Event):
    """(server) The client closed: finish outstanding work, then the machine answers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionClosed(Event):
    """The dialogue is over. ``error`` is set for a protocol violation; ``reason`` always.

    ``reason`` and the text of ``error`` are local: they may name internals
    (an exception's repr, an id, a size) and go to the logs only. What a peer
    may be told is :meth:`public`.
    """

    reason: str
    clean: bool
    error: ProtocolError | None = None

    def public(self) -> tuple[CloseCode, str]:
        """The close as a peer may see it: a close code and a fixed, public text.

        The one boundary where a Dialogue close becomes wire text (a websocket
        close frame; the seed's TCP wire carries no reason). Only
        ``public_message`` texts cross it: ``internal error`` for a bug on this
        side, the error's public text for a protocol error, none for a clean
        close, ``going away`` for a local abort (eviction, shutdown, a lost
        transport).
        """
        error = self.error
        if error is None:
            return (CloseCode.NORMAL, "") if self.clean else (CloseCode.GOING_AWAY, "going away")
        if isinstance(error, PayloadTooLarge):
            code = CloseCode.MESSAGE_TOO_BIG
        elif isinstance(error, RemoteProtocolError):
            code = CloseCode.PROTOCOL_ERROR
        else:  # our own side broke the protocol: InternalProtocolError, LocalProtocolError
            code = CloseCode.INTERNAL_ERROR
        text = error.public_message
        if isinstance(error, InternalProtocolError):
            text = InternalProtocolError.public_message  # never a text a bug's raiser chose
        return code, text.encode()[:MAX_CLOSE_REASON].decode(errors="ignore")


class CloseCode(enum.IntEnum):
    """Websocket close codes (RFC 6455, 7.4.1) a Dialogue close maps to."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011

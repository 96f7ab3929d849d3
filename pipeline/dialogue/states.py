"""The Dialogue machine's states and transition tables (data, not code: h11's style).

Only :mod:`pipeline.dialogue.protocol` reads these tables and changes state;
see it for the theory of operation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pipeline.dialogue.packets import PacketType


class Role(enum.Enum):
    """Which end of a Dialogue connection this is (the seed's close rules differ)."""

    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    #: Normal operation.
    OPEN = "open"
    #: Server: it sent its close signal. Client: it received one. Still normal operation.
    SIGNALLED = "signalled"
    #: Client: it sent its empty Message and sends nothing more.
    #: Server: it received the client's and is finishing what is outstanding.
    CLOSING = "closing"
    CLOSED = "closed"


class CloseAction(enum.Enum):
    """What the machine does with the peer's empty Message."""

    #: (client) The server asks us to close: -> SIGNALLED, report CloseRequested.
    CLOSE_REQUESTED = "close_requested"
    #: (client) A repeated request to close: nothing to do.
    IGNORE = "ignore"
    #: (client) The server's answer to our close: the dialogue ended cleanly.
    CLOSED = "closed"
    #: (server) The client closed: -> CLOSING, finish what is outstanding.
    PEER_CLOSING = "peer_closing"
    #: (server) A second close from the client: a protocol error.
    ERROR = "error"


# What an empty Message from the peer does, by (our role, our state).
ON_CLOSE_MESSAGE: dict[tuple[Role, State], CloseAction] = {
    (Role.CLIENT, State.OPEN): CloseAction.CLOSE_REQUESTED,
    (Role.CLIENT, State.SIGNALLED): CloseAction.IGNORE,
    (Role.CLIENT, State.CLOSING): CloseAction.CLOSED,
    (Role.SERVER, State.OPEN): CloseAction.PEER_CLOSING,
    (Role.SERVER, State.SIGNALLED): CloseAction.PEER_CLOSING,
    (Role.SERVER, State.CLOSING): CloseAction.ERROR,
}

# What a local close() does, by (our role, our state): (send empty Message, new state).
ON_LOCAL_CLOSE: dict[tuple[Role, State], tuple[bool, State]] = {
    (Role.CLIENT, State.OPEN): (True, State.CLOSING),
    (Role.CLIENT, State.SIGNALLED): (True, State.CLOSING),
    (Role.CLIENT, State.CLOSING): (False, State.CLOSING),
    (Role.SERVER, State.OPEN): (True, State.SIGNALLED),
    (Role.SERVER, State.SIGNALLED): (False, State.SIGNALLED),
    (Role.SERVER, State.CLOSING): (False, State.CLOSING),
}

# May we start something new (message, request, duplex)?
CAN_START = {State.OPEN, State.SIGNALLED}
# May we continue what is outstanding (respond, duplex data and ends), by role?
CAN_CONTINUE: dict[Role, set[State]] = {
    Role.CLIENT: {State.OPEN, State.SIGNALLED},
    Role.SERVER: {State.OPEN, State.SIGNALLED, State.CLOSING},
}


class Half(enum.Enum):
    """The receiving half of a duplex, as a duplex packet finds it."""

    #: No duplex of that id: never opened, or forgotten once both halves ended.
    NONE = "none"
    OPEN = "open"
    ENDED = "ended"


class HalfAction(enum.Enum):
    """What a duplex packet does to the receiving half it finds."""

    #: (DuplexInitial) A new duplex, both halves open: report DuplexOpened.
    OPEN = "open"
    #: Data for the application (a packet without data is malformed): report DuplexData.
    DATA = "data"
    #: The receiving half ends: report DuplexEnded; forget the duplex if our half ended too.
    END = "end"
    #: A late packet for a duplex of ours we forgot: ignored if we issued the id, else an error.
    STALE = "stale"
    #: Protocol errors: an id the peer never opened, one already in use, a packet after the end.
    UNKNOWN_ID = "unknown id"
    DUPLICATE_ID = "duplicate id"
    AFTER_END = "after end"


# Which duplex a duplex packet names: True for one we opened (the id is ours),
# False for one the peer opened (the id is the peer's, see "Ids" in protocol).
DUPLEX_PACKET_LOCAL: dict[PacketType, bool] = {
    PacketType.DUPLEX_INITIAL: False,
    PacketType.DUPLEX_REQUEST: False,
    PacketType.DUPLEX_REQUEST_END: False,
    PacketType.DUPLEX_RESPONSE: True,
    PacketType.DUPLEX_RESPONSE_END: True,
}

# What a duplex packet from the peer does, by (packet type, the receiving half it finds).
ON_DUPLEX_PACKET: dict[tuple[PacketType, Half], HalfAction] = {
    (PacketType.DUPLEX_INITIAL, Half.NONE): HalfAction.OPEN,
    (PacketType.DUPLEX_INITIAL, Half.OPEN): HalfAction.DUPLICATE_ID,
    (PacketType.DUPLEX_INITIAL, Half.ENDED): HalfAction.DUPLICATE_ID,
    (PacketType.DUPLEX_REQUEST, Half.NONE): HalfAction.UNKNOWN_ID,
    (PacketType.DUPLEX_REQUEST, Half.OPEN): HalfAction.DATA,
    (PacketType.DUPLEX_REQUEST, Half.ENDED): HalfAction.AFTER_END,
    (PacketType.DUPLEX_REQUEST_END, Half.NONE): HalfAction.UNKNOWN_ID,
    (PacketType.DUPLEX_REQUEST_END, Half.OPEN): HalfAction.END,
    (PacketType.DUPLEX_REQUEST_END, Half.ENDED): HalfAction.AFTER_END,
    (PacketType.DUPLEX_RESPONSE, Half.NONE): HalfAction.STALE,
    (PacketType.DUPLEX_RESPONSE, Half.OPEN): HalfAction.DATA,
    (PacketType.DUPLEX_RESPONSE, Half.ENDED): HalfAction.AFTER_END,
    (PacketType.DUPLEX_RESPONSE_END, Half.NONE): HalfAction.STALE,
    (PacketType.DUPLEX_RESPONSE_END, Half.OPEN): HalfAction.END,
    (PacketType.DUPLEX_RESPONSE_END, Half.ENDED): HalfAction.AFTER_END,
}


@dataclass(slots=True)
class DuplexHalves:
    """The machine's record of one duplex: its two halves and flow-control counters."""

    send_open: bool = True
    recv_open: bool = True
    #: Flow control: bytes we may still send (meaningful once the peer said HELLO).
    credit: int = 0
    #: Flow control: bytes received and consumed but not yet granted back.
    consumed: int = 0
    end_deadline: float | None = None


@dataclass(slots=True)
class Stats:
    """Counters of one machine."""

    frames_in: int = 0
    frames_out: int = 0
    stale_ignored: int = 0
    timeouts: int = 0

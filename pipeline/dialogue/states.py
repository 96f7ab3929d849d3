"""The Dialogue machine's states and transition tables (data, not code: h11's style).

Only :mod:`pipeline.dialogue.protocol` reads these tables and changes state;
see it for the theory of operation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


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

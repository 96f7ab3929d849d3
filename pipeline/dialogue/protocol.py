"""The Dialogue protocol as a state machine with no I/O (sans-IO).

Theory of operation
-------------------
Bytes come in through :meth:`Dialogue.receive_data` / :meth:`receive_eof`;
local intentions go in through commands (:meth:`send_message`,
:meth:`send_request`, :meth:`respond`, :meth:`open_duplex`,
:meth:`duplex_send`, :meth:`duplex_end`, :meth:`close`). Out come
:meth:`events_received` (what the peer did), :meth:`data_to_send` (bytes to
write, batched) and :meth:`close_expected` (the transport should be closed).

Every transition is decided in this module: the commands below, the
receiving side (one method per packet type, indexed by type in
:data:`_RECEIVE`) and the deadlines. The transitions that are pure data (what
a close does, by role and state; what a duplex packet does to the half it
finds) are the tables of enums in :mod:`~pipeline.dialogue.states`, read here
and nowhere else. What the machine holds (open requests and duplexes, issued
ids, queued frames, events, deadlines) and the bookkeeping every transition
shares (queue a frame, allocate an id, forget a duplex, end the dialogue) is
its base class, :class:`~pipeline.dialogue.ledger.Ledger`.

The parser never raises to the caller: a malformed frame, an unknown type, an
oversize frame or a packet for an id in the wrong state closes the dialogue
with a :class:`ConnectionClosed` event carrying the reason, and so does any
other exception while handling what arrived (a bug here: the dialogue closes
with an :class:`InternalProtocolError` whose cause is the bug, as websockets
closes with 1011, instead of staying open with a dead reader). Commands that
the protocol forbids *locally* raise :class:`LocalProtocolError` (or
:class:`DialogueClosed` once closing).

Ids. Request and duplex ids are chosen by the side that opens them, so the
two peers' ids live in separate spaces: a ``Request``/``DuplexInitial``
names the *sender's* id, a ``Response``/``DuplexResponse`` the *receiver's*.
We hand out our ids from one u32 counter, so "an id we issued" is decidable
without memory: a late packet for an id we issued and forgot (a cancelled
request, an abandoned duplex) is ignored; one for an id we never issued is a
protocol error.

Duplex halves. Each duplex has a sending and a receiving half, each open or
ended. A duplex packet from the peer acts on the receiving half: the peer's
``DuplexInitial`` opens a duplex (both halves open), ``DuplexRequest`` /
``DuplexResponse`` carry data, and ``DuplexRequestEnd`` / ``DuplexResponseEnd``
end the half. The ``Request`` packets name a duplex the peer opened, the
``Response`` packets one we opened (:data:`~pipeline.dialogue.states.DUPLEX_PACKET_LOCAL`).
What each does, by the state of the half it finds (none, open, ended), is the
:data:`~pipeline.dialogue.states.ON_DUPLEX_PACKET` table: a packet for a half
that ended is an error, and one for a duplex that is gone is an error too,
unless it is a late packet for a duplex of ours (ignored if we issued the id).
A duplex is forgotten when both halves ended. Half-close works both ways:
either side may keep sending after the other ended (the seed's "unidirectional
stream with a single response after its end" needs exactly that).

Closing (the seed's asymmetric shutdown) is the :data:`~pipeline.dialogue.states.ON_CLOSE_MESSAGE` and
:data:`~pipeline.dialogue.states.ON_LOCAL_CLOSE` tables. A client's close sends an empty ``Message`` and
then nothing at all, which implicitly ends every sending half it had; the
server, on receiving it, aborts its own requests (they cannot be answered),
lets the application answer what is outstanding, and answers with the empty
``Message`` as soon as nothing is left.

Deadlines. The machine has no clock. Commands take absolute deadlines in the
caller's clock; :meth:`next_deadline` says when to call :meth:`expire`, which
times out requests, abandons duplexes whose end never came and ends a close
that took too long. The asyncio layer enforces them.

Flow control (optional, see WIRE.md and :mod:`control`): with ``window`` set,
the machine sends a HELLO first; once the peer's HELLO arrives, duplex data we
send is limited by the credit the peer grants (:meth:`send_credit`,
:class:`DuplexWritable`), and the data we receive is granted back as the
application reports it consumed (:meth:`consumed`). Without ``window`` the
wire is exactly the seed's.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.dialogue import control
from pipeline.dialogue.deadlines import DeadlineKind
from pipeline.dialogue.events import (
    CloseRequested,
    DuplexData,
    DuplexOpened,
    MessageReceived,
    PeerCancelledRequest,
    RequestDeclined,
    RequestReceived,
    RequestTimedOut,
    ResponseReceived,
)
from pipeline.dialogue.ledger import Ledger
from pipeline.dialogue.packets import (
    DEFAULT_MAX_FRAME,
    DUPLEX_INITIAL,
    DUPLEX_REQUEST,
    DUPLEX_REQUEST_END,
    DUPLEX_RESPONSE,
    DUPLEX_RESPONSE_END,
    MAX_ID,
    MESSAGE,
    REQUEST,
    RESPONSE,
    PacketType,
)
from pipeline.dialogue.states import (
    CAN_CONTINUE,
    CAN_START,
    DUPLEX_PACKET_LOCAL,
    ON_CLOSE_MESSAGE,
    ON_DUPLEX_PACKET,
    ON_LOCAL_CLOSE,
    CloseAction,
    DuplexHalves,
    Half,
    HalfAction,
    Role,
    State,
)
from pipeline.errors import DialogueClosed, LocalProtocolError, ProtocolError, RemoteProtocolError

#: Default bounds on what a peer may keep open on us (exceeding one is a protocol error).
DEFAULT_MAX_INCOMING_REQUESTS = 4096
DEFAULT_MAX_DUPLEXES = 1024


class Dialogue(Ledger):
    """One side of a Dialogue connection. Not thread-safe; no I/O."""

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        window: int | None = None,
        max_incoming_requests: int = DEFAULT_MAX_INCOMING_REQUESTS,
        max_duplexes: int = DEFAULT_MAX_DUPLEXES,
    ) -> None:
        if window is not None and not 0 < window <= MAX_ID:
            raise LocalProtocolError(f"flow-control window {window} out of range")
        super().__init__(
            role,
            max_frame=max_frame,
            window=window,
            max_incoming_requests=max_incoming_requests,
            max_duplexes=max_duplexes,
        )
        if window is not None:
            self._queue(MESSAGE, 0, control.encode_hello(window))

    def can_send(self, pid: int, local: bool) -> bool:
        """Is our sending half of this duplex open (and the dialogue able to send)?"""
        duplex = self._duplex(pid, local)
        return duplex is not None and duplex.send_open and self.state in CAN_CONTINUE[self.role]

    # ------------------------------------------------------------------- inputs

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the transport. Never raises: errors close the dialogue."""
        if self.state is State.CLOSED:
            return
        try:
            packets = self._decoder.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self.stats.frames_in += len(packets)
        receive = _RECEIVE
        for ptype, pid, pdata in packets:
            if self.close_reason is not None:  # an earlier packet closed the dialogue
                return
            try:
                receive[ptype](self, pid, pdata)
            except ProtocolError as exc:
                self._fail(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a bug here must close the dialogue, not kill its reader
                self.internal_error(exc)
                return

    def receive_eof(self) -> None:
        """The transport ended. Clean only after the close exchange finished."""
        if self.state is State.CLOSED:
            return
        if self._decoder.buffered:
            self._fail(RemoteProtocolError("connection ended inside a frame", public="truncated"))
            return
        self._finish("connection lost", clean=False)

    # ----------------------------------------------------------------- commands

    def send_message(self, data: bytes) -> None:
        self._check_start()
        if self.window is not None and control.is_control(data):
            raise LocalProtocolError("messages starting with the control prefix are reserved")
        self._queue(MESSAGE, 0, data)

    def send_request(self, data: bytes, *, deadline: float | None = None) -> int:
        """Send a request; returns its id. With a deadline, :meth:`expire` cancels it."""
        self._check_start()
        pid = self._allocate()
        self._queue(REQUEST, pid, data)
        self._out_requests[pid] = deadline
        if deadline is not None:
            self._add_deadline(deadline, DeadlineKind.REQUEST, pid)
        return pid

    def cancel_request(self, pid: int) -> bool:
        """Cancel our request (empty Request). A later response is ignored."""
        if pid not in self._out_requests:
            return False
        del self._out_requests[pid]
        if self.state in CAN_CONTINUE[self.role]:
            self._queue(REQUEST, pid, None)
        return True

    def respond(self, pid: int, data: bytes | None) -> bool:
        """Answer the peer's request; ``None`` declines it. False if it is no longer pending."""
        if pid not in self._in_requests:
            return False
        if self.state not in CAN_CONTINUE[self.role]:
            self._in_requests.discard(pid)
            return False
        self._in_requests.discard(pid)
        self._queue(RESPONSE, pid, data)
        self._maybe_finish_close()
        return True

    def open_duplex(self, data: bytes | None = None) -> int:
        """Open a duplex (DuplexInitial); returns its id."""
        self._check_start()
        if len(self._out_duplexes) >= self.max_duplexes:
            raise LocalProtocolError(f"more than {self.max_duplexes} open duplexes")
        pid = self._allocate()
        self._queue(DUPLEX_INITIAL, pid, data)
        self._out_duplexes[pid] = DuplexHalves(credit=self.peer_window or 0)
        return pid

    def duplex_send(self, pid: int, local: bool, data: bytes) -> None:
        """Send data on our half. With flow control, needs positive :meth:`send_credit`."""
        duplex = self._sending_half(pid, local)
        if self.peer_window is not None:
            if duplex.credit <= 0:
                raise LocalProtocolError("no flow-control credit on this duplex")
            duplex.credit -= len(data)
        self._queue(DUPLEX_REQUEST if local else DUPLEX_RESPONSE, pid, data)

    def duplex_end(
        self, pid: int, local: bool, error: bytes | None = None, *, deadline: float | None = None
    ) -> None:
        """End our sending half (``error`` data signals an error).

        For a duplex we opened, ``deadline`` bounds the wait for the peer's end:
        :meth:`expire` then forgets the duplex and later packets are ignored.
        """
        duplex = self._sending_half(pid, local)
        duplex.send_open = False
        self._queue(DUPLEX_REQUEST_END if local else DUPLEX_RESPONSE_END, pid, error)
        if not duplex.recv_open:
            self._forget(pid, local)
        elif local and deadline is not None:
            duplex.end_deadline = deadline
            self._add_deadline(deadline, DeadlineKind.DUPLEX, pid)
        self._maybe_finish_close()

    def consumed(self, pid: int, local: bool, nbytes: int) -> None:
        """Flow control: the application consumed ``nbytes`` received on this duplex."""
        if self.peer_window is None or self.window is None:
            return
        duplex = self._duplex(pid, local)
        if duplex is None or not duplex.recv_open:
            return
        duplex.consumed += nbytes
        if duplex.consumed >= self.window // 2 and self.state in CAN_CONTINUE[self.role]:
            self._queue(MESSAGE, 0, control.encode_grant([(local, pid, duplex.consumed)]))
            duplex.consumed = 0

    def close(self, *, deadline: float | None = None) -> None:
        """Start the seed's asymmetric close (see the module doc). Safe to call again."""
        if self.state is State.CLOSED:
            return
        send, new_state = ON_LOCAL_CLOSE[(self.role, self.state)]
        if deadline is not None and (
            self._close_deadline is None or deadline < self._close_deadline
        ):
            self._close_deadline = deadline
            self._add_deadline(deadline, DeadlineKind.CLOSE, 0)
        if not send:
            return
        self._queue(MESSAGE, 0, None)
        self.state = new_state
        if new_state is State.CLOSING:
            # The client sends nothing more: every sending half ends silently and
            # the server's requests can no longer be answered.
            self._in_requests.clear()
            for table, local in ((self._out_duplexes, True), (self._in_duplexes, False)):
                for pid, duplex in list(table.items()):
                    duplex.send_open = False
                    if not duplex.recv_open:
                        self._forget(pid, local)

    # ---------------------------------------------------------------- receiving
    # One method per packet type, one for all five duplex packets (see :data:`_RECEIVE`).
    # Each records events or raises RemoteProtocolError, which receive_data turns into a close.

    def _on_message(self, pid: int, data: bytes | None) -> None:
        if data is None:
            action = ON_CLOSE_MESSAGE[(self.role, self.state)]
            if action is CloseAction.CLOSE_REQUESTED:
                self.state = State.SIGNALLED
                self._events.append(CloseRequested())
            elif action is CloseAction.CLOSED:
                self._finish("closed", clean=True)
            elif action is CloseAction.PEER_CLOSING:
                self._peer_closing()
            elif action is CloseAction.ERROR:
                raise RemoteProtocolError("second close message", public="unexpected close")
            return
        self._check_peer_may_send()
        if self.window is not None and data[:4] == control.PREFIX:
            self._on_control(data)
            return
        self._events.append(MessageReceived(data=data))

    def _on_request(self, pid: int, data: bytes | None) -> None:
        self._check_peer_may_send()
        if data is None:
            if pid in self._in_requests:
                self._in_requests.discard(pid)
                self._events.append(PeerCancelledRequest(id=pid))
                self._maybe_finish_close()
            return
        if self.role is Role.CLIENT and self.state is State.CLOSING:
            return  # we cannot answer any more
        if pid in self._in_requests:
            raise RemoteProtocolError(f"request id {pid} already pending", public="duplicate id")
        if len(self._in_requests) >= self.max_incoming_requests:
            raise RemoteProtocolError("too many pending requests", public="too many requests")
        self._in_requests.add(pid)
        self._events.append(RequestReceived(id=pid, data=data))

    def _on_response(self, pid: int, data: bytes | None) -> None:
        if pid not in self._out_requests:
            self._stale(pid, "response")
            return
        del self._out_requests[pid]
        if data is None:
            self._events.append(RequestDeclined(id=pid))
        else:
            self._events.append(ResponseReceived(id=pid, data=data))

    def _on_duplex_packet(self, ptype: PacketType, pid: int, data: bytes | None) -> None:
        """A duplex packet does what :data:`ON_DUPLEX_PACKET` says for the half it finds."""
        local = DUPLEX_PACKET_LOCAL[ptype]
        if not local:
            self._check_peer_may_send()
        duplex = self._duplex(pid, local)
        half = Half.NONE if duplex is None else Half.OPEN if duplex.recv_open else Half.ENDED
        action = ON_DUPLEX_PACKET[(ptype, half)]
        if action is HalfAction.DATA:
            if data is None:
                name = "DuplexResponse" if local else "DuplexRequest"
                raise RemoteProtocolError(f"{name} without data", public="malformed packet")
            self._events.append(DuplexData(id=pid, local=local, data=data))
        elif action is HalfAction.END and duplex is not None:  # (only an open half ends)
            self._end_receiving_half(pid, local, duplex, data)
        elif action is HalfAction.OPEN:
            self._open_incoming(pid, data)
        elif action is HalfAction.STALE:
            self._stale(pid, "duplex packet")
        else:
            raise _duplex_error(action, pid)

    def _open_incoming(self, pid: int, data: bytes | None) -> None:
        if len(self._in_duplexes) >= self.max_duplexes:
            raise RemoteProtocolError("too many open duplexes", public="too many duplexes")
        duplex = DuplexHalves(credit=self.peer_window or 0)
        if self.role is Role.CLIENT and self.state is State.CLOSING:
            duplex.send_open = False
        self._in_duplexes[pid] = duplex
        self._events.append(DuplexOpened(id=pid, data=data))

    # ---------------------------------------------------------------- deadlines

    def expire(self, now: float) -> None:
        """Act on every deadline at or before ``now``."""
        while (item := self._deadlines.pop_due(now)) is not None:
            if item.kind is DeadlineKind.REQUEST:
                del self._out_requests[item.id]
                self.stats.timeouts += 1
                if self.state in CAN_CONTINUE[self.role]:
                    self._queue(REQUEST, item.id, None)
                self._events.append(RequestTimedOut(id=item.id))
            elif item.kind is DeadlineKind.DUPLEX:
                self._forget(item.id, True, abandoned=True)
            else:
                self._finish("close timed out", clean=False)
                return

    # ---------------------------------------------------------------- decisions

    def _sending_half(self, pid: int, local: bool) -> DuplexHalves:
        if self.state not in CAN_CONTINUE[self.role]:
            raise DialogueClosed(f"dialogue is {self.state.value}")
        duplex = self._duplex(pid, local)
        if duplex is None or not duplex.send_open:
            raise LocalProtocolError(f"duplex {pid} is not open for sending")
        return duplex

    def _check_peer_may_send(self) -> None:
        if self.role is Role.SERVER and self.state is State.CLOSING:
            raise RemoteProtocolError("packet after the client closed", public="packet after close")

    def _check_start(self) -> None:
        if self.state not in CAN_START:
            raise DialogueClosed(f"dialogue is {self.state.value}")


def _duplex_error(action: HalfAction, pid: int) -> RemoteProtocolError:
    """The protocol error a refused duplex packet closes the dialogue with."""
    if action is HalfAction.DUPLICATE_ID:
        return RemoteProtocolError(f"duplex id {pid} already open", public="duplicate id")
    if action is HalfAction.AFTER_END:
        return RemoteProtocolError(f"duplex {pid} packet after its end", public="wrong state")
    return RemoteProtocolError(f"duplex packet for unknown id {pid}", public="unknown id")


def _receive_duplex(ptype: PacketType) -> Callable[[Dialogue, int, bytes | None], None]:
    """The receiver of one duplex packet type (``_RECEIVE``'s entries share one signature)."""

    def receive(machine: Dialogue, pid: int, data: bytes | None) -> None:
        machine._on_duplex_packet(ptype, pid, data)

    return receive


#: The receiving side of the machine, by packet type.
_RECEIVE: dict[int, Callable[[Dialogue, int, bytes | None], None]] = {
    PacketType.MESSAGE: Dialogue._on_message,
    PacketType.REQUEST: Dialogue._on_request,
    PacketType.RESPONSE: Dialogue._on_response,
    **{ptype: _receive_duplex(ptype) for ptype in DUPLEX_PACKET_LOCAL},
}

__all__ = ["Dialogue", "Role", "State"]

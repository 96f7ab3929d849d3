"""The Dialogue protocol as a state machine with no I/O (sans-IO).

Theory of operation
-------------------
Bytes come in through :meth:`Dialogue.receive_data` / :meth:`receive_eof`;
local intentions go in through commands (:meth:`send_message`,
:meth:`send_request`, :meth:`respond`, :meth:`open_duplex`,
:meth:`duplex_send`, :meth:`duplex_end`, :meth:`close`). Out come
:meth:`events_received` (what the peer did), :meth:`data_to_send` (bytes to
write, batched) and :meth:`close_expected` (the transport should be closed).

Everything that changes the machine's state is in this module: the commands
below, the receiving side (one method per packet type, indexed by type in
:data:`_RECEIVE`) and the deadlines. The transitions that are pure data (what
a close does, by role and state) are the tables of enums in
:mod:`~pipeline.dialogue.states`.

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
ended. The packet transitions, for the receiving half:

=====================  ================  ====================  ===================
packet                 duplex opened by  receiving half open   receiving half gone
=====================  ================  ====================  ===================
DuplexInitial          peer              (new) -> both open    error if id in use
DuplexRequest          peer              data                  error
DuplexRequestEnd       peer              -> ended              error
DuplexResponse         us                data                  ignored if issued
DuplexResponseEnd      us                -> ended              ignored if issued
=====================  ================  ====================  ===================

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
from pipeline.dialogue.deadlines import Deadline, DeadlineKind, Deadlines
from pipeline.dialogue.events import (
    CloseRequested,
    ConnectionClosed,
    DuplexClosed,
    DuplexData,
    DuplexEnded,
    DuplexOpened,
    DuplexWritable,
    Event,
    MessageReceived,
    PeerCancelledRequest,
    PeerClosing,
    RequestAborted,
    RequestDeclined,
    RequestReceived,
    RequestTimedOut,
    ResponseReceived,
)
from pipeline.dialogue.packets import (
    DEFAULT_MAX_FRAME,
    HAS_DATA,
    HEADER,
    MAX_ID,
    Decoder,
    PacketType,
)
from pipeline.dialogue.states import (
    CAN_CONTINUE,
    CAN_START,
    ON_CLOSE_MESSAGE,
    ON_LOCAL_CLOSE,
    CloseAction,
    DuplexHalves,
    Role,
    State,
    Stats,
)
from pipeline.errors import (
    DialogueClosed,
    InternalProtocolError,
    LocalProtocolError,
    PayloadTooLarge,
    ProtocolError,
    RemoteProtocolError,
)

_pack = HEADER.pack

#: Default bounds on what a peer may keep open on us (exceeding one is a protocol error).
DEFAULT_MAX_INCOMING_REQUESTS = 4096
DEFAULT_MAX_DUPLEXES = 1024

MESSAGE = PacketType.MESSAGE.value
REQUEST = PacketType.REQUEST.value
RESPONSE = PacketType.RESPONSE.value
DUPLEX_INITIAL = PacketType.DUPLEX_INITIAL.value
DUPLEX_REQUEST = PacketType.DUPLEX_REQUEST.value
DUPLEX_RESPONSE = PacketType.DUPLEX_RESPONSE.value
DUPLEX_REQUEST_END = PacketType.DUPLEX_REQUEST_END.value
DUPLEX_RESPONSE_END = PacketType.DUPLEX_RESPONSE_END.value


class Dialogue:
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
        self.role = role
        self.state = State.OPEN
        self.max_frame = max_frame
        self.window = window
        #: The peer's initial window once its HELLO arrived (flow control active for sends).
        self.peer_window: int | None = None
        self.max_incoming_requests = max_incoming_requests
        self.max_duplexes = max_duplexes
        self.close_reason: str | None = None
        self.error: ProtocolError | None = None
        self.stats = Stats()
        self._decoder = Decoder(max_frame)
        self._events: list[Event] = []
        self._out: list[bytes] = []
        self._out_size = 0
        self._next_id = 1
        self._wrapped = False
        #: our requests: id -> deadline
        self._out_requests: dict[int, float | None] = {}
        #: the peer's requests we have not answered
        self._in_requests: set[int] = set()
        self._out_duplexes: dict[int, DuplexHalves] = {}
        self._in_duplexes: dict[int, DuplexHalves] = {}
        self._deadlines = Deadlines(self._deadline_live)
        self._close_deadline: float | None = None
        if window is not None:
            self._queue(MESSAGE, 0, control.encode_hello(window))

    # ------------------------------------------------------------------ outputs

    def events_received(self) -> list[Event]:
        """Events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def data_to_send(self) -> bytes:
        """Bytes to write since the last call (b"" if none)."""
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        return data

    @property
    def bytes_to_send(self) -> int:
        return self._out_size

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete incoming frame held by the decoder (0 between frames)."""
        return self._decoder.buffered

    @property
    def has_deadlines(self) -> bool:
        return bool(self._deadlines)

    def can_send(self, pid: int, local: bool) -> bool:
        """Is our sending half of this duplex open (and the dialogue able to send)?"""
        duplex = self._duplex(pid, local)
        return duplex is not None and duplex.send_open and self.state in CAN_CONTINUE[self.role]

    def close_expected(self) -> bool:
        """True once the dialogue is over: flush :meth:`data_to_send`, then close the transport."""
        return self.state is State.CLOSED

    @property
    def flow_control(self) -> bool:
        """True when our sends are limited by the peer's credit."""
        return self.peer_window is not None

    def outstanding(self) -> tuple[int, int, int, int]:
        """(our requests, the peer's unanswered requests, our duplexes, the peer's duplexes)."""
        return (
            len(self._out_requests),
            len(self._in_requests),
            len(self._out_duplexes),
            len(self._in_duplexes),
        )

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

    def send_credit(self, pid: int, local: bool) -> int | None:
        """Bytes we may send on the duplex now; None when flow control is not active."""
        if self.peer_window is None:
            return None
        duplex = self._duplex(pid, local)
        return duplex.credit if duplex is not None else 0

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

    def abort(self, reason: str) -> None:
        """Close at once (local failure, transport error); no more bytes are produced."""
        if self.state is not State.CLOSED:
            self._finish(reason, clean=False)

    def internal_error(self, exc: Exception) -> None:
        """Close at once because of a bug on this side (``exc``), as websockets closes with 1011.

        ``error`` becomes an :class:`InternalProtocolError` caused by ``exc``;
        the peer may be told ``internal error`` and nothing more.
        """
        if self.state is not State.CLOSED:
            error = InternalProtocolError(f"internal error: {exc!r}")
            error.__cause__ = exc
            self._fail(error)

    def peer_failed(self, error: ProtocolError) -> None:
        """Close at once because of the peer (e.g. it missed a read deadline); ``error`` is kept."""
        if self.state is not State.CLOSED:
            self._fail(error)

    # ---------------------------------------------------------------- receiving
    # One method per packet type (see :data:`_RECEIVE`). Each records events or
    # raises RemoteProtocolError, which receive_data turns into a close.

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

    def _on_duplex_initial(self, pid: int, data: bytes | None) -> None:
        self._check_peer_may_send()
        if pid in self._in_duplexes:
            raise RemoteProtocolError(f"duplex id {pid} already open", public="duplicate id")
        if len(self._in_duplexes) >= self.max_duplexes:
            raise RemoteProtocolError("too many open duplexes", public="too many duplexes")
        duplex = DuplexHalves(credit=self.peer_window or 0)
        if self.role is Role.CLIENT and self.state is State.CLOSING:
            duplex.send_open = False
        self._in_duplexes[pid] = duplex
        self._events.append(DuplexOpened(id=pid, data=data))

    def _on_duplex_request(self, pid: int, data: bytes | None) -> None:
        self._on_duplex_data(pid, False, data)

    def _on_duplex_response(self, pid: int, data: bytes | None) -> None:
        self._on_duplex_data(pid, True, data)

    def _on_duplex_data(self, pid: int, local: bool, data: bytes | None) -> None:
        duplex = self._receiving_half(pid, local)
        if duplex is None:
            return
        if data is None:
            name = "DuplexResponse" if local else "DuplexRequest"
            raise RemoteProtocolError(f"{name} without data", public="malformed packet")
        self._events.append(DuplexData(id=pid, local=local, data=data))

    def _on_duplex_request_end(self, pid: int, data: bytes | None) -> None:
        self._on_duplex_end(pid, False, data)

    def _on_duplex_response_end(self, pid: int, data: bytes | None) -> None:
        self._on_duplex_end(pid, True, data)

    def _on_duplex_end(self, pid: int, local: bool, data: bytes | None) -> None:
        duplex = self._receiving_half(pid, local)
        if duplex is None:
            return
        duplex.recv_open = False
        self._events.append(DuplexEnded(id=pid, local=local, error=data))
        if not duplex.send_open:
            self._forget(pid, local)
            self._maybe_finish_close()

    def _on_control(self, data: bytes) -> None:
        msg = control.decode(data)
        if isinstance(msg, control.Hello):
            if self.peer_window is not None:
                raise RemoteProtocolError("second flow-control hello", public="bad control message")
            self.peer_window = msg.window
            # Duplexes opened before the HELLO arrived start with a full window now.
            for table in (self._out_duplexes, self._in_duplexes):
                for duplex in table.values():
                    duplex.credit = msg.window
        elif isinstance(msg, control.Grant):
            for local, pid, credit in msg.entries:
                target = self._duplex(pid, local)
                if target is None or not target.send_open:
                    continue  # the grant crossed our end: harmless
                was_blocked = target.credit <= 0
                target.credit += credit
                if was_blocked and target.credit > 0:
                    self._events.append(DuplexWritable(id=pid, local=local))

    # ---------------------------------------------------------------- deadlines

    def next_deadline(self) -> float | None:
        """The earliest pending deadline, or None."""
        return self._deadlines.next()

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

    def _deadline_live(self, item: Deadline) -> bool:
        if self.state is State.CLOSED:
            return False
        if item.kind is DeadlineKind.REQUEST:
            return self._out_requests.get(item.id, -1.0) == item.when
        if item.kind is DeadlineKind.DUPLEX:
            duplex = self._out_duplexes.get(item.id)
            return duplex is not None and duplex.end_deadline == item.when
        return self._close_deadline == item.when

    def _add_deadline(self, when: float, kind: DeadlineKind, pid: int) -> None:
        self._deadlines.add(when, kind, pid, len(self._out_requests) + len(self._out_duplexes) + 1)

    # ------------------------------------------------------------------ helpers

    def _queue(self, ptype: int, pid: int, data: bytes | None) -> None:
        if data is None:
            self._out.append(_pack(ptype, pid, 0))
            self._out_size += 9
        else:
            size = len(data)
            if size > self.max_frame:
                raise PayloadTooLarge(
                    f"{size} bytes exceed the maximum frame of {self.max_frame}",
                    public="payload too large",
                )
            self._out.append(_pack(ptype | HAS_DATA, pid, size))
            self._out.append(data)
            self._out_size += 9 + size
        self.stats.frames_out += 1

    def _allocate(self) -> int:
        in_use = self._out_requests.keys() | self._out_duplexes.keys() if self._wrapped else ()
        while True:
            pid = self._next_id
            if pid == MAX_ID:
                self._next_id = 1
                self._wrapped = True
            else:
                self._next_id = pid + 1
            if pid not in in_use:
                return pid

    def _issued(self, pid: int) -> bool:
        return self._wrapped or 0 < pid < self._next_id

    def _stale(self, pid: int, what: str) -> None:
        if not self._issued(pid):
            raise RemoteProtocolError(f"{what} for id {pid} we never issued", public="unknown id")
        self.stats.stale_ignored += 1

    def _duplex(self, pid: int, local: bool) -> DuplexHalves | None:
        return (self._out_duplexes if local else self._in_duplexes).get(pid)

    def _sending_half(self, pid: int, local: bool) -> DuplexHalves:
        if self.state not in CAN_CONTINUE[self.role]:
            raise DialogueClosed(f"dialogue is {self.state.value}")
        duplex = self._duplex(pid, local)
        if duplex is None or not duplex.send_open:
            raise LocalProtocolError(f"duplex {pid} is not open for sending")
        return duplex

    def _receiving_half(self, pid: int, local: bool) -> DuplexHalves | None:
        """The duplex if its receiving half is open; None for a stale one; else an error."""
        if not local:
            self._check_peer_may_send()
        duplex = self._duplex(pid, local)
        if duplex is None:
            if local:
                self._stale(pid, "duplex packet")
                return None
            raise RemoteProtocolError(f"duplex packet for unknown id {pid}", public="unknown id")
        if not duplex.recv_open:
            raise RemoteProtocolError(f"duplex {pid} packet after its end", public="wrong state")
        return duplex

    def _check_peer_may_send(self) -> None:
        if self.role is Role.SERVER and self.state is State.CLOSING:
            raise RemoteProtocolError("packet after the client closed", public="packet after close")

    def _check_start(self) -> None:
        if self.state not in CAN_START:
            raise DialogueClosed(f"dialogue is {self.state.value}")

    def _forget(self, pid: int, local: bool, abandoned: bool = False) -> None:
        del (self._out_duplexes if local else self._in_duplexes)[pid]
        self._events.append(DuplexClosed(id=pid, local=local, abandoned=abandoned))

    def _peer_closing(self) -> None:
        self.state = State.CLOSING
        self._events.append(PeerClosing())
        for pid in list(self._out_requests):
            del self._out_requests[pid]
            self._events.append(RequestAborted(id=pid))
        for table, local in ((self._out_duplexes, True), (self._in_duplexes, False)):
            for pid, duplex in list(table.items()):
                if duplex.recv_open:
                    duplex.recv_open = False
                    self._events.append(DuplexEnded(id=pid, local=local, error=None))
                if not duplex.send_open:
                    self._forget(pid, local)
        self._maybe_finish_close()

    def _maybe_finish_close(self) -> None:
        if (
            self.role is Role.SERVER
            and self.state is State.CLOSING
            and not self._in_requests
            and not self._out_duplexes
            and not self._in_duplexes
        ):
            self._queue(MESSAGE, 0, None)
            self._finish("closed", clean=True)

    def _fail(self, exc: ProtocolError) -> None:
        self.error = exc
        self._finish(str(exc), clean=False)

    def _finish(self, reason: str, *, clean: bool) -> None:
        self.state = State.CLOSED
        self.close_reason = reason
        for pid in list(self._out_requests):
            self._events.append(RequestAborted(id=pid))
        self._out_requests.clear()
        self._in_requests.clear()
        for table, local in ((self._out_duplexes, True), (self._in_duplexes, False)):
            for pid in table:
                self._events.append(DuplexClosed(id=pid, local=local, abandoned=True))
            table.clear()
        self._deadlines.clear()
        self._events.append(ConnectionClosed(reason=reason, clean=clean, error=self.error))


#: The receiving side of the machine, by packet type.
_RECEIVE: dict[int, Callable[[Dialogue, int, bytes | None], None]] = {
    PacketType.MESSAGE: Dialogue._on_message,
    PacketType.REQUEST: Dialogue._on_request,
    PacketType.RESPONSE: Dialogue._on_response,
    PacketType.DUPLEX_INITIAL: Dialogue._on_duplex_initial,
    PacketType.DUPLEX_REQUEST: Dialogue._on_duplex_request,
    PacketType.DUPLEX_RESPONSE: Dialogue._on_duplex_response,
    PacketType.DUPLEX_REQUEST_END: Dialogue._on_duplex_request_end,
    PacketType.DUPLEX_RESPONSE_END: Dialogue._on_duplex_response_end,
}

__all__ = ["Dialogue", "Role", "State"]

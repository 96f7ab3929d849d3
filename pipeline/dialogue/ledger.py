"""What a Dialogue machine holds, and the steps its transitions share (no I/O, no table reads).

:class:`Ledger` is the base of :class:`~pipeline.dialogue.protocol.Dialogue`:
the requests and duplexes open each way, the ids we issue, the frames queued
for the transport, the events for the caller, the deadlines, and the steps
every transition uses: queue a frame, allocate an id, end a receiving half,
forget a duplex, apply the peer's flow-control messages, and end the dialogue
(at once, or, for the server, once the client closed and nothing is left).
Which transition happens (what a command, a packet or a deadline does, read
from the tables of :mod:`~pipeline.dialogue.states`) is decided in
:mod:`~pipeline.dialogue.protocol` alone; nothing here reads those tables.
"""

from __future__ import annotations

from pipeline.dialogue import control
from pipeline.dialogue.deadlines import Deadline, DeadlineKind, Deadlines
from pipeline.dialogue.events import (
    ConnectionClosed,
    DuplexClosed,
    DuplexEnded,
    DuplexWritable,
    Event,
    PeerClosing,
    RequestAborted,
)
from pipeline.dialogue.packets import HAS_DATA, HEADER, MAX_ID, MESSAGE, Decoder
from pipeline.dialogue.states import DuplexHalves, Role, State, Stats
from pipeline.errors import (
    InternalProtocolError,
    PayloadTooLarge,
    ProtocolError,
    RemoteProtocolError,
)

_pack = HEADER.pack


class Ledger:
    """The record of one side of a Dialogue connection and its bookkeeping. Not thread-safe."""

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int,
        window: int | None,
        max_incoming_requests: int,
        max_duplexes: int,
    ) -> None:
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

    def send_credit(self, pid: int, local: bool) -> int | None:
        """Bytes we may send on the duplex now; None when flow control is not active."""
        if self.peer_window is None:
            return None
        duplex = self._duplex(pid, local)
        return duplex.credit if duplex is not None else 0

    def next_deadline(self) -> float | None:
        """The earliest pending deadline, or None."""
        return self._deadlines.next()

    # ------------------------------------------------------------------- ending

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

    def _peer_closing(self) -> None:
        """(server) The client closed: abort our requests, end every receiving half."""
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
        """(server) Once the client closed and nothing is outstanding, answer and end."""
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

    # ------------------------------------------------------------- flow control

    def _on_control(self, data: bytes) -> None:
        """A flow-control message from the peer: its HELLO, or credit it grants back."""
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

    # -------------------------------------------------------------- bookkeeping

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

    def _end_receiving_half(
        self, pid: int, local: bool, duplex: DuplexHalves, error: bytes | None
    ) -> None:
        duplex.recv_open = False
        self._events.append(DuplexEnded(id=pid, local=local, error=error))
        if not duplex.send_open:
            self._forget(pid, local)
            self._maybe_finish_close()

    def _forget(self, pid: int, local: bool, abandoned: bool = False) -> None:
        del (self._out_duplexes if local else self._in_duplexes)[pid]
        self._events.append(DuplexClosed(id=pid, local=local, abandoned=abandoned))


__all__ = ["Ledger"]

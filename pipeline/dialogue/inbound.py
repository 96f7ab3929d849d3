"""How the Dialogue machine reacts to each incoming packet type (the receiving half of it).

Plain functions over a :class:`~pipeline.dialogue.protocol.Dialogue`, indexed by
packet type in :data:`HANDLERS`; each either records events on the machine or
raises :class:`RemoteProtocolError`, which the machine turns into a close.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.dialogue import control
from pipeline.dialogue.events import (
    CloseRequested,
    DuplexData,
    DuplexEnded,
    DuplexOpened,
    DuplexWritable,
    MessageReceived,
    RequestCancelled,
    RequestDeclined,
    RequestReceived,
    ResponseReceived,
)
from pipeline.dialogue.packets import PacketType
from pipeline.dialogue.states import ON_CLOSE_MESSAGE, DuplexHalves, Role, State
from pipeline.errors import RemoteProtocolError

if TYPE_CHECKING:
    from pipeline.dialogue.protocol import Dialogue


def on_message(d: Dialogue, pid: int, data: bytes | None) -> None:
    if data is None:
        action = ON_CLOSE_MESSAGE[(d.role, d.state)]
        if action == "close_requested":
            d.state = State.SIGNALLED
            d._events.append(CloseRequested())
        elif action == "closed":
            d._finish("closed", clean=True)
        elif action == "peer_closing":
            d._peer_closing()
        elif action == "error":
            raise RemoteProtocolError("second close message", public="unexpected close")
        return
    d._check_peer_may_send()
    if d.window is not None and data[:4] == control.PREFIX:
        on_control(d, data)
        return
    d._events.append(MessageReceived(data=data))


def on_request(d: Dialogue, pid: int, data: bytes | None) -> None:
    d._check_peer_may_send()
    if data is None:
        if pid in d._in_requests:
            d._in_requests.discard(pid)
            d._events.append(RequestCancelled(id=pid))
            d._maybe_finish_close()
        return
    if d.role is Role.CLIENT and d.state is State.CLOSING:
        return  # we cannot answer any more
    if pid in d._in_requests:
        raise RemoteProtocolError(f"request id {pid} already pending", public="duplicate id")
    if len(d._in_requests) >= d.max_incoming_requests:
        raise RemoteProtocolError("too many pending requests", public="too many requests")
    d._in_requests.add(pid)
    d._events.append(RequestReceived(id=pid, data=data))


def on_response(d: Dialogue, pid: int, data: bytes | None) -> None:
    if pid not in d._out_requests:
        d._stale(pid, "response")
        return
    del d._out_requests[pid]
    if data is None:
        d._events.append(RequestDeclined(id=pid))
    else:
        d._events.append(ResponseReceived(id=pid, data=data))


def on_duplex_initial(d: Dialogue, pid: int, data: bytes | None) -> None:
    d._check_peer_may_send()
    if pid in d._in_duplexes:
        raise RemoteProtocolError(f"duplex id {pid} already open", public="duplicate id")
    if len(d._in_duplexes) >= d.max_duplexes:
        raise RemoteProtocolError("too many open duplexes", public="too many duplexes")
    duplex = DuplexHalves(credit=d.peer_window or 0)
    if d.role is Role.CLIENT and d.state is State.CLOSING:
        duplex.send_open = False
    d._in_duplexes[pid] = duplex
    d._events.append(DuplexOpened(id=pid, data=data))


def on_duplex_request(d: Dialogue, pid: int, data: bytes | None) -> None:
    on_duplex_data(d, pid, False, data)


def on_duplex_response(d: Dialogue, pid: int, data: bytes | None) -> None:
    on_duplex_data(d, pid, True, data)


def on_duplex_data(d: Dialogue, pid: int, local: bool, data: bytes | None) -> None:
    duplex = d._receiving_half(pid, local)
    if duplex is None:
        return
    if data is None:
        name = "DuplexResponse" if local else "DuplexRequest"
        raise RemoteProtocolError(f"{name} without data", public="malformed packet")
    d._events.append(DuplexData(id=pid, local=local, data=data))


def on_duplex_request_end(d: Dialogue, pid: int, data: bytes | None) -> None:
    on_duplex_end(d, pid, False, data)


def on_duplex_response_end(d: Dialogue, pid: int, data: bytes | None) -> None:
    on_duplex_end(d, pid, True, data)


def on_duplex_end(d: Dialogue, pid: int, local: bool, data: bytes | None) -> None:
    duplex = d._receiving_half(pid, local)
    if duplex is None:
        return
    duplex.recv_open = False
    d._events.append(DuplexEnded(id=pid, local=local, error=data))
    if not duplex.send_open:
        d._forget(pid, local)
        d._maybe_finish_close()


HANDLERS: dict[int, Callable[[Dialogue, int, bytes | None], None]] = {
    PacketType.MESSAGE: on_message,
    PacketType.REQUEST: on_request,
    PacketType.RESPONSE: on_response,
    PacketType.DUPLEX_INITIAL: on_duplex_initial,
    PacketType.DUPLEX_REQUEST: on_duplex_request,
    PacketType.DUPLEX_RESPONSE: on_duplex_response,
    PacketType.DUPLEX_REQUEST_END: on_duplex_request_end,
    PacketType.DUPLEX_RESPONSE_END: on_duplex_response_end,
}


def on_control(d: Dialogue, data: bytes) -> None:
    msg = control.decode(data)
    if isinstance(msg, control.Hello):
        if d.peer_window is not None:
            raise RemoteProtocolError("second flow-control hello", public="bad control message")
        d.peer_window = msg.window
        # Duplexes opened before the HELLO arrived start with a full window now.
        for table in (d._out_duplexes, d._in_duplexes):
            for duplex in table.values():
                duplex.credit = msg.window
    elif isinstance(msg, control.Grant):
        for local, pid, credit in msg.entries:
            target = d._duplex(pid, local)
            if target is None or not target.send_open:
                continue  # the grant crossed our end: harmless
            was_blocked = target.credit <= 0
            target.credit += credit
            if was_blocked and target.credit > 0:
                d._events.append(DuplexWritable(id=pid, local=local))

"""The Dialogue state machine: every packet type and transition, on two machines back to back."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.dialogue import events as ev
from pipeline.dialogue.packets import MAX_ID, PacketType, encode_packet
from pipeline.dialogue.protocol import Dialogue, Role, State
from pipeline.errors import (
    DialogueClosed,
    InternalProtocolError,
    LocalProtocolError,
    PayloadTooLarge,
)


def raw(ptype: PacketType, pid: int, data: bytes | None = None) -> bytes:
    return b"".join(encode_packet(ptype, pid, data))


def closed_with_error(events: list[ev.Event], text: str) -> None:
    last = events[-1]
    assert isinstance(last, ev.ConnectionClosed), events
    assert not last.clean and last.error is not None
    assert text in str(last.error)


def test_message_and_empty_data_message(pair: Any) -> None:
    pair.client.send_message(b"hello")
    pair.client.send_message(b"")  # empty data is a message; only *no* data means close
    _, server = pair.pump()
    assert server == [ev.MessageReceived(data=b"hello"), ev.MessageReceived(data=b"")]
    assert pair.server.state is State.OPEN


def test_request_response(pair: Any) -> None:
    pid = pair.client.send_request(b"ping")
    _, server = pair.pump()
    assert server == [ev.RequestReceived(id=pid, data=b"ping")]
    assert pair.server.respond(pid, b"pong")
    client, _ = pair.pump()
    assert client == [ev.ResponseReceived(id=pid, data=b"pong")]
    assert pair.client.outstanding() == (0, 0, 0, 0)
    assert pair.server.outstanding() == (0, 0, 0, 0)


def test_both_sides_request_with_independent_ids(pair: Any) -> None:
    a = pair.client.send_request(b"from client")
    b = pair.server.send_request(b"from server")
    assert a == b == 1  # the two id spaces are separate
    client, server = pair.pump()
    assert client == [ev.RequestReceived(id=b, data=b"from server")]
    assert server == [ev.RequestReceived(id=a, data=b"from client")]
    pair.client.respond(b, b"c")
    pair.server.respond(a, b"s")
    client, server = pair.pump()
    assert client == [ev.ResponseReceived(id=a, data=b"s")]
    assert server == [ev.ResponseReceived(id=b, data=b"c")]


def test_empty_response_declines(pair: Any) -> None:
    pid = pair.client.send_request(b"?")
    pair.pump()
    pair.server.respond(pid, None)
    client, _ = pair.pump()
    assert client == [ev.RequestDeclined(id=pid)]


def test_cancel_request_and_late_response_is_ignored(pair: Any) -> None:
    pid = pair.client.send_request(b"slow")
    pair.pump()
    assert pair.client.cancel_request(pid)
    assert not pair.client.cancel_request(pid)
    _, server = pair.pump()
    assert server == [ev.PeerCancelledRequest(id=pid)]
    assert not pair.server.respond(pid, b"too late")  # nothing pending: nothing sent
    assert pair.server.data_to_send() == b""


def test_cancellation_race_response_crosses_cancel(pair: Any) -> None:
    pid = pair.client.send_request(b"q")
    pair.pump()
    pair.server.respond(pid, b"answer")  # in flight ...
    pair.client.cancel_request(pid)  # ... while the client cancels
    client, server = pair.pump()
    assert client == [] and server == []  # the response is ignored, the cancel is moot
    assert pair.client.stats.stale_ignored == 1
    assert pair.client.state is State.OPEN and pair.server.state is State.OPEN


def test_response_for_an_id_never_issued_is_a_protocol_error(pair: Any) -> None:
    pair.client.receive_data(raw(PacketType.RESPONSE, 77, b"x"))
    closed_with_error(pair.client.events_received(), "never issued")
    assert pair.client.close_expected()


def test_duplicate_pending_request_id_is_a_protocol_error(pair: Any) -> None:
    pair.server.receive_data(raw(PacketType.REQUEST, 5, b"a") + raw(PacketType.REQUEST, 5, b"b"))
    events = pair.server.events_received()
    assert events[0] == ev.RequestReceived(id=5, data=b"a")
    closed_with_error(events, "already pending")


def test_duplex_full_lifecycle(pair: Any) -> None:
    pid = pair.client.open_duplex(b"init")
    _, server = pair.pump()
    assert server == [ev.DuplexOpened(id=pid, data=b"init")]
    pair.client.duplex_send(pid, True, b"up1")
    pair.server.duplex_send(pid, False, b"down1")
    client, server = pair.pump()
    assert server == [ev.DuplexData(id=pid, local=False, data=b"up1")]
    assert client == [ev.DuplexData(id=pid, local=True, data=b"down1")]
    pair.client.duplex_end(pid, True)
    client, server = pair.pump()
    assert server == [ev.DuplexEnded(id=pid, local=False, error=None)]
    pair.server.duplex_end(pid, False)
    client, server = pair.pump()
    assert server == [ev.DuplexClosed(id=pid, local=False)]
    assert client == [
        ev.DuplexEnded(id=pid, local=True, error=None),
        ev.DuplexClosed(id=pid, local=True),
    ]
    assert pair.client.outstanding() == (0, 0, 0, 0) == pair.server.outstanding()


def test_duplex_initial_without_data(pair: Any) -> None:
    pid = pair.client.open_duplex()
    _, server = pair.pump()
    assert server == [ev.DuplexOpened(id=pid, data=None)]


def test_half_close_initiator_ends_first_acceptor_keeps_sending(pair: Any) -> None:
    pid = pair.client.open_duplex()
    pair.client.duplex_send(pid, True, b"upload")
    pair.client.duplex_end(pid, True)
    pair.pump()
    for i in range(3):
        pair.server.duplex_send(pid, False, b"r%d" % i)
    pair.server.duplex_end(pid, False)
    client, _ = pair.pump()
    data = [e.data for e in client if isinstance(e, ev.DuplexData)]
    assert data == [b"r0", b"r1", b"r2"]
    assert isinstance(client[-1], ev.DuplexClosed)


def test_half_close_acceptor_ends_first_initiator_keeps_sending(pair: Any) -> None:
    pid = pair.client.open_duplex()
    pair.pump()
    pair.server.duplex_end(pid, False)
    client, _ = pair.pump()
    assert client == [ev.DuplexEnded(id=pid, local=True, error=None)]
    pair.client.duplex_send(pid, True, b"still")
    pair.client.duplex_end(pid, True)
    _, server = pair.pump()
    assert server == [
        ev.DuplexData(id=pid, local=False, data=b"still"),
        ev.DuplexEnded(id=pid, local=False, error=None),
        ev.DuplexClosed(id=pid, local=False),
    ]


def test_duplex_termination_with_error_data_both_ways(pair: Any) -> None:
    pid = pair.client.open_duplex()
    pair.pump()
    pair.server.duplex_end(pid, False, b"disk full")
    pair.client.duplex_end(pid, True, b"gave up")
    client, server = pair.pump()
    assert ev.DuplexEnded(id=pid, local=True, error=b"disk full") in client
    assert ev.DuplexEnded(id=pid, local=False, error=b"gave up") in server


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([raw(PacketType.DUPLEX_REQUEST, 9, b"x")], "unknown id"),
        ([raw(PacketType.DUPLEX_REQUEST_END, 9)], "unknown id"),
        ([raw(PacketType.DUPLEX_INITIAL, 9), raw(PacketType.DUPLEX_INITIAL, 9)], "already open"),
        ([raw(PacketType.DUPLEX_INITIAL, 9), raw(PacketType.DUPLEX_REQUEST, 9)], "without data"),
        (
            [
                raw(PacketType.DUPLEX_INITIAL, 9),
                raw(PacketType.DUPLEX_REQUEST_END, 9),
                raw(PacketType.DUPLEX_REQUEST, 9, b"late"),
            ],
            "after its end",
        ),
        ([raw(PacketType.DUPLEX_RESPONSE, 3, b"x")], "never issued"),
        ([raw(PacketType.DUPLEX_RESPONSE_END, 3)], "never issued"),
        ([b"\x20" + b"\x00" * 8], "unknown packet type"),
    ],
)
def test_duplex_packets_in_the_wrong_state(frames: list[bytes], reason: str) -> None:
    server = Dialogue(Role.SERVER)
    server.receive_data(b"".join(frames))
    closed_with_error(server.events_received(), reason)
    server.receive_data(raw(PacketType.MESSAGE, 0, b"ignored after close"))
    assert server.events_received() == []


def test_duplex_response_after_the_peer_end_is_an_error(pair: Any) -> None:
    pid = pair.client.open_duplex()
    pair.pump()
    pair.client.receive_data(raw(PacketType.DUPLEX_RESPONSE_END, pid))
    pair.client.receive_data(raw(PacketType.DUPLEX_RESPONSE, pid, b"x"))
    closed_with_error(pair.client.events_received(), "after its end")


def test_local_misuse_raises(pair: Any) -> None:
    pid = pair.client.open_duplex()
    pair.client.duplex_end(pid, True)
    with pytest.raises(LocalProtocolError):
        pair.client.duplex_send(pid, True, b"x")
    with pytest.raises(LocalProtocolError):
        pair.client.duplex_end(pid, True)
    with pytest.raises(LocalProtocolError):
        pair.client.duplex_send(123, False, b"x")
    small = Dialogue(Role.CLIENT, max_frame=4)
    with pytest.raises(PayloadTooLarge):
        small.send_message(b"12345")
    with pytest.raises(LocalProtocolError):
        Dialogue(Role.CLIENT, window=0)


def test_oversize_incoming_frame_closes(pair: Any) -> None:
    small = Dialogue(Role.SERVER, max_frame=8)
    small.receive_data(raw(PacketType.MESSAGE, 0, b"123456789"))
    closed_with_error(small.events_received(), "exceeds maximum")


def test_client_close_with_request_outstanding(pair: Any) -> None:
    pid = pair.client.send_request(b"work")
    pair.pump()
    pair.client.close()
    assert pair.client.state is State.CLOSING
    with pytest.raises(DialogueClosed):
        pair.client.send_message(b"no")
    with pytest.raises(DialogueClosed):
        pair.client.send_request(b"no")
    _, server = pair.pump()
    assert server == [ev.PeerClosing()]
    assert pair.server.state is State.CLOSING
    with pytest.raises(DialogueClosed):
        pair.server.send_request(b"no new work")
    pair.server.respond(pid, b"done")  # the last outstanding item: the server answers the close
    client, server = pair.pump()
    assert client == [
        ev.ResponseReceived(id=pid, data=b"done"),
        ev.ConnectionClosed(reason="closed", clean=True),
    ]
    assert server == [ev.ConnectionClosed(reason="closed", clean=True)]
    assert pair.client.close_expected() and pair.server.close_expected()


def test_client_close_with_duplexes_outstanding(pair: Any) -> None:
    mine = pair.client.open_duplex()
    theirs = pair.server.open_duplex()
    srv_req = pair.server.send_request(b"server asks")
    pair.pump()
    pair.client.close()
    _, server = pair.pump()
    # The client's halves ended implicitly; the server's own request can never be answered.
    assert ev.RequestAborted(id=srv_req) in server
    assert ev.DuplexEnded(id=mine, local=False, error=None) in server
    assert ev.DuplexEnded(id=theirs, local=True, error=None) in server
    assert pair.server.state is State.CLOSING
    pair.server.duplex_send(mine, False, b"last words")
    pair.server.duplex_end(mine, False)
    pair.server.duplex_end(theirs, True)
    client, _ = pair.pump()
    assert ev.DuplexData(id=mine, local=True, data=b"last words") in client
    assert client[-1] == ev.ConnectionClosed(reason="closed", clean=True)


def test_server_initiated_close(pair: Any) -> None:
    pair.server.close()
    assert pair.server.state is State.SIGNALLED
    pair.server.send_message(b"still operating")
    client, _ = pair.pump()
    assert client == [ev.CloseRequested(), ev.MessageReceived(data=b"still operating")]
    pair.client.close()
    client, server = pair.pump()
    assert server == [ev.PeerClosing(), ev.ConnectionClosed(reason="closed", clean=True)]
    assert client == [ev.ConnectionClosed(reason="closed", clean=True)]


def test_client_packets_after_its_close_are_errors(pair: Any) -> None:
    pid = pair.client.send_request(b"keep the server busy")
    pair.pump()
    pair.server.receive_data(raw(PacketType.MESSAGE, 0) + raw(PacketType.MESSAGE, 0, b"late"))
    closed_with_error(pair.server.events_received(), "after the client closed")
    assert pid == 1


def test_second_close_message_is_an_error(pair: Any) -> None:
    pair.client.send_request(b"busy")
    pair.pump()
    pair.server.receive_data(raw(PacketType.MESSAGE, 0) + raw(PacketType.MESSAGE, 0))
    closed_with_error(pair.server.events_received(), "second close")


def test_request_deadline_cancels_and_ignores_late_answer(pair: Any) -> None:
    pid = pair.client.send_request(b"q", deadline=10.0)
    pair.client.send_request(b"q2", deadline=20.0)
    assert pair.client.next_deadline() == 10.0
    pair.pump()
    pair.client.expire(9.0)
    assert pair.client.events_received() == []
    pair.client.expire(10.0)
    assert pair.client.events_received() == [ev.RequestTimedOut(id=pid)]
    assert pair.client.next_deadline() == 20.0
    pair.server.respond(pid, b"late")
    client, server = pair.pump()
    assert client == [] and server == []  # cancel crossed the answer
    assert pair.client.stats.timeouts == 1


def test_deadline_heap_stays_bounded(pair: Any) -> None:
    for _ in range(1000):
        pid = pair.client.send_request(b"x", deadline=100.0)
        pair.pump()
        pair.server.respond(pid, b"y")
        pair.pump()
    assert len(pair.client._deadlines) < 100
    assert pair.client.next_deadline() is None


def test_duplex_end_deadline_abandons_and_ignores_later_packets(pair: Any) -> None:
    pid = pair.client.open_duplex()
    pair.pump()
    pair.client.duplex_end(pid, True, deadline=5.0)
    pair.pump()
    pair.client.expire(5.0)
    assert pair.client.events_received() == [ev.DuplexClosed(id=pid, local=True, abandoned=True)]
    pair.server.duplex_send(pid, False, b"late")
    pair.server.duplex_end(pid, False)
    client, _ = pair.pump()
    assert client == []
    assert pair.client.state is State.OPEN


def test_close_deadline(pair: Any) -> None:
    pair.server.close(deadline=3.0)
    pair.pump()  # the client hears the signal but (misbehaving) never closes
    pair.server.expire(3.0)
    events = pair.server.events_received()
    assert events == [ev.ConnectionClosed(reason="close timed out", clean=False)]


def test_eof_mid_frame_and_peer_gone(pair: Any) -> None:
    pid = pair.client.send_request(b"q")
    pair.client.receive_eof()
    assert pair.client.events_received() == [
        ev.RequestAborted(id=pid),
        ev.ConnectionClosed(reason="connection lost", clean=False),
    ]
    server = Dialogue(Role.SERVER)
    server.receive_data(raw(PacketType.MESSAGE, 0, b"abc")[:5])
    server.receive_eof()
    closed_with_error(server.events_received(), "inside a frame")


def test_limits_on_what_a_peer_keeps_open() -> None:
    server = Dialogue(Role.SERVER, max_incoming_requests=2, max_duplexes=1)
    server.receive_data(b"".join(raw(PacketType.REQUEST, i, b"r") for i in (1, 2, 3)))
    closed_with_error(server.events_received(), "too many pending requests")
    server = Dialogue(Role.SERVER, max_duplexes=1)
    server.receive_data(raw(PacketType.DUPLEX_INITIAL, 1) + raw(PacketType.DUPLEX_INITIAL, 2))
    closed_with_error(server.events_received(), "too many open duplexes")
    client = Dialogue(Role.CLIENT, max_duplexes=1)
    client.open_duplex()
    with pytest.raises(LocalProtocolError):
        client.open_duplex()


def test_id_wraps_and_skips_ids_in_use() -> None:
    client = Dialogue(Role.CLIENT)
    first = client.send_request(b"a")
    client._next_id = MAX_ID
    assert client.send_request(b"b") == MAX_ID
    assert client.send_request(b"c") == 2  # 1 is still pending
    assert first == 1
    client.receive_data(raw(PacketType.RESPONSE, 999, b"stale"))  # issued (wrapped): ignored
    assert client.events_received() == []


def test_abort_and_close_are_idempotent(pair: Any) -> None:
    pair.client.abort("local failure")
    pair.client.abort("again")
    pair.client.close()
    assert pair.client.events_received() == [
        ev.ConnectionClosed(reason="local failure", clean=False)
    ]
    assert pair.client.data_to_send() == b""


def test_a_bug_in_inbound_handling_closes_with_an_internal_error(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like websockets (1011): the dialogue closes at once; receive_data never raises."""
    from pipeline.dialogue import protocol

    pid = pair.server.send_request(b"waiting")
    pair.pump()

    secret = "a bug in /srv/sluice/secret.py"

    def broken(d: Dialogue, pid: int, data: bytes | None) -> None:
        raise RuntimeError(secret)

    monkeypatch.setitem(protocol._RECEIVE, PacketType.MESSAGE, broken)
    pair.client.send_message(b"boom")
    pair.server.receive_data(pair.client.data_to_send())  # must not raise
    assert pair.server.close_expected()
    assert pair.server.data_to_send() == b""  # nothing explains it on the seed's wire
    events = pair.server.events_received()
    assert ev.RequestAborted(id=pid) in events
    closed = events[-1]
    assert isinstance(closed, ev.ConnectionClosed) and not closed.clean
    assert isinstance(closed.error, InternalProtocolError)
    assert isinstance(closed.error.__cause__, RuntimeError)
    assert closed.error.public_message == "internal error"
    assert pair.server.state is State.CLOSED
    # The local reason keeps the detail (for the log); the public close does not.
    assert secret in (pair.server.close_reason or "")
    assert closed.public() == (ev.CloseCode.INTERNAL_ERROR, "internal error")

"""The flow-control extension: HELLO negotiation, per-duplex credit, grants, the seed default."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.dialogue import control
from pipeline.dialogue import events as ev
from pipeline.dialogue.packets import PacketType, encode_packet
from pipeline.dialogue.protocol import Dialogue, Role
from pipeline.errors import LocalProtocolError, RemoteProtocolError


def test_codec_round_trip() -> None:
    assert control.decode(control.encode_hello(4096)) == control.Hello(window=4096)
    grant = control.encode_grant([(True, 7, 100), (False, 9, 5)])
    # The receiver of a grant sees the sides swapped: our duplex is "theirs" to them.
    assert control.decode(grant) == control.Grant(entries=((False, 7, 100), (True, 9, 5)))
    assert control.decode(control.PREFIX + b"Zfuture") == control.Unknown(kind=b"Z")
    assert control.PREFIX[0] == 0xC1  # never the first byte of a msgpack document


@pytest.mark.parametrize(
    "data",
    [
        control.PREFIX + b"H\x01",  # truncated hello
        control.PREFIX + b"H" + b"\x01\x00\x00\x00\x00",  # zero window
        control.PREFIX + b"G\x00\x00",  # truncated grant
        control.PREFIX + b"G\x02" + b"\x00" * 8,  # bad side
    ],
)
def test_codec_rejects_malformed(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        control.decode(data)


def test_default_is_the_seed_wire() -> None:
    plain = Dialogue(Role.CLIENT)
    assert plain.data_to_send() == b""  # no HELLO
    plain.receive_data(b"".join(encode_packet(PacketType.MESSAGE, 0, control.encode_hello(10))))
    # Without the extension, a control-looking message is just a message.
    assert plain.events_received() == [ev.MessageReceived(data=control.encode_hello(10))]
    assert not plain.flow_control


def test_only_one_side_enabled_means_no_limit(make_pair: Any) -> None:
    client = Dialogue(Role.CLIENT, window=100)
    server = Dialogue(Role.SERVER)
    server.receive_data(client.data_to_send())
    assert server.send_credit(1, False) is None  # the server never heard a HELLO
    assert not client.flow_control


def test_credit_limits_and_grants_reopen(make_pair: Any) -> None:
    pair = make_pair(window=100)
    assert pair.client.flow_control and pair.server.flow_control
    pid = pair.client.open_duplex()
    pair.pump()
    assert pair.client.send_credit(pid, True) == 100
    pair.client.duplex_send(pid, True, b"x" * 60)
    pair.client.duplex_send(pid, True, b"x" * 60)  # may overshoot by one frame
    assert pair.client.send_credit(pid, True) == -20
    with pytest.raises(LocalProtocolError, match="credit"):
        pair.client.duplex_send(pid, True, b"x")
    pair.pump()
    pair.server.consumed(pid, False, 60)  # >= half a window: a grant goes back
    client, _ = pair.pump()
    assert client == [ev.DuplexWritable(id=pid, local=True)]
    assert pair.client.send_credit(pid, True) == 40
    # And the other direction, on the same duplex.
    assert pair.server.send_credit(pid, False) == 100
    pair.server.duplex_send(pid, False, b"y" * 100)
    pair.pump()
    pair.client.consumed(pid, True, 100)
    _, server = pair.pump()
    assert server == [ev.DuplexWritable(id=pid, local=False)]


def test_application_may_not_send_control_prefix_when_enabled(make_pair: Any) -> None:
    pair = make_pair(window=100)
    with pytest.raises(LocalProtocolError):
        pair.client.send_message(control.PREFIX + b"spoof")


def test_second_hello_and_bad_control_close(make_pair: Any) -> None:
    pair = make_pair(window=100)
    hello = b"".join(encode_packet(PacketType.MESSAGE, 0, control.encode_hello(5)))
    pair.server.receive_data(hello)
    last = pair.server.events_received()[-1]
    assert isinstance(last, ev.ConnectionClosed) and "second flow-control hello" in last.reason


def test_grant_for_unknown_or_ended_duplex_is_harmless(make_pair: Any) -> None:
    pair = make_pair(window=100)
    grant = control.encode_grant([(False, 42, 10)])
    pair.client.receive_data(b"".join(encode_packet(PacketType.MESSAGE, 0, grant)))
    assert pair.client.events_received() == []
    assert pair.client.state.value == "open"

"""The routed-message codec: round trips, route tracing helpers, and every malformed input."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import LocalProtocolError, PayloadTooLarge, RemoteProtocolError
from pipeline.routing.message import (
    MAX_HOPS,
    Address,
    AddressType,
    Route,
    StreamAddress,
    TransportMessage,
    parse_route,
)

addresses = st.builds(Address, st.integers(0, 255), st.binary(max_size=64))
routes = st.lists(addresses, max_size=8).map(Route)
messages = st.builds(TransportMessage, routes, routes, st.binary(max_size=512))


@settings(deadline=None)
@given(messages)
def test_encode_decode_round_trip(message: TransportMessage) -> None:
    assert TransportMessage.decode(message.encode()) == message


@settings(deadline=None)
@given(messages)
def test_wire_form_is_the_documented_array(message: TransportMessage) -> None:
    obj = msgpack.unpackb(message.encode(), raw=False)
    assert obj[0] == 1
    assert obj[1] == [[a.type, a.value] for a in message.onward_route]
    assert obj[2] == [[a.type, a.value] for a in message.return_route]
    assert obj[3] == message.payload


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_raise_remote_protocol_error(data: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        TransportMessage.decode(data, max_payload=128)


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_fuzz_mutated_messages(message: TransportMessage, data: st.DataObject) -> None:
    raw = bytearray(message.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        decoded = TransportMessage.decode(bytes(raw))
    except RemoteProtocolError:
        return
    assert isinstance(decoded.payload, bytes)


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"a": 1}, "max_map_len"),
        ("text", "4-item"),
        ([1, [], []], "4-item"),
        ([2, [], [], b""], "version"),
        ([True, [], [], b""], "version"),
        ([1, [[0, b"a"]], [], "text"], "payload"),
        ([1, "x", [], b""], "onward route"),
        ([1, [[0]], [], b""], "pair"),
        ([1, [["0", b"a"]], [], b""], "types"),
        ([1, [[300, b"a"]], [], b""], "range"),
        ([1, [], [[0, "a"]], b""], "types"),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(obj: object, reason: str) -> None:
    with pytest.raises(RemoteProtocolError, match=reason):
        TransportMessage.decode(msgpack.packb(obj, use_bin_type=True))


def test_truncated_and_garbage_bytes() -> None:
    good = TransportMessage(Route(["a"]), Route(["b"]), b"x" * 10).encode()
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(good[:-3])
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(good + b"\x00")
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(b"")


def test_oversized_payload_is_payload_too_large() -> None:
    big = TransportMessage(Route(["a"]), Route(), b"x" * 2000).encode()
    with pytest.raises(PayloadTooLarge):
        TransportMessage.decode(big, max_payload=1000)
    assert TransportMessage.decode(big, max_payload=2000).payload == b"x" * 2000


def test_too_many_hops_is_refused() -> None:
    hops = [[0, b"a"]] * (MAX_HOPS + 1)
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(msgpack.packb([1, hops, [], b""], use_bin_type=True))
    with pytest.raises(LocalProtocolError):
        Route(["a"] * (MAX_HOPS + 1))


def test_unknown_address_types_decode_but_are_typed() -> None:
    message = TransportMessage(Route([Address(77, b"?")]), Route(), b"")
    assert TransportMessage.decode(message.encode()).onward_route.first.type == 77


def test_route_helpers() -> None:
    route = Route(["a", "b"])
    assert route.first == Address.local("a")
    assert route.rest() == Route(["b"])
    assert route.prepend("z") == Route(["z", "a", "b"])
    assert repr(route) == "Route(['a', 'b'])"
    with pytest.raises(LocalProtocolError):
        Route().first  # noqa: B018


@settings(deadline=None)
@given(st.text(min_size=1, max_size=50), st.text(min_size=1, max_size=50))
def test_stream_address_round_trip_and_reverse(onward: str, ret: str) -> None:
    sa = StreamAddress(onward, ret)
    address = sa.to_address()
    assert address.type == AddressType.STREAM
    assert StreamAddress.from_address(address) == sa
    assert sa.reversed() == StreamAddress(ret, onward)
    assert sa.reversed().reversed() == sa


def test_malformed_stream_address() -> None:
    with pytest.raises(RemoteProtocolError):
        StreamAddress.from_address(Address(2, b"\xc1"))
    with pytest.raises(RemoteProtocolError):
        StreamAddress.from_address(Address(2, msgpack.packb(["only-one"])))
    with pytest.raises(RemoteProtocolError):
        StreamAddress.from_address(Address.local("x"))
    assert "invalid" in str(Address(2, b"\xc1"))


def test_parse_route() -> None:
    route = parse_route("stream:stream_b/stream_a, B, tcp:127.0.0.1:7001")
    assert route == Route(
        [StreamAddress("stream_b", "stream_a").to_address(), "B", Address(1, b"127.0.0.1:7001")]
    )
    assert [str(a) for a in route] == ["stream:stream_b/stream_a", "B", "tcp:127.0.0.1:7001"]
    with pytest.raises(LocalProtocolError):
        parse_route("stream:nobackslash")


def test_address_validation() -> None:
    with pytest.raises(LocalProtocolError):
        Address(-1, b"")
    with pytest.raises(LocalProtocolError):
        Address(0, "text")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        Address.local("")

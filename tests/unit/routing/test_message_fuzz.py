"""Hostile input to the routing codec (and the bi-directional entry codec): fuzz plus fixed bombs.

Whatever the bytes, :meth:`TransportMessage.decode` and
:func:`~pipeline.streams.bidirectional.decode_entry` return a value or raise
:class:`RemoteProtocolError` (``PayloadTooLarge`` included), never anything
else, and every bound is checked before anything of that size is allocated.
"""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import PayloadTooLarge, RemoteProtocolError
from pipeline.routing.message import (
    MAX_ADDRESS_LEN,
    MAX_HOPS,
    Address,
    Route,
    TransportMessage,
)
from pipeline.streams.bidirectional import decode_entry, encode_entry

LIMIT = 4096

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=40)
    | st.binary(max_size=64)
)
objects = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=40,
)


def decodes_or_refuses(data: bytes) -> None:
    try:
        message = TransportMessage.decode(data, max_payload=LIMIT)
    except RemoteProtocolError:
        pass
    else:
        assert len(message.payload) <= LIMIT
        assert len(message.onward_route) <= MAX_HOPS and len(message.return_route) <= MAX_HOPS
    with contextlib.suppress(RemoteProtocolError):
        decode_entry(data, max_payload=LIMIT)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes(data: bytes) -> None:
    decodes_or_refuses(data)


@settings(max_examples=300, deadline=None)
@given(objects)
def test_any_msgpack_document(obj: object) -> None:
    decodes_or_refuses(msgpack.packb(obj, use_bin_type=True))


@settings(max_examples=200, deadline=None)
@given(objects, st.integers(min_value=0, max_value=3))
def test_wrong_types_in_every_field(value: object, position: int) -> None:
    fields: list[object] = [1, [[0, b"echo"]], [[0, b"me"]], b"payload"]
    fields[position] = value
    decodes_or_refuses(msgpack.packb(fields, use_bin_type=True))
    hop = [0, b"x"]
    hop[position % 2] = value
    decodes_or_refuses(msgpack.packb([1, [hop], [], b""], use_bin_type=True))


hops = st.builds(
    Address, st.integers(min_value=0, max_value=255), st.binary(min_size=1, max_size=40)
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(hops, max_size=MAX_HOPS),
    st.lists(hops, max_size=MAX_HOPS),
    st.binary(max_size=LIMIT),
)
def test_round_trip(onward: list[Address], ret: list[Address], payload: bytes) -> None:
    message = TransportMessage(Route(onward), Route(ret), payload)
    assert TransportMessage.decode(message.encode(), max_payload=LIMIT) == message
    assert decode_entry(encode_entry("back", message), max_payload=LIMIT) == ("back", message)


NESTED = b"\x91" * 100_000 + b"\xc0"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(NESTED, id="100k-deep"),
        pytest.param(b"\x94\x01" + NESTED, id="100k-deep-route"),
        pytest.param(b"\x94\x01\x91" + NESTED, id="100k-deep-hop"),
        pytest.param(b"\xdd\xff\xff\xff\xff", id="array-of-4G"),
        pytest.param(b"\xdf\xff\xff\xff\xff", id="map-of-4G"),
        pytest.param(b"\x94\x01\x90\x90\xc6\xff\xff\xff\xff", id="bin-of-4G"),
        pytest.param(b"\x94\x01\x90\x90\xdb\xff\xff\xff\xff", id="str-of-4G"),
        pytest.param(b"\x94\x01\x90\x90\xc9\xff\xff\xff\xff\x01", id="ext-of-4G"),
        pytest.param(b"\x94\xcf" + b"\xff" * 8 + b"\x90\x90\xc4\x00", id="version-2**64-1"),
        pytest.param(msgpack.packb([2**63, [], [], b""]), id="version-2**63"),
        pytest.param(msgpack.packb([-(2**63), [], [], b""]), id="version--2**63"),
        pytest.param(msgpack.packb([2.0**256, [], [], b""]), id="version-2.0**256"),
        pytest.param(msgpack.packb([1, [[2**63, b"x"]], [], b""]), id="hop-type-2**63"),
        pytest.param(msgpack.packb([1, [[2.0**256, b"x"]], [], b""]), id="hop-type-2.0**256"),
        pytest.param(msgpack.packb([True, [], [], b""]), id="version-bool"),
        pytest.param(msgpack.packb([1, [], [], b"", b""]), id="five-fields"),
        pytest.param(b"", id="empty"),
    ],
)
def test_bombs_are_refused(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(data, max_payload=LIMIT)
    with pytest.raises(RemoteProtocolError):
        decode_entry(data, max_payload=LIMIT)


def test_sizes_at_and_just_over_each_limit() -> None:
    def message(onward: int = 1, value: int = 1, payload: int = 0) -> bytes:
        hop = [0, b"x" * value]
        return msgpack.packb([1, [hop] * onward, [], b"p" * payload], use_bin_type=True)

    TransportMessage.decode(message(payload=LIMIT), max_payload=LIMIT)
    with pytest.raises(PayloadTooLarge):
        TransportMessage.decode(message(payload=LIMIT + 1), max_payload=LIMIT)
    TransportMessage.decode(message(onward=MAX_HOPS), max_payload=LIMIT)
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(message(onward=MAX_HOPS + 1), max_payload=LIMIT)
    TransportMessage.decode(message(value=MAX_ADDRESS_LEN), max_payload=LIMIT)
    with pytest.raises(RemoteProtocolError):
        TransportMessage.decode(message(value=MAX_ADDRESS_LEN + 1), max_payload=LIMIT)
    with pytest.raises(PayloadTooLarge):  # refused by its length before any parsing
        TransportMessage.decode(b"\x00" * (LIMIT + (1 << 20)), max_payload=LIMIT)

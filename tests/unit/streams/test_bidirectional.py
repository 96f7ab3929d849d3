"""The seed-000 stream entry codec: [return_stream, encoded message]."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import RemoteProtocolError
from pipeline.routing.message import Route, TransportMessage
from pipeline.streams.bidirectional import decode_entry, encode_entry


@settings(deadline=None)
@given(st.text(min_size=1, max_size=30), st.binary(max_size=100))
def test_entry_round_trip(ret: str, payload: bytes) -> None:
    message = TransportMessage(Route(["remote_destination"]), Route(["sender"]), payload)
    assert decode_entry(encode_entry(ret, message), max_payload=1000) == (ret, message)


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",
        msgpack.packb(["only"]),
        msgpack.packb(["", b"x"]),
        msgpack.packb([5, b"x"]),
        msgpack.packb(["s", "not bytes"]),
        msgpack.packb(["s", b"not a message"]),
        msgpack.packb(["s", [1, [], [], "text"]]),
    ],
)
def test_malformed_entries(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_entry(data, max_payload=1000)

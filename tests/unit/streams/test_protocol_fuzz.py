"""Hostile input to the stream-protocol codec: fuzz plus fixed bombs.

Whatever the bytes, :func:`protocol.decode` returns a stream message or
raises :class:`RemoteProtocolError` (``PayloadTooLarge`` included), and
:func:`protocol.peek_request_id` returns a string: neither raises anything else.
"""

from __future__ import annotations

from dataclasses import fields

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import PayloadTooLarge, RemoteProtocolError
from pipeline.streams import protocol as p

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

#: A valid instance of every message kind.
SAMPLES: list[p.StreamMessage] = [
    p.CreateStream(request_id="r", name="s"),
    p.Init(request_id="r", name="s", address="stream_service:s"),
    p.Push(request_id="r", data=(b"a", b"b")),
    p.PushConfirm(request_id="r", status=1, indexes=("1-0",)),
    p.Pull(request_id="r", index="0-0", limit=10, wait_ms=100),
    p.Messages(request_id="r", messages=(("1-0", b"a"),), next_index="1-0"),
    p.GetIndex(request_id="r", client_id="c", stream="s"),
    p.SaveIndex(request_id="r", client_id="c", stream="s", index="1-0"),
    p.Index(request_id="r", client_id="c", stream="s", index="1-0"),
    p.Lease(request_id="r", stream="s", holder="h", ttl_ms=1000),
    p.Release(request_id="r", stream="s", holder="h"),
    p.DeadLetter(request_id="r", stream="s", index="1-0", data=b"x", reason="why"),
    p.Attempts(request_id="r", stream="s", key="c#1-0", op=p.INCR),
    p.Ok(request_id="r"),
    p.Error(request_id="r", code="not_found", message="no"),
]


def decodes_or_refuses(data: bytes) -> None:
    try:
        message = p.decode(data, max_payload=LIMIT)
    except RemoteProtocolError:
        pass
    else:
        assert type(message) in {type(s) for s in SAMPLES}
    assert isinstance(p.peek_request_id(data), str)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes(data: bytes) -> None:
    decodes_or_refuses(data)


@settings(max_examples=300, deadline=None)
@given(objects)
def test_any_msgpack_document(obj: object) -> None:
    decodes_or_refuses(msgpack.packb(obj, use_bin_type=True))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_wrong_types_in_every_field(sample: p.StreamMessage, data: st.DataObject) -> None:
    body = msgpack.unpackb(p.encode(sample), raw=False)
    position = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    body[position] = data.draw(objects)
    decodes_or_refuses(msgpack.packb(body, use_bin_type=True))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_every_kind_round_trips(sample: p.StreamMessage) -> None:
    assert p.decode(p.encode(sample), max_payload=LIMIT) == sample


NESTED = b"\x91" * 100_000 + b"\xc0"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(NESTED, id="100k-deep"),
        pytest.param(b"\x93\x03\xa1r" + NESTED, id="100k-deep-push-data"),
        pytest.param(b"\xdd\xff\xff\xff\xff", id="array-of-4G"),
        pytest.param(b"\xdf\xff\xff\xff\xff", id="map-of-4G"),
        pytest.param(b"\x93\x03\xa1r\x91\xc6\xff\xff\xff\xff", id="bin-of-4G"),
        pytest.param(b"\x93\x03\xdb\xff\xff\xff\xff", id="str-of-4G"),
        pytest.param(msgpack.packb([2**63, "r"]), id="kind-2**63"),
        pytest.param(msgpack.packb([2.0**256, "r"]), id="kind-2.0**256"),
        pytest.param(msgpack.packb([True, "r", "s"]), id="kind-bool"),
        pytest.param(msgpack.packb([p.Kind.PULL, "r", "0-0", 2.0**256, 0]), id="limit-float"),
        pytest.param(msgpack.packb([p.Kind.PULL, "r", "0-0", True, 0]), id="limit-bool"),
        pytest.param(msgpack.packb([p.Kind.OK]), id="missing-field"),
        pytest.param(msgpack.packb([p.Kind.OK, "r", "extra"]), id="extra-field"),
        pytest.param(msgpack.packb([p.Kind.PUSH, "r", []]), id="empty-push"),
        pytest.param(msgpack.packb([p.Kind.MESSAGES, "r", ["1-0"], "1-0"]), id="odd-messages"),
        pytest.param(b"", id="empty"),
    ],
)
def test_bombs_are_refused(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        p.decode(data, max_payload=LIMIT)
    assert isinstance(p.peek_request_id(data), str)


def test_big_numbers_decode_and_are_left_to_the_service_to_clamp() -> None:
    for n in (2**63 - 1, 2**63, 2**64 - 1, -(2**63)):
        pull = p.decode(msgpack.packb([p.Kind.PULL, "r", "0-0", n, n]), max_payload=LIMIT)
        assert isinstance(pull, p.Pull) and pull.limit == n


def test_sizes_at_and_just_over_each_limit() -> None:
    def push(count: int = 1, size: int = 1) -> bytes:
        return p.encode(p.Push(request_id="r", data=(b"x" * size,) * count))

    p.decode(push(size=LIMIT), max_payload=LIMIT)
    with pytest.raises(PayloadTooLarge):
        p.decode(push(size=LIMIT + 1), max_payload=LIMIT)
    p.decode(push(count=p.MAX_BATCH), max_payload=LIMIT)
    with pytest.raises(RemoteProtocolError):
        p.decode(push(count=p.MAX_BATCH + 1), max_payload=LIMIT)
    text = "t" * p.MAX_TEXT
    p.decode(p.encode(p.Ok(request_id=text)), max_payload=LIMIT)
    with pytest.raises(RemoteProtocolError):
        p.decode(p.encode(p.Ok(request_id=text + "t")), max_payload=LIMIT)
    assert p.peek_request_id(push(size=LIMIT + 1)) == "r"


def test_every_field_name_is_checked() -> None:
    """Every field of every kind refuses a value of the wrong type (a map, here)."""
    for sample in SAMPLES:
        for position in range(len(fields(sample))):
            body = msgpack.unpackb(p.encode(sample), raw=False)
            body[position + 1] = [[1, 2]] if isinstance(body[position + 1], str) else "s"
            with pytest.raises(RemoteProtocolError):
                p.decode(msgpack.packb(body, use_bin_type=True), max_payload=LIMIT)

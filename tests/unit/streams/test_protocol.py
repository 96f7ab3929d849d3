"""The stream-protocol codec: every message round-trips; malformed input is a clear error."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import (
    LeaseHeld,
    PayloadTooLarge,
    RedisUnavailable,
    RemoteProtocolError,
    StreamError,
    StreamNotFound,
)
from pipeline.streams import protocol as p

text = st.text(max_size=40)
ids = st.from_regex(r"\A[0-9]{1,13}-[0-9]{1,3}\Z")
blobs = st.binary(max_size=64)

stream_messages = st.one_of(
    st.builds(p.CreateStream, request_id=text, name=text),
    st.builds(p.Init, request_id=text, name=text, address=text),
    st.builds(p.Push, request_id=text, data=st.lists(blobs, min_size=1, max_size=5).map(tuple)),
    st.builds(
        p.PushConfirm,
        request_id=text,
        status=st.sampled_from([p.NEW, p.DUPLICATE]),
        indexes=st.lists(ids, max_size=5).map(tuple),
    ),
    st.builds(
        p.Pull,
        request_id=text,
        index=ids,
        limit=st.integers(0, 10_000),
        wait_ms=st.integers(0, 60_000),
    ),
    st.builds(
        p.Messages,
        request_id=text,
        messages=st.lists(st.tuples(ids, blobs), max_size=5).map(tuple),
        next_index=ids,
    ),
    st.builds(p.GetIndex, request_id=text, client_id=text, stream=text),
    st.builds(p.SaveIndex, request_id=text, client_id=text, stream=text, index=ids),
    st.builds(p.Index, request_id=text, client_id=text, stream=text, index=ids),
    st.builds(p.Lease, request_id=text, stream=text, holder=text, ttl_ms=st.integers(0, 10**6)),
    st.builds(p.Release, request_id=text, stream=text, holder=text),
    st.builds(p.DeadLetter, request_id=text, stream=text, index=ids, data=blobs, reason=text),
    st.builds(p.Ok, request_id=text),
    st.builds(p.Error, request_id=text, code=text, message=text),
)


@settings(deadline=None)
@given(stream_messages)
def test_round_trip(message: p.StreamMessage) -> None:
    assert p.decode(p.encode(message)) == message


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_only_remote_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        p.decode(data, max_payload=64)


@settings(max_examples=300, deadline=None)
@given(stream_messages, st.data())
def test_fuzz_mutations(message: p.StreamMessage, data: st.DataObject) -> None:
    raw = bytearray(p.encode(message))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(RemoteProtocolError):
        p.decode(bytes(raw))


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ([], "non-empty"),
        (["x"], "kind must be"),
        ([99], "unknown kind 99"),
        ([int(p.Kind.OK)], "takes 1 fields"),
        ([int(p.Kind.PUSH), "r", []], "1..10000"),
        ([int(p.Kind.PUSH), "r", ["text"]], "bytes"),
        ([int(p.Kind.PULL), "r", "0-0", "10", 5], "limit"),
        ([int(p.Kind.PULL), "r", "0-0", True, 5], "limit"),
        ([int(p.Kind.OK), 5], "request_id"),
        ([int(p.Kind.MESSAGES), "r", ["1-0"], "1-0"], "pairs"),
        ([int(p.Kind.MESSAGES), "r", [5, b"x"], "1-0"], "index must be"),
        ([int(p.Kind.MESSAGES), "r", ["1-0", "x"], "1-0"], "data must be bytes"),
    ],
)
def test_malformed(obj: object, reason: str) -> None:
    with pytest.raises(RemoteProtocolError, match=reason):
        p.decode(msgpack.packb(obj, use_bin_type=True))


def test_oversized_entry_is_payload_too_large() -> None:
    data = p.encode(p.Push(request_id="r", data=(b"x" * 100,)))
    with pytest.raises(PayloadTooLarge):
        p.decode(data, max_payload=50)


@pytest.mark.parametrize(
    ("code", "exc"),
    [
        (p.ErrorCode.NOT_FOUND, StreamNotFound),
        (p.ErrorCode.LEASE_HELD, LeaseHeld),
        (p.ErrorCode.TOO_LARGE, PayloadTooLarge),
        (p.ErrorCode.UNAVAILABLE, RedisUnavailable),
        (p.ErrorCode.BAD_REQUEST, RemoteProtocolError),
        ("other", StreamError),
    ],
)
def test_error_maps_to_exception(code: str, exc: type[Exception]) -> None:
    error = p.Error(request_id="r", code=code, message="why").exception()
    assert isinstance(error, exc)
    assert "why" in str(error)


def test_push_confirm_index_is_the_last() -> None:
    assert p.PushConfirm(request_id="r", status=1, indexes=("1-0", "2-0")).index == "2-0"
    assert p.PushConfirm(request_id="r", status=1, indexes=()).index == ""


def test_peek_request_id() -> None:
    assert p.peek_request_id(p.encode(p.Push(request_id="abc", data=(b"x" * 100,)))) == "abc"
    assert p.peek_request_id(b"\xc1") == ""
    assert p.peek_request_id(msgpack.packb([1])) == ""
    assert p.peek_request_id(msgpack.packb([1, 5])) == ""

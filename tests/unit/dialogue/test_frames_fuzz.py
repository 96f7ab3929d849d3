"""Hostile input to the Dialogue frame decoder and machine: fuzz plus fixed bombs.

Whatever the bytes and however they are chunked, :class:`Decoder` returns
frames or raises :class:`RemoteProtocolError` (holding at most one frame plus
a chunk), :meth:`Dialogue.receive_data` never raises (a defect closes the
dialogue with the error kept), and :func:`control.decode` returns a control
message or raises :class:`RemoteProtocolError`.
"""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dialogue import control
from pipeline.dialogue import events as ev
from pipeline.dialogue.packets import HAS_DATA, HEADER_SIZE, Decoder, PacketType
from pipeline.dialogue.protocol import Dialogue, Role, State
from pipeline.errors import PayloadTooLarge, RemoteProtocolError

MAX_FRAME = 1024
header = struct.Struct(">BII").pack


def frames() -> st.SearchStrategy[bytes]:
    """Frames that are mostly well formed (so the machine gets past the decoder)."""
    typed = st.builds(
        lambda t, pid, data: (
            header(t | (HAS_DATA if data is not None else 0), pid, len(data or b"")) + (data or b"")
        ),
        st.integers(min_value=0, max_value=7),
        st.integers(min_value=0, max_value=8) | st.integers(min_value=0, max_value=2**32 - 1),
        st.none() | st.binary(max_size=64),
    )
    return typed | st.binary(max_size=32)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.lists(st.integers(min_value=0), max_size=8))
def test_decoder_any_bytes_any_chunks(data: bytes, cuts: list[int]) -> None:
    decoder = Decoder(MAX_FRAME)
    try:
        for chunk in chunked(data, cuts):
            for ptype, pid, payload in decoder.feed(chunk):
                assert 0 <= ptype <= 7 and 0 <= pid < 2**32
                assert payload is None or len(payload) <= MAX_FRAME
            assert decoder.buffered <= MAX_FRAME + HEADER_SIZE + len(chunk)
    except RemoteProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([Role.CLIENT, Role.SERVER]),
    st.none() | st.integers(min_value=1, max_value=2**32 - 1),
    st.lists(frames(), max_size=30),
    st.lists(st.integers(min_value=0), max_size=8),
)
def test_machine_any_frames_never_raises(
    role: Role, window: int | None, parts: list[bytes], cuts: list[int]
) -> None:
    machine = Dialogue(role, max_frame=MAX_FRAME, window=window, max_incoming_requests=8)
    for chunk in chunked(b"".join(parts), cuts):
        machine.receive_data(chunk)
        events = machine.events_received()
        closed = [e for e in events if isinstance(e, ev.ConnectionClosed)]
        if closed:
            assert machine.state is State.CLOSED
            assert machine.close_reason
        machine.data_to_send()
    machine.receive_eof()
    assert machine.state in set(State)
    assert machine.outstanding()[1] <= 8


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_control_any_bytes(body: bytes) -> None:
    for kind in (b"H", b"G", b"X", b""):
        with contextlib.suppress(RemoteProtocolError):
            control.decode(control.PREFIX + kind + body)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(header(HAS_DATA, 0, MAX_FRAME + 1), PayloadTooLarge, id="just-over-max"),
        pytest.param(header(HAS_DATA, 0, 2**32 - 1), PayloadTooLarge, id="4GiB-announced"),
        pytest.param(header(0x10, 0, 0), RemoteProtocolError, id="type-byte-0x10"),
        pytest.param(header(0xFF, 0, 0), RemoteProtocolError, id="type-byte-0xff"),
        pytest.param(header(0, 0, 1), RemoteProtocolError, id="length-without-data-flag"),
    ],
)
def test_bad_headers_are_refused_from_the_header_alone(data: bytes, error: type[Exception]) -> None:
    decoder = Decoder(MAX_FRAME)
    with pytest.raises(error):
        decoder.feed(data)  # 9 bytes: nothing of the announced size was allocated
    machine = Dialogue(Role.SERVER, max_frame=MAX_FRAME)
    machine.receive_data(data)
    assert machine.state is State.CLOSED and isinstance(machine.error, error)


def test_exactly_max_frame_is_accepted_and_buffered_until_complete() -> None:
    decoder = Decoder(MAX_FRAME)
    data = header(HAS_DATA, 0, MAX_FRAME) + b"x" * MAX_FRAME
    assert decoder.feed(data[:-1]) == []
    assert decoder.buffered == len(data) - 1
    assert decoder.feed(data[-1:]) == [(0, 0, b"x" * MAX_FRAME)]
    assert decoder.buffered == 0


def test_counts_are_bounded() -> None:
    """One request or duplex over the bound closes the dialogue (no unbounded tables)."""
    machine = Dialogue(Role.SERVER, max_frame=MAX_FRAME, max_incoming_requests=4, max_duplexes=4)
    requests = b"".join(header(PacketType.REQUEST | HAS_DATA, i, 1) + b"q" for i in range(1, 6))
    machine.receive_data(requests)
    assert machine.state is State.CLOSED and "too many" in str(machine.error)
    machine = Dialogue(Role.SERVER, max_frame=MAX_FRAME, max_incoming_requests=4, max_duplexes=4)
    duplexes = b"".join(header(PacketType.DUPLEX_INITIAL, i, 0) for i in range(1, 6))
    machine.receive_data(duplexes)
    assert machine.state is State.CLOSED and "too many" in str(machine.error)


def test_a_flood_of_empty_frames_in_one_chunk() -> None:
    """100k frames in one read: parsed (bounded by the read size), no recursion, no error."""
    machine = Dialogue(Role.SERVER, max_frame=MAX_FRAME)
    machine.receive_data(header(PacketType.MESSAGE | HAS_DATA, 0, 0) * 100_000)
    assert machine.state is State.OPEN
    assert len(machine.events_received()) == 100_000


def test_ids_at_the_u32_edges() -> None:
    machine = Dialogue(Role.SERVER, max_frame=MAX_FRAME)
    machine.receive_data(header(PacketType.RESPONSE | HAS_DATA, 2**32 - 1, 1) + b"r")
    assert machine.state is State.CLOSED and "never issued" in str(machine.error)

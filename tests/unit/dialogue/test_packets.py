"""Frames: every packet type round-trips; malformed input raises only protocol errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dialogue.packets import (
    HEADER_SIZE,
    Decoder,
    Packet,
    PacketType,
    decode_packet,
    encode_packet,
)
from pipeline.errors import LocalProtocolError, PayloadTooLarge, ProtocolError, RemoteProtocolError


@pytest.mark.parametrize("ptype", list(PacketType))
@pytest.mark.parametrize("data", [None, b"", b"payload", bytes(range(256))])
def test_every_type_round_trips(ptype: PacketType, data: bytes | None) -> None:
    packet = Packet(type=ptype, id=0xDEADBEEF, data=data)
    assert decode_packet(packet.encode()) == packet


def test_wire_layout_is_the_design_frame() -> None:
    assert Packet(type=PacketType.RESPONSE, id=258, data=b"ab").encode() == (
        b"\x0a\x00\x00\x01\x02\x00\x00\x00\x02ab"
    )
    assert Packet(type=PacketType.DUPLEX_RESPONSE_END, id=1).encode() == (
        b"\x07\x00\x00\x00\x01\x00\x00\x00\x00"
    )


def test_empty_data_differs_from_no_data() -> None:
    assert decode_packet(Packet(type=PacketType.REQUEST, id=1, data=b"").encode()).data == b""
    assert decode_packet(Packet(type=PacketType.REQUEST, id=1).encode()).data is None


def test_decoder_reassembles_frames_split_at_every_byte() -> None:
    frames = [
        b"".join(encode_packet(t, i, d))
        for i, (t, d) in enumerate([(0, b"hello"), (1, None), (4, b"x" * 300), (7, b"")])
    ]
    stream = b"".join(frames)
    for cut in range(len(stream) + 1):
        decoder = Decoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert got == [(0, 0, b"hello"), (1, 1, None), (4, 2, b"x" * 300), (7, 3, b"")]
        assert decoder.buffered == 0


def test_decoder_one_byte_at_a_time() -> None:
    stream = b"".join(encode_packet(5, 9, b"abc")) * 3
    decoder = Decoder()
    got = [p for byte in stream for p in decoder.feed(bytes([byte]))]
    assert got == [(5, 9, b"abc")] * 3


@pytest.mark.parametrize("tbyte", [0x10, 0x18, 0x80, 0xFF])
def test_unknown_type_is_a_protocol_error(tbyte: int) -> None:
    with pytest.raises(RemoteProtocolError, match="unknown packet type"):
        Decoder().feed(bytes([tbyte]) + b"\x00" * 8)


def test_oversize_frame_is_refused_from_its_header() -> None:
    decoder = Decoder(max_frame=100)
    header = encode_packet(0, 0, b"x" * 101)[0]
    with pytest.raises(PayloadTooLarge):
        decoder.feed(header)  # the payload never has to arrive
    assert Decoder(max_frame=100).feed(b"".join(encode_packet(0, 0, b"x" * 100)))


def test_length_without_data_flag_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="without data flag"):
        Decoder().feed(b"\x01\x00\x00\x00\x01\x00\x00\x00\x05hello")


def test_decode_packet_wants_exactly_one_frame() -> None:
    frame = Packet(type=PacketType.MESSAGE, id=0, data=b"a").encode()
    with pytest.raises(RemoteProtocolError):
        decode_packet(frame + frame)
    with pytest.raises(RemoteProtocolError):
        decode_packet(frame[:-1])


def test_packet_id_must_be_u32() -> None:
    with pytest.raises(LocalProtocolError):
        Packet(type=PacketType.MESSAGE, id=1 << 32)
    with pytest.raises(LocalProtocolError):
        Decoder(max_frame=-1)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=4096),
    chunk=st.integers(min_value=1, max_value=64),
    max_frame=st.integers(min_value=0, max_value=512),
)
def test_fuzz_random_bytes_only_protocol_errors_bounded_memory(
    data: bytes, chunk: int, max_frame: int
) -> None:
    decoder = Decoder(max_frame=max_frame)
    try:
        for start in range(0, len(data), chunk):
            for ptype, pid, pdata in decoder.feed(data[start : start + chunk]):
                assert 0 <= ptype <= 7 and 0 <= pid < 1 << 32
                assert pdata is None or len(pdata) <= max_frame
            assert decoder.buffered <= HEADER_SIZE + max_frame + chunk
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(PacketType)),
            st.integers(0, (1 << 32) - 1),
            st.none() | st.binary(max_size=64),
        ),
        max_size=20,
    ),
    st.integers(min_value=1, max_value=50),
)
def test_property_any_frame_sequence_round_trips(
    packets: list[tuple[PacketType, int, bytes | None]], chunk: int
) -> None:
    stream = b"".join(b"".join(encode_packet(t, i, d)) for t, i, d in packets)
    decoder = Decoder()
    got = [p for s in range(0, len(stream), chunk) for p in decoder.feed(stream[s : s + chunk])]
    assert got == [(int(t), i, d) for t, i, d in packets]

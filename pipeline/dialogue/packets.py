"""Dialogue frames: encode, decode, and the maximum frame size.

A frame is ``1 byte type | (0x08 if it carries data)``, a big-endian u32 id, a
big-endian u32 length, then ``length`` bytes of data (see WIRE.md). A frame
without the data flag must have length 0; a frame with the flag may carry
empty data, which is *not* the same as carrying none (only "no data" means
cancellation or close).

The :class:`Decoder` is incremental: feed it whatever bytes arrive and it
returns the complete frames. It checks a frame's header before buffering its
payload, so it never holds more than one maximum-size frame plus the last
chunk it was fed. Malformed input raises :class:`RemoteProtocolError` (or
:class:`PayloadTooLarge`), and nothing else.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from pipeline.errors import LocalProtocolError, PayloadTooLarge, RemoteProtocolError

#: type byte (with the has-data flag), id, length.
HEADER = struct.Struct(">BII")
HEADER_SIZE = HEADER.size
HAS_DATA = 0x08
MAX_ID = 0xFFFFFFFF
#: Default largest data length of one frame (1 MiB, like ``Settings.max_payload``).
DEFAULT_MAX_FRAME = 1 << 20

_pack = HEADER.pack
_unpack_from = HEADER.unpack_from


class PacketType(enum.IntEnum):
    """The eight packet types, numbered in the seed's order."""

    MESSAGE = 0
    REQUEST = 1
    RESPONSE = 2
    DUPLEX_INITIAL = 3
    DUPLEX_REQUEST = 4
    DUPLEX_RESPONSE = 5
    DUPLEX_REQUEST_END = 6
    DUPLEX_RESPONSE_END = 7


# The packet types as plain ints, for the machine's hot paths (no enum lookup).
MESSAGE = PacketType.MESSAGE.value
REQUEST = PacketType.REQUEST.value
RESPONSE = PacketType.RESPONSE.value
DUPLEX_INITIAL = PacketType.DUPLEX_INITIAL.value
DUPLEX_REQUEST = PacketType.DUPLEX_REQUEST.value
DUPLEX_RESPONSE = PacketType.DUPLEX_RESPONSE.value
DUPLEX_REQUEST_END = PacketType.DUPLEX_REQUEST_END.value
DUPLEX_RESPONSE_END = PacketType.DUPLEX_RESPONSE_END.value

#: A decoded frame as the hot path sees it: (type, id, data or None).
RawPacket = tuple[int, int, bytes | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Packet:
    """One frame. ``data is None`` means the packet carries no data."""

    type: PacketType
    id: int
    data: bytes | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.id <= MAX_ID:
            raise LocalProtocolError(f"packet id {self.id} is not a u32")

    def encode(self) -> bytes:
        return b"".join(encode_packet(self.type, self.id, self.data))


def encode_packet(ptype: int, pid: int, data: bytes | None) -> tuple[bytes, ...]:
    """The frame as one or two byte strings (header, data): join or write them in order."""
    if data is None:
        return (_pack(ptype, pid, 0),)
    return (_pack(ptype | HAS_DATA, pid, len(data)), data)


def decode_packet(frame: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> Packet:
    """Decode exactly one whole frame (raises RemoteProtocolError on anything else)."""
    decoder = Decoder(max_frame)
    packets = decoder.feed(frame)
    if len(packets) != 1 or decoder.buffered:
        raise RemoteProtocolError("not exactly one frame", public="malformed frame")
    ptype, pid, data = packets[0]
    return Packet(type=PacketType(ptype), id=pid, data=data)


class Decoder:
    """Incremental frame parser with a maximum data length per frame."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 0 or max_frame > MAX_ID:
            raise LocalProtocolError(f"max_frame {max_frame} out of range")
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[RawPacket]:
        """Add bytes; return every complete frame, in order.

        On a malformed frame raise :class:`RemoteProtocolError`; the decoder is
        then unusable (the stream has no resynchronisation point).
        """
        if self._buf:
            self._buf += data
            buf: bytes | bytearray = self._buf
        else:
            buf = data
        n = len(buf)
        pos = 0
        out: list[RawPacket] = []
        max_frame = self.max_frame
        with memoryview(buf) as view:
            while n - pos >= HEADER_SIZE:
                tbyte, pid, length = _unpack_from(buf, pos)
                if tbyte & 0xF0:
                    raise RemoteProtocolError(
                        f"unknown packet type byte 0x{tbyte:02x}", public="unknown packet type"
                    )
                if length > max_frame:
                    raise PayloadTooLarge(f"frame of {length} bytes exceeds maximum {max_frame}")
                start = pos + HEADER_SIZE
                if tbyte & HAS_DATA:
                    end = start + length
                    if end > n:
                        break
                    out.append((tbyte & 0x07, pid, bytes(view[start:end])))
                    pos = end
                else:
                    if length:
                        raise RemoteProtocolError(
                            "frame without data flag has a length", public="malformed frame"
                        )
                    out.append((tbyte, pid, None))
                    pos = start
            rest = bytes(view[pos:]) if pos < n and buf is not self._buf else b""
        if buf is self._buf:
            del self._buf[:pos]
        elif rest:
            self._buf = bytearray(rest)
        return out

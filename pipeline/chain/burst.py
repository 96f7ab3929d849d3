"""Catch-up bursts: many websocket text frames written to the transport at once.

A catch-up hands the connection's writer hundreds of frames at a time.
Sent one by one through aiohttp's ``send_frame``, each frame is a
``transport.write`` that asyncio turns into a ``send()`` system call as long
as the kernel takes the data (it does: loopback and LAN sockets have large
send buffers): about a quarter of a catch-up's CPU (py-spy, ``make bench
B=resume``). :func:`frame_texts` builds the frames of a run of texts as one
bytes object, the exact bytes aiohttp writes for each (RFC 6455: FIN, text
opcode, no mask, no compression, shortest length form), so a run costs one
write.

Pure: no I/O. The writer (:class:`pipeline.chain.serve.wsconn.Connection`) decides
when a burst may be written: only on a connection without compression, while
the transport's buffer is empty, at most :data:`BURST_BYTES` at once, and
always through aiohttp's own ``send_frame`` for the rest (its flow control
then applies, see there).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

#: Largest burst written at once, in bytes of frames (a bound on what one write may
#: leave in the transport's buffer beyond aiohttp's own flow control).
BURST_BYTES = 256 * 1024

_FIN_TEXT = 0x81
#: The 2-byte headers of every short payload length (0..125).
_SHORT = tuple(bytes((_FIN_TEXT, n)) for n in range(126))
_PACK16 = struct.Struct("!BBH").pack
_PACK64 = struct.Struct("!BBQ").pack


def frame_header(length: int) -> bytes:
    """The header of an unmasked, uncompressed, final text frame of ``length`` payload bytes."""
    if length < 126:
        return _SHORT[length]
    if length < 65536:
        return _PACK16(_FIN_TEXT, 126, length)
    return _PACK64(_FIN_TEXT, 127, length)


def burst_end(texts: Sequence[bytes], start: int, limit: int = BURST_BYTES) -> int:
    """The end of the run of ``texts`` from ``start`` whose frames fit in ``limit`` bytes
    (a header's allowance included); ``start`` itself when its first text does not fit."""
    size = 0
    for end in range(start, len(texts)):
        size += len(texts[end]) + 10
        if size > limit:
            return end
    return len(texts)


def frame_texts(texts: Sequence[bytes]) -> bytes:
    """The websocket frames of ``texts`` (UTF-8 payloads) back to back, as aiohttp writes them."""
    parts: list[bytes] = []
    append = parts.append
    short = _SHORT
    for text in texts:
        n = len(text)
        append(short[n] if n < 126 else frame_header(n))
        append(text)
    return b"".join(parts)


#: Largest ``wire`` a :class:`SharedFrames` keeps: asyncio's default high-water mark (a
#: connection writes it directly only below its transport's mark). Bigger frames go
#: through the writer, and recent live blocks (kept for fork choice) do not hold twice.
WIRE_BYTES = 64 * 1024


class SharedFrames(tuple[bytes, ...]):
    """The notification texts of one live block for one subscription prefix, shared by every
    subscriber with that prefix (:mod:`pipeline.chain.serve.frames`), with ``wire``: their
    websocket frames back to back (:func:`frame_texts`), built once for all of them, which
    a connection with nothing queued writes as they are
    (:meth:`pipeline.chain.serve.wswrite.Sending._write_direct`); None over :data:`WIRE_BYTES`."""

    wire: bytes | None

    @classmethod
    def of(cls, texts: Sequence[bytes]) -> SharedFrames:
        shared = cls(texts)
        size = sum([len(t) + 10 for t in shared])  # (a header's allowance each)
        shared.wire = frame_texts(shared) if size <= WIRE_BYTES else None
        return shared


__all__ = ["BURST_BYTES", "WIRE_BYTES", "SharedFrames", "burst_end", "frame_header", "frame_texts"]

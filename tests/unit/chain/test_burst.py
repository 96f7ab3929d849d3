"""Burst frames are the bytes aiohttp's own writer sends for each text, back to back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import WSMsgType
from aiohttp.http import WebSocketWriter

from pipeline.chain.burst import BURST_BYTES, WIRE_BYTES, SharedFrames, burst_end, frame_texts


class _Recorder:
    """A transport that keeps what it is given (aiohttp's writer only calls these)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False


class _Protocol:
    _paused = False


def _aiohttp_frames(texts: list[bytes]) -> bytes:
    async def run() -> bytes:
        transport = _Recorder()
        writer = WebSocketWriter(_Protocol(), transport)  # type: ignore[arg-type]
        for text in texts:
            await writer.send_frame(text, WSMsgType.TEXT)
        return bytes(transport.data)

    return asyncio.run(run())


@pytest.mark.parametrize("sizes", [[0, 1, 125], [126, 127, 65535], [65536, 70_000], [3] * 50])
def test_frames_equal_aiohttps_writer(sizes: list[int]) -> None:
    texts = [(b"x" * n) for n in sizes]
    assert frame_texts(texts) == _aiohttp_frames(texts)


def test_a_burst_ends_before_the_text_that_would_pass_the_limit() -> None:
    texts: list[Any] = [b"a" * 90] * 10
    assert burst_end(texts, 0, limit=1000) == 10  # 10 * (90 + 10) fits exactly
    assert burst_end(texts, 0, limit=999) == 9
    assert burst_end(texts, 4, limit=250) == 6
    assert burst_end(texts, 10) == 10  # nothing left
    big = [b"b" * (BURST_BYTES + 1), b"c"]
    assert burst_end(big, 0) == 0  # a text over the limit is never part of a burst
    assert burst_end(big, 1) == 2


@pytest.mark.parametrize("sizes", [[0], [125], [126, 3], [65000], [3] * 5])
def test_shared_frames_wire_equals_aiohttps_writer(sizes: list[int]) -> None:
    texts = [(bytes([65 + i % 26]) * n) for i, n in enumerate(sizes)]
    shared = SharedFrames.of(texts)
    assert list(shared) == texts and isinstance(shared, tuple)
    assert shared.wire == _aiohttp_frames(texts)


def test_shared_frames_over_the_wire_bound_keep_no_second_copy() -> None:
    small = SharedFrames.of([b"x" * (WIRE_BYTES - 10)])
    big = SharedFrames.of([b"x" * (WIRE_BYTES - 9)])
    assert small.wire == _aiohttp_frames(list(small))
    assert big.wire is None and list(big) == [b"x" * (WIRE_BYTES - 9)]

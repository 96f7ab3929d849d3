"""Contract of pipeline.chain.aiohttp_adapter with aiohttp: fails loudly when an upgrade moves an internal.

RawWriter writes whole frames to aiohttp's transport and waits through
``BaseProtocol._drain_helper``. If any of these checks fails after an aiohttp
upgrade, the server already falls back to PublicWriter (only the versions in
SUPPORTED use the shortcut); re-check the internals below, then add the
version to SUPPORTED, or drop the shortcut.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_websocket import WebSocketWriter
from aiohttp.web_protocol import RequestHandler

from pipeline.chain import aiohttp_adapter
from pipeline.chain.aiohttp_adapter import SUPPORTED, PublicWriter, text_frame


def test_aiohttp_is_a_version_the_shortcut_was_checked_against() -> None:
    version = tuple(int(x) for x in aiohttp.__version__.split(".")[:2])
    assert version in SUPPORTED, (
        f"aiohttp {aiohttp.__version__} is not in aiohttp_adapter.SUPPORTED: the server now uses "
        "the public (slower) writer; re-check RawWriter's internals, then add the version"
    )


def test_the_internals_raw_writer_uses_exist() -> None:
    assert issubclass(RequestHandler, BaseProtocol)  # what web.BaseRequest.protocol is
    assert inspect.iscoroutinefunction(BaseProtocol._drain_helper)
    assert isinstance(inspect.getattr_static(BaseProtocol, "writing_paused"), property)
    assert isinstance(inspect.getattr_static(web.BaseRequest, "protocol"), property)
    assert isinstance(inspect.getattr_static(web.BaseRequest, "transport"), property)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def write(self, data: Any) -> None:
        self.data += bytes(data)

    def is_closing(self) -> bool:
        return False


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
async def test_hand_built_frames_equal_aiohttps_own(size: int) -> None:
    text = "é" * (size // 2) + "x" * (size % 2)
    transport = _Transport()
    protocol = BaseProtocol(asyncio.get_running_loop())
    protocol.connection_made(transport)
    writer = WebSocketWriter(protocol, transport, use_mask=False)
    await writer.send_frame(text.encode(), WSMsgType.TEXT)
    assert text_frame(text.encode()) == bytes(transport.data)


def test_the_public_writer_is_chosen_off_the_checked_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws, request = web.WebSocketResponse(), cast(web.BaseRequest, object())  # (not read)
    cache = aiohttp_adapter.FrameCache()
    monkeypatch.setattr(aiohttp_adapter, "SUPPORTED", frozenset())
    assert isinstance(aiohttp_adapter.frame_writer(ws, request, cache), PublicWriter)
    monkeypatch.setattr(aiohttp_adapter, "SUPPORTED", SUPPORTED)
    monkeypatch.setenv("SLUICE_WS_PUBLIC", "1")
    assert isinstance(aiohttp_adapter.frame_writer(ws, request, cache), PublicWriter)

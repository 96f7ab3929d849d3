"""The long-running processes' event loop: uvloop when installed, else asyncio's."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from pipeline.runtime import loops


async def _loop_kind() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_when_it_is_installed() -> None:
    assert loops.loop_factory() is uvloop.new_event_loop
    assert issubclass(loops.run(_loop_kind()), uvloop.Loop)


def test_asyncio_s_own_loop_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError
    assert loops.loop_factory() is None
    kind = loops.run(_loop_kind())
    assert not issubclass(kind, uvloop.Loop)
    assert issubclass(kind, asyncio.BaseEventLoop)


def test_run_returns_the_coroutine_s_result_and_raises_its_error() -> None:
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise ValueError("no")

    assert loops.run(answer()) == 42
    with pytest.raises(ValueError, match="no"):
        loops.run(fail())

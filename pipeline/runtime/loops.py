"""The event loop of Sluice's long-running asyncio processes (``sluice bus``, ``sluice serve``).

uvloop when it is installed (a core dependency, except on Windows), else
asyncio's own loop. uvloop's transports and loop are in C: ``sluice serve``
spent about a tenth less CPU per message in the live fan-out on it
(``fanout_go_publish_cpu_us_per_message`` of ``make bench B=resume``), and the
bus was moved to it earlier (``make bench B=bus``). Two behaviours differ and
are handled where they meet Sluice: its transports are not subclasses of
``asyncio.Transport`` (they have its methods), and a write on a transport it
closed already raises ``RuntimeError`` (:mod:`pipeline.redisio.conn` turns that
into a ``ConnectionError`` for every Redis client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed, else None (asyncio's default)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on :func:`loop_factory`'s loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


__all__ = ["loop_factory", "run"]

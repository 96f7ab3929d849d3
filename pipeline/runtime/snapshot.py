"""One JSON snapshot shared by every reader of a page, rebuilt at most once per TTL.

Used by the status page of ``sluice serve`` and the Airflow coverage view: any
number of viewers cost one build per ``ttl_s``; callers that arrive while a
build runs wait for it instead of starting their own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any


class SharedSnapshot:
    """``await get()`` returns the JSON bytes of ``build()``, at most ``ttl_s`` old."""

    def __init__(self, build: Callable[[], Awaitable[Any]], ttl_s: float) -> None:
        self._build = build
        self._ttl_s = ttl_s
        self._body: bytes | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    def _fresh(self) -> bool:
        return self._body is not None and time.monotonic() - self._at < self._ttl_s

    async def get(self) -> bytes:
        if self._body is not None and self._fresh():
            return self._body
        async with self._lock:
            if self._body is None or not self._fresh():
                self._body = json.dumps(await self._build(), separators=(",", ":")).encode()
                self._at = time.monotonic()
            return self._body


__all__ = ["SharedSnapshot"]

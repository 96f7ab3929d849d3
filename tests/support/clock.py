"""A clock moved by hand, for code that reads ``time.monotonic()`` through its module's ``time``.

Patch it in for the module under test (``monkeypatch.setattr(module, "time", clock)``):
``monotonic()`` stands still until a test moves ``now``; ``time()`` is the wall clock.
"""

from __future__ import annotations

import time


class HandClock:
    """``time`` as one module sees it, its monotonic reading moved only by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

"""Log lines of a repeating failure, bounded: one gate for every retry loop.

A loop that retries while Redis is away or refuses writes fails every few
hundred milliseconds; one line per attempt buries the cause in noise (and a
dead peer fails every request at once). A :class:`LogGate` keys each
condition (a failure class, a peer, a queue) and logs for it:

- the first occurrence, with its cause, at once;
- then at most one line per ``every_s`` seconds, saying how many were
  suppressed since the line before (every one is still counted where the
  caller counts it, in ``/metrics``);
- one line when the condition ends (:meth:`LogGate.ended`, at WARNING at
  most), with how long it lasted and how many failures it saw; an end with no
  open condition logs nothing, so callers may call it on every success.

Pure: no I/O besides the logger, the clock injected. Not thread-safe (each
gate belongs to one event loop or one thread). At most ``max_keys`` conditions
are remembered; beyond that the oldest is forgotten (its next failure is then
logged as a first one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

#: Default seconds between two lines of one still-failing condition.
EVERY_S = 10.0


@dataclass(slots=True)
class _Open:
    since: float
    logged_at: float
    failures: int = 1
    suppressed: int = 0


class LogGate:
    """Rate-limited log lines per condition key (see the module docstring)."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = EVERY_S,
        *,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        if every_s < 0 or max_keys < 1:
            raise ValueError("every_s must be non-negative and max_keys positive")
        self._log = logger
        self._every = every_s
        self._level = level
        self._clock = clock
        self._max = max_keys
        self._open: dict[Hashable, _Open] = {}

    def failing(self, key: Hashable) -> bool:
        """Whether ``key``'s condition is open (failed, not ended since)."""
        return key in self._open

    def failed(self, key: Hashable, msg: str, *args: object, level: int | None = None) -> bool:
        """One more failure of ``key``: logged if it is the first, or ``every_s`` passed
        since its last line (then with the count suppressed in between). True if logged."""
        now = self._clock()
        state = self._open.get(key)
        if state is None:
            if len(self._open) >= self._max:
                del self._open[next(iter(self._open))]
            self._open[key] = _Open(since=now, logged_at=now)
            self._log.log(self._level if level is None else level, msg, *args)
            return True
        state.failures += 1
        if now - state.logged_at < self._every:
            state.suppressed += 1
            return False
        self._log.log(
            self._level if level is None else level,
            msg + " (still failing after %.1fs; %d more such line(s) suppressed)",
            *args,
            now - state.since,
            state.suppressed,
        )
        state.logged_at, state.suppressed = now, 0
        return True

    def open_keys(self) -> list[Hashable]:
        """The open conditions' keys, oldest first."""
        return list(self._open)

    def forget(self, match: Callable[[Hashable], bool]) -> None:
        """Close the conditions whose key ``match``es, silently (the caller said it ended)."""
        for key in [k for k in self._open if match(k)]:
            del self._open[key]

    def ended(self, key: Hashable, msg: str, *args: object) -> bool:
        """``key``'s condition is over: one line (with its duration and failure count) if
        it was open, else nothing. True if logged."""
        state = self._open.pop(key, None)
        if state is None:
            return False
        self._log.log(
            min(self._level, logging.WARNING),  # a recovery is no error
            msg + " (after %.1fs, %d failure(s))",
            *args,
            self._clock() - state.since,
            state.failures,
        )
        return True

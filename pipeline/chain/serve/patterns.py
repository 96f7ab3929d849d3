"""Client prefix patterns: RE2 expressions matched at the start of each key.

RE2 runs in time linear in the key, so no client pattern can stall the
server. Patterns are bounded in number and length; one that does not compile
is refused with :class:`~pipeline.errors.BadParams` naming it. An empty list
keeps every key.
"""

from __future__ import annotations

from collections.abc import Sequence

import re2

from pipeline.errors import BadParams

MAX_PATTERNS = 32
MAX_PATTERN_LEN = 256
_CACHE_LIMIT = 4096


class KeyFilter:
    """``filter(key)`` is True when some pattern matches at the start of ``key``."""

    __slots__ = ("_cache", "_regex", "patterns")

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        options = re2.Options()
        options.log_errors = False
        options.max_mem = 1 << 20
        self._regex = re2.compile("|".join(f"(?:{p})" for p in self.patterns), options)
        self._cache: dict[str, bool] = {}

    def __call__(self, key: str) -> bool:
        hit = self._cache.get(key)
        if hit is None:
            hit = self._regex.match(key) is not None
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit


def compile_patterns(raw: object) -> KeyFilter | None:
    """Validate and compile a params list of patterns; None means keep everything."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadParams("prefix patterns must be a list of strings")
    if len(raw) > MAX_PATTERNS:
        raise BadParams(f"at most {MAX_PATTERNS} prefix patterns, got {len(raw)}")
    options = re2.Options()
    options.log_errors = False
    options.max_mem = 1 << 20
    for index, pattern in enumerate(raw):
        if not isinstance(pattern, str):
            raise BadParams(f"prefix pattern {index} is not a string")
        if len(pattern) > MAX_PATTERN_LEN:
            raise BadParams(f"prefix pattern {index} is longer than {MAX_PATTERN_LEN} characters")
        try:
            re2.compile(pattern, options)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else "invalid"
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", "replace")
            raise BadParams(f"prefix pattern {index} does not compile: {reason}") from exc
    return KeyFilter(raw) if raw else None

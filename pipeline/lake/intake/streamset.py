"""Which streams a run archives: ``SLUICE_STREAMS`` names and glob patterns, resolved in Redis.

``lake.streams`` holds stream names and glob patterns (``*``, ``?``, ``[...]``,
matched like Redis' ``SCAN MATCH``, e.g. ``events:*``). A run resolves them
once, at its start (:func:`resolve`): a name stands for itself, whether Redis
holds it yet or not; a pattern stands for every stream key Redis holds that
matches it, found with ``SCAN ... TYPE stream`` on one server, on every master
of a Redis Cluster (redis-py's cluster ``scan_iter`` walks each primary). So a
stream created later is archived and trimmed from the next run on, without a
redeploy.

``lake.chain_streams`` holds names and patterns too: a resolved stream is a
chain stream when one of them matches it (:func:`is_chain`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from pipeline import keys
from pipeline.errors import ConfigError, RedisUnavailable
from pipeline.settings import LakeSettings, Settings

#: Characters that make a ``SLUICE_STREAMS`` item a pattern (Redis glob syntax).
GLOB = frozenset("*?[")
#: Keys asked for per ``SCAN`` call (a hint to Redis, not a bound).
SCAN_COUNT = 1000
#: Most streams one pattern may resolve to: a run maps one task per stream.
MAX_MATCHES = 10_000


def is_pattern(item: str) -> bool:
    """True when a ``SLUICE_STREAMS`` / ``SLUICE_CHAIN_STREAMS`` item is a glob pattern."""
    return any(ch in GLOB for ch in item)


def matches(items: tuple[str, ...], stream: str) -> bool:
    """True when ``stream`` is one of ``items`` or matches one of their patterns."""
    return any(item == stream or (is_pattern(item) and fnmatchcase(stream, item)) for item in items)


def is_chain(lake: LakeSettings, stream: str) -> bool:
    """True when ``stream`` carries one block per entry (``lake.chain_streams``)."""
    return matches(lake.chain_streams, stream)


def is_configured(lake: LakeSettings, stream: str) -> bool:
    """True when ``SLUICE_STREAMS`` names ``stream`` or has a pattern matching it."""
    return matches(lake.streams, stream)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The streams of one run, in ``SLUICE_STREAMS`` order (a pattern's in name order)."""

    streams: tuple[str, ...]
    chain_streams: tuple[str, ...]


def resolve(lake: LakeSettings, client: Any, items: tuple[str, ...] | None = None) -> Resolved:
    """Resolve ``items`` (default ``lake.streams``) in the Redis of ``client`` (redis-py).

    Raises :class:`RedisUnavailable` when Redis cannot be scanned and
    :class:`ConfigError` when a pattern matches more than :data:`MAX_MATCHES`.
    """
    from pipeline.redisio.conn import UNAVAILABLE

    found: dict[str, None] = {}
    for item in lake.streams if items is None else items:
        if not is_pattern(item):
            found[item] = None
            continue
        try:
            names = _scan(client, item)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(f"redis unavailable while resolving {item!r}: {exc}") from exc
        found.update(dict.fromkeys(names))
    streams = tuple(found)
    return Resolved(streams, tuple(s for s in streams if is_chain(lake, s)))


def resolve_now(settings: Settings, items: tuple[str, ...] | None = None) -> Resolved:
    """:func:`resolve` on a client of ``settings.redis.url`` (no Redis call without a pattern)."""
    wanted = settings.lake.streams if items is None else items
    if not any(is_pattern(item) for item in wanted):
        return resolve(settings.lake, None, wanted)
    from pipeline.lake.intake.redisread import connect

    client = connect(settings.redis.url)
    try:
        return resolve(settings.lake, client, wanted)
    finally:
        client.close()


def _scan(client: Any, pattern: str) -> list[str]:
    names: set[str] = set()
    for key in client.scan_iter(match=keys.stream(pattern), count=SCAN_COUNT, _type="stream"):
        raw = key.decode() if isinstance(key, bytes) else str(key)
        try:
            name = keys.stream_name(raw)
        except ConfigError:
            continue
        if fnmatchcase(name, pattern):  # SCAN's glob may also match across ':}' seams
            names.add(name)
            if len(names) > MAX_MATCHES:
                raise ConfigError(
                    f"stream pattern {pattern!r} matches more than {MAX_MATCHES} streams"
                )
    return sorted(names)


__all__ = [
    "Resolved",
    "is_chain",
    "is_configured",
    "is_pattern",
    "matches",
    "resolve",
    "resolve_now",
]

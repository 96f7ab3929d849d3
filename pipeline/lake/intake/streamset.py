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
chain stream when one of them matches it (:func:`is_chain`). The setting is
the rule; :func:`check_kind` only catches a slip in it, from the stream's
first and last entries in Redis (:mod:`pipeline.blockcodec.streamkind` says
why), and the archive, canonical and trim jobs call it before any write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from pipeline import keys
from pipeline.blockcodec.streamkind import GLOB, Look, is_pattern, look, matches, mismatch
from pipeline.errors import ConfigError, RedisUnavailable, StreamKindError
from pipeline.settings import LakeSettings, Settings

#: Keys asked for per ``SCAN`` call (a hint to Redis, not a bound).
SCAN_COUNT = 1000
#: Most streams one pattern may resolve to: a run maps one task per stream.
MAX_MATCHES = 10_000


def is_chain(lake: LakeSettings, stream: str) -> bool:
    """True when ``stream`` carries one block per entry (``lake.chain_streams``)."""
    return matches(lake.chain_streams, stream)


def sample(client: Any, key: str) -> list[Look]:
    """How the first and the last entry of the stream at ``key`` look (one look for one
    entry, none for none): ``XRANGE - + COUNT 1`` and ``XREVRANGE + - COUNT 1`` on a
    redis-py client whose replies are parsed (:func:`~pipeline.lake.intake.redisread.connect`).
    Redis errors reach the caller."""
    first = client.xrange(key, "-", "+", count=1)
    if not first:
        return []
    last = client.xrevrange(key, "+", "-", count=1) or first
    entries = [first[0]] if last[0][0] == first[0][0] else [first[0], last[0]]
    return [look(fields) for _, fields in entries]


def check_kind(lake: LakeSettings, stream: str, looks: list[Look]) -> None:
    """Raise :class:`StreamKindError` when ``looks`` (:func:`sample`) contradict
    ``lake.chain_streams``; nothing to check without an entry."""
    text = mismatch(lake.chain_streams, stream, looks)
    if text is not None:
        raise StreamKindError(text)


def check_now(settings: Settings, stream: str) -> None:
    """:func:`check_kind` of the stream's entries in ``settings.redis.url`` (a job that
    reads Redis for nothing else: the canonical job). :class:`RedisUnavailable` when
    Redis does not answer; a key that is not a stream is left to the job."""
    from pipeline.lake.intake.redisread import connect
    from pipeline.redisio.conn import UNAVAILABLE

    key = keys.stream(stream)
    client = connect(settings.redis.url)
    try:
        looks = sample(client, key) if client.type(key) == b"stream" else []
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while checking {stream!r}: {exc}") from exc
    finally:
        client.close()
    check_kind(settings.lake, stream, looks)


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


def shards(streams: Sequence[str], size: int) -> list[list[str]]:
    """``streams`` cut in order into shards of at most ``size``: one ``archive`` task of a
    ``sluice_archive`` run each (``SLUICE_ARCHIVE_SHARD_STREAMS``), so a run's tasks grow with
    its streams divided by ``size``, not with its streams."""
    if size < 1:
        raise ValueError(f"a shard holds at least one stream, got {size}")
    return [list(streams[i : i + size]) for i in range(0, len(streams), size)]


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
    "GLOB",
    "Resolved",
    "check_kind",
    "check_now",
    "is_chain",
    "is_configured",
    "is_pattern",
    "matches",
    "resolve",
    "resolve_now",
    "sample",
    "shards",
]

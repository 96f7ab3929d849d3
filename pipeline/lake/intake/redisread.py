"""Stream ids and paged Redis reads shared by the lake jobs (no Spark import).

Ids are ``(ms, seq)`` tuples; ranges are inclusive, as ``XRANGE`` takes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipeline.errors import RedisUnavailable

MAX_SEQ = (1 << 64) - 1
#: Entries per ``XRANGE`` call of a paged read (the data source's ``pageSize`` default).
DEFAULT_PAGE = 5000

StreamId = tuple[int, int]


def parse_id(text: str | bytes) -> StreamId:
    """``"MS-SEQ"`` or ``"MS"`` -> ``(ms, seq)``; raises ValueError on anything else."""
    raw = text.decode() if isinstance(text, bytes) else text
    ms_text, sep, seq_text = raw.strip().partition("-")
    if not ms_text.isdigit() or (sep and not seq_text.isdigit()):
        raise ValueError(f"not a stream id: {raw!r}")
    ms, seq = int(ms_text), int(seq_text) if sep else 0
    if ms > MAX_SEQ or seq > MAX_SEQ:
        raise ValueError(f"stream id out of range: {raw!r}")
    return ms, seq


def format_id(value: StreamId) -> str:
    return f"{value[0]}-{value[1]}"


def id_before(value: StreamId) -> StreamId | None:
    """The greatest id strictly below ``value`` (None below ``0-0``)."""
    ms, seq = value
    if seq > 0:
        return ms, seq - 1
    if ms > 0:
        return ms - 1, MAX_SEQ
    return None


def split_range(first: StreamId, last: StreamId, parts: int) -> list[tuple[StreamId, StreamId]]:
    """Split the inclusive id range ``[first, last]`` into at most ``parts`` inclusive ranges.

    Ranges are cut on millisecond boundaries, are contiguous, do not overlap
    and cover exactly ``[first, last]``; empty when ``first > last``.
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    if first > last:
        return []
    span = last[0] - first[0] + 1
    parts = min(parts, span)
    cuts = [first[0] + (span * i) // parts for i in range(1, parts)]
    return _cut_at(first, last, cuts)


def _cut_at(first: StreamId, last: StreamId, cuts: list[int]) -> list[tuple[StreamId, StreamId]]:
    """``[first, last]`` as ranges that end just before each millisecond of ``cuts`` (ascending)."""
    ranges: list[tuple[StreamId, StreamId]] = []
    lo = first
    for cut in cuts:
        ranges.append((lo, (cut - 1, MAX_SEQ)))
        lo = (cut, 0)
    ranges.append((lo, last))
    return ranges


def split_occupied(
    first: StreamId, last: StreamId, edges: list[int], busy: list[bool], parts: int
) -> list[tuple[StreamId, StreamId]]:
    """:func:`split_range` weighted by where the entries are: ``edges`` cut the span of
    ``[first, last]`` into millisecond slices (slice ``i`` is ``[edges[i], edges[i+1])``),
    ``busy`` says which hold an entry. When some are empty, each range gets about as many
    busy slices (an interval whose entries came in a burst: a range per task, not one for
    all); cuts fall on slice edges; the ranges still cover exactly ``[first, last]``.
    """
    full = [i for i, b in enumerate(busy) if b]
    if len(full) == len(busy) or parts < 2 or len(full) < 2:
        return split_range(first, last, parts)
    parts = min(parts, len(full))
    cuts = [edges[full[len(full) * k // parts]] for k in range(1, parts)]
    return _cut_at(first, last, cuts)


#: Millisecond slices of an interval probed for entries before it is cut into task ranges.
PROBES = 256


# --- Redis access ----------------------------------------------------------------


def probe_count(first: StreamId, last: StreamId, parts: int, probes: int = PROBES) -> int:
    """How many ``XRANGE`` probes :func:`balanced_ranges` sends for ``[first, last]`` (0: none,
    the range is split by milliseconds alone)."""
    span = last[0] - first[0] + 1
    return 0 if parts < 2 or span < 2 else min(probes, span)


def balanced_ranges(
    client: Any, key: str, first: StreamId, last: StreamId, parts: int, probes: int = PROBES
) -> list[tuple[StreamId, StreamId]]:
    """``[first, last]`` cut into at most ``parts`` ranges of about as many busy slices
    (:func:`split_occupied`): one pipelined ``XRANGE .. COUNT 1`` per slice, ``probes`` at
    most."""
    from pipeline.redisio.conn import UNAVAILABLE

    n = probe_count(first, last, parts, probes)
    if not n:
        return split_range(first, last, parts)
    span = last[0] - first[0] + 1
    edges = [first[0] + span * i // n for i in range(n + 1)]
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        lo = max((edges[i], 0), first)
        hi = min((edges[i + 1] - 1, MAX_SEQ), last)
        pipe.xrange(key, format_id(lo), format_id(hi), count=1)
    try:
        busy = [bool(found) for found in pipe.execute()]
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while reading {key}: {exc}") from exc
    return split_occupied(first, last, edges, busy, parts)


def ranges_for(
    client: Any, key: str, first: StreamId, last: StreamId, parts: int, per_range: int
) -> int:
    """How many ranges ``[first, last]`` is cut into: ``parts`` at most, one per
    ``per_range`` entries it is expected to hold (``archive_range_entries``: a range
    costs a Spark task's start, a Redis connection and a file per table, more than a few
    thousand small entries cost to write).

    The estimate is the stream's length times the share of its time span that
    ``[first, last]`` covers (``XLEN`` and its first and last ids: one pipelined
    round trip): exact for a stream written at a steady rate, and a bursty one
    only gets more or fewer Spark tasks, never other rows.
    """
    from pipeline.redisio.conn import UNAVAILABLE

    if parts < 2 or per_range <= 1:
        return max(1, parts)  # 1 entry a range: as many ranges as allowed, no estimate
    pipe = client.pipeline(transaction=False)
    pipe.xlen(key)
    pipe.xrange(key, "-", "+", count=1)
    pipe.xrevrange(key, "+", "-", count=1)
    try:
        length, head, tail = pipe.execute()
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while reading {key}: {exc}") from exc
    if not head or not tail:
        return 1
    span = parse_id(tail[0][0])[0] - parse_id(head[0][0])[0] + 1
    share = (last[0] - first[0] + 1) / span
    expected = int(length) * min(1.0, share)
    return max(1, min(parts, -(-int(expected) // per_range)))


def connect(url: str) -> Any:
    """A redis-py client for lake jobs (raw bytes responses), from the one client factory."""
    from pipeline.redisio.conn import Role, connect_sync

    return connect_sync(url, Role.LAKE)


def raw_connect(url: str) -> Any:
    """:func:`connect`, with ``XRANGE`` replies returned raw: ``[[id, [field, value, ...]], ...]``.

    redis-py's own reply callback builds a dict per entry (about 1.8 us of the
    4.2 us an entry costs to read); the archive's hot path builds Arrow from
    the flat reply instead (:func:`pipeline.lake.spark.source.raw_to_batch`).
    """
    from pipeline.redisio.conn import is_cluster

    client = connect(url)
    # A cluster client parses each node's reply first and applies its own callbacks after:
    # there the entries come back as (id, {field: value}) and are flattened again.
    callback = _flat_reply if is_cluster(client) else _raw_reply
    client.set_response_callback("XRANGE", callback)
    client.set_response_callback("XREVRANGE", callback)
    return client


def _raw_reply(response: Any, **options: Any) -> Any:
    return response


def _flat_reply(response: Any, **options: Any) -> Any:
    """redis-py's parsed ``XRANGE`` reply in the raw shape ``[[id, [field, value, ...]], ...]``."""
    return [
        [entry_id, [item for pair in (fields or {}).items() for item in pair]]
        for entry_id, fields in response
    ]


def read_raw_pages(
    client: Any, key: str, lo: StreamId, hi: StreamId, page: int
) -> Iterator[list[list[Any]]]:
    """Paged ``XRANGE key lo hi`` through a :func:`raw_connect` client (raw replies)."""
    from pipeline.redisio.conn import UNAVAILABLE

    start = format_id(lo)
    end = format_id(hi)
    while True:
        try:
            entries = client.xrange(key, start, end, count=page)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(f"redis unavailable while reading {key}: {exc}") from exc
        if not entries:
            return
        yield entries
        if len(entries) < page:
            return
        start = "(" + entries[-1][0].decode()


def read_raw_before(
    client: Any, key: str, before: StreamId, floor: StreamId, count: int
) -> list[list[Any]]:
    """The last ``count`` entries with ids in ``[floor, before)``, in id order, through a
    :func:`raw_connect` client (raw replies)."""
    from pipeline.redisio.conn import UNAVAILABLE

    if before <= floor:
        return []
    try:
        entries = client.xrevrange(key, "(" + format_id(before), format_id(floor), count=count)
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while reading {key}: {exc}") from exc
    return list(reversed(entries))


def bounds(client: Any, key: str, lo: StreamId, hi: StreamId) -> tuple[StreamId, StreamId] | None:
    """The first and last ids actually present in ``[lo, hi]``, or None if there are none."""
    from pipeline.redisio.conn import UNAVAILABLE

    try:
        first = client.xrange(key, format_id(lo), format_id(hi), count=1)
        last = client.xrevrange(key, format_id(hi), format_id(lo), count=1)
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while reading {key}: {exc}") from exc
    if not first or not last:
        return None
    return parse_id(first[0][0]), parse_id(last[0][0])

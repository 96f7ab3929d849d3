"""Republish canonical blocks from the lake into a Redis stream (no Spark).

Blocks ``[from_num, to_num]`` are read through :class:`LakeReader` and added
with ``XADD`` (one ``block`` field per entry, as producers write them). To
keep a rerun from publishing twice, the last entries of the target stream
(at most :data:`SCAN_LIMIT` + the range size) are scanned first and blocks
whose hash is already there are skipped; a block published further back
than that scan would be published again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from pipeline.errors import BadBatch, LakeError, RedisUnavailable
from pipeline.lake.intake.redisread import connect
from pipeline.lake.storage.reader import LakeReader
from pipeline.settings import Settings

#: Largest range one replay may publish.
MAX_BLOCKS = 1_000_000
#: Extra target entries scanned (beyond the range size) to find blocks already published.
SCAN_LIMIT = 10_000
_PIPELINE = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    stream: str
    target: str
    from_num: int
    to_num: int
    published: int
    skipped: int
    #: heights in the range with no canonical block in the lake
    missing: int
    last_id: str | None


def replay(
    settings: Settings,
    stream: str,
    from_num: int,
    to_num: int,
    *,
    target_stream: str | None = None,
    reader: LakeReader | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Publish canonical blocks ``from_num..to_num`` (inclusive) of ``stream`` into ``target_stream``.

    ``progress(n)`` is called after each batch read from the lake with the
    heights it settled (published or already there).
    """

    from pipeline.redisio.conn import UNAVAILABLE

    if from_num < 0 or to_num < from_num:
        raise LakeError(f"bad block range {from_num}..{to_num}")
    if to_num - from_num + 1 > MAX_BLOCKS:
        raise LakeError(f"range {from_num}..{to_num} is over {MAX_BLOCKS} blocks: split it")
    target = target_stream or stream
    key = keys.stream(target)
    reader = reader or LakeReader(settings.lake)
    client = connect(settings.redis.url)
    published = skipped = 0
    last_id: str | None = None
    try:
        present = _published_hashes(client, key, to_num - from_num + 1 + SCAN_LIMIT)
        for batch in reader.iter_canonical_arrow(stream, from_num, to_num + 1):
            added, known, last = _publish(client, key, batch, present)
            published, skipped, last_id = published + added, skipped + known, last or last_id
            if progress is not None:
                progress(batch.num_rows)
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while replaying into {target!r}: {exc}") from exc
    finally:
        client.close()
    missing = (to_num - from_num + 1) - published - skipped
    return ReplayResult(
        stream=stream,
        target=target,
        from_num=from_num,
        to_num=to_num,
        published=published,
        skipped=skipped,
        missing=missing,
        last_id=last_id,
    )


def _publish(
    client: Any, key: str, batch: pa.Table, present: set[str]
) -> tuple[int, int, str | None]:
    """``XADD`` the blocks of ``batch`` whose hash is not in ``present``, :data:`_PIPELINE`
    at a time; (published, skipped, the last id added or None)."""
    published = skipped = queued = 0
    last_id: str | None = None
    pipe = client.pipeline(transaction=False)
    for hash_, payload in zip(
        batch.column("hash").to_pylist(), batch.column("payload").to_pylist(), strict=True
    ):
        if hash_ in present:
            skipped += 1
            continue
        pipe.xadd(key, {ENTRY_FIELD: payload})
        queued += 1
        if queued == _PIPELINE:
            last_id = _flush(pipe) or last_id
            published += queued
            queued = 0
    if queued:
        last_id = _flush(pipe) or last_id
        published += queued
    return published, skipped, last_id


def _flush(pipe: Any) -> str | None:
    ids = pipe.execute()
    return ids[-1].decode() if ids else None


def _published_hashes(client: Any, key: str, limit: int) -> set[str]:
    """Hashes (hex) of the blocks among the last ``limit`` entries of ``key``."""
    found: set[str] = set()
    end = "+"
    remaining = limit
    while remaining > 0:
        page = client.xrevrange(key, end, "-", count=min(remaining, 5000))
        if not page:
            break
        for _, fields in page:
            data = fields.get(ENTRY_FIELD)
            if data is None:
                continue
            try:
                found.add(decode_block(data).hash.hex())
            except BadBatch:
                continue  # not a block: nothing to compare with
        remaining -= len(page)
        end = "(" + page[-1][0].decode()
    return found

"""Lake reads for resumption: Arrow pages of the ``blocks`` table turned into :class:`Emit` lists.

The pages come from a :class:`~pipeline.chain.planning.History` (the
JVM-free :class:`~pipeline.lake.storage.reader.LakeReader`); :func:`next_page` is
blocking work (read, decode and encode a page), run in a thread by
resumption. Catch-up reads a page in a thread and encodes it with
:func:`page_emits` in the event loop, :data:`ENCODE_ROWS` at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.blockcodec import KeyTest, decode_raw, raw_results, weight_from_bytes
from pipeline.chain.cardinal import Encoding, encode_results
from pipeline.chain.history.plainblock import plain_results
from pipeline.chain.history.shared import SharedResults
from pipeline.chain.planning import Emit, History
from pipeline.errors import BadBatch

log = logging.getLogger(__name__)

#: Rows of the first lake page of a subscription (later pages are ``batch_rows``).
FIRST_PAGE = 32
#: Rows encoded in one go in the event loop (about 2 ms): other connections wait no longer.
ENCODE_ROWS = 512
#: Payload bytes encoded in one go (whichever of this and ENCODE_ROWS comes first, at least
#: one block): the encoded blocks are held while the subscriber has no room for them.
ENCODE_BYTES = 512 * 1024
#: What a subscriber is told when history has a hole (details go to the log).
HISTORY_GAP = "history gap: blocks missing between the lake and redis, resubscribe later"


async def refresh_history(history: History) -> None:
    """Move ``history`` to the latest lake version (in a thread: it lists files)."""
    await asyncio.to_thread(history.refresh)


def short_first(pages: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``pages`` with the first one split after ``rows`` rows; closing it closes ``pages``."""
    try:
        first = True
        for table in pages:
            if first and table.num_rows > rows:
                yield table.slice(0, rows)
                table = table.slice(rows)
            first = False
            yield table
    finally:
        close_pages(pages)


def rows_within(table: pa.Table, rows: int, nbytes: int) -> int:
    """How many of ``table``'s first rows to take: at most ``rows``, whose payloads add
    up to at most ``nbytes`` (one row at least, whatever its size)."""
    head = table.slice(0, rows)
    if head.num_rows <= 1:
        return int(head.num_rows)
    sizes = pc.cast(pc.binary_length(head.column("payload")), pa.int64())
    if (pc.sum(sizes).as_py() or 0) <= nbytes:
        return int(head.num_rows)
    within = pc.sum(pc.less_equal(pc.cumulative_sum(sizes), nbytes)).as_py() or 0
    return max(1, int(within))


def byte_pages(pages: Iterator[pa.Table], rows: int, nbytes: int) -> Iterator[pa.Table]:
    """``pages`` cut into slices of at most ``rows`` rows and ``nbytes`` of payloads
    (:func:`rows_within`); closing it closes ``pages``."""
    try:
        for table in pages:
            while table.num_rows:
                n = rows_within(table, rows, nbytes)
                yield table.slice(0, n)
                table = table.slice(n)
    finally:
        close_pages(pages)


def close_pages(pages: Iterator[pa.Table]) -> None:
    close = getattr(pages, "close", None)
    if close is not None:
        with contextlib.suppress(ValueError):  # still running in its thread after a cancel
            close()


def drop_read(read: asyncio.Future[pa.Table | None]) -> None:
    """Let go of a page read ahead that nobody will take (its failure, if any, was seen
    and is moot: the catch-up already stopped for its own reason)."""
    if read.done():
        if not read.cancelled():
            read.exception()
    else:
        read.cancel()  # the thread finishes its read; its page is dropped


def next_page(pages: Iterator[pa.Table], keep: KeyTest | None) -> list[Emit] | None:
    table = next(pages, None)
    if table is None:
        return None
    return page_emits(table, keep)


def page_emits(
    table: pa.Table,
    keep: KeyTest | None,
    shared: SharedResults | None = None,
    shape: Hashable | None = None,
    *,
    fill: bool = True,
) -> list[Emit]:
    """The blocks of an Arrow page as :class:`Emit` lists (a block that cannot be encoded is skipped).

    With ``shared`` (and the subscription's ``shape``, :func:`~pipeline.chain.history.shared.shape_of`),
    blocks another catch-up encoded are taken from it, and the others put in it
    unless ``fill`` is false (nobody else would read them).
    """
    nums = table.column("num").to_pylist()
    hashes = table.column("hash").to_pylist()
    parents = table.column("parent").to_pylist()
    payloads = table.column("payload").to_pylist()
    if shared is None or shape is None:
        return _encode_rows(nums, hashes, parents, payloads, keep)
    get = shared.get
    kept: list[Emit] = []
    missing: list[int] = []
    for i, h in enumerate(hashes):
        hit = get((h, shape))
        if hit is None:
            missing.append(i)
        else:
            kept.append(Emit(nums[i], h, parents[i], hit[0], 0, hit[1]))
    fresh = _encode_rows(
        [nums[i] for i in missing],
        [hashes[i] for i in missing],
        [parents[i] for i in missing],
        [payloads[i] for i in missing],
        keep,
    )
    if fill:
        for emit in fresh:
            shared.put((emit.hash, shape), emit.results, emit.weight)
    shared.count(len(kept), len(missing))
    if not kept:
        return fresh
    out = kept + fresh
    out.sort(key=_num)  # a page's canonical rows: one per number
    return out


def rows_emits(rows: Sequence[tuple[int, str, str, bytes]], keep: KeyTest | None) -> list[Emit]:
    """Blocks given as ``(num, hash hex, parent hex, payload)`` rows (a
    :class:`~pipeline.chain.planning.Seam`'s) as :class:`Emit` lists, as :func:`page_emits`."""
    return _encode_rows(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], keep
    )


def _num(emit: Emit) -> int:
    return emit.num


def _encode_rows(
    nums: list[int],
    hashes: list[str],
    parents: list[str],
    payloads: list[bytes],
    keep: KeyTest | None,
) -> list[Emit]:
    # One block is a few microseconds of work: the calls are bound once per page
    # (catchup_cpu_us_per_block of make bench B=resume).
    encode = raw_results if not isinstance(keep, Encoding) else encode_results
    fast = plain_results if keep is None else None
    out: list[Emit] = []
    append = out.append
    for n, h, p, b in zip(nums, hashes, parents, payloads, strict=True):
        hit = fast(b, n, h, p) if fast is not None else None
        if hit is not None:
            append(Emit(n, h, p, hit[0], 0, hit[1]))
            continue
        try:
            raw = decode_raw(b)
            texts = encode(raw, n, h, p, keep)
            stored = raw.get("weight")
            weight = n + 1 if stored is None else weight_from_bytes(stored)  # effective_weight
        except BadBatch as exc:
            # The archive checks a block's header only (number, hashes, weight): a body
            # that cannot be encoded is skipped, as the Redis tail skips such an entry.
            log.warning("skipping lake block %d (0x%s): %s", n, h, exc)
            continue
        append(Emit(n, h, p, texts, 0, weight))
    return out


__all__ = [
    "ENCODE_BYTES",
    "ENCODE_ROWS",
    "FIRST_PAGE",
    "HISTORY_GAP",
    "byte_pages",
    "close_pages",
    "drop_read",
    "next_page",
    "page_emits",
    "refresh_history",
    "rows_emits",
    "rows_within",
    "short_first",
]

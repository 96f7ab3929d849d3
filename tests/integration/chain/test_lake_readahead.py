"""Catch-up reads the next lake page while the current one is encoded and sent."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from pipeline.chain.history.lakepages import FIRST_PAGE
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.lake.storage.reader import LakeReader
from pipeline.redisio.conn import Role, connect
from tests.support.poll import until

from .conftest import STREAM, write_lake

PAGE_ROWS = 200


class CountingReader:
    """The real lake reader; counts how many pages the catch-up asked for (from its thread)."""

    def __init__(self, reader: LakeReader) -> None:
        self._reader = reader
        self.asked = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def iter_canonical_arrow(self, *args: Any, **kwargs: Any) -> Iterator[pa.Table]:
        pages = self._reader.iter_canonical_arrow(*args, **kwargs)
        while True:
            with self._lock:
                self.asked += 1
            page = next(pages, None)
            if page is None:
                return
            yield page


class AheadSink:
    """Takes a run of blocks only once the page after theirs was asked for."""

    def __init__(self, reader: CountingReader) -> None:
        self.reader = reader
        self.blocks: list[int] = []

    async def put(self, emits) -> None:
        first = emits[0].num
        if first >= FIRST_PAGE:  # the first blocks come from the plan's own first read
            wanted = first // PAGE_ROWS + 2
            await until(
                lambda: self.reader.asked >= wanted,
                f"page {wanted} asked for while block {first} is sent",
                within_s=30,
            )
        self.blocks += [e.num for e in emits]

    def put_nowait(self, emits) -> None:
        self.blocks += [e.num for e in emits]

    def ready(self, num: int, hash: str) -> None:
        pass


async def test_the_next_page_is_read_while_a_page_is_sent(settings, redis_url: str) -> None:
    blocks = SyntheticChain(seed=3).take(5 * PAGE_ROWS)
    write_lake(settings.lake.uri, blocks)
    reader = CountingReader(LakeReader(settings.lake))
    client = connect(redis_url, Role.SERVE)
    try:
        resumption = TieredResumption(
            redis=client,
            stream=STREAM,
            hub=WebsocketHub(),
            history_factory=lambda: reader,
            batch_rows=PAGE_ROWS,
        )
        plan = await resumption.resolve(0, blocks[0].hash, None)
        sink = AheadSink(reader)
        task = asyncio.create_task(resumption.stream(plan, None, sink))
        try:
            await until(lambda: len(sink.blocks) == len(blocks) or task.done(), within_s=60)
            if task.done():
                task.result()  # the failure, if it failed
            assert sink.blocks == [b.num for b in blocks]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await client.aclose()

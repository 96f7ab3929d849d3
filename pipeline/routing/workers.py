"""Small workers that ship with every node: ``echo`` and ``requester`` (for demos and tests)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import IO

from pipeline.errors import SluiceError
from pipeline.routing.message import Route, TransportMessage
from pipeline.routing.node import Context, Worker, WorkerContext

log = logging.getLogger(__name__)


class Echo(Worker):
    """Replies with the payload it got, along the traced return route."""

    async def handle(self, ctx: Context) -> None:
        await ctx.reply(ctx.payload)


class Requester(Worker):
    """Sends ``count`` requests ``req-<i>`` to ``route``; records each reply payload.

    Replies are kept in :attr:`replies` and, if ``record`` is given, appended
    one per line to that file (flushed at once, so another process can watch).
    A request its node could not send (by the transport's deadline) is logged,
    counted (:attr:`failed`, the node's ``requester.failed``) and skipped.
    """

    def __init__(
        self,
        route: Route,
        count: int,
        *,
        record: Path | None = None,
        interval_s: float = 0.0,
        max_replies: int = 1_000_000,
    ) -> None:
        self.route = route
        self.count = count
        self.interval_s = interval_s
        self.replies: list[bytes] = []
        self.max_replies = max_replies
        self.sent = 0
        self.failed = 0
        self._stop = asyncio.Event()
        self._file: IO[bytes] | None = record.open("ab") if record else None

    async def run(self, wctx: WorkerContext) -> None:
        for i in range(self.count):
            if self._stop.is_set():
                break
            payload = f"req-{i}".encode()
            message = TransportMessage(self.route, Route([wctx.address]), payload)
            try:
                await wctx.node.deliver(message, strict=True)
            except SluiceError as exc:
                self.failed += 1
                wctx.node.counters["requester.failed"] += 1
                log.error("requester: request %d not sent: %s", i, exc)
                continue
            self.sent += 1
            if self.interval_s:
                try:
                    async with asyncio.timeout(self.interval_s):
                        await self._stop.wait()
                except TimeoutError:
                    pass
        log.info("requester: sent %d requests to %s", self.sent, self.route)

    def stopping(self) -> None:
        self._stop.set()

    async def handle(self, ctx: Context) -> None:
        if len(self.replies) < self.max_replies:
            self.replies.append(ctx.payload)
        self._record(ctx.payload)

    def _record(self, payload: bytes) -> None:
        if self._file is not None:
            self._file.write(payload.replace(b"\n", b" ") + b"\n")
            self._file.flush()

    async def teardown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

"""The stream pusher: batches pushed to one stream, retried idempotently until a deadline.

:class:`StreamPusher` is what the publisher and the stream transport push
through; :func:`split_pushes` cuts a batch into pushes that each fit a node's
payload limit.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pipeline.errors import SluiceError, StreamError, StreamNotFound
from pipeline.loggate import LogGate
from pipeline.streams import protocol as p
from pipeline.streams.client import PERMANENT, StreamClient, new_request_id

log = logging.getLogger(__name__)

#: Bytes a push adds to its entries when encoded: per entry, and once (request id, headers).
PUSH_ENTRY_OVERHEAD = 5
PUSH_OVERHEAD = 64


def split_pushes(data: list[bytes], max_bytes: int) -> list[list[bytes]]:
    """``data`` in order, cut into pushes that each encode to at most ``max_bytes``
    (an entry too large alone is a push of its own, which the service refuses)."""
    if PUSH_OVERHEAD + sum(map(len, data)) + PUSH_ENTRY_OVERHEAD * len(data) <= max_bytes:
        return [data] if data else []  # the usual case, without a loop in Python
    chunks: list[list[bytes]] = []
    chunk: list[bytes] = []
    size = PUSH_OVERHEAD
    for item in data:
        grown = size + len(item) + PUSH_ENTRY_OVERHEAD
        if chunk and grown > max_bytes:
            chunks.append(chunk)
            chunk, grown = [], PUSH_OVERHEAD + len(item) + PUSH_ENTRY_OVERHEAD
        chunk.append(item)
        size = grown
    if chunk:
        chunks.append(chunk)
    return chunks


#: Seconds a push is retried (Redis away or refusing writes) before its sender is told.
DEFAULT_SEND_TIMEOUT_S = 45.0


class StreamPusher:
    """Pushes batches to one stream with idempotent retries (used by Publisher and the transport).

    A push that fails for a reason a retry can cure (the service answered "redis
    unavailable": Redis away, failing over or refusing writes; no answer in time) is
    retried with the same request id, backing off up to ``backoff_max_s``, until its
    deadline; then :class:`StreamError` reaches the sender (counted as
    ``stream_client.push_failures``). An outage is logged once when it starts and once
    when it ends, not per attempt.
    """

    def __init__(
        self,
        client: StreamClient,
        stream: str,
        *,
        timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        backoff_max_s: float = 1.0,
    ) -> None:
        self.client = client
        self.stream = stream
        self.timeout_s = timeout_s
        self.backoff_max_s = backoff_max_s
        self._address: str | None = None
        #: A run of failed attempts: logged when it starts, every 10 s, and when it ends.
        self._gate = LogGate(log)

    async def ensure(self) -> str:
        if self._address is None:
            self._address = (await self.client.create(self.stream)).address
        return self._address

    async def push(self, data: list[bytes], *, deadline: float | None = None) -> p.PushConfirm:
        """Push ``data`` as one request, retried with the same request id until ``deadline``
        (a ``time.monotonic()`` value; default ``timeout_s`` from now)."""
        rid = new_request_id()
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        attempts = 0
        counters = self.client.node.counters
        while True:
            attempts += 1
            try:
                address = await self.ensure()
                confirm = await self.client.push(address, data, rid)
            except StreamNotFound:
                self._address = None  # the service lost the stream's address: create again
                last: SluiceError = StreamNotFound(f"stream {self.stream!r} not found")
            except PERMANENT:
                raise
            except StreamError as exc:
                last = exc
            else:
                self._gate.ended("push", "push to %s works again", self.stream)
                return confirm
            left = deadline - time.monotonic()
            if left <= 0:
                counters["stream_client.push_failures"] += 1
                raise StreamError(
                    f"push to {self.stream!r} failed until its deadline "
                    f"({attempts} attempt(s)): {last}"
                )
            counters["stream_client.push_retries"] += 1
            self._gate.failed(
                "push", "push to %s failing (%s); retrying until its deadline", self.stream, last
            )
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, self.backoff_max_s)

"""The publisher worker: what it receives goes to one stream.

:class:`Publisher` pushes what it receives to one stream, many messages per
``Push`` (its mailbox is drained in batches), retrying a failed push with the
same ``request_id`` (idempotent) until its deadline
(:class:`~pipeline.streams.pusher.StreamPusher`).
"""

from __future__ import annotations

from pipeline.routing.message import TransportMessage
from pipeline.routing.node import Context, Node, Worker, WorkerContext
from pipeline.streams.client import StreamClient
from pipeline.streams.pusher import DEFAULT_SEND_TIMEOUT_S, StreamPusher, split_pushes


class Publisher(Worker):
    """Publishes the payload of every message it receives to ``stream``."""

    mailbox_size = 8192
    batch_size = 1000

    def __init__(
        self,
        stream: str,
        *,
        service: str = "stream_service",
        timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self.stream = stream
        self.service = service
        #: Seconds each push is retried before the sender is told (:class:`StreamPusher`).
        self.timeout_s = timeout_s
        self._client: StreamClient | None = None
        self._pusher: StreamPusher | None = None

    async def setup(self, wctx: WorkerContext) -> None:
        self._client = StreamClient(wctx.node, wctx.address, service=self.service)
        self._pusher = StreamPusher(self._client, self.stream, timeout_s=self.timeout_s)

    def intercept(self, message: TransportMessage) -> bool:
        return self._client is not None and self._client.intercept(message)

    def encode(self, ctx: Context) -> bytes:
        """What goes into the stream for one received message."""
        return ctx.payload

    async def handle(self, ctx: Context) -> None:
        await self.handle_batch([ctx])

    async def handle_batch(self, batch: list[Context]) -> None:
        assert self._pusher is not None
        node = batch[0].node
        data = [self.encode(ctx) for ctx in batch]
        for chunk in split_pushes(data, node.max_payload):  # each push fits the node's limit
            confirm = await self._pusher.push(chunk)
            self.counters_add(node, len(confirm.indexes))

    def counters_add(self, node: Node, n: int) -> None:
        node.counters[f"publisher.{self.stream}.pushed"] += n

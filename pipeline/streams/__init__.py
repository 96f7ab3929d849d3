"""Streams on Redis Streams: the stream service, its client, publishers and consumers,
bidirectional streams and the stream transport (seeds 000, 001).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "StreamService": "pipeline.streams.service",
    "StreamClient": "pipeline.streams.client",
    "StreamPusher": "pipeline.streams.pusher",
    "Publisher": "pipeline.streams.publisher",
    "Consumer": "pipeline.streams.consumer",
    "BiPublisher": "pipeline.streams.bidirectional",
    "ReturnRegistry": "pipeline.streams.bidirectional",
    "bidirectional_consumer": "pipeline.streams.bidirectional",
    "StreamTransport": "pipeline.streams.transport",
}

__all__ = [
    "BiPublisher",
    "Consumer",
    "Publisher",
    "ReturnRegistry",
    "StreamClient",
    "StreamPusher",
    "StreamService",
    "StreamTransport",
    "bidirectional_consumer",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.streams.bidirectional import (
        BiPublisher as BiPublisher,
    )
    from pipeline.streams.bidirectional import (
        ReturnRegistry as ReturnRegistry,
    )
    from pipeline.streams.bidirectional import (
        bidirectional_consumer as bidirectional_consumer,
    )
    from pipeline.streams.client import (
        StreamClient as StreamClient,
    )
    from pipeline.streams.consumer import (
        Consumer as Consumer,
    )
    from pipeline.streams.publisher import (
        Publisher as Publisher,
    )
    from pipeline.streams.pusher import (
        StreamPusher as StreamPusher,
    )
    from pipeline.streams.service import (
        StreamService as StreamService,
    )
    from pipeline.streams.transport import (
        StreamTransport as StreamTransport,
    )

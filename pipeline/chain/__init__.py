"""Chain streams: block batches, the muxing producer, resumption and its server (seed 004).

Exported: the block types, the Redis and muxing producers, and the consumer
side (``subscribe`` over websocket, ``subscribe_dialogue`` over Dialogue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "Block": "pipeline.blockcodec",
    "SubBatch": "pipeline.blockcodec",
    "Added": "pipeline.chain.client.ordered",
    "Removed": "pipeline.chain.client.ordered",
    "subscribe": "pipeline.chain.client.consumer",
    "subscribe_dialogue": "pipeline.chain.serve.dialogue_feed",
    "RedisStreamProducer": "pipeline.chain.produce.producer",
    "MuxProducer": "pipeline.chain.produce.producer",
    "WebsocketHub": "pipeline.chain.produce.producer",
}

__all__ = [
    "Added",
    "Block",
    "MuxProducer",
    "RedisStreamProducer",
    "Removed",
    "SubBatch",
    "WebsocketHub",
    "subscribe",
    "subscribe_dialogue",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.blockcodec import (
        Block as Block,
    )
    from pipeline.blockcodec import (
        SubBatch as SubBatch,
    )
    from pipeline.chain.client.consumer import (
        subscribe as subscribe,
    )
    from pipeline.chain.client.ordered import (
        Added as Added,
    )
    from pipeline.chain.client.ordered import (
        Removed as Removed,
    )
    from pipeline.chain.produce.producer import (
        MuxProducer as MuxProducer,
    )
    from pipeline.chain.produce.producer import (
        RedisStreamProducer as RedisStreamProducer,
    )
    from pipeline.chain.produce.producer import (
        WebsocketHub as WebsocketHub,
    )
    from pipeline.chain.serve.dialogue_feed import (
        subscribe_dialogue as subscribe_dialogue,
    )

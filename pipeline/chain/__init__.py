"""Chain streams: block batches, the muxing producer, resumption and its server (seed 004).

Exported: the block types, the Redis and muxing producers, and the consumer
side (``subscribe`` over websocket, ``subscribe_dialogue`` over Dialogue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "Block": "pipeline.chain.batch",
    "SubBatch": "pipeline.chain.batch",
    "Added": "pipeline.chain.ordered",
    "Removed": "pipeline.chain.ordered",
    "subscribe": "pipeline.chain.consumer",
    "subscribe_dialogue": "pipeline.chain.dialogue_feed",
    "RedisStreamProducer": "pipeline.chain.producer",
    "MuxProducer": "pipeline.chain.producer",
    "WebsocketHub": "pipeline.chain.producer",
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
    from pipeline.chain.batch import (
        Block as Block,
    )
    from pipeline.chain.batch import (
        SubBatch as SubBatch,
    )
    from pipeline.chain.consumer import (
        subscribe as subscribe,
    )
    from pipeline.chain.dialogue_feed import (
        subscribe_dialogue as subscribe_dialogue,
    )
    from pipeline.chain.ordered import (
        Added as Added,
    )
    from pipeline.chain.ordered import (
        Removed as Removed,
    )
    from pipeline.chain.producer import (
        MuxProducer as MuxProducer,
    )
    from pipeline.chain.producer import (
        RedisStreamProducer as RedisStreamProducer,
    )
    from pipeline.chain.producer import (
        WebsocketHub as WebsocketHub,
    )

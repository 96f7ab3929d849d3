"""One request's history, from the lake to the Redis tail to live blocks: where it starts, what it sends, with no gap and no duplicate.

It reads the lake through `pipeline.lake.storage` (never Spark) and Redis through `pipeline.redisio`; it speaks to no socket.
"""

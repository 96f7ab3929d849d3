"""The Python bus client: ``await bus.call(cmd, dst=[...], data=...)``.

It speaks only the seed's Redis protocol: RPUSH the envelope to
``msgbus.system.local`` on the twin's own Redis, then BLPOP the ``ret`` queue
(a fresh uuid4) once per destination. Every answer carries ``src`` = the
destination it answers for, which is how answers are put back in ``dst`` order.

A wait of any length is cut into BLPOPs of at most :data:`BLOCK_S` seconds on
a client whose socket timeout is longer (see :mod:`pipeline.redisio.conn`), so
``exp=60`` waits 60 s, not redis-py's default 5.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import redis.asyncio as aioredis

from pipeline import keys, lifecycle
from pipeline.bus.config import bus_redis_url
from pipeline.bus.envelope import Envelope, decode, encode_data
from pipeline.errors import CallFailed, RemoteError, RequestExpired
from pipeline.loggate import LogGate
from pipeline.redisio import conn as redisconn

log = logging.getLogger(__name__)

#: Extra seconds the client waits past ``exp`` for the bus's own "request expired" answer.
GRACE_S = 5.0
#: Pause before waiting again for an answer after Redis went away.
RETRY_S = 0.25
#: Longest single BLPOP; longer waits are several of them.
BLOCK_S = 20.0


class BusClient:
    """Calls bus commands through the twin's own Redis, as a seed-002 client would.

    ``async with BusClient.from_url(url) as bus: await bus.call(...)``; or
    ``await bus.close()`` when done (safe to call twice, and concurrently).
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self.redis = client
        self._closing = lifecycle.Once()
        self._gate = LogGate(log)

    @classmethod
    def from_url(cls, url: str, *, max_connections: int = 64) -> BusClient:
        """A client of the bus whose Redis is ``url`` (at most ``max_connections`` to it)."""
        client = redisconn.connect(
            bus_redis_url(url),
            redisconn.Role.BUS_CLIENT,
            block_s=BLOCK_S,
            max_connections=max_connections,
        )
        return cls(client)

    async def __aenter__(self) -> BusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the Redis connections; a second caller waits for the first's close."""
        await self._closing.run(self._close)

    async def _close(self) -> None:
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    async def request(
        self,
        cmd: str,
        *,
        dst: list[int],
        data: bytes | str = b"",
        exp: int = 60,
        retries: int = 3,
        wait_s: float | None = None,
    ) -> list[Envelope]:
        """Send one request; return every answer envelope (err or not), in ``dst`` order."""
        if not dst:
            raise ValueError("dst must name at least one twin")
        ret = str(uuid.uuid4())
        env = Envelope(
            cmd=cmd,
            exp=exp,
            try_=retries,
            dat=encode_data(data),
            dst=list(dst),
            ret=ret,
            now=int(time.time()),
        )
        await self.redis.rpush(keys.BUS_LOCAL, env.encode())
        limit = time.monotonic() + (wait_s if wait_s is not None else exp + GRACE_S)
        by_src: dict[int, list[Envelope]] = {}
        for _ in dst:
            popped = None
            while popped is None and (left := limit - time.monotonic()) > 0:
                try:
                    popped = await self.redis.blpop([ret], timeout=max(min(left, BLOCK_S), 0.01))
                except redisconn.UNAVAILABLE as exc:
                    # Redis away or failing over: waiting for the answer is safe to repeat
                    # (the request itself is not resent: it may have landed).
                    redisconn.checkpoint(exc)
                    self._gate.failed(
                        "wait", "bus client: waiting on %s: %r; retrying", ret, exc
                    )  # fmt: skip
                    await asyncio.sleep(min(RETRY_S, max(limit - time.monotonic(), 0)))
            if popped is None:
                await self.redis.delete(ret)
                raise RequestExpired(f"no answer to {cmd} on {ret} in time")
            self._gate.ended("wait", "bus client: redis answers again")
            answer = decode(popped[1], reply=True)
            by_src.setdefault(answer.src, []).append(answer)
        ordered: list[Envelope] = []
        for twin in dst:
            queue = by_src.get(twin)
            if not queue:
                raise RemoteError(f"no answer from twin {twin}")
            ordered.append(queue.pop(0))
        return ordered

    async def call(
        self,
        cmd: str,
        *,
        dst: list[int],
        data: bytes | str = b"",
        exp: int = 60,
        retries: int = 3,
        wait_s: float | None = None,
    ) -> list[bytes]:
        """One result per destination, in ``dst`` order; :class:`RemoteError` if any has ``err``."""
        answers = await self.request(
            cmd, dst=dst, data=data, exp=exp, retries=retries, wait_s=wait_s
        )
        failed = [a for a in answers if a.err]
        if failed:
            text = "; ".join(f"twin {a.src}: {a.err}" for a in failed)
            raise CallFailed(text, answers)
        return [a.data for a in answers]

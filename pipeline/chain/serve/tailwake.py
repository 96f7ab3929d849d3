"""Wake the live tailer when its chain stream is written, without reading the stream.

Redis has no blocking read that returns only ids: ``XREAD BLOCK`` sends the
entries, a hostile 20 MB one too, so the tailer reads through
:class:`~pipeline.chain.history.tailread.FilteredReads` and must be told when to.
Client-side-caching invalidations tell it: on a connection of its own,
``CLIENT TRACKING ON REDIRECT <itself> BCAST PREFIX <key>`` and ``SUBSCRIBE
__redis__:invalidate`` make Redis send the key's name (tens of bytes) each
time anyone writes the key. Nothing has to be configured on the server
(keyspace notifications would need ``notify-keyspace-events``).

:meth:`TailWake.wait` returns at such a message, or after ``idle_s`` at the
latest (a poll that covers a reconnect that dropped the tracking). Where the
connection cannot be set up (a Redis Cluster client, whose pubsub goes to
another node than the key's; an ACL refusing ``CLIENT``; Redis down) it sleeps
``poll_s`` instead, and tries again after ``retry_s``, doubling up to
:data:`MAX_RETRY_S` while it keeps failing (each failure logged,
rate-limited, and told to ``on_error``). The connection is set up afresh every
``renew_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pipeline.loggate import LogGate
from pipeline.redisio.conn import checkpoint, is_cluster

log = logging.getLogger(__name__)

#: The channel Redis sends invalidations to (RESP2, redirected to a subscriber).
INVALIDATE = "__redis__:invalidate"
#: The longest wait before setting up again after failures (a server that refuses it for good).
MAX_RETRY_S = 300.0
#: Seconds a reply of the setup may take (it is three round trips on an idle connection).
SETUP_S = 5.0


class TailWake:
    """Waits until ``key`` may have been written (see the module doc)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        key: str,
        *,
        poll_s: float = 0.01,
        idle_s: float = 0.25,
        renew_s: float = 10.0,
        retry_s: float = 5.0,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._redis = redis
        self._key = key
        self._poll_s = poll_s
        self._idle_s = idle_s
        self._renew_s = renew_s
        self._retry_s = retry_s
        self._pubsub: Any = None
        self._opened = 0.0
        self._retry_at = 0.0
        self._backoff = retry_s
        self._gate = LogGate(log)
        self._on_error = on_error
        #: tracking connections set up so far
        self.opened = 0
        #: False where tracking cannot work at all (a Cluster client): polls only
        self.usable = not is_cluster(redis)

    @property
    def tracking(self) -> bool:
        """Whether waits are woken by Redis now (else they poll every ``poll_s``)."""
        return self._pubsub is not None

    async def wait(self) -> None:
        """Return when the key may have been written since the last call returned."""
        now = asyncio.get_running_loop().time()
        if (
            self.usable
            and now >= self._retry_at
            and (self._pubsub is None or now - self._opened >= self._renew_s)
        ):
            await self._renew(now)
        pubsub = self._pubsub
        if pubsub is None:
            await asyncio.sleep(self._poll_s)
            return
        try:
            # Any message wakes: redis-py answers None for an invalidation (a type
            # it has no handler for), as it does when the wait ran out.
            await pubsub.get_message(timeout=self._idle_s)
            checkpoint()
        except (RedisError, OSError) as exc:
            self._failed(exc, "live tailer: wake-up connection lost (%r): polling")
            await self._drop()
            self._retry_at = asyncio.get_running_loop().time() + self._retry_s

    async def close(self) -> None:
        await self._drop()

    async def _renew(self, now: float) -> None:
        """A new tracking connection (then the old one closed: no write goes unnoticed)."""
        pubsub: Any = self._redis.pubsub()  # (redis-py leaves its methods untyped)
        ready = False
        try:
            async with asyncio.timeout(SETUP_S):
                await pubsub.execute_command("CLIENT", "ID")
                client_id = await pubsub.parse_response(block=False, timeout=SETUP_S)
                await pubsub.execute_command(
                    "CLIENT", "TRACKING", "ON", "REDIRECT", client_id, "BCAST", "PREFIX", self._key
                )
                ok = await pubsub.parse_response(block=False, timeout=SETUP_S)
                if ok not in (b"OK", "OK"):
                    raise RedisError(f"CLIENT TRACKING answered {ok!r}")
                await pubsub.subscribe(INVALIDATE)
                await pubsub.get_message(timeout=SETUP_S)  # the subscription's confirmation
            checkpoint()
            ready = True
        except (RedisError, OSError, TimeoutError) as exc:
            self._retry_at = now + self._backoff
            self._backoff = min(self._backoff * 2, MAX_RETRY_S)
            self._failed(exc, "live tailer: no wake-up from redis (%r): polling")
        finally:
            if not ready:
                await pubsub.aclose()
        if ready:
            await self._drop()
            self._pubsub, self._opened, self._backoff = pubsub, now, self._retry_s
            self.opened += 1
            self._gate.ended("wake", "live tailer: woken by redis again")

    def _failed(self, exc: BaseException, msg: str) -> None:
        if self._on_error is not None:
            self._on_error(exc)
        self._gate.failed("wake", msg, exc)

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await pubsub.aclose()


__all__ = ["INVALIDATE", "TailWake"]

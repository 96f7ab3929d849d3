"""The stream service's Redis clients: the two it is given, and the hot ones it holds.

:func:`connect` makes the service's client and :func:`connect_hot` the one
for the pushes and pulls it serves in its own node's clients' tasks;
:class:`HeldClients` keeps single-connection clients of the latter between
commands. :data:`REDIS_ERRORS` are the failures the service answers
"redis unavailable".
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from pipeline.redisio import conn as redisconn

#: Retried Redis errors: a dropped connection, Redis loading or going away.
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, *redisconn.UNAVAILABLE)

#: Held clients kept while unused (see :class:`HeldClients`).
HELD_IDLE = 16


def connect(url: str, *, max_connections: int | None = None, block_s: float = 5.0) -> Redis:
    """The stream service's Redis client (:func:`pipeline.redisio.conn.connect`, role STREAM_SERVICE).

    ``block_s`` is the longest ``XREAD BLOCK`` it issues (``max_wait_ms``).
    Retried pushes are safe: a push is idempotent by its request id.
    """
    return redisconn.connect(
        url, redisconn.Role.STREAM_SERVICE, block_s=block_s, max_connections=max_connections
    )


def connect_hot(url: str) -> Redis:
    """The client for the pushes and pulls the service serves in its own node's clients'
    tasks (:meth:`StreamService.serve_now
    <pipeline.streams.service.StreamService.serve_now>`; role STREAM_HOT, no socket timeout).

    Every command on it runs under the calling client's deadline (a push's or
    pull's timeout), so it needs no socket timeout of its own, whose
    per-command ``asyncio.wait_for`` costs about 20 us (``rtt_p50_ms`` of
    ``make bench B=streams``). Pass it as ``StreamService(redis, hot=...)``,
    which closes it when it stops (``redis`` stays the caller's to close).
    """
    return redisconn.connect(url, redisconn.Role.STREAM_HOT)


class HeldClients:
    """Single-connection clients of the service's hot pool, kept between commands (LIFO).

    Why: a command through the role's ``BlockingConnectionPool`` pays its
    condition and wait timeout twice per command (about 15-20 us here), four
    times per stream-transport round trip (``tests/bench/bench_streams.py``,
    ``rtt_p50_ms``); a held client (``Redis.client()``) pays only its lock. The
    connections still come from the pool of ``redis`` (the service's ``hot``
    client, else its own) and count against its size; at most ``max_idle``
    stay held while unused, the others go back to it.
    """

    def __init__(self, redis: Redis, max_idle: int) -> None:
        self.redis = redis
        self.max_idle = max_idle
        self._idle: list[Redis] = []
        self._closed = False
        #: A cluster client has no single-connection clients (each command goes to the
        #: node owning its key), and a Sentinel one's would stay on a dead master after a
        #: failover (see :mod:`pipeline.redisio.ha`): every take is then the client itself.
        self._shared = redisconn.is_cluster(redis) or redisconn.is_sentinel(redis)

    def take(self) -> Redis:
        if self._shared:
            return self.redis
        return self._idle.pop() if self._idle else self.redis.client()

    def keep(self, client: Redis) -> bool:
        """Hold ``client`` for the next take; False: close it (its connection goes back)."""
        if self._shared:
            return True  # the shared client itself: nothing to hold or close
        if len(self._idle) < self.max_idle and not self._closed:
            self._idle.append(client)
            return True
        return False

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for client in idle:
            await client.aclose()

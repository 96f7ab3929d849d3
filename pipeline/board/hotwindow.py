"""The Redis hot window of many streams: one pipelined ``XINFO STREAM`` each, on one lazy client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from pipeline import keys
from pipeline.board.source import one_line

if TYPE_CHECKING:
    import redis.asyncio as aioredis

#: Give up on Redis after this long and report it down.
REDIS_TIMEOUT_S = 2.0


class HotStream(TypedDict):
    """One stream in Redis: its length and its oldest and newest entry ids (None: empty)."""

    length: int
    first_id: str | None
    last_id: str | None


class RedisView(TypedDict):
    """Redis as the page shows it: up with its streams and the URL's source, or down with why."""

    up: bool
    error: NotRequired[str]
    source: NotRequired[str | None]
    streams: NotRequired[dict[str, HotStream]]


class HotWindow:
    """Reads the hot window of streams; the client is made on first use, on the caller's loop.

    ``resolve_url`` is blocking (it may ask a secrets backend) and returns the
    URL and where it came from; it may raise ``ConfigError``, which is
    reported, not raised. A Redis that fails drops the client: the next read
    resolves the URL and connects again.
    """

    def __init__(self, resolve_url: Callable[[], tuple[str, str]]) -> None:
        self._resolve_url = resolve_url
        self._client: aioredis.Redis | None = None
        self._source: str | None = None

    async def read(self, names: list[str]) -> RedisView:
        """The hot window of ``names``, or Redis down with a one-line reason; never raises."""
        import redis.asyncio as aioredis

        from pipeline.errors import ConfigError
        from pipeline.redisio.conn import UNAVAILABLE, checkpoint

        redis_errors: tuple[type[BaseException], ...] = (
            TimeoutError,
            aioredis.RedisError,
            *UNAVAILABLE,
        )
        try:
            client = await self._connected()
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                pipe = client.pipeline(transaction=False)
                for name in names:
                    pipe.xinfo_stream(keys.stream(name))
                replies = await pipe.execute(raise_on_error=False)
            checkpoint()
        except ConfigError as exc:
            return {"up": False, "error": f"redis: {one_line(exc)}"}
        except redis_errors as exc:
            checkpoint(exc)
            # The next snapshot resolves the URL and connects again.
            await self.close()
            return {"up": False, "error": f"redis unavailable: {one_line(exc)}"}
        streams = {name: _hot(info) for name, info in zip(names, replies, strict=True)}
        return {"up": True, "source": self._source, "streams": streams}

    async def _connected(self) -> aioredis.Redis:
        if self._client is None:
            from pipeline.redisio.conn import Role, connect

            url, self._source = await asyncio.to_thread(self._resolve_url)
            self._client = connect(url, Role.SERVE, max_connections=2)
        return self._client

    async def close(self) -> None:
        """Drop the client (a later :meth:`read` makes a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _hot(info: dict[str, Any] | Exception) -> HotStream:
    """One ``XINFO STREAM`` reply; an error reply means no such key (empty or absent)."""
    if isinstance(info, Exception):
        return {"length": 0, "first_id": None, "last_id": None}
    first, last = info.get("first-entry"), info.get("last-entry")
    return {
        "length": int(info.get("length", 0)),
        "first_id": first[0].decode() if first else None,
        "last_id": last[0].decode() if last else None,
    }


__all__ = ["REDIS_TIMEOUT_S", "HotStream", "HotWindow", "RedisView"]

"""The Redis hot window of many streams, against a real redis-server."""

from __future__ import annotations

import redis

from pipeline import keys
from pipeline.board.hotwindow import HotWindow
from pipeline.errors import ConfigError
from pipeline.runtime.ports import free_port


async def test_streams_in_redis_and_an_absent_one(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.xadd(keys.stream("s"), {"v": "1"}, id="1000-0")
    redis_client.xadd(keys.stream("s"), {"v": "2"}, id="2000-0")
    window = HotWindow(lambda: (redis_url, "settings"))
    try:
        view = await window.read(["s", "absent"])
    finally:
        await window.close()
    assert view == {
        "up": True,
        "source": "settings",
        "streams": {
            "s": {"length": 2, "first_id": "1000-0", "last_id": "2000-0"},
            "absent": {"length": 0, "first_id": None, "last_id": None},
        },
    }


async def test_a_redis_that_is_down_is_reported_and_tried_again(redis_url: str) -> None:
    urls = iter([f"redis://127.0.0.1:{free_port()}/0", redis_url])
    window = HotWindow(lambda: (next(urls), "settings"))
    try:
        down = await window.read(["s"])
        assert down["up"] is False
        assert down["error"].startswith("redis unavailable: "), down
        # The failed client was dropped: the next read resolves the URL again.
        assert (await window.read(["s"]))["up"] is True
    finally:
        await window.close()


async def test_a_bad_url_is_reported_not_raised() -> None:
    def bad() -> tuple[str, str]:
        raise ConfigError("setting 'redis_url': not a Redis URL")

    window = HotWindow(bad)
    assert await window.read(["s"]) == {
        "up": False,
        "error": "redis: setting 'redis_url': not a Redis URL",
    }
    await window.close()

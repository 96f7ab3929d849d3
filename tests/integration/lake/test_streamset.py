"""``SLUICE_STREAMS`` glob patterns resolved in a real Redis: one server and a Redis Cluster."""

from __future__ import annotations

import pytest
import redis

from pipeline import keys
from pipeline.errors import RedisUnavailable
from pipeline.lake.intake import streamset
from pipeline.redisio.conn import Role, connect_sync
from tests.integration.lake.helpers import settings_for


def _add(client: redis.Redis, *names: str) -> None:
    for name in names:
        client.xadd(keys.stream(name), {b"n": b"1"})


def test_patterns_resolve_to_the_streams_redis_holds(
    redis_url: str, redis_client: redis.Redis
) -> None:
    _add(redis_client, "events:a", "events:b", "chain:x", "other:c")
    # A key of the same shape that is not a stream, and a stream outside Sluice's keys.
    redis_client.set(keys.stream("events:not-a-stream"), b"x")
    redis_client.xadd("events:raw", {b"n": b"1"})
    settings = settings_for(
        redis_url,
        "./unused-lake",
        streams=("fixed", "events:*", "chain:*", "events:a"),
        chain_streams=("chain:*",),
    )
    resolved = streamset.resolve_now(settings)
    # Names stand for themselves (present or not), each stream once, in SLUICE_STREAMS order.
    assert resolved.streams == ("fixed", "events:a", "events:b", "chain:x")
    assert resolved.chain_streams == ("chain:x",)
    # A stream created later is in the next resolution, without a settings change.
    _add(redis_client, "events:c")
    assert "events:c" in streamset.resolve_now(settings).streams
    assert streamset.is_configured(settings.lake, "events:zzz")
    assert not streamset.is_configured(settings.lake, "other:c")


def test_names_only_need_no_redis() -> None:
    settings = settings_for("redis://127.0.0.1:1/0", "./unused-lake", streams=("a", "b"))
    assert streamset.resolve_now(settings).streams == ("a", "b")


def test_a_pattern_with_redis_down_is_one_error() -> None:
    settings = settings_for("redis://127.0.0.1:1/0", "./unused-lake", streams=("events:*",))
    with pytest.raises(RedisUnavailable, match="resolving 'events:\\*'"):
        streamset.resolve_now(settings)


def test_patterns_resolve_on_every_master_of_a_cluster(cluster_url: str) -> None:
    client = connect_sync(cluster_url, Role.CLI)
    try:
        names = [f"events:{i}" for i in range(24)]  # hash tags spread over the 3 masters
        for name in names:
            client.xadd(keys.stream(name), {b"n": b"1"})
        slots = {client.keyslot(keys.stream(n)) for n in names}
        assert len({client.get_node_from_key(keys.stream(n)).name for n in names}) == 3, slots
    finally:
        client.close()
    settings = settings_for(cluster_url, "./unused-lake", streams=("events:*",))
    assert sorted(streamset.resolve_now(settings).streams) == sorted(names)

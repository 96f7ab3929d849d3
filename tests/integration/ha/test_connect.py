"""The one factory on Sentinel and Cluster: clients that work, one-line misconfiguration errors."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.redisio import check as redischeck
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from pipeline.runtime.ports import free_port
from tests.support.poll import until_sync
from tests.support.userenv import user_env


async def test_async_clients_of_every_layout(any_redis_url: str) -> None:
    client = redisconn.connect(any_redis_url, Role.CLI)
    try:
        for i in range(20):  # keys spread over the cluster's slots
            await client.set(f"k{i}", i)
        assert [int(await client.get(f"k{i}")) for i in range(20)] == list(range(20))
    finally:
        await client.aclose()
    redischeck.check(any_redis_url)  # a correct URL passes the start-up check


async def test_many_connections_at_once_keep_every_sentinel_client(sentinel_url: str) -> None:
    """Many connections asking the Sentinels at once, the first Sentinel not answering (as
    in a failover): every Sentinel client stays in the manager, so closing the client
    closes all their connections (redis-py 8.1's own discovery dropped one, whose open
    connections were then garbage-collected unclosed)."""
    from pipeline.runtime.ports import free_port

    hosts = sentinel_url.split("//")[1].split("/")[0]
    url = sentinel_url.replace(hosts, f"127.0.0.1:{free_port()},{hosts}")
    client = redisconn.connect(url, Role.STREAM_SERVICE)
    manager = client.connection_pool.sentinel_manager  # type: ignore[attr-defined]
    before = list(manager.sentinels)
    try:
        assert all(await asyncio.gather(*(client.ping() for _ in range(30))))
        assert sorted(map(id, manager.sentinels)) == sorted(map(id, before))
    finally:
        await client.aclose()
    open_left = [
        c
        for s in before
        for c in s.connection_pool._available_connections  # noqa: SLF001 - what aclose closed
        if c.is_connected
    ]
    assert open_left == []


def test_sync_clients_of_every_layout(any_redis_url: str) -> None:
    client = redisconn.connect_sync(any_redis_url, Role.LAKE)
    try:
        client.xadd("sluice:{s}:stream", {"data": b"x"})
        assert client.xlen("sluice:{s}:stream") == 1
    finally:
        client.close()


def test_cluster_node_given_as_plain_url(redis_cluster: Any) -> None:
    node = redis_cluster.nodes[0]
    with pytest.raises(
        ConfigError, match="is a Redis Cluster node: use redis\\+cluster://"
    ) as info:
        redischeck.check(f"redis://127.0.0.1:{node.port}/0")
    assert "\n" not in str(info.value)


def test_plain_server_given_as_cluster(redis_url: str) -> None:
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(ConfigError, match="is not a Redis Cluster node"):
        redischeck.check(f"redis+cluster://127.0.0.1:{port}")


def test_replica_given_as_master(redis_sentinels: Any) -> None:
    redis_sentinels.wait_whole()
    replica = next(s for s in redis_sentinels.data if s is not redis_sentinels.master())
    with pytest.raises(ConfigError, match="is a replica of .*redis\\+sentinel://"):
        redischeck.check(f"redis://127.0.0.1:{replica.port}/0")


def test_sentinel_that_does_not_know_the_service(sentinel_url: str) -> None:
    wrong = sentinel_url.replace("/sluice/0", "/nosuch/0")
    with pytest.raises(ConfigError, match="knows the service 'nosuch' \\(they know: sluice\\)"):
        redischeck.check(wrong)


def test_data_node_given_as_sentinel(redis_url: str) -> None:
    hostport = redis_url.split("//")[1].split("/")[0]
    with pytest.raises(ConfigError, match="is not a Sentinel"):
        redischeck.check(f"redis+sentinel://{hostport}/sluice")


def test_unreachable_redis_is_not_a_misconfiguration() -> None:
    from pipeline.runtime.ports import free_port

    port = free_port()
    for url in (
        f"redis://127.0.0.1:{port}/0",
        f"redis+cluster://127.0.0.1:{port}",
        f"redis+sentinel://127.0.0.1:{port}/svc",
    ):
        redischeck.check(url)


def _cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**user_env(keep_sluice=True), "SLUICE_REDIS_URL": url, "SLUICE_LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_commands_say_a_misconfiguration_in_one_line(
    redis_cluster: Any, redis_sentinels: Any
) -> None:
    node = redis_cluster.nodes[0]
    produce = _cli("produce", "--count", "1", url=f"redis://127.0.0.1:{node.port}/0")
    assert produce.returncode == 2
    assert produce.stderr.strip().splitlines() == [
        f"sluice produce: redis://127.0.0.1:{node.port}/0 is a Redis Cluster node: "
        f"use redis+cluster://127.0.0.1:{node.port}"
    ]
    redis_sentinels.wait_whole()
    replica = next(s for s in redis_sentinels.data if s is not redis_sentinels.master())
    started = _cli("node", "--name", "X", url=f"redis://127.0.0.1:{replica.port}/0")
    assert started.returncode == 2
    [line] = started.stderr.strip().splitlines()
    assert line.startswith("sluice node: ") and "is a replica of" in line


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", ["node", "serve", "bus"])
def test_a_cluster_node_down_at_start_is_said_in_one_line_once_it_answers(
    redis_cluster: Any, command: str, tmp_path: Any
) -> None:
    """An always-on process started with a plain URL of a Cluster node that is down: it
    waits for Redis as for any outage; when the node answers, the process ends with the
    start-up check's one line and exit code 2 (it used to go on, every command MOVED)."""
    redis_cluster.ready_url()
    node = redis_cluster.replica()
    node.kill()  # a replica: its death starts no failover
    url = f"redis://127.0.0.1:{node.port}/0"
    args = {
        "node": ["node", "--name", "X", "--listen", f"127.0.0.1:{free_port()}"],
        "serve": ["serve", "--port", str(free_port())],
        "bus": ["bus", "--twin", "1", "--listen", f"127.0.0.1:{free_port()}"],
    }[command]
    env = {
        **user_env(keep_sluice=True),
        "SLUICE_REDIS_URL": url,
        "SLUICE_BUS_LEGACY_PEERS": "1",
        "SLUICE_LAKE_URI": str(tmp_path / "lake"),
        "SLUICE_LOG_LEVEL": "INFO",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        # running, its Redis down: the process retries (node) or serves (serve) meanwhile
        running = {
            "node": "transport of X listening",
            "serve": "live tailer: redis error",
            "bus": "sluice bus: waiting for redis",
        }
        until_sync(
            lambda: any(running[command] in line for line in lines) or proc.poll() is not None,
            f"sluice {command} running with its Redis down",
            within_s=120,
            detail=lambda: "".join(lines[-20:]),
        )
        assert proc.poll() is None, "".join(lines)
        redis_cluster.heal()
        try:
            code = proc.wait(120)  # bounds a hang only
        except subprocess.TimeoutExpired:
            pytest.fail(f"sluice {command} still runs on a Cluster node named redis://")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 2, "".join(lines)
    assert lines[-1].strip() == (
        f"sluice {command}: {url} is a Redis Cluster node: use redis+cluster://127.0.0.1:{node.port}"
    )


def test_a_bus_stopped_while_it_waits_for_redis_at_start_exits_0(tmp_path: Any) -> None:
    """SIGTERM while ``sluice bus`` waits for a Redis that is down: exit 0, no traceback
    (its stop waited on an empty set of tasks: ValueError)."""
    env = {
        **user_env(keep_sluice=True),
        "SLUICE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "SLUICE_BUS_LEGACY_PEERS": "1",
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "bus", "--twin", "1",
         "--listen", f"127.0.0.1:{free_port()}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        until_sync(
            lambda: any("waiting for redis" in line for line in lines) or proc.poll() is not None,
            "sluice bus waiting for redis",
            within_s=60,
        )
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)  # bounds a hang only
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 0, "".join(lines)
    assert not any("Traceback" in line for line in lines), "".join(lines)

"""Each Toxiproxy fault really happens to a real redis-server's connections.

Raw sockets show what a connection sees (refused, EOF, reset, silence while still
established); redis-py shows what a client sees. Timings are only lower bounds
that the fault itself guarantees (a delay cannot be shorter than its toxic).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.toxiproxy import Proxy, Toxiproxy, ToxiproxyError, missing

pytestmark = pytest.mark.timeout(60)

PING = b"PING\r\n"
PONG = b"+PONG\r\n"
#: TCP_ESTABLISHED in Linux's tcp_info.tcpi_state
TCP_ESTABLISHED = 1


def _connect(proxy: Proxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=timeout)


def _ping(sock: socket.socket) -> bool:
    sock.sendall(PING)
    return sock.recv(64) == PONG


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closed or reset the connection (a PING gets EOF or an error)."""
    try:
        sock.sendall(PING)
        return sock.recv(64) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _client(proxy: Proxy, timeout: float = 10.0) -> redis.Redis:
    # no retries: each fault must reach the caller as it happened
    return redis.Redis(
        host=proxy.host, port=proxy.port, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def test_latency_delays_each_direction_by_at_least_its_ms(redis_proxy: Proxy) -> None:
    client = _client(redis_proxy)
    try:
        assert client.ping()
        assert redis_proxy.latency(150) == "latency_downstream"
        assert redis_proxy.latency(100, stream="upstream") == "latency_upstream"
        start = time.monotonic()
        assert client.ping()
        assert time.monotonic() - start >= 0.25
        redis_proxy.clear()
        assert redis_proxy.toxics() == []
        assert client.ping()
    finally:
        client.close()


def test_cut_refuses_new_connections_and_closes_open_ones_restore_reopens(
    redis_proxy: Proxy,
) -> None:
    with _connect(redis_proxy) as sock:
        assert _ping(sock)
        redis_proxy.cut()
        assert _closed_by_peer(sock)
    with pytest.raises(ConnectionRefusedError):
        _connect(redis_proxy).close()
    client = _client(redis_proxy)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
        redis_proxy.restore()
        assert client.ping()
    finally:
        client.close()


def test_half_open_drops_data_while_the_connection_stays_established(
    redis_proxy: Proxy,
) -> None:
    with _connect(redis_proxy, timeout=1.0) as sock:
        assert _ping(sock)
        assert redis_proxy.half_open() == ["timeout_downstream", "timeout_upstream"]
        sock.sendall(PING)
        with pytest.raises(TimeoutError):
            sock.recv(64)
        # neither EOF nor reset: nothing to read, and the kernel still has it established
        sock.settimeout(0.0)
        with pytest.raises(BlockingIOError):
            sock.recv(64, socket.MSG_PEEK)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == TCP_ESTABLISHED
        client = _client(redis_proxy, timeout=1.0)
        try:
            with pytest.raises(redis.TimeoutError):
                client.ping()
        finally:
            client.close()
        # removing the toxic closes the connections it held; new ones work
        redis_proxy.clear()
        sock.settimeout(5.0)
        assert _closed_by_peer(sock)
    with _connect(redis_proxy) as fresh:
        assert _ping(fresh)


def test_slow_limits_a_large_reads_throughput(
    redis_proxy: Proxy, redis_client: redis.Redis
) -> None:
    size, rate = 100_000, 100_000
    redis_client.set("big", b"x" * size)
    client = _client(redis_proxy)
    try:
        assert client.ping()
        assert redis_proxy.slow(rate) == "bandwidth_downstream"
        start = time.monotonic()
        assert client.get("big") == b"x" * size
        # 1 s at the configured rate; half of it is a bound no loopback copy comes near
        assert time.monotonic() - start >= 0.5 * size / rate
    finally:
        client.close()


def test_reset_peer_resets_new_connections(redis_proxy: Proxy, redis_client: redis.Redis) -> None:
    redis_proxy.reset_peer()
    with _connect(redis_proxy) as sock:
        sock.sendall(b"SET reset-probe 1\r\n")
        with pytest.raises(ConnectionResetError):
            sock.recv(64)
    # downstream: the command reached Redis, its answer was replaced by the reset
    assert redis_client.get("reset-probe") == b"1"
    client = _client(redis_proxy)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        client.close()


def test_api_errors_raise_the_apis_message_on_one_line(
    toxiproxy: Toxiproxy, redis_proxy: Proxy
) -> None:
    with pytest.raises(ToxiproxyError, match="proxy already exists") as exists:
        toxiproxy.proxy("redis", redis_proxy.port)
    assert "\n" not in str(exists.value)
    redis_proxy.latency(10)
    with pytest.raises(ToxiproxyError, match="toxic already exists"):
        redis_proxy.latency(20)
    with pytest.raises(ValueError, match="bytes_per_s must be >= 1000"):
        redis_proxy.slow(500)
    with pytest.raises(ValueError, match="stream must be"):
        redis_proxy.latency(10, stream="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency must be a whole number"):
        redis_proxy.latency(-1)
    toxiproxy.reset()
    assert redis_proxy.toxics() == []
    redis_proxy.delete()
    assert toxiproxy.proxies() == []
    with pytest.raises(ToxiproxyError, match="proxy not found"):
        redis_proxy.cut()


def test_server_starts_answers_and_is_gone_after_the_block(tmp_path: Path) -> None:
    if reason := missing():
        pytest.skip(reason)
    with Toxiproxy(log=tmp_path / "toxiproxy.log") as server:
        assert server.proxies() == []
        proc = server.proc
        assert proc is not None and proc.poll() is None
    assert proc.poll() is not None
    with pytest.raises(ToxiproxyError, match="toxiproxy GET /proxies: .*refused"):
        server.proxies()


def test_a_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ToxiproxyError, match="no-such-binary is not an executable"):
        Toxiproxy(tmp_path / "no-such-binary").start()

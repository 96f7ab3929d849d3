"""The Redis hook: an Airflow connection when defined, else SLUICE_REDIS_URL; a real PING."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError

pytestmark = pytest.mark.airflow


def test_connection_from_airflow_wins(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_redis_hook import SluiceRedisHook

    monkeypatch.setenv("SLUICE_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", "redis://:s%40cret@10.1.2.3:6380/3")
    assert SluiceRedisHook().get_url() == "redis://:s%40cret@10.1.2.3:6380/3"


def test_fallback_to_sluice_redis_url(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_redis_hook import SluiceRedisHook

    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_REDIS", raising=False)
    monkeypatch.setenv("SLUICE_REDIS_URL", "redis://127.0.0.1:7001/2")
    assert SluiceRedisHook().get_url() == "redis://127.0.0.1:7001/2"


def test_hook_talks_to_a_real_redis(
    airflow_home: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice_redis_hook import SluiceRedisHook

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", redis_url)
    hook = SluiceRedisHook()
    assert hook.test_connection() == (True, "redis answered PING")
    client = hook.get_conn()
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_unreachable_redis_is_reported(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_redis_hook import SluiceRedisHook

    from pipeline.runtime.ports import free_port

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", f"redis://127.0.0.1:{free_port()}/0")
    ok, message = SluiceRedisHook().test_connection()
    assert ok is False and message.startswith("redis ping failed")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"host": None}, "no host"),
        ({"schema": "zero"}, "db must be a number"),
        ({"extra": {"db": "x"}}, "db must be a number"),
    ],
)
def test_bad_connections_are_clear_errors(fields: dict[str, object], error: str) -> None:
    from sluice_redis_hook import connection_url

    base: dict[str, object] = {"host": "h", "port": 1, "password": None, "schema": "", "extra": {}}
    with pytest.raises(ConfigError, match=error):
        connection_url(**{**base, **fields})  # type: ignore[arg-type]


def test_ssl_and_db_from_extra() -> None:
    from sluice_redis_hook import connection_url

    url = connection_url(
        host="h", port=None, password="pw", schema="", extra={"db": 4, "ssl": "true"}
    )
    assert url == "rediss://:pw@h:6379/4"


def test_tls_survives_a_rediss_connection_and_the_fallback(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: the hook must never turn ``rediss://`` (TLS) into ``redis://``."""
    from sluice_redis_hook import SluiceRedisHook

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", "rediss://:pw@10.1.2.3:6380/1")
    assert SluiceRedisHook().get_url() == "rediss://:pw@10.1.2.3:6380/1"
    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_REDIS")
    monkeypatch.setenv("SLUICE_REDIS_URL", "rediss://:pw@10.9.9.9:6390/2")
    assert SluiceRedisHook().get_url() == "rediss://:pw@10.9.9.9:6390/2"
    # A TLS client, not a plaintext one, comes out of it.
    client = SluiceRedisHook().get_conn()
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert client.connection_pool.connection_class.__name__ == "SSLConnection", kwargs
    finally:
        client.close()


@pytest.mark.parametrize("layout", ["sentinel", "cluster"])
def test_hook_on_sentinel_and_cluster(
    airflow_home: Path, layout: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Sentinel group or a cluster has no one host: the connection's extra ``url`` holds it."""
    import json

    from sluice_redis_hook import SluiceRedisHook

    url = str(request.getfixturevalue(f"{layout}_url"))
    conn = {"conn_type": "redis", "host": "ignored", "extra": {"url": url}}
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", json.dumps(conn))
    hook = SluiceRedisHook()
    assert hook.get_url() == url
    assert hook.test_connection() == (True, "redis answered PING")
    client = hook.get_conn()
    try:
        client.xadd("sluice:{hook}:stream", {"data": b"x"})
        assert client.xlen("sluice:{hook}:stream") == 1
    finally:
        client.close()

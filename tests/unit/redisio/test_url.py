"""The Redis URL forms: one server, Sentinel, Cluster (pure parsing, no server)."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.redisio.url import RedisTarget, Topology, parse, redact
from pipeline.settings import Settings


def test_single_forms_are_as_before() -> None:
    t = parse("redis://:pw@10.0.0.1:7000/3")
    assert (t.topology, t.hosts, t.db, t.password, t.tls) == (
        Topology.SINGLE, (("10.0.0.1", 7000),), 3, "pw", False,
    )  # fmt: skip
    assert parse("rediss://h/0").tls
    assert parse("unix:///tmp/r.sock?db=2").db == 2


def test_sentinel_url() -> None:
    t = parse("rediss+sentinel://u:p%40ss@s1:5000,s2,[::1]:5002/mymaster/4?sentinel_password=sp")
    assert t == RedisTarget(
        Topology.SENTINEL,
        t.url,
        (("s1", 5000), ("s2", 26379), ("::1", 5002)),
        tls=True,
        service="mymaster",
        db=4,
        username="u",
        password="p@ss",
        sentinel_password="sp",
    )
    assert parse("redis+sentinel://s1/svc").db == 0


def test_cluster_url() -> None:
    t = parse("redis+cluster://:pw@n1:7000,n2:7001")
    assert (t.topology, t.hosts, t.password, t.tls) == (
        Topology.CLUSTER, (("n1", 7000), ("n2", 7001)), "pw", False,
    )  # fmt: skip
    assert parse("rediss+cluster://n1").hosts == (("n1", 6379),)
    assert parse("redis+cluster://n1:7000/0").db == 0


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://h:1", "not a redis URL"),
        ("redis+sentinel://s1:26379", "names its service"),
        ("redis+sentinel://s1:26379/svc/x", "must be a number"),
        ("redis+sentinel://s1:99999/svc", "bad port"),
        ("redis+sentinel://s1,,s2/svc", "empty host"),
        ("redis+sentinel://s1/svc?tls=1", "unknown option"),
        ("redis+cluster://n1:7000/2", "only database 0"),
        ("redis+cluster://n1:7000?sentinel_password=x", "for Sentinel URLs"),
        ("redis://h1:1,h2:2/0", "several hosts need"),
    ],
)
def test_bad_urls_are_one_line_config_errors(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as info:
        parse(url)
    assert "\n" not in str(info.value)


def test_passwords_never_reach_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse("redis+sentinel://:topsecret@s1:1/svc/x?sentinel_password=alsosecret")
    assert "topsecret" not in str(info.value) and "alsosecret" not in str(info.value)
    assert redact("redis+cluster://u:pw@n1:1") == "redis+cluster://u:***@n1:1"


def test_settings_take_every_form() -> None:
    s = Settings.load(env={}, redis_url="redis+sentinel://a:1,b:2/svc/1")
    assert (s.redis.topology, s.redis.host, s.redis.port, s.redis.db) == (
        Topology.SENTINEL, "a", 1, 1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="setting 'redis_url'"):
        Settings.load(env={}, redis_url="redis+cluster://a:1/5")

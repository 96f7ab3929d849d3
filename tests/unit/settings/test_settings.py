"""Settings: every user-facing name still read, nested sections, one ConfigError naming the setting."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from pipeline.bus.config import BusConfig
from pipeline.cli import main
from pipeline.errors import ConfigError
from pipeline.settings import (
    MAX_PAYLOAD,
    BusSettings,
    LakeSettings,
    RedisSettings,
    ServeSettings,
    Settings,
    flat_names,
)

#: Every SLUICE_* setting variable in use before the settings were nested (README, docker/,
#: dags/, plugins/, the demo, tests): each must keep working under its exact name.
ENV_NAMES = [
    "SLUICE_REDIS_URL",
    "SLUICE_LAKE_URI",
    "SLUICE_VAR_DIR",
    "SLUICE_SPARK_MASTER",
    "SLUICE_SPARK_REMOTE",
    "SLUICE_SPARK_JARS",
    "SLUICE_SPARK_DRIVER_MEMORY",
    "SLUICE_SPARK_CONNECT_PORT",
    "SLUICE_SPARK_SHUFFLE_PARTITIONS",
    "SLUICE_STREAMS",
    "SLUICE_CHAIN_STREAMS",
    "SLUICE_ARCHIVE_CRON",
    "SLUICE_ARCHIVE_PARTITIONS",
    "SLUICE_HOT_RETENTION_S",
    "SLUICE_REORG_THRESHOLD",
    "SLUICE_MAX_PAYLOAD",
    "SLUICE_NODE_NAME",
    "SLUICE_NODE_WORKERS",
    "SLUICE_NODE_LISTEN",
    "SLUICE_NODE_TCP_MAX_CONNECTIONS",
    "SLUICE_NODE_TCP_FIRST_FRAME_S",
    "SLUICE_NODE_TCP_FRAME_S",
    "SLUICE_NODE_TCP_IDLE_S",
    "SLUICE_CONSUMER_MAX_FAILURES",
    "SLUICE_LEASE_TTL_S",
    "SLUICE_NODE_HEALTH_LISTEN",
    "SLUICE_BUS_TWIN",
    "SLUICE_BUS_LISTEN",
    "SLUICE_BUS_DIRECTORY",
    "SLUICE_BUS_KEY_FILE",
    "SLUICE_BUS_LEGACY_PEERS",
    "SLUICE_BUS_HEALTH_LISTEN",
    "SLUICE_BUS_DEFAULT_EXP_S",
    "SLUICE_BUS_MAX_EXP_S",
    "SLUICE_BUS_MAX_TRY",
    "SLUICE_BUS_RETRY_BASE_S",
    "SLUICE_BUS_RETRY_MAX_S",
    "SLUICE_BUS_REPLAY_WINDOW_S",
    "SLUICE_BUS_MAX_SEEN",
    "SLUICE_BUS_MAX_ATTEMPTS",
    "SLUICE_BUS_HTTP_IDLE_S",
    "SLUICE_BUS_HTTP_MAX_CONNECTIONS",
    "SLUICE_SERVE_HOST",
    "SLUICE_SERVE_PORT",
    "SLUICE_SERVE_STREAM",
    "SLUICE_SERVE_TOKEN",
    "SLUICE_SERVE_SEND_BUFFER",
    "SLUICE_SERVE_HEARTBEAT_S",
    "SLUICE_SERVE_DIALOGUE_PORT",
    "SLUICE_SERVE_HISTORY_CACHE_MB",
    "SLUICE_SERVE_TAIL_INDEX_MAX",
    "SLUICE_LOG_LEVEL",
    "SLUICE_LAKE_JOB_TIMEOUT_S",
    "SLUICE_ARCHIVE_PARALLELISM",
    "SLUICE_LAKE_TASK_RETRIES",
    "SLUICE_LAKE_LOCK_WAIT_S",
]

#: Where each flat name lives now (a sample per section, and every prefix-free one).
NESTED = {
    "redis_url": "redis.url",
    "lake_uri": "lake.uri",
    "streams": "lake.streams",
    "chain_streams": "lake.chain_streams",
    "archive_cron": "lake.archive_cron",
    "archive_partitions": "lake.archive_partitions",
    "archive_parallelism": "lake.archive_parallelism",
    "hot_retention_s": "lake.hot_retention_s",
    "reorg_threshold": "lake.reorg_threshold",
    "lake_job_timeout_s": "lake.job_timeout_s",
    "spark_remote": "spark.remote",
    "consumer_max_failures": "node.consumer_max_failures",
    "lease_ttl_s": "node.lease_ttl_s",
    "node_tcp_idle_s": "node.tcp_idle_s",
    "bus_twin": "bus.twin",
    "bus_legacy_peers": "bus.legacy_peers",
    "serve_port": "serve.port",
    "var_dir": "var_dir",
    "max_payload": "max_payload",
    "log_level": "log_level",
}

NO_FILE = "/nonexistent/sluice.toml"


def _get(settings: Settings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _sample(hint: Any) -> tuple[str, Any]:
    """A valid non-default value of type ``hint``: (as an env var, as read back)."""
    base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
    if base is bool:
        return "yes", True
    if base is int:
        return "7", 7
    if base is float:
        return "2.5", 2.5
    if base is str:
        return "", ""
    return "a, b,c", ("a", "b", "c")


def _where(flat: str) -> tuple[str, Any]:
    """The nested path and type of a flat name: ``<section>_<field>``, a prefix-free section
    field, or a top-level field."""
    top = typing.get_type_hints(Settings, include_extras=True)
    sections = [name for name, hint in top.items() if dataclasses.is_dataclass(hint)]
    if flat in top and flat not in sections:
        return flat, top[flat]
    found = []
    for section in sections:
        hints = typing.get_type_hints(top[section], include_extras=True)
        for name, hint in hints.items():
            if flat in (f"{section}_{name}", name):
                found.append((f"{section}.{name}", hint))
    assert len(found) == 1, (flat, found)
    return found[0]


def test_every_existing_env_name_is_still_a_setting() -> None:
    names = {"SLUICE_" + name.upper() for name in flat_names()}
    assert sorted(set(ENV_NAMES) - names) == []


def test_nested_paths() -> None:
    for flat, dotted in NESTED.items():
        assert _where(flat)[0] == dotted


#: A valid non-default value where the type's sample (``_sample``) is not one: the text
#: to set, and the value read back when it differs.
VALID: dict[str, str | tuple[str, Any]] = {
    "redis.url": "rediss://:pw@example:6380/3",
    "lake.uri": "s3://bucket/lake",
    "lake.archive_cron": "0 * * * *",
    "lake.archive_writer": "spark",
    "lake.s3_endpoint": "https://s3.example:9000",
    "lake.s3_conditional_put": "unsafe-rename",
    "spark.remote": "sc://spark:15003",
    "spark.driver_memory": "2g",
    "bus.retry_base_s": ("1.5", 1.5),
    "bus.max_exp_s": ("600", 600),
    "log_level": "ERROR",
}
#: Settings that are valid only with another one set: that one, as a flat name and value.
COMPANIONS = {
    "lake_s3_access_key": {"lake_s3_secret_key": "s"},
    "lake_s3_secret_key": {"lake_s3_access_key": "k"},
}


@pytest.mark.parametrize("flat", flat_names())
def test_every_env_var_is_read(flat: str) -> None:
    dotted, hint = _where(flat)
    env_value, expected = _sample(hint)
    if dotted in VALID:
        valid = VALID[dotted]
        env_value, expected = valid if isinstance(valid, tuple) else (valid, valid)
    elif dotted == "bus.listen" or dotted.endswith("listen"):
        env_value = expected = "0.0.0.0:1234"
    elif expected == "":
        env_value = expected = "something-else"
    others = COMPANIONS.get(flat, {})
    env = {"SLUICE_" + name.upper(): value for name, value in {**others, flat: env_value}.items()}
    got = Settings.load(env=env, config_path=NO_FILE)
    assert _get(got, dotted) == expected
    # and the same name works as a keyword override and in replace()
    assert (
        _get(Settings.load(env={}, config_path=NO_FILE, **others, **{flat: env_value}), dotted)
        == expected
    )
    assert _get(Settings().replace(**others, **{flat: env_value}), dotted) == expected


def test_toml_flat_and_nested_tables(tmp_path: Path) -> None:
    cfg = tmp_path / "sluice.toml"
    cfg.write_text(
        "[sluice]\n"
        "reorg_threshold = 10\n"
        'streams = ["a", "b"]\n'
        "bus_twin = 4\n"
        "[sluice.bus]\n"
        "max_try = 5\n"
        "legacy_peers = true\n"
        "[sluice.lake]\n"
        'chain_streams = ["a"]\n'
        "job_timeout_s = 99\n"
        "[sluice.serve]\n"
        "port = 9000\n"
    )
    s = Settings.load(env={}, config_path=cfg)
    assert s.lake.reorg_threshold == 10
    assert s.lake.streams == ("a", "b")
    assert s.lake.chain_streams == ("a",)
    assert s.lake.job_timeout_s == 99
    assert (s.bus.twin, s.bus.max_try, s.bus.legacy_peers) == (4, 5, True)
    assert s.serve.port == 9000


def test_config_path_from_env(tmp_path: Path) -> None:
    cfg = tmp_path / "other.toml"
    cfg.write_text("[sluice]\nnode_name = 'from-file'\n")
    assert Settings.load(env={"SLUICE_CONFIG": str(cfg)}).node.name == "from-file"


def test_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "sluice.toml"
    cfg.write_text("[sluice]\nserve_port = 1\nnode_name = 'file'\n[sluice.bus]\ntwin = 1\n")
    env = {"SLUICE_SERVE_PORT": "9", "SLUICE_BUS_TWIN": "2"}
    s = Settings.load(env=env, config_path=cfg, bus_twin=3)
    assert s.serve.port == 9  # env over file
    assert s.node.name == "file"  # file over default
    assert s.bus.twin == 3  # argument over env over file
    assert s.spark.master == "local[*]"  # the default


def test_defaults_are_valid_and_local() -> None:
    s = Settings()
    assert s.redis.url == "redis://127.0.0.1:6379/0"
    assert Path(s.lake.uri).is_absolute() and s.lake.uri.endswith("var/lake")
    assert s.max_payload == MAX_PAYLOAD


def test_replace_by_flat_name_and_by_section() -> None:
    s = Settings()
    t = s.replace(serve_port=0, redis_url="redis://h:7/1", hot_retention_s="5")
    assert (t.serve.port, t.redis.url, t.lake.hot_retention_s) == (0, "redis://h:7/1", 5)
    assert t.serve.host == s.serve.host and s.serve.port == 8765  # s unchanged
    u = s.replace(bus=BusSettings(twin=9))
    assert u.bus.twin == 9
    with pytest.raises(ConfigError, match="serve_port"):
        s.replace(serve_port=-1)
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        s.replace(nope=1)
    with pytest.raises(ConfigError, match="'bus' must be a BusSettings"):
        s.replace(bus={"twin": 1})


def test_lake_section_table_and_relative_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings.load(env={"SLUICE_LAKE_URI": "rel/lake"}, config_path=NO_FILE)
    assert s.lake.uri == str(tmp_path / "rel" / "lake")
    assert s.lake.table("blocks") == str(tmp_path / "rel" / "lake" / "blocks")
    assert LakeSettings.from_url("s3://bucket/lake/").table("x") == "s3://bucket/lake/x"
    assert LakeSettings.from_url("file:///data/lake").uri == "/data/lake"


def test_redis_section_parts() -> None:
    r = Settings.load(
        env={"SLUICE_REDIS_URL": "rediss://:p%40ss@h:7000/3"}, config_path=NO_FILE
    ).redis
    assert (r.url, r.host, r.port, r.db, r.password) == (
        "rediss://:p%40ss@h:7000/3",
        "h",
        7000,
        3,
        "p@ss",
    )
    d = RedisSettings.from_url("redis://h")
    assert (d.port, d.db, d.password) == (6379, 0, None)
    u = RedisSettings.from_url("unix:///tmp/r.sock?db=2")
    assert (u.host, u.port, u.db) == ("/tmp/r.sock", 0, 2)


BAD = [
    # (env var, value, words the one error line must hold)
    ("SLUICE_LEASE_TTL_S", "-1", ["'lease_ttl_s'", "SLUICE_LEASE_TTL_S", "non-negative"]),
    ("SLUICE_BUS_RETRY_BASE_S", "-0.5", ["'bus_retry_base_s'", "non-negative"]),
    ("SLUICE_SERVE_HEARTBEAT_S", "nan", ["'serve_heartbeat_s'", "non-negative"]),
    ("SLUICE_NODE_TCP_IDLE_S", "inf", ["'node_tcp_idle_s'"]),
    ("SLUICE_SERVE_RELEASE_EVERY_S", "0", ["'serve_release_every_s'", "positive"]),
    ("SLUICE_SERVE_PORT", "70000", ["'serve_port'", "0-65535"]),
    ("SLUICE_SPARK_CONNECT_PORT", "65536", ["'spark_connect_port'", "0-65535"]),
    ("SLUICE_SERVE_PORT", "eighty", ["'serve_port'", "int", "eighty"]),
    ("SLUICE_BUS_LISTEN", "nowhere", ["'bus_listen'", "host:port"]),
    ("SLUICE_BUS_LISTEN", "", ["'bus_listen'", "host:port"]),
    ("SLUICE_NODE_LISTEN", "h:99999", ["'node_listen'", "host:port"]),
    ("SLUICE_NODE_HEALTH_LISTEN", "h:x", ["'node_health_listen'", "host:port"]),
    ("SLUICE_REDIS_URL", "http://x", ["'redis_url'", "redis://"]),
    ("SLUICE_REDIS_URL", "redis://h:99999/0", ["'redis_url'", "out of range"]),
    ("SLUICE_REDIS_URL", "redis://h:6379/x", ["'redis_url'", "db"]),
    ("SLUICE_REDIS_URL", "unix:///tmp/s?db=x", ["'redis_url'", "db"]),
    ("SLUICE_BUS_LEGACY_PEERS", "maybe", ["'bus_legacy_peers'", "bool", "maybe"]),
    ("SLUICE_LOG_LEVEL", "LOUD", ["'log_level'", "LOUD"]),
    ("SLUICE_LAKE_URI", "", ["'lake_uri'", "empty"]),
    ("SLUICE_MAX_PAYLOAD", "1.5", ["'max_payload'", "int"]),
]


@pytest.mark.parametrize(("var", "value", "words"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_env_value_names_the_setting(var: str, value: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load(env={var: value}, config_path=NO_FILE)
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[sluice]\nno_such = 1\n", ["unknown setting 'no_such'", "sluice.toml"]),
        ("[sluice.bus]\nno_such = 1\n", ["unknown setting 'no_such'", "[sluice.bus]"]),
        ("[sluice]\nbus_twin = -2\n", ["'bus_twin'", "sluice.toml", "non-negative"]),
        ("[sluice.bus]\ntwin = 'x'\n", ["'bus_twin'", "int"]),
        ("[sluice]\nserve_port = true\n", ["'serve_port'", "int"]),
        ("[sluice]\nbus_legacy_peers = 'maybe'\n", ["'bus_legacy_peers'", "bool"]),
        ("[sluice]\nstreams = [1, 2]\n", ["'streams'", "list of text"]),
        ("[sluice]\nserve_token = ['a']\n", ["'serve_token'", "text"]),
        ("[sluice.serve]\nport = 70000\n", ["'serve_port'", "0-65535"]),
        ("sluice = 3\n", ["[sluice] must be a table"]),
    ],
)
def test_bad_toml_names_the_setting(tmp_path: Path, toml: str, words: list[str]) -> None:
    cfg = tmp_path / "sluice.toml"
    cfg.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        Settings.load(env={}, config_path=cfg)
    for word in words:
        assert word in str(caught.value), caught.value


def test_bad_override_and_unknown_names() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'nonsense'"):
        Settings.load(env={}, config_path=NO_FILE, nonsense=1)
    with pytest.raises(ConfigError, match="'bus_twin' cannot read 'x'"):
        Settings.load(env={}, config_path=NO_FILE, bus_twin="x")
    # SLUICE_* variables read by other tools (docker/init.sh's SLUICE_BUS_URL...): not settings
    Settings.load(env={"SLUICE_BUS_URL": "http://bus:8051"}, config_path=NO_FILE)


def test_an_unknown_variable_is_refused_like_the_same_key_in_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'bus_twinn' \(from SLUICE_BUS_TWINN\)"):
        Settings.load(env={"SLUICE_BUS_TWINN": "3"}, config_path=NO_FILE)
    cfg = tmp_path / "sluice.toml"
    cfg.write_text("[sluice]\nbus_twinn = 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'bus_twinn' \(from .*sluice.toml\)"):
        Settings.load(env={}, config_path=cfg)


def test_a_config_file_named_in_sluice_config_must_exist() -> None:
    with pytest.raises(ConfigError, match=r"config file /nonexistent.toml \(from SLUICE_CONFIG\)"):
        Settings.load(env={"SLUICE_CONFIG": "/nonexistent.toml"})


def test_parts_leave_the_other_sections_unread() -> None:
    env = {"SLUICE_SERVE_PORT": "99999", "SLUICE_BUS_TWIN": "7"}
    with pytest.raises(ConfigError, match="serve_port"):
        Settings.load(env=env, config_path=NO_FILE)
    settings = Settings.load(env=env, config_path=NO_FILE, parts=("redis", "bus"))
    assert settings.bus.twin == 7 and settings.serve.port == ServeSettings().port


def test_bools() -> None:
    for text, value in [
        ("1", True),
        ("TRUE", True),
        ("on", True),
        ("0", False),
        ("off", False),
        ("", False),
    ]:
        s = Settings.load(env={"SLUICE_BUS_LEGACY_PEERS": text}, config_path=NO_FILE)
        assert s.bus.legacy_peers is value, text


def test_bus_config_is_the_bus_section() -> None:
    """BusConfig adds only the payload bound: every other default is the bus section's."""
    own = {f.name for f in dataclasses.fields(BusConfig)} - {
        f.name for f in dataclasses.fields(BusSettings)
    }
    assert own == {"max_size"}
    assert BusConfig().max_size == Settings().max_payload
    s = Settings.load(
        env={
            "SLUICE_BUS_LISTEN": "0.0.0.0:0",
            "SLUICE_BUS_MAX_TRY": "3",
            "SLUICE_MAX_PAYLOAD": "4096",
        },
        config_path=NO_FILE,
    )
    config = BusConfig.from_settings(s, twin=5)
    assert (config.host, config.port, config.max_try, config.max_size, config.twin) == (
        "0.0.0.0", 0, 3, 4096, 5,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="'max_payload'"):
        BusConfig(max_size=-1)


def test_cli_turns_a_bad_setting_into_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("SLUICE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./sluice.toml
    monkeypatch.setenv("SLUICE_BUS_LEGACY_PEERS", "maybe")
    assert main(["bus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bus_legacy_peers" in err[0] and "SLUICE_BUS_LEGACY_PEERS" in err[0]

"""Every field of every settings section is checked when built: type, range, relation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.settings import (
    BusSettings,
    LakeSettings,
    NodeSettings,
    RedisSettings,
    ServeSettings,
    Settings,
    SparkSettings,
)

NO_FILE = "/nonexistent/sluice.toml"
SECTIONS = [RedisSettings, LakeSettings, SparkSettings, NodeSettings, BusSettings, ServeSettings]

#: Counts, sizes and durations that 0 makes meaningless (an empty pool, a timeout already
#: over): the environment variable of each.
POSITIVE = [
    "SLUICE_ARCHIVE_PARTITIONS",
    "SLUICE_ARCHIVE_PARALLELISM",
    "SLUICE_ARCHIVE_JOB_WORKERS",
    "SLUICE_LAKE_JOB_TIMEOUT_S",
    "SLUICE_LAKE_S3_TIMEOUT_S",
    "SLUICE_SPARK_SHUFFLE_PARTITIONS",
    "SLUICE_NODE_TCP_MAX_CONNECTIONS",
    "SLUICE_CONSUMER_MAX_FAILURES",
    "SLUICE_LEASE_TTL_S",
    "SLUICE_BUS_DEFAULT_EXP_S",
    "SLUICE_BUS_MAX_EXP_S",
    "SLUICE_BUS_RETRY_BASE_S",
    "SLUICE_BUS_RETRY_MAX_S",
    "SLUICE_BUS_REPLAY_WINDOW_S",
    "SLUICE_BUS_MAX_SEEN",
    "SLUICE_BUS_MAX_ATTEMPTS",
    "SLUICE_BUS_HTTP_IDLE_S",
    "SLUICE_BUS_HTTP_MAX_CONNECTIONS",
    "SLUICE_BUS_BATCH",
    "SLUICE_BUS_SCRUB_INTERVAL_S",
    "SLUICE_BUS_HTTP_WORKERS",
    "SLUICE_BUS_MAX_PENDING",
    "SLUICE_BUS_REDIS_CONNECTIONS",
    "SLUICE_SERVE_SEND_BUFFER",
    "SLUICE_SERVE_STALL_S",
    "SLUICE_SERVE_MAX_CONNECTIONS",
    "SLUICE_SERVE_HEADER_TIMEOUT_S",
    "SLUICE_SERVE_CACHE_IDLE_S",
    "SLUICE_SERVE_RELEASE_EVERY_S",
    "SLUICE_MAX_PAYLOAD",
]

BAD = [
    # (variables set, the setting named, words the one error line must hold)
    ({"SLUICE_SERVE_HISTORY_CACHE_MB": "-1"}, "serve_history_cache_mb", ["non-negative"]),
    ({"SLUICE_ARCHIVE_CRON": "every minute"}, "archive_cron", ["cron fields", "@hourly"]),
    ({"SLUICE_ARCHIVE_CRON": ""}, "archive_cron", ["cron fields"]),
    ({"SLUICE_ARCHIVE_WRITER": "fast"}, "archive_writer", ["arrow or spark", "'fast'"]),
    (
        {"SLUICE_ARCHIVE_WRITER": "spark", "SLUICE_LAKE_URI": "s3://b/l"},
        "archive_writer",
        ["object storage"],
    ),
    ({"SLUICE_LAKE_S3_ACCESS_KEY": "k"}, "lake_s3_access_key", ["lake_s3_secret_key", "both"]),
    ({"SLUICE_LAKE_S3_SECRET_KEY": "s"}, "lake_s3_secret_key", ["lake_s3_access_key", "both"]),
    ({"SLUICE_SPARK_MASTER": " "}, "spark_master", ["empty"]),
    ({"SLUICE_SPARK_REMOTE": "http://h:1"}, "spark_remote", ["sc://host"]),
    ({"SLUICE_SPARK_REMOTE": "sc://"}, "spark_remote", ["sc://host"]),
    ({"SLUICE_SPARK_DRIVER_MEMORY": "lots"}, "spark_driver_memory", ["memory size", "'lots'"]),
    ({"SLUICE_NODE_NAME": ""}, "node_name", ["empty"]),
    ({"SLUICE_SERVE_HOST": ""}, "serve_host", ["empty"]),
    ({"SLUICE_SERVE_STREAM": ""}, "serve_stream", ["empty"]),
    ({"SLUICE_VAR_DIR": ""}, "var_dir", ["empty"]),
    (
        {"SLUICE_REDIS_MIN_REPLICAS": "1", "SLUICE_REDIS_MIN_REPLICAS_TIMEOUT_MS": "0"},
        "redis_min_replicas_timeout_ms",
        ["positive", "redis_min_replicas", "forever"],
    ),
    (
        {"SLUICE_BUS_DEFAULT_EXP_S": "600", "SLUICE_BUS_MAX_EXP_S": "300"},
        "bus_default_exp_s",
        ["bus_max_exp_s", "600"],
    ),
    ({"SLUICE_BUS_RETRY_BASE_S": "3"}, "bus_retry_base_s", ["bus_retry_max_s", "3"]),
    (
        {"SLUICE_SERVE_PORT": "9000", "SLUICE_SERVE_DIALOGUE_PORT": "9000"},
        "serve_dialogue_port",
        ["serve_port", "9000"],
    ),
    *(({var: "0"}, var.removeprefix("SLUICE_").lower(), ["positive"]) for var in POSITIVE),
]


@pytest.mark.parametrize(
    ("env", "flat", "words"), BAD, ids=[",".join(f"{k}={v}" for k, v in b[0].items()) for b in BAD]
)
def test_a_bad_value_is_refused_naming_its_variable(
    env: dict[str, str], flat: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load(env=env, config_path=NO_FILE)
    message = str(caught.value)
    assert "\n" not in message
    assert f"setting {flat!r} (from " in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("section", "changes", "flat", "words"),
    [
        (ServeSettings, {"port": "80"}, "serve_port", ["an int", "'80'"]),
        (ServeSettings, {"heartbeat_s": "20"}, "serve_heartbeat_s", ["a number"]),
        (ServeSettings, {"send_buffer": True}, "serve_send_buffer", ["an int", "True"]),
        (ServeSettings, {"token": None}, "serve_token", ["text", "None"]),
        (BusSettings, {"legacy_peers": "yes"}, "bus_legacy_peers", ["a bool"]),
        (LakeSettings, {"streams": ["a"]}, "streams", ["a tuple of text"]),
        (LakeSettings, {"streams": ("a", "")}, "streams", ["empty name"]),
        (NodeSettings, {"workers": ("echo", " ")}, "node_workers", ["empty name"]),
        (LakeSettings, {"archive_writer": "fast"}, "archive_writer", ["SLUICE_ARCHIVE_WRITER"]),
        (Settings, {"bus": {"twin": 1}}, "bus", ["a BusSettings"]),
        (Settings, {"max_payload": 1.5}, "max_payload", ["an int"]),
        (LakeSettings, {"s3_secret_key": 12345}, "lake_s3_secret_key", ["text", "got a int"]),
    ],
)
def test_a_section_built_in_code_checks_its_types(
    section: type, changes: dict[str, Any], flat: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        section(**changes)
    message = str(caught.value)
    assert message.startswith(f"setting {flat!r}") and "\n" not in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("section", [*SECTIONS, Settings], ids=lambda c: c.__name__)
def test_the_defaults_are_accepted(section: type) -> None:
    built = section()
    assert dataclasses.replace(built) == built  # rebuilt: checked again, still valid


def test_zero_stays_a_value_where_it_means_off() -> None:
    env = {
        "SLUICE_SERVE_HISTORY_CACHE_MB": "0",
        "SLUICE_SERVE_HEARTBEAT_S": "0",
        "SLUICE_SERVE_TAIL_INDEX_MAX": "0",
        "SLUICE_SERVE_PORT": "0",
        "SLUICE_NODE_TCP_IDLE_S": "0",
        "SLUICE_NODE_TCP_FRAME_S": "0",
        "SLUICE_NODE_TCP_FIRST_FRAME_S": "0",
        "SLUICE_HOT_RETENTION_S": "0",
        "SLUICE_LAKE_LOCK_WAIT_S": "0",
        "SLUICE_LAKE_TASK_RETRIES": "0",
        "SLUICE_BUS_MAX_TRY": "0",
        "SLUICE_REDIS_MIN_REPLICAS_TIMEOUT_MS": "0",  # no replica awaited: no WAIT at all
    }
    settings = Settings.load(env=env, config_path=NO_FILE)
    assert settings.serve.history_cache_mb == 0 and settings.serve.heartbeat_s == 0
    assert settings.redis.min_replicas_timeout_ms == 0


@pytest.mark.parametrize(
    "values",
    [
        {"SLUICE_ARCHIVE_CRON": "@hourly"},
        {"SLUICE_ARCHIVE_CRON": "0 0 * * *"},
        {"SLUICE_ARCHIVE_CRON": "*/10 * * * * 30"},  # croniter's seconds field
        {"SLUICE_SPARK_REMOTE": "sc://10.0.0.1"},
        {"SLUICE_SPARK_REMOTE": "sc://a:1/;user_id=x"},
        {"SLUICE_SPARK_DRIVER_MEMORY": "512M"},
        {"SLUICE_SPARK_DRIVER_MEMORY": "2gb"},
        {"SLUICE_STREAMS": "a,,b"},  # the empty name dropped when read from text
        {"SLUICE_LAKE_S3_ACCESS_KEY": "k", "SLUICE_LAKE_S3_SECRET_KEY": "s"},
        {"SLUICE_ARCHIVE_WRITER": "spark"},  # on a local lake
        {"SLUICE_BUS_DEFAULT_EXP_S": "300", "SLUICE_BUS_MAX_EXP_S": "300"},
        {"SLUICE_SERVE_PORT": "0", "SLUICE_SERVE_DIALOGUE_PORT": "0"},
        {"SLUICE_SERVE_HEARTBEAT_S": "1"},  # an int for a float
    ],
    ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()),
)
def test_good_values_near_the_bounds_are_accepted(values: dict[str, str]) -> None:
    Settings.load(env=values, config_path=NO_FILE)


def test_a_bad_secret_is_refused_without_being_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        LakeSettings(s3_secret_key=12345)  # type: ignore[arg-type]
    assert "12345" not in str(caught.value)

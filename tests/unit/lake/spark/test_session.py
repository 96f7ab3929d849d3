"""Session settings: cached Delta jars, the Connect URL, the one-line error of a server that is down."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from pipeline.errors import ConfigError, SparkUnavailable
from pipeline.lake.spark.session import (
    cached_jars,
    delta_package,
    drop_provided,
    parse_remote,
    probe,
    shared_session_id,
    spark_conf,
    write_manifest,
)
from pipeline.settings import Settings


def test_manifest_gives_jar_paths_only_for_this_delta_and_existing_files(tmp_path: Path) -> None:
    jar = tmp_path / "delta.jar"
    jar.write_bytes(b"")
    manifest = tmp_path / "m.json"
    assert cached_jars(manifest=manifest) is None  # none written yet
    write_manifest([f"file://{jar}"], manifest)
    assert cached_jars(manifest=manifest) == [f"file://{jar}"]
    manifest.write_text(json.dumps({"package": "io.delta:other:1", "jars": [str(jar)]}))
    assert cached_jars(manifest=manifest) is None  # another Delta version: resolve again
    write_manifest([str(tmp_path / "gone.jar")], manifest)
    assert cached_jars(manifest=manifest) is None  # a jar was deleted
    manifest.write_text("not json")
    assert cached_jars(manifest=manifest) is None


def test_explicit_jars_win_and_conf_uses_paths_not_ivy(tmp_path: Path) -> None:
    settings = Settings.load(config_path=tmp_path / "none.toml", spark_jars="/a.jar, /b.jar")
    assert cached_jars(settings) == ["/a.jar", "/b.jar"]
    conf = spark_conf(settings)
    assert conf["spark.jars"] == "/a.jar,/b.jar" and "spark.jars.packages" not in conf
    assert conf["spark.connect.session.planCache.enabled"] == "false"
    assert "spark.jars" not in spark_conf(settings, jars=False)
    assert delta_package().startswith("io.delta:delta-spark_")


def test_remote_urls() -> None:
    assert parse_remote("sc://spark:15003") == ("spark", 15003)
    assert parse_remote("sc://10.0.0.1") == ("10.0.0.1", 15002)
    for bad in ("http://x:1", "sc://", "spark:15002"):
        with pytest.raises(ConfigError):
            parse_remote(bad)
    one = shared_session_id("sc://a:1")
    assert one == shared_session_id("sc://a:1/;user_id=x") and one != shared_session_id("sc://b:1")


def test_a_server_that_is_down_is_one_line_naming_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"sc://127.0.0.1:{port}"
    with pytest.raises(SparkUnavailable) as info:
        probe(url, timeout_s=1.0)
    text = str(info.value)
    assert url in text and "\n" not in text and "sluice spark" in text


def test_jars_spark_ships_itself_are_not_passed_again() -> None:
    ivy = "file:///root/.ivy2/jars/"
    paths = [
        ivy + "io.delta_delta-spark_4.2_2.13-4.4.0.jar",
        ivy + "io.delta_delta-storage-4.4.0.jar",
        ivy + "org.apache.hadoop_hadoop-client-runtime-3.4.2.jar",
        ivy + "org.apache.parquet_parquet-hadoop-1.16.0.jar",
        ivy + "com.github.luben_zstd-jni-1.5.7-3.jar",
    ]
    assert drop_provided(paths) == paths[:2]

from __future__ import annotations

import pytest

from pipeline import keys
from pipeline.cli import main
from pipeline.errors import ConfigError
from pipeline.settings import LakeSettings, RedisSettings, Settings


def test_settings_precedence(tmp_path):
    cfg = tmp_path / "sluice.toml"
    cfg.write_text('[sluice]\nreorg_threshold = 10\nstreams = ["a", "b"]\nserve_port = 1\n')
    s = Settings.load(env={"SLUICE_SERVE_PORT": "9"}, config_path=cfg, node_name="x")
    assert s.lake.reorg_threshold == 10
    assert s.lake.streams == ("a", "b")
    assert s.serve.port == 9
    assert s.node.name == "x"


def test_settings_errors():
    with pytest.raises(ConfigError, match="reorg_threshold"):
        Settings.load(env={"SLUICE_REORG_THRESHOLD": "many"})
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.load(env={}, nonsense=1)
    with pytest.raises(ConfigError):
        RedisSettings.from_url("http://x")


def test_from_url():
    r = RedisSettings.from_url("redis://:pw@h:7000/3")
    assert (r.host, r.port, r.db, r.password) == ("h", 7000, 3, "pw")
    odd = RedisSettings.from_url("redis://:p%40ss%2Fw@h:7000/0")
    assert odd.password == "p@ss/w"
    assert RedisSettings.from_url(odd.url) == odd
    assert LakeSettings.from_url("s3://bucket/lake").table("blocks") == "s3://bucket/lake/blocks"
    assert LakeSettings.from_url("./var/lake").uri.startswith("/")


def test_keys_hash_tags():
    assert keys.stream("chain:demo") == "sluice:{chain:demo}:stream"
    assert keys.stream_name(keys.stream("x")) == "x"
    for bad in ("", "a{b", "a b"):
        with pytest.raises(ConfigError):
            keys.stream(bad)
    assert keys.BUS_LOCAL == "msgbus.system.local"


def test_cli_usage(capsys):
    assert main(["--help"]) == 0
    assert "serve" in capsys.readouterr().out
    assert main(["nope"]) == 2


def test_health_probe_key_is_one_hash_tag_for_any_process_name():
    assert keys.health_probe("node:n1") == "sluice:health:{node:n1}"
    assert keys.health_probe("node:a {b}") == "sluice:health:{node:a__b_}"
    assert keys.health_probe("") == "sluice:health:{_}"

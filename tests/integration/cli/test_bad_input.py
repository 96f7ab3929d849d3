"""Bad input through the real ``sluice`` command: one clear line on stderr and exit 2, never a traceback.

A port in use (server, node TCP transport, bus, health endpoint), a bad Redis
URL, a bad log level, an unreadable config file, negative or non-finite
numbers (settings and flags), a port out of range.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.userenv import user_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def sluice(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    full = {
        **user_env(),
        "SLUICE_CONFIG": os.devnull,  # no config file
        "SLUICE_LOG_LEVEL": "WARNING",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=full, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _one_line(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


CASES = [
    ("bad redis url", ["serve"], {"SLUICE_REDIS_URL": "http://x"}, ["redis_url", "redis://"]),
    ("redis port out of range", ["produce"], {"SLUICE_REDIS_URL": "redis://h:99999/0"},
     ["redis_url", "out of range"]),
    ("redis port not a number", ["serve"], {"SLUICE_REDIS_URL": "redis://h:abc/0"}, ["redis_url"]),
    ("redis db not a number", ["produce"], {"SLUICE_REDIS_URL": "redis://h:6379/x"}, ["db"]),
    ("bad log level", ["produce"], {"SLUICE_LOG_LEVEL": "LOUD"}, ["log_level", "LOUD"]),
    ("negative ttl", ["node"], {"SLUICE_LEASE_TTL_S": "-1"}, ["lease_ttl_s", "non-negative"]),
    ("negative retention", ["lake", "trim", "--stream", "s"], {"SLUICE_HOT_RETENTION_S": "-5"},
     ["hot_retention_s"]),
    ("nan timeout", ["serve"], {"SLUICE_SERVE_HEARTBEAT_S": "nan"}, ["serve_heartbeat_s"]),
    ("port out of range", ["serve"], {"SLUICE_SERVE_PORT": "70000"}, ["serve_port", "0-65535"]),
    ("not a number", ["serve"], {"SLUICE_SERVE_PORT": "eighty"}, ["serve_port", "int"]),
    ("bad listen", ["bus", "--twin", "1", "--legacy-peers"], {"SLUICE_BUS_LISTEN": "nowhere"},
     ["bus_listen", "host:port"]),
    ("bad redis url flag", ["bus", "--twin", "1", "--legacy-peers", "--redis", "nope"], {},
     ["redis_url"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_settings(
    args: list[str], env: dict[str, str], needles: list[str], tmp_path: Path
) -> None:
    _one_line(sluice(args, env, tmp_path), *needles)


def test_unreadable_config_files(tmp_path: Path) -> None:
    folder = tmp_path / "conf.d"
    folder.mkdir()
    _one_line(sluice(["produce"], {"SLUICE_CONFIG": str(folder)}, tmp_path), "cannot read config")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    _one_line(sluice(["produce"], {"SLUICE_CONFIG": str(binary)}, tmp_path), "not UTF-8")
    broken = tmp_path / "broken.toml"
    broken.write_text("[sluice\n")
    _one_line(sluice(["produce"], {"SLUICE_CONFIG": str(broken)}, tmp_path), str(broken))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[sluice]\nno_such_setting = 1\n")
    _one_line(sluice(["produce"], {"SLUICE_CONFIG": str(unknown)}, tmp_path), "no_such_setting")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["produce", "--rate", "-1"], "--rate"),
        (["produce", "--count", "-3"], "--count"),
        (["produce", "--retry-for", "inf"], "--retry-for"),
        (["serve", "--rate", "-0.5"], "--rate"),
    ],
)
def test_negative_flags(args: list[str], flag: str, tmp_path: Path) -> None:
    out = sluice(args, {}, tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"argument {flag}: must be a non-negative number" in out.stderr.splitlines()[-1]


def test_ports_in_use(busy_port: int, redis_url: str, tmp_path: Path) -> None:
    env = {"SLUICE_REDIS_URL": redis_url}
    port = str(busy_port)
    _one_line(sluice(["serve", "--port", port], env, tmp_path), "cannot listen", "in use")
    _one_line(
        sluice(["node"], {**env, "SLUICE_NODE_LISTEN": f"127.0.0.1:{port}"}, tmp_path),
        "cannot listen", "in use",
    )  # fmt: skip
    _one_line(
        sluice(["bus", "--twin", "3", "--legacy-peers", "--listen", f"127.0.0.1:{port}"], env, tmp_path),
        "cannot listen", "in use",
    )  # fmt: skip
    _one_line(
        sluice(["node"], {**env, "SLUICE_NODE_HEALTH_LISTEN": f"127.0.0.1:{port}"}, tmp_path),
        "health endpoint", "in use",
    )  # fmt: skip

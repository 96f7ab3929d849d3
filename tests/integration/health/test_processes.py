"""``sluice bus`` and ``sluice node`` as real processes: curl their /healthz and /metrics.

Each process runs with ``SLUICE_*_HEALTH_LISTEN`` on a free port; the test
reads both endpoints with curl, stops Redis and sees /healthz turn 503 with
the reason, then stops the process with SIGTERM and expects a clean exit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
SLUICE = [sys.executable, "-m", "pipeline.cli"]

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")


def curl(url: str) -> tuple[int, str]:
    out = subprocess.run(
        ["curl", "-s", "--max-time", "5", "-w", "\n%{http_code}", url],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    body, _, code = out.stdout.rpartition("\n")
    return int(code or 0), body


def wait_for(url: str, status: int, limit_s: float = 30.0) -> str:
    deadline = time.monotonic() + limit_s
    code, body = 0, ""
    while time.monotonic() < deadline:
        code, body = curl(url)
        if code == status:
            return body
        time.sleep(0.1)
    raise AssertionError(f"{url}: {code} {body!r}, wanted {status}")


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([*SLUICE, *args], cwd=ROOT, env=env, stdout=out, stderr=out)


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert code == 0, log.read_text(errors="replace")


def _env(local: LocalRedis, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "SLUICE_REDIS_URL": local.url,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_CONFIG": os.devnull,  # no config file
        **extra,
    }


def test_bus_health_and_metrics(redis_factory: Callable[..., LocalRedis], tmp_path: Path) -> None:
    local = redis_factory()
    key = tmp_path / "twin7.key"
    public = subprocess.run(
        [*SLUICE, "bus", "keygen", "--out", str(key)],
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    ).stdout.strip()  # fmt: skip
    bus_port, health_port = free_port(), free_port()
    directory = tmp_path / "twins.json"
    directory.write_text(
        json.dumps(
            {
                "7": {"url": f"http://127.0.0.1:{bus_port}", "key": public},
                "8": {"url": f"http://127.0.0.1:{free_port()}", "key": public},  # nobody there
            }
        )
    )
    env = _env(
        local,
        tmp_path,
        SLUICE_BUS_HEALTH_LISTEN=f"127.0.0.1:{health_port}",
        # one server, no replica: the request's backlog is counted as not replicated
        SLUICE_REDIS_MIN_REPLICAS="1",
        SLUICE_REDIS_MIN_REPLICAS_TIMEOUT_MS="50",
    )
    log = tmp_path / "bus.log"
    proc = start(
        ["bus", "--twin", "7", "--listen", f"127.0.0.1:{bus_port}", "--directory", str(directory),
         "--key", str(key)], env, log,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{health_port}"
        body = json.loads(wait_for(f"{base}/healthz", 200))
        assert body["status"] == "ok" and body["checks"] == {"redis": "ok", "peers": "ok"}
        code, text = curl(f"{base}/metrics")
        assert code == 200
        assert "sluice_bus_up 1" in text
        assert 'sluice_bus_queue_length{queue="msgbus.system.remote"} 0' in text
        assert "sluice_bus_backlog_size" in text and "sluice_bus_outbox_size" in text
        assert "sluice_bus_dead_length 0" in text
        # A call to a peer that is down: /healthz degraded with the peer named, counted,
        # and once its exp is up the caller is told it never reached the peer.
        client = redis.Redis.from_url(local.url)
        try:
            request = {
                "ver": 1, "uid": "", "cmd": "echo", "exp": 3, "try": 2, "dat": "", "src": 0,
                "dst": [8], "ret": "caller.ret", "shm": "", "now": int(time.time()), "err": "",
            }  # fmt: skip
            client.rpush("msgbus.system.local", json.dumps(request))
            body = json.loads(wait_for(f"{base}/healthz", 503))
            assert "twin 8 unreachable" in body["checks"]["peers"]
            assert body["checks"]["redis"] == "ok"
            popped = client.blpop(["caller.ret"], timeout=30)
            assert popped is not None
            assert json.loads(popped[1])["err"].startswith("remote unreachable: cannot connect")
        finally:
            client.close()
        code, text = curl(f"{base}/metrics")
        assert 'sluice_bus_outbound_total{kind="remote",outcome="unreachable"} 1' in text
        assert "sluice_bus_peers_unreachable 1" in text
        assert "sluice_bus_not_replicated_total 1" in text
        [retries] = [
            line for line in text.splitlines() if line.startswith("sluice_bus_retries_total ")
        ]
        assert float(retries.split()[1]) >= 1
        local.kill()
        # Still 503 for twin 8 (a peer counts for a minute after its last failed POST):
        # wait for the redis check itself.
        deadline = time.monotonic() + 30
        while True:
            body = json.loads(wait_for(f"{base}/healthz", 503))
            if body["checks"]["redis"] != "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert body["status"] == "degraded" and body["checks"]["redis"] != "ok"
    finally:
        local.start()
        stop(proc, log)


def test_node_health_and_metrics(redis_factory: Callable[..., LocalRedis], tmp_path: Path) -> None:
    local = redis_factory()
    health_port = free_port()
    env = _env(local, tmp_path, SLUICE_NODE_HEALTH_LISTEN=f"127.0.0.1:{health_port}")
    log = tmp_path / "node.log"
    proc = start(["node", "--name", "n1", "--workers", "echo"], env, log)
    try:
        base = f"http://127.0.0.1:{health_port}"
        body = json.loads(wait_for(f"{base}/healthz", 200))
        assert body["checks"] == {"redis": "ok"}
        code, text = curl(f"{base}/metrics")
        assert code == 200
        assert "sluice_node_up 1" in text and "# TYPE sluice_node_uptime_seconds gauge" in text
        assert 'sluice_node_mailbox{name="echo"} 0' in text
        local.kill()
        body = json.loads(wait_for(f"{base}/healthz", 503))
        assert body["checks"]["redis"] != "ok"
    finally:
        local.start()
        stop(proc, log)

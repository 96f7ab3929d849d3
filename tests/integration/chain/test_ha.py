"""sluice produce + sluice serve + sluice subscribe on Sentinel and on a Cluster, and a
master killed (SIGKILL) under the three running processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.runtime.ports import free_port
from tests.support.poll import until_sync

pytestmark = pytest.mark.timeout(240)

STREAM = "chain:ha"


@pytest.fixture(params=["sentinel", "cluster"])
def ha(request: pytest.FixtureRequest) -> tuple[str, str, Any]:
    group = request.getfixturevalue(
        {"sentinel": "redis_sentinels", "cluster": "redis_cluster"}[request.param]
    )
    group.wait_whole()
    group.flush()
    return request.param, str(group.url), group


def _lines(path: Path) -> list[dict[str, Any]]:
    """The complete lines so far: the subscriber may be writing the last one."""
    text = path.read_text() if path.exists() else ""
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _health(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            return str(json.load(reply)["status"])
    except urllib.error.HTTPError as exc:  # a 503 carries the status too ("degraded")
        return str(json.load(exc)["status"])
    except OSError:
        return "unavailable"


def _watch(port: int, seen: list[str], stop: threading.Event) -> None:
    """Record each change of serve's /healthz status until ``stop``."""
    while not stop.is_set():
        status = _health(port)
        if not seen or seen[-1] != status:
            seen.append(status)
        stop.wait(0.05)


def test_produce_serve_subscribe_through_a_failover(
    ha: tuple[str, str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout, url, group = ha
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": url,
        "SLUICE_LAKE_URI": str(tmp_path / "lake"),
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_CHAIN_STREAMS": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    env.pop("PYTHONASYNCIODEBUG", None)
    port = free_port()
    cli = [sys.executable, "-m", "pipeline.cli"]
    names = ("serve", "produce", "subscribe")
    # the children write them; closed in the finally below
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in names}  # noqa: SIM115
    out = tmp_path / "subscribe.jsonl"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["serve"] = subprocess.Popen(
            [*cli, "serve", "--port", str(port)],
            env=env,
            stderr=logs["serve"],
            stdout=logs["serve"],
        )
        until_sync(lambda: _health(port) == "ok", "serve healthy", within_s=60)
        procs["produce"] = subprocess.Popen(
            [*cli, "produce", "--rate", "40", "--count", "0", "--retry-for", "120"],
            env=env, stdout=logs["produce"], stderr=logs["produce"],
        )  # fmt: skip
        with open(out, "wb") as sink:
            procs["subscribe"] = subprocess.Popen(
                [*cli, "subscribe", "--url", f"ws://127.0.0.1:{port}/ws"],
                env=env, stdout=sink, stderr=logs["subscribe"],
            )  # fmt: skip
        until_sync(lambda: len(_lines(out)) >= 40, "40 blocks before the kill", within_s=60)
        seen: list[str] = []
        watching = threading.Event()
        watcher = threading.Thread(target=_watch, args=(port, seen, watching), daemon=True)
        watcher.start()
        killed_at = time.monotonic()
        dead = (
            group.kill_master(keys.stream(STREAM)) if layout == "cluster" else group.kill_master()
        )
        seen_at_kill = max(line["added"] for line in _lines(out) if "added" in line)
        group.wait_failed_over(dead)
        until_sync(
            lambda: max(x.get("added", 0) for x in _lines(out)) >= seen_at_kill + 80,
            "80 more blocks after the failover",
            within_s=120,
            detail=lambda: {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in logs},
        )
        recovered_s = time.monotonic() - killed_at
        until_sync(lambda: _health(port) == "ok", "serve healthy again", within_s=60)
        watching.set()
        watcher.join(10)
        # /healthz followed the master: degraded while the tail had none, then ok again.
        assert "degraded" in seen and seen[-1] == "ok", seen
        alive = {name: proc.poll() is None for name, proc in procs.items()}
        assert all(alive.values()), alive
        added = [x["added"] for x in _lines(out) if "added" in x]
        removed = [x["removed"] for x in _lines(out) if "removed" in x]
        counts = Counter(added)
        gaps = sorted(set(range(max(added) + 1)) - set(added))
        duplicated = sum(n - 1 for n in counts.values() if n > 1)
        assert added[0] == 0 and not gaps, gaps[:20]
        with capsys.disabled():
            print(  # noqa: T201 - the counts are the test's report
                f"\nchain failover ({layout}): blocks={len(added)} gaps={len(gaps)} "
                f"re-sent={duplicated} removed={len(removed)} recovered_in={recovered_s:.1f}s"
            )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for log in logs.values():
            log.close()
        group.heal()


@pytest.mark.parametrize("where", ["single", "sentinel", "cluster"])
def test_produce_waits_for_a_replica(where: str, request: pytest.FixtureRequest) -> None:
    """SLUICE_REDIS_MIN_REPLICAS=1: sluice produce confirms a block only once a replica has
    it; with no replica (one server) it retries, then gives up in one line."""
    url = str(request.getfixturevalue({"single": "redis_url"}.get(where, f"{where}_url")))
    env = {**os.environ, "SLUICE_REDIS_URL": url, "SLUICE_REDIS_MIN_REPLICAS": "1",
           "SLUICE_REDIS_MIN_REPLICAS_TIMEOUT_MS": "200", "SLUICE_LOG_LEVEL": "ERROR"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", "5",
         "--stream", STREAM, "--retry-for", "1"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if where == "single":
        assert proc.returncode == 1
        assert "0 of 1 replicas acknowledged the write" in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("sluice produce: ")
    else:
        assert proc.returncode == 0, proc.stderr
        assert "produced 5 blocks" in proc.stdout

"""``sluice node`` as real processes: two nodes talk through streams only; kill -9 and restart."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from pipeline import keys
from pipeline.settings import Settings
from pipeline.streams import cli
from tests.support.poll import until_sync

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[3]
N = 300


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], out: Path) -> None:
        self.out = out
        self.handle = out.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "node", *args],
            cwd=ROOT,
            env=env,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, needle: str, limit_s: float = 20.0) -> None:
        deadline = time.monotonic() + limit_s
        while needle not in self.text():
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited {self.proc.returncode}:\n{self.text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not seen in time:\n{self.text()}")
            time.sleep(0.02)

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.handle.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


@pytest.fixture
def env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    made = {
        **os.environ,
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_CONFIG": os.devnull,  # no config file
        "SLUICE_LEASE_TTL_S": "3",
        "SLUICE_LOG_LEVEL": "INFO",
        "SLUICE_NODE_LISTEN": "",
    }
    made.pop("PYTHONASYNCIODEBUG", None)  # any value, even "0", turns asyncio debug on
    return made


def replies(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line]


def wait_until(check: Callable[[], object], limit_s: float, what: str) -> None:
    until_sync(check, what, within_s=limit_s, every_s=0.02)


def counters(proc: Proc) -> dict[str, int]:
    text = proc.text()
    complete = text[: text.rfind("\n") + 1]  # the node may be writing the last line
    lines = [line for line in complete.splitlines() if line.startswith('{"node"')]
    assert lines, proc.text()
    data: dict[str, int] = json.loads(lines[-1])["counters"]
    return data


def test_two_nodes_through_streams_survive_kill_9_of_the_receiver(
    env: dict[str, str], tmp_path: Path, procs: list[Proc], redis_client: sync_redis.Redis
) -> None:
    record = tmp_path / "replies.txt"
    b_args = ["--name", "B", "--workers", "echo", "--consume", "stream_b"]
    b = Proc(b_args, env, tmp_path / "b.log")
    procs.append(b)
    b.wait_for("node B ready")
    a = Proc(
        [
            "--name", "A",
            "--workers", "requester",
            "--request-route", "stream:stream_b/stream_a,echo",
            "--request-count", str(N),
            "--request-interval", "0.005",
            "--record", str(record),
        ],
        env,
        tmp_path / "a.log",
    )  # fmt: skip
    procs.append(a)
    a.wait_for("node A ready")
    wait_until(lambda: len(replies(record)) >= 40, 30, "the first replies")

    b.kill()  # kill -9 mid-stream: A keeps sending into stream_b meanwhile
    at_kill = len(replies(record))
    assert at_kill < N, "the receiver must be killed mid-stream"
    b2 = Proc(b_args, env, tmp_path / "b2.log")
    procs.append(b2)
    b2.wait_for("node B ready")

    expected = {f"req-{i}" for i in range(N)}
    wait_until(lambda: set(replies(record)) >= expected, 60, "every reply")
    got = replies(record)
    assert set(got) == expected  # none lost
    duplicates = len(got) - len(set(got))
    assert a.terminate() == 0
    assert b2.terminate() == 0
    b2_counts = counters(b2)
    assert b2_counts.get("consumer.dead_lettered", 0) == 0
    assert b2_counts["consumer.handled"] >= N - at_kill
    # At-least-once: re-deliveries after the kill are allowed and counted, losses are not.
    log.info("replies=%d duplicates=%d at_kill=%d", len(got), duplicates, at_kill)

    # B stopped gracefully: lease released, index saved at the end of stream_b.
    assert redis_client.get(keys.consumer_lease("stream_b")) is None
    last = redis_client.xrevrange(keys.stream("stream_b"), count=1)[0][0]
    assert redis_client.hget(keys.consumer_index("stream_b"), "B") == last


def test_sigterm_is_graceful_and_settings_are_checked(
    env: dict[str, str], tmp_path: Path, procs: list[Proc]
) -> None:
    node = Proc(
        ["--name", "C", "--workers", "echo", "--consume", "stream_c"], env, tmp_path / "c.log"
    )
    procs.append(node)
    node.wait_for("node C ready")
    assert node.terminate() == 0
    assert "node C: stopping" in node.text()
    assert counters(node).get("handler_errors", 0) == 0

    bad = Proc(["--name", "D", "--workers", "nope"], env, tmp_path / "d.log")
    procs.append(bad)
    assert bad.proc.wait(30) == 2  # bad input: exit 2 (pipeline/cli.py)
    assert "unknown worker 'nope'" in bad.text()


def test_tcp_transport_without_listen_does_not_listen() -> None:
    transport = cli._tcp_transport(Settings.load(env={}, node_listen=""))
    assert transport.address_type == 1
    assert transport.listen is None  # type: ignore[attr-defined]


def test_node_listen_uses_the_tcp_transport() -> None:
    transport = cli._tcp_transport(Settings.load(env={}, node_listen="127.0.0.1:0"))
    assert transport.address_type == 1

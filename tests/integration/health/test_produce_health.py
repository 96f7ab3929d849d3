"""``sluice produce --health-listen`` as a real process: /healthz and /metrics read with urllib.

Before (issue 32, item 6) the producer had neither, so an orchestrator could not
tell a producer riding out a refusal from one writing. Here it writes into a
private redis-server that is then made to refuse writes (NOREPLICAS: it has no
replica for ``min-replicas-to-write 1``; READONLY: it is turned into a replica):
/healthz answers 503 with Redis's refusal as the cause, then 200 once writes go in
again; /metrics counts the blocks written, the retries by kind and the outage
ridden out. SIGTERM ends it with its summary (exit 0), every block in the stream once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
from tests.support.poll import until_sync
from tests.support.refusal import noreplicas, replica

ROOT = Path(__file__).resolve().parents[3]
STREAM = "chain:produce-health"

pytestmark = pytest.mark.timeout(120)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, repr(exc)


def figure(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics:\n{text}"
    return float(found.group(1))


@contextmanager
def producing(url: str, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": url,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_CONFIG": os.devnull,
    }
    args = ["--stream", STREAM, "--rate", "40", "--count", "0", "--reorg-every", "7"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "produce", *args,
             "--health-listen", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _refusal(kind: str, url: str, spare: str) -> AbstractContextManager[object]:
    made: dict[str, Callable[[], AbstractContextManager[object]]] = {
        "noreplicas": lambda: noreplicas(url),
        "readonly": lambda: replica(url, spare),
    }
    return made[kind]()


@pytest.mark.parametrize(
    ("kind", "cause"), [("noreplicas", "NOREPLICAS"), ("readonly", "ReadOnlyError")]
)
def test_produce_health_follows_a_write_refusal(
    redis_factory: Callable[..., LocalRedis], tmp_path: Path, kind: str, cause: str
) -> None:
    server, spare = redis_factory(), redis_factory()
    port, log = free_port(), tmp_path / "produce.log"
    base = f"http://127.0.0.1:{port}"
    with producing(server.url, port, log) as proc:

        def output() -> str:
            return log.read_text(errors="replace")[-3000:]

        def answers(status: int, needle: str = "") -> Callable[[], object]:
            def check() -> object:
                assert proc.poll() is None, f"exited {proc.returncode}:\n{output()}"
                code, body = get(base + "/healthz")
                return code == status and needle in body

            return check

        until_sync(answers(200), "/healthz 200", within_s=30)
        until_sync(lambda: figure(get(base + "/metrics")[1], "sluice_produce_blocks_written_total") > 5, "blocks written")  # fmt: skip
        with _refusal(kind, server.url, spare.url):
            until_sync(answers(503, cause), f"/healthz 503 naming {cause}", within_s=30)

            def writes_failing() -> dict[str, str]:
                code, body = get(base + "/healthz")
                checks: dict[str, str] = json.loads(body)["checks"] if code == 503 else {}
                return checks if "has failed for" in checks.get("writes", "") else {}

            checks = until_sync(writes_failing, "the blocks' writes failing", within_s=30)
            assert cause in checks["redis"] and cause in checks["writes"], checks
        until_sync(answers(200), "/healthz 200 again", within_s=30)
        _, metrics = get(base + "/metrics")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, output()
    assert figure(metrics, "sluice_produce_outages_ridden_out_total") >= 1, metrics
    assert figure(metrics, "sluice_produce_retries_total") >= 1, metrics
    assert figure(metrics, f'sluice_produce_redis_errors_total{{kind="{kind}"}}') >= 1, metrics
    assert figure(metrics, "sluice_produce_reorgs_total") >= 1, metrics
    summary = re.search(r"stopped: produced (\d+) blocks", log.read_text())
    assert summary, log.read_text()
    with redis.Redis.from_url(server.url) as client:
        entries = client.xrange(keys.stream(STREAM))
    hashes = [decode_block(fields[ENTRY_FIELD]).hash for _, fields in entries]
    assert len(hashes) == len(set(hashes)), "a block was written twice"
    assert int(summary.group(1)) <= len(hashes) <= int(summary.group(1)) + 1

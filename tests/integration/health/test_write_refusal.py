"""Redis refusing writes (``maxmemory`` reached with ``noeviction``) under real processes.

``sluice produce``, two ``sluice node`` (a requester and an echo, talking through
streams), two ``sluice bus`` (each on its own Redis) with a handler, and a bus caller
all run while both Redis servers are filled until they refuse writes (OOM), held
there, then freed. Nothing may be lost: every produced block is in the stream once,
every node request is answered, every bus call is answered without ``err``. Each
``/healthz`` says down, with Redis's refusal as the cause, while writes are refused
and up after; the retry counters moved.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis
from redis.exceptions import OutOfMemoryError

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from pipeline.bus.signing import Signer
from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
from tests.support.poll import until_sync
from tests.support.refusal import Refusal, misconf, refusing, replica

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
SLUICE = [sys.executable, "-m", "pipeline.cli"]
#: How long both Redis servers refuse writes: longer than the old node retries (~5 s), and
#: as short as that allows (every test here holds the refusal this long).
REFUSAL_S = float(os.environ.get("SLUICE_TEST_REFUSAL_S", "8"))
REQUESTS = int(os.environ.get("SLUICE_TEST_REFUSAL_REQUESTS", "300"))
BLOCKS = 400
CALLS = 120
A, B = 1001, 1002
CMD = "bench.echo"  # the handler of tests/bench/bench_bus.py


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*SLUICE, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, within_s: float = 60.0) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and needle not in self.text():
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            return needle in self.text()

        until_sync(seen, f"{needle!r} in {self.log.name}", within_s=within_s, every_s=0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


def curl(url: str) -> tuple[int, str]:
    out = subprocess.run(
        ["curl", "-s", "--max-time", "5", "-w", "\n%{http_code}", url],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    body, _, code = out.stdout.rpartition("\n")
    return int(code or 0), body


def health_is(url: str, status: int, needle: str = "") -> Callable[[], bool]:
    def check() -> bool:
        code, body = curl(url)
        return code == status and needle in body

    return check


class Caller:
    """A bus client on twin A's Redis: ``CALLS`` calls to twin B's echo, one ret queue.

    Its own RPUSH is retried while Redis refuses it (a call counts once Redis took it);
    answers are read by their ``dat`` (the echo gives it back).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: dict[str, str] = {}  # dat -> err
        self.pushed = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            for i in range(CALLS):
                call = {
                    "ver": 1, "uid": "", "cmd": CMD, "exp": 120, "try": 4,
                    "dat": base64.b64encode(f"call-{i}".encode()).decode(), "src": 0,
                    "dst": [B], "ret": "caller.ret", "shm": "", "now": int(time.time()),
                    "err": "",
                }  # fmt: skip
                while True:
                    try:
                        client.rpush(keys.BUS_LOCAL, json.dumps(call))
                        break
                    except OutOfMemoryError:
                        time.sleep(0.1)
                self.pushed += 1
                time.sleep(0.1)
            deadline = time.monotonic() + 150
            while len(self.answers) < CALLS and time.monotonic() < deadline:
                popped = client.blpop(["caller.ret"], timeout=1)
                if popped is not None:
                    answer = json.loads(popped[1])
                    self.answers[base64.b64decode(answer["dat"]).decode()] = answer["err"]
        except BaseException as exc:  # noqa: BLE001 - the thread's error, re-raised by the test
            self.error = exc
        finally:
            client.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def test_nothing_lost_while_redis_refuses_writes(
    redis_factory: Callable[..., LocalRedis], tmp_path: Path, procs: list[Proc]
) -> None:
    main, other = redis_factory(), redis_factory()  # twin A, nodes, produce / twin B
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": main.url,
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_NODE_LISTEN": "",
        "SLUICE_LEASE_TTL_S": "5",
    }
    env.pop("PYTHONASYNCIODEBUG", None)
    health = {name: free_port() for name in ("node-a", "node-b", "bus-a", "bus-b")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in health.items()}

    # Two buses, each on its own Redis, and the echo handler on twin B's.
    ports = {A: free_port(), B: free_port()}
    signers = {A: Signer.generate(), B: Signer.generate()}
    directory = tmp_path / "twins.json"
    directory.write_text(
        json.dumps(
            {str(t): {"url": f"http://127.0.0.1:{ports[t]}", "key": signers[t].public_key}
             for t in (A, B)}
        )
    )  # fmt: skip
    for twin, server, name in ((A, main, "bus-a"), (B, other, "bus-b")):
        signers[twin].write(tmp_path / f"{twin}.key")
        bus_env = {**env, "SLUICE_BUS_HEALTH_LISTEN": f"127.0.0.1:{health[name]}"}
        procs.append(
            Proc(
                [
                    "bus",
                    "--twin",
                    str(twin),
                    "--listen",
                    f"127.0.0.1:{ports[twin]}",
                    "--directory",
                    str(directory),
                    "--key",
                    str(tmp_path / f"{twin}.key"),
                    "--redis",
                    server.url,
                ],
                bus_env,
                tmp_path / f"{name}.log",
            )  # fmt: skip
        )
    with (tmp_path / "handler.log").open("ab") as out:
        handler = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/bench/bench_bus.py"), "--handler", other.url],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _run(main, other, env, urls, health, procs, tmp_path)
    finally:
        handler.terminate()
        handler.wait(20)


def _run(
    main: LocalRedis,
    other: LocalRedis,
    env: dict[str, str],
    urls: dict[str, str],
    health: dict[str, int],
    procs: list[Proc],
    tmp_path: Path,
) -> None:
    record = tmp_path / "replies.txt"
    node_b = Proc(
        ["node", "--name", "B", "--workers", "echo", "--consume", "rb"],
        {**env, "SLUICE_NODE_HEALTH_LISTEN": f"127.0.0.1:{health['node-b']}"},
        tmp_path / "node-b.log",
    )
    procs.append(node_b)
    node_b.wait_for("node B ready")
    node_a = Proc(
        ["node", "--name", "A", "--workers", "requester",
         "--request-route", "stream:rb/ra,echo", "--request-count", str(REQUESTS),
         "--request-interval", "0.04", "--record", str(record)],
        {**env, "SLUICE_NODE_HEALTH_LISTEN": f"127.0.0.1:{health['node-a']}"},
        tmp_path / "node-a.log",
    )  # fmt: skip
    procs.append(node_a)
    for proc in procs[:2]:
        proc.wait_for("listening")
    node_a.wait_for("node A ready")
    producer = Proc(
        ["produce", "--stream", "refused", "--rate", "25", "--count", str(BLOCKS)],
        env, tmp_path / "produce.log",
    )  # fmt: skip
    procs.append(producer)
    caller = Caller(main.url)
    caller.thread.start()

    def replies() -> set[str]:
        return set(record.read_text().split()) if record.exists() else set()

    until_sync(lambda: len(replies()) >= 20 and caller.pushed >= 10, "traffic", within_s=60)
    for name in urls:
        until_sync(health_is(f"{urls[name]}/healthz", 200), f"{name} up", within_s=30)

    refusals = [Refusal(main.url), Refusal(other.url)]
    started = time.monotonic()
    for refusal in refusals:
        refusal.start()
    try:
        for name in urls:
            until_sync(
                health_is(f"{urls[name]}/healthz", 503, "OutOfMemoryError"),
                f"{name} /healthz down with the cause",
                within_s=30,  # a hang's bound: the refusal lasts until every one said so
                every_s=0.2,
                detail=lambda name=name: curl(f"{urls[name]}/healthz"),  # type: ignore[misc]
            )
        assert producer.proc.poll() is None, producer.text()
        # Keep writes refused for the whole window: the scenario, not an assertion.
        time.sleep(max(0.0, REFUSAL_S - (time.monotonic() - started)))
        assert producer.proc.poll() is None, producer.text()
    finally:
        for refusal in refusals:
            refusal.end()
    freed = time.monotonic()
    for name in urls:
        until_sync(health_is(f"{urls[name]}/healthz", 200), f"{name} up again", within_s=30)
    figures: dict[str, float] = {"healthz_up_after_s": round(time.monotonic() - freed, 1)}

    # Produce: went on, and every block is in the stream exactly once.
    assert producer.proc.wait(120) == 0, producer.text()
    assert "redis outage(s) ridden out" in producer.text()
    client = redis.Redis.from_url(main.url)
    try:
        entries = client.xrange(keys.stream("refused"))
    finally:
        client.close()
    nums = [decode_block(fields[ENTRY_FIELD]).num for _, fields in entries]
    assert sorted(nums) == list(range(BLOCKS))

    # Nodes: every request answered.
    expected = {f"req-{i}" for i in range(REQUESTS)}
    until_sync(lambda: replies() >= expected, "every node request answered", within_s=120,
               every_s=0.2, detail=lambda: sorted(expected - replies())[:10])  # fmt: skip
    code, text = curl(f"{urls['node-a']}/metrics")
    assert code == 200
    retried = [
        ln for ln in text.splitlines() if ln.startswith("sluice_node_stream_client_push_retries")
    ]
    assert retried and float(retried[0].split()[-1]) > 0, text
    figures["node_push_retries"] = float(retried[0].split()[-1])
    assert "sluice_node_requester_failed_total" not in text, text
    assert "sluice_node_stream_client_push_failures_total" not in text, text

    # Bus: every call answered, none with an error.
    caller.thread.join(180)
    assert caller.error is None, caller.error
    assert caller.answers == {f"call-{i}": "" for i in range(CALLS)}
    code, text = curl(f"{urls['bus-a']}/metrics")
    assert code == 200, text
    # (sluice_bus_answers_total shows every outcome, unreachable at 0 included)
    unreachable = [ln for ln in text.splitlines() if 'outcome="unreachable"' in ln]
    assert all(float(ln.split()[-1]) == 0 for ln in unreachable), unreachable
    [errors] = [ln for ln in text.splitlines() if ln.startswith("sluice_bus_redis_errors_total")]
    assert float(errors.split()[-1]) > 0, text  # its loops met the refusal and went on
    lines = record.read_text().split()
    figures.update(
        refusal_s=REFUSAL_S,
        node_replies=len(lines),
        node_duplicates=len(lines) - len(set(lines)),
        bus_redis_errors=float(errors.split()[-1]),
        recovered_s=round(time.monotonic() - freed, 1),
    )
    logging.getLogger(__name__).info("write refusal figures: %s", figures)


def _misconf(server: LocalRedis, spare: LocalRedis) -> AbstractContextManager[None]:
    return misconf(server.url)


def _readonly(server: LocalRedis, spare: LocalRedis) -> AbstractContextManager[None]:
    return replica(server.url, spare.url)


@pytest.mark.parametrize(
    ("refuse", "cause"),
    [
        # MISCONF: a failed RDB save stops writes; before, `sluice produce` exited 1 on it
        pytest.param(_misconf, "MISCONF", id="misconf"),
        # READONLY: the server turned into a replica mid-run (a client still on a demoted
        # master); REPLICAOF NO ONE ends it
        pytest.param(_readonly, "ReadOnlyError", id="readonly"),
    ],
)
def test_produce_and_node_ride_out_a_write_refusal(
    refuse: Callable[[LocalRedis, LocalRedis], AbstractContextManager[None]],
    cause: str,
    redis_factory: Callable[..., LocalRedis],
    tmp_path: Path,
    procs: list[Proc],
) -> None:
    """A write refusal is retried like an outage and /healthz says so with its cause;
    when it ends, nothing is lost."""
    server, spare = redis_factory(), redis_factory()
    port = free_port()
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": server.url,
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_NODE_LISTEN": "",
        "SLUICE_NODE_HEALTH_LISTEN": f"127.0.0.1:{port}",
    }
    env.pop("PYTHONASYNCIODEBUG", None)
    node = Proc(["node", "--name", "M", "--workers", "echo"], env, tmp_path / "node.log")
    procs.append(node)
    node.wait_for("node M ready")
    health = f"http://127.0.0.1:{port}/healthz"
    until_sync(health_is(health, 200), "node up", within_s=30)
    stream = f"refused-{cause}"
    producer = Proc(
        # 15 s of blocks: the refusal must come while it still writes
        ["produce", "--stream", stream, "--rate", "20", "--count", "300"],
        env, tmp_path / "produce.log",
    )  # fmt: skip
    procs.append(producer)
    client = redis.Redis.from_url(server.url)
    try:
        until_sync(lambda: client.xlen(keys.stream(stream)) >= 5, "first blocks", within_s=30)
        with refuse(server, spare):
            until_sync(health_is(health, 503, cause), "node /healthz down", within_s=30)
            # held until the producer has met the refusal: /healthz can flip between
            # two of its writes (one every 50 ms), and leaving then tests nothing
            producer.wait_for("redis unavailable (", within_s=30)
            assert producer.proc.poll() is None, producer.text()
        until_sync(health_is(health, 200), "node /healthz up", within_s=30)
        assert producer.proc.wait(60) == 0, producer.text()
        assert "1 redis outage(s) ridden out" in producer.text()
        entries = client.xrange(keys.stream(stream))
    finally:
        client.close()
    assert sorted(decode_block(f[ENTRY_FIELD]).num for _, f in entries) == list(range(300))


#: Retries each loop must have met before the refusal ends (a loop retries every 2 s
#: at most): the old code logged a line for each.
RETRIES = 6


def _metric(url: str, name: str) -> float:
    code, text = curl(f"{url}/metrics")
    assert code == 200, text
    values = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ")]
    return values[0] if values else 0.0


def _kind(line: str) -> str:
    """A log line's kind: its logger and message with quoted text, causes and numbers cut."""
    _, _, rest = line.partition(" ")  # the date
    _, _, rest = rest.partition(" ")  # the time
    return re.sub(r"\d+", "N", re.split(r"['\"(<]| - ", rest, maxsplit=1)[0])


def test_retry_log_lines_are_bounded_while_redis_refuses_writes(
    redis_factory: Callable[..., LocalRedis], tmp_path: Path, procs: list[Proc]
) -> None:
    """A node (stream consumer and service) and a bus on a Redis refusing writes for
    ~10 s log each kind of failure once with its cause, then at most once per 10 s
    (with the count suppressed), and once when it ends: before, a line per retry (every
    2 s per loop)."""
    server = redis_factory()
    ports = {name: free_port() for name in ("node", "bus", "bus-http")}
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": server.url,
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_NODE_LISTEN": "",
        "SLUICE_LEASE_TTL_S": "5",
        "SLUICE_NODE_HEALTH_LISTEN": f"127.0.0.1:{ports['node']}",
        "SLUICE_BUS_HEALTH_LISTEN": f"127.0.0.1:{ports['bus']}",
    }
    env.pop("PYTHONASYNCIODEBUG", None)
    urls = {name: f"http://127.0.0.1:{ports[name]}" for name in ("node", "bus")}
    signer = Signer.generate()
    signer.write(tmp_path / "a.key")
    directory = tmp_path / "twins.json"
    directory.write_text(
        json.dumps({str(A): {"url": f"http://127.0.0.1:{ports['bus-http']}",
                             "key": signer.public_key}})
    )  # fmt: skip
    node = Proc(
        ["node", "--name", "B", "--workers", "echo", "--consume", "rb"], env, tmp_path / "node.log"
    )
    bus = Proc(
        ["bus", "--twin", str(A), "--listen", f"127.0.0.1:{ports['bus-http']}",
         "--directory", str(directory), "--key", str(tmp_path / "a.key"), "--redis", server.url],
        env, tmp_path / "bus.log",
    )  # fmt: skip
    procs.extend([node, bus])
    node.wait_for("node B ready")
    bus.wait_for("listening")
    for url in urls.values():
        until_sync(health_is(f"{url}/healthz", 200), f"{url} up", within_s=30)
    marks = {proc: len(proc.text().splitlines()) for proc in (node, bus)}
    errors = {
        "node": "sluice_node_consumer_errors_total",
        "bus": "sluice_bus_redis_errors_total",
    }
    before = {name: _metric(urls[name], metric) for name, metric in errors.items()}
    started = time.monotonic()
    with refusing(server.url):
        for name, url in urls.items():
            until_sync(health_is(f"{url}/healthz", 503, "OutOfMemoryError"), f"{name} down",
                       within_s=30, every_s=0.2)  # fmt: skip
        # Held until every loop retried often (the old code logged a line per retry).
        until_sync(
            lambda: all(
                _metric(urls[name], metric) - before[name] >= RETRIES * (3 if name == "bus" else 1)
                for name, metric in errors.items()
            ),
            "retries under the refusal",
            within_s=120,
            every_s=0.5,
            detail=lambda: {n: _metric(urls[n], m) for n, m in errors.items()},
        )
        # Keep writes refused for the whole window: the scenario, not an assertion.
        time.sleep(max(0.0, REFUSAL_S - (time.monotonic() - started)))
        refused_s = time.monotonic() - started
        logged = {proc: proc.text().splitlines()[marks[proc] :] for proc in (node, bus)}
    allowed = 2 + int(refused_s / 10)  # the first, one per 10 s, one of slack
    figures: dict[str, object] = {"refused_s": round(refused_s, 1)}
    for proc, lines in logged.items():
        kinds = collections.Counter(_kind(line) for line in lines)
        figures[proc.log.name] = {"lines": len(lines), "kinds": len(kinds)}
        assert kinds and max(kinds.values()) <= allowed, (allowed, kinds, "\n".join(lines))
    # and one line each when it ends
    for name, url in urls.items():
        until_sync(health_is(f"{url}/healthz", 200), f"{name} up again", within_s=30)
    node.wait_for("consumer rb: session started again")
    for queue in (keys.BUS_LOCAL, keys.BUS_REMOTE, keys.BUS_REPLY):
        bus.wait_for(f"bus: {queue} loop: redis works again")
    retried = {n: _metric(urls[n], m) - before[n] for n, m in errors.items()}
    logging.getLogger(__name__).info("retry log figures: %s, retries %s", figures, retried)

"""``sluice demo`` start-up, restart and stop with a quick subset of its components.

The full system (Spark Connect, Airflow) is ``make demo-check``, a CI step:
here the supervisor's paths run with Redis, the server, the producer, the two
nodes and the two bus twins (a few seconds), and the test walks ``/proc`` for
the demo's marker afterwards: no process may outlive the demo.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import keys
from pipeline.demo.plan import STREAM
from pipeline.demo.prereq import git_ignored
from pipeline.demo.procs import MARKER, marked_pids
from pipeline.demo.supervisor import sweep
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from pipeline.runtime.ports import free_port
from tests.integration.lake.connect import shared_server
from tests.support.poll import until_sync

ROOT = Path(__file__).resolve().parents[3]
SUBSET = "serve,produce,nodes,buses"


def _demo(tmp_path: Path, demo_id: str, *args: str) -> subprocess.Popen[bytes]:
    """The demo with its output in ``tmp_path/out`` (a file: a pipe nobody reads could block it)."""
    env = {
        **os.environ,
        "SLUICE_VAR_DIR": str(tmp_path / "var"),
        MARKER: demo_id,
        "COLUMNS": "120",
    }
    with (tmp_path / "out").open("wb") as out:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "demo", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _out(tmp_path: Path) -> str:
    return (tmp_path / "out").read_text(errors="replace")


def _wait_for(what: str, cond: Callable[[], bool], tmp_path: Path) -> None:
    """Poll ``cond``; on a timeout the failure shows the demo's output."""
    until_sync(cond, what, within_s=60, every_s=0.1, detail=lambda: _out(tmp_path))


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _pid_of(demo_id: str, needle: str) -> int | None:
    for pid in marked_pids(demo_id):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmd:
            return pid
    return None


def test_live_demo_restarts_a_dead_component_and_ctrl_c_leaves_no_process(
    tmp_path: Path,
) -> None:
    demo_id = f"test-{uuid.uuid4().hex[:8]}"
    demo_dir = tmp_path / "var" / "demo"
    proc = _demo(tmp_path, demo_id, "--only", SUBSET, "--serve-port", str(free_port()))
    try:
        # traffic flows both ways between the nodes: the components are up and talking
        _wait_for("all up", lambda: "all up in" in _out(tmp_path), tmp_path)
        _wait_for(
            "round trips",
            lambda: (
                _lines(demo_dir / "node-a.replies") > 0 and _lines(demo_dir / "node-b.replies") > 0
            ),
            tmp_path,
        )
        victim = _pid_of(demo_id, "node --name node-b")
        assert victim is not None
        os.killpg(victim, signal.SIGKILL)
        _wait_for(
            "node-b restarted",
            lambda: (_pid_of(demo_id, "node --name node-b") or victim) != victim,
            tmp_path,
        )
        before = _lines(demo_dir / "node-b.replies")
        _wait_for(
            "node-b talking again", lambda: _lines(demo_dir / "node-b.replies") > before, tmp_path
        )
        # the bus keys are private, and where `git add .` never picks them up
        for key in (demo_dir / "bus").glob("twin*.key"):
            assert key.stat().st_mode & 0o077 == 0, oct(key.stat().st_mode)
            assert git_ignored(key, ROOT) in (True, None)  # None: not a git checkout
        assert len(list((demo_dir / "bus").glob("twin*.key"))) == 2
        # the walk sees every component, redis-server too (it overwrites its environment)
        assert _pid_of(demo_id, "redis-server") is not None
        assert _pid_of(demo_id, "produce --stream") is not None
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            asyncio.run(sweep(demo_id))  # whatever a failed test left behind
    out = _out(tmp_path)
    assert proc.returncode == 0, out
    assert "node-b exited with code" in out and "restarting (1/" in out, out
    assert "the sweep had to stop" not in out, out  # every process group stopped by itself
    assert marked_pids(demo_id) == []


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _demo(tmp_path, "unused", "--only", SUBSET, "--serve-port", str(port))
        proc.wait(timeout=60)
    out = _out(tmp_path)
    assert proc.returncode == 2, out
    lines = out.strip().splitlines()
    assert lines == [f"sluice demo: port {port} (status page, --serve-port) is in use"], out


def test_missing_java_and_redis_are_one_line_each_and_exit_2(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare), "SLUICE_VAR_DIR": str(tmp_path / "var")}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--serve-port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any(line.startswith("sluice demo: Java is missing") for line in lines), lines
    assert any(line.startswith("sluice demo: redis-server is missing") for line in lines), lines
    assert all(line.startswith("sluice demo: ") for line in lines), lines  # no traceback


def test_var_is_git_ignored_in_this_checkout() -> None:
    assert git_ignored(ROOT / "var" / "demo" / "bus" / "twin1.key", ROOT) in (True, None)


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "unused", "--only", "serve,nope")
    proc.wait(timeout=60)
    out = _out(tmp_path)
    assert proc.returncode == 2 and "unknown component(s) nope" in out, out


def test_the_lake_on_the_demos_s3_server_starts_before_serve_and_stops_with_it(
    tmp_path: Path,
) -> None:
    demo_id = f"test-{uuid.uuid4().hex[:8]}"
    proc = _demo(
        tmp_path, demo_id, "--only", "serve", "--lake", "s3", "--up-then-stop",
        "--serve-port", str(free_port()),
    )  # fmt: skip
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            asyncio.run(sweep(demo_id))
    out = _out(tmp_path)
    assert proc.returncode == 0, out
    assert out.index("s3 up in") < out.index("serve up in"), out
    assert (tmp_path / "var" / "demo" / "s3" / "lake").is_dir()  # the lake's bucket
    assert "the sweep had to stop" not in out, out
    assert marked_pids(demo_id) == []


@pytest.mark.parametrize("layout", ["sentinel", "cluster"])
def test_live_demo_on_the_users_sentinel_or_cluster(
    tmp_path: Path, layout: str, request: pytest.FixtureRequest
) -> None:
    """``sluice demo --redis URL``: the producer, the server and the two nodes run on the
    user's Sentinel-watched master or Redis Cluster (the chain stream and the nodes'
    streams are there, the nodes talk through it); the bus twins keep the demo's own."""
    url = request.getfixturevalue(f"{layout}_url")
    demo_id = f"test-{uuid.uuid4().hex[:8]}"
    demo_dir = tmp_path / "var" / "demo"
    proc = _demo(
        tmp_path, demo_id, "--only", SUBSET, "--serve-port", str(free_port()), "--redis", url
    )
    client = redisconn.connect_sync(url, Role.CLI)
    try:
        _wait_for("all up", lambda: "all up in" in _out(tmp_path), tmp_path)
        _wait_for(
            "round trips",
            lambda: (
                _lines(demo_dir / "node-a.replies") > 0 and _lines(demo_dir / "node-b.replies") > 0
            ),
            tmp_path,
        )
        _wait_for(
            "blocks in the user's Redis",
            lambda: client.xlen(keys.stream(STREAM)) >= 3,
            tmp_path,
        )
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            asyncio.run(sweep(demo_id))
    out = _out(tmp_path)
    assert proc.returncode == 0, out
    assert marked_pids(demo_id) == []


#: ``--follow`` of the check in the suite: at the check's 4 blocks/s, about 20 blocks and a
#: couple of reorgs arrive while the subscriber follows the live chain (15 s by default)
FOLLOW_S = 5


@pytest.fixture
def spark_remote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``sc://`` URL of the session's Spark Connect server (shared with the lake tests)."""
    return shared_server(request, tmp_path_factory.getbasetemp()).url


@pytest.mark.soak  # make soak: CI's `make demo-check` runs the check on one Redis
@pytest.mark.timeout(1200)
def test_demo_check_passes_on_a_cluster(
    tmp_path: Path, cluster_url: str, spark_remote: str
) -> None:
    """``sluice demo --check --redis redis+cluster://...``: the whole scripted scenario
    (Airflow's archive runs through Spark Connect, trim, serve, a subscriber from 0 that
    follows the live chain, the nodes) with every part but the bus twins on the session's
    3+3 Redis Cluster and the lake jobs on the session's Spark Connect server (``--spark``:
    one Connect server per session; ``make demo-check`` starts and warms the demo's own)."""
    demo_id = f"test-{uuid.uuid4().hex[:8]}"
    proc = _demo(
        tmp_path, demo_id, "--check", "--redis", cluster_url, "--spark", spark_remote,
        "--follow", str(FOLLOW_S),
        "--serve-port", str(free_port()), "--airflow-port", str(free_port()),
    )  # fmt: skip
    try:
        proc.wait(timeout=1100)  # bounds a hang only: the check has its own deadline
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            asyncio.run(sweep(demo_id))
    out = _out(tmp_path)
    assert proc.returncode == 0, out
    assert marked_pids(demo_id) == []
    assert "spark up in" not in out, out  # the session's server, not one of its own
    # the live chain flowed while the subscriber followed it: blocks arrived
    followed = re.search(r"followed live: (\d+) blocks added", out)
    assert followed is not None and int(followed[1]) > 0, out

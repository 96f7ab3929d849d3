"""The docs' examples that need services, run as written against real ones.

Each example is read from its page (README.md or docs/...), its Redis URL,
port or path swapped for the test's, and run as written (Python with this
interpreter, shell with bash and the test's virtualenv as ``.venv``): the
library's publisher and consumer, and the README's two nodes, on the test's
redis-server; the chain examples (``subscribe`` over the websocket,
``subscribe_dialogue`` over Dialogue, the README's ``sluice subscribe`` and
``curl``) against a real ``sluice produce`` and ``sluice serve``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.runtime.ports import free_port
from tests.support.docblocks import PYTHON, SHELL, page_blocks
from tests.support.poll import until_sync

BLOCKS = 12  # produced before the examples subscribe from block 0
VENV = Path(sys.executable).parent.parent


def _example(page: str, marker: str, swaps: dict[str, str], langs: frozenset[str] = PYTHON) -> str:
    [code] = page_blocks(page, langs, marker)
    for old, new in swaps.items():
        assert old in code, f"{page}: the example no longer says {old}"
        code = code.replace(old, new)
    return code


def _env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_CONFIG="/dev/null", SLUICE_LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(settings)
    return env


def _with_venv(tmp_path: Path) -> Path:
    """``tmp_path`` holding ``.venv``, the test's virtualenv: the examples' .venv/bin/sluice."""
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    return tmp_path


def test_the_readme_nodes_example_runs(redis_url: str, tmp_path: Path) -> None:
    """Node B's echo and node A's 100 requests through Redis streams: 100 replies recorded."""
    replies = tmp_path / "replies.txt"
    code = _example(
        "README.md",
        "--workers requester",
        {"redis://127.0.0.1:6379/0": redis_url, "/tmp/replies.txt": str(replies)},
        SHELL,
    )
    proc = subprocess.Popen(
        ["bash", "-c", code], cwd=_with_venv(tmp_path), env=_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        until_sync(
            lambda: replies.exists() and len(replies.read_text().splitlines()) >= 100,
            "node A recorded 100 replies",
            within_s=120,
            detail=lambda: (replies.exists() and replies.read_text()[-200:], proc.poll()),
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # both nodes: the block's process group
        _, err = proc.communicate(timeout=60)
    assert set(replies.read_text().split()) == {f"req-{i}" for i in range(100)}
    assert "Traceback" not in err, err


def test_the_library_streams_example_runs(redis_url: str, tmp_path: Path) -> None:
    code = _example(
        "docs/guide/library.md", "StreamService(", {"redis://127.0.0.1:6379/0": redis_url}
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b'hello'"


@pytest.fixture
def served_chain(redis_url: str, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A chain of BLOCKS blocks in ``chain:demo`` (the examples' stream), served by a real
    ``sluice serve`` on a free port and a free Dialogue port: (port, dialogue_port)."""
    env = _env(SLUICE_REDIS_URL=redis_url, SLUICE_LAKE_URI=str(tmp_path / "lake"))
    subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", str(BLOCKS)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    port, dialogue_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port),
         "--dialogue-port", str(dialogue_port)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield port, dialogue_port
    finally:
        server.terminate()
        server.wait(30)


def _follow(code: str, tmp_path: Path, name: str, expect: list[str]) -> None:
    """Run an example that follows the chain forever until it printed ``expect``'s lines."""
    out = tmp_path / f"{name}.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=tmp_path, env=_env(), stdout=sink,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    try:
        until_sync(
            lambda: (
                [line.split()[:2] for line in out.read_text().splitlines()][: len(expect)]
                == [e.split() for e in expect]
            ),
            f"{name} printed {expect[0]} ... {expect[-1]}",
            within_s=90,
            detail=lambda: (out.read_text()[-500:], proc.poll()),
        )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err.split("KeyboardInterrupt")[0], err


def test_the_chain_examples_follow_a_served_chain(
    served_chain: tuple[int, int], tmp_path: Path
) -> None:
    port, dialogue_port = served_chain
    demo = _example("README.md", "sluice subscribe --url", {"8765": str(port)}, SHELL)
    out = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", demo], cwd=_with_venv(tmp_path), env=_env(),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    *updates, health = out.stdout.splitlines()
    assert [json.loads(line)["added"] for line in updates] == list(range(5))
    assert json.loads(health)["status"] in ("ok", "degraded")
    blocks = [f"block {n}" for n in range(BLOCKS)]
    ws = {"ws://127.0.0.1:8765/ws": f"ws://127.0.0.1:{port}/ws"}
    _follow(_example("README.md", "subscribe(", ws), tmp_path, "readme", blocks)
    _follow(_example("docs/guide/chain.md", "in subscribe(", ws), tmp_path, "guide", blocks)
    feed = _example(
        "docs/guide/chain.md",
        "subscribe_dialogue(",
        {
            'subscribe_dialogue("127.0.0.1", 8766,': f'subscribe_dialogue("127.0.0.1", {dialogue_port},'
        },
    )
    _follow(feed, tmp_path, "dialogue", blocks)

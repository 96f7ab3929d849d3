"""The core install: ``pip install sluice`` without extras runs the bus and Dialogue.

A fresh virtualenv (conftest.py) gets the wheel of this checkout with its core
dependencies only, then runs the bus handler (docs/guide/bus.md) and the bus
calls of the README and of that guide between two real ``sluice bus`` processes
on two real redis-servers, and the Dialogue examples of the README and of
docs/guide/dialogue.md, all with that venv's interpreter. No pyarrow, deltalake, pandas, rich or RE2 may
be installed there.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
from tests.support.docblocks import PYTHON, page_blocks

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("pyarrow", "deltalake", "pandas", "rich", "re2", "pyspark")


def _block(page: str, marker: str) -> str:
    """The one Python block of ``page`` (README.md, docs/...) that contains ``marker``."""
    [block] = page_blocks(page, PYTHON, marker)
    return block


def _run(venv: Path, code: str, *, cwd: Path, timeout: float = 120) -> str:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=cwd,  # not the checkout: the installed package is the one imported
        capture_output=True,
        text=True,
        timeout=timeout,  # bounds a hang only
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_core_installs_nothing_heavy(core_venv: Path, tmp_path: Path) -> None:
    found = _run(
        core_venv,
        "import importlib.util, pipeline\n"
        f"print([m for m in {HEAVY!r} if importlib.util.find_spec(m)])\n"
        "print(pipeline.__file__)",
        cwd=tmp_path,
    ).split("\n")
    assert found[0] == "[]"
    assert str(core_venv) in found[1]  # the installed copy, not the checkout


#: What the core install holds: every module of these rooms imports without an extra.
CORE_PARTS = ("routing", "streams", "bus", "dialogue", "redisio", "runtime", "settings")
#: The ground modules at the top of the package the core install holds too.
CORE_GROUND = ("cli", "errors", "keys", "intervals", "lifecycle", "loggate", "facade", "blockcodec")


def test_every_core_module_imports_without_an_extra(core_venv: Path, tmp_path: Path) -> None:
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for part in CORE_PARTS
        for path in sorted((ROOT / "pipeline" / part).rglob("*.py"))
        if path.stem != "__init__"
    ]
    modules += [f"pipeline.{name}" for name in CORE_GROUND]
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    _run(core_venv, code, cwd=tmp_path)
    out = subprocess.run(
        [str(core_venv / "bin" / "sluice"), "node", "--help"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and "sluice node" in out.stdout, out.stderr


def test_the_dialogue_examples_run_on_the_core(core_venv: Path, tmp_path: Path) -> None:
    out = _run(core_venv, _block("docs/guide/dialogue.md", "DialogueServer"), cwd=tmp_path)
    assert out.split("\n")[:2] == ["b'pong: ping'", "b'CHUNK'"]
    out = _run(core_venv, _block("README.md", "DialogueServer"), cwd=tmp_path)
    assert out.split("\n")[:1] == ["b'pong: ping'"]


@pytest.fixture
def two_buses(
    core_venv: Path, redis_factory: Callable[..., LocalRedis], tmp_path: Path
) -> Iterator[dict[int, LocalRedis]]:
    """Twins 1001 and 1002, each a real ``sluice bus`` of the core venv on its own Redis."""
    sluice = str(core_venv / "bin" / "sluice")
    twins = {1001: redis_factory(), 1002: redis_factory()}
    ports = {twin: free_port() for twin in twins}
    keys = {}
    for twin in twins:
        out = subprocess.run(
            [sluice, "bus", "keygen", "--out", str(tmp_path / f"twin{twin}.key")],
            check=True, capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        keys[twin] = out.stdout.strip()
    directory = tmp_path / "twins.json"
    directory.write_text(
        json.dumps({str(t): {"url": f"http://127.0.0.1:{ports[t]}", "key": keys[t]} for t in twins})
    )
    procs = []
    try:
        for twin, redis in twins.items():
            proc = subprocess.Popen(
                [
                    sluice, "bus", "--twin", str(twin),
                    "--listen", f"127.0.0.1:{ports[twin]}",
                    "--directory", str(directory),
                    "--key", str(tmp_path / f"twin{twin}.key"),
                    "--redis", redis.url,
                ],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path,
            )  # fmt: skip
            procs.append(proc)
            assert proc.stdout is not None
            assert b"listening" in proc.stdout.readline()
        yield twins
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()


def test_the_bus_examples_run_on_the_core(
    core_venv: Path, two_buses: dict[int, LocalRedis], tmp_path: Path
) -> None:
    guide = "docs/guide/bus.md"
    handler = _block(guide, "BusServer").replace("redis://127.0.0.1:6402/0", two_buses[1002].url)
    calls = [
        _block(page, "BusClient").replace("redis://127.0.0.1:6401/0", two_buses[1001].url)
        for page in ("README.md", guide)
    ]
    server = subprocess.Popen(
        [str(core_venv / "bin" / "python"), "-c", handler],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for call in calls:
            out = _run(core_venv, call, cwd=tmp_path)
            assert out.strip() == "b'18024884.1393419'"
    finally:
        server.terminate()
        server.wait(30)
        assert server.stderr is not None
        server.stderr.close()

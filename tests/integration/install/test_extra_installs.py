"""Each install answers every command: the core, ``[serve]`` alone and ``[lake]`` alone.

In each fresh venv (conftest.py) every command's ``--help`` works (argparse
parsers import no extra), and the commands and public names that need an extra
the venv lacks answer one line naming ``pip install 'sluice[EXTRA]'`` (a
command: exit 2), while what the venv's extra brings runs for real: a lake audit
of an empty lake on ``[serve]`` and ``[lake]``, a lake job's progress on a
terminal without rich on ``[lake]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.cli import COMMANDS
from pipeline.lake.jobargs import parser as lake_parser
from pipeline.runtime.ports import free_port

from .conftest import INSTALL_S

LAKE_JOBS = tuple(
    next(a for a in lake_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
)
#: every command line that takes --help
LINES = (
    [[name] for name in COMMANDS]
    + [["bus", sub] for sub in ("keygen", "register", "dead", "requeue")]
    + [["lake", job] for job in LAKE_JOBS]
)
#: what each install runs --help of: every line on the core (the fewest packages), every
#: command on the others
HELP_LINES = {
    "core": LINES,
    "serve": [[name] for name in COMMANDS],
    "lake": [[name] for name in COMMANDS],
}


def _sluice(venv: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SLUICE")}
    env.update(
        SLUICE_VAR_DIR=str(cwd / "var"),
        SLUICE_LAKE_URI=str(cwd / "lake"),
        # nothing listens there: no command here needs Redis, none may reach the suite's
        SLUICE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("install", HELP_LINES)
def test_every_help_answers(install: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    venv: Path = request.getfixturevalue(f"{install}_venv")
    lines = HELP_LINES[install]
    with ThreadPoolExecutor(4) as pool:
        done = list(
            pool.map(lambda line: _sluice(venv, ["sluice", *line, "--help"], tmp_path), lines)
        )
    for line, out in zip(lines, done, strict=True):
        assert (out.returncode, out.stderr) == (0, ""), (install, line, out.stderr[-2000:])
        assert out.stdout.startswith(f"usage: sluice {' '.join(line)}"), (install, line)
    print(f"{install}: installed in {INSTALL_S.get(install, 0):.1f} s")  # noqa: T201


def _needs(command: str, module: str, extra: str) -> tuple[int, str]:
    return 2, f"{command} needs {module}, which is not installed: pip install 'sluice[{extra}]'\n"


AUDIT = ["lake", "audit", "--stream", "chain:x"]
MISSING = [
    ("core", ["serve"], _needs("sluice serve", "pyarrow", "serve")),
    ("core", ["spark"], _needs("sluice spark", "pyspark", "lake")),
    ("core", AUDIT, _needs("sluice lake audit", "pyarrow", "lake")),
    ("core", ["demo"], _needs("sluice demo", "rich", "demo")),
    ("serve", ["lake", "canonical", "--stream", "chain:x"],
     _needs("sluice lake canonical", "pyspark", "lake")),
    ("serve", ["spark"], _needs("sluice spark", "pyspark", "lake")),
    ("serve", ["demo"], _needs("sluice demo", "rich", "demo")),
    ("lake", ["demo", "--check"], _needs("sluice demo", "rich", "demo")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("install", "argv", "answer"),
    MISSING,
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_command_without_its_extra_answers_one_line(
    install: str, argv: list[str], answer: tuple[int, str], request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:  # fmt: skip
    out = _sluice(request.getfixturevalue(f"{install}_venv"), ["sluice", *argv], tmp_path)
    assert (out.returncode, out.stderr) == answer


def test_a_public_name_without_its_extra_is_one_line(core_venv: Path, tmp_path: Path) -> None:
    out = _sluice(core_venv, ["python", "-c", "from pipeline.lake import LakeReader"], tmp_path)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        "pipeline.errors.MissingExtra: pipeline.lake.LakeReader needs pyarrow, which is not "
        "installed: pip install 'sluice[serve]'"
    )


@pytest.mark.parametrize("install", ["serve", "lake"])
def test_a_lake_audit_runs_where_deltalake_is(
    install: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    out = _sluice(request.getfixturevalue(f"{install}_venv"), ["sluice", *AUDIT], tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["job"], doc["ok"], doc["canonical_count"]) == ("audit", True, 0)


def test_lake_progress_on_a_terminal_needs_no_rich(lake_venv: Path, tmp_path: Path) -> None:
    """rich comes with [demo]: a [lake] backfill on a terminal logs rate lines instead."""
    code = (
        "import io, importlib.util\n"
        "from pipeline.lake.progress import LineReporter, reporter\n"
        "assert importlib.util.find_spec('rich') is None\n"
        "shown = reporter('backfill', 2, 'intervals', 'entries', stream=io.StringIO(), tty=True)\n"
        "shown.advance(2, 10)\n"
        "shown.close()\n"
        "print(type(shown).__name__)\n"
    )
    out = _sluice(lake_venv, ["python", "-c", code], tmp_path)
    assert (out.returncode, out.stdout) == (0, "LineReporter\n"), out.stderr

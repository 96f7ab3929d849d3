"""Every Python and shell block of the README and of docs/ runs, or says why it cannot.

A block with no marker runs here as it stands: Python with the test's
interpreter, a shell block with bash (``-e -o pipefail``), each in a fresh
directory that holds a ``.venv`` link to the test's virtualenv (so
``.venv/bin/sluice`` is the installed command, and ``var/`` is the block's
own), with no ``SLUICE_*`` setting of the machine. It must exit 0. A block
marked ``not-run`` is still compiled or syntax-checked (``bash -n``), and the
tests its reason names must exist; a block marked ``run-by`` names a test that
exists and reads its page (tests/support/docblocks.py has the markers).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docblocks import (
    PYTHON,
    ROOT,
    SHELL,
    Block,
    checked_blocks,
    pages,
    shell_commands,
)

BLOCKS = checked_blocks()
RUN_TIMEOUT_S = 120  # bounds a hang only
VENV = Path(sys.executable).parent.parent


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["SLUICE_CONFIG"] = "/dev/null"
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    return env


def _workdir(tmp_path: Path) -> Path:
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    return tmp_path


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_the_pages_have_blocks_of_each_kind() -> None:
    kinds = {(b.lang in PYTHON, b.kind) for b in BLOCKS}
    assert {(True, "run"), (False, "run"), (True, "run-by"), (False, "not-run")} <= kinds


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in PYTHON], ids=lambda b: b.id)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, block.id, "exec")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in SHELL], ids=lambda b: b.id)
def test_shell_blocks_parse(block: Block, tmp_path: Path) -> None:
    out = _run(["bash", "-n", "-c", shell_commands(block)], tmp_path)
    assert out.returncode == 0, f"{block.id}: {out.stderr}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs_here], ids=lambda b: b.id)
def test_unmarked_blocks_run(block: Block, tmp_path: Path) -> None:
    cwd = _workdir(tmp_path)
    if block.lang in PYTHON:
        out = _run([sys.executable, "-c", block.code], cwd)
    else:
        out = _run(["bash", "-e", "-o", "pipefail", "-c", shell_commands(block)], cwd)
    assert out.returncode == 0, (
        f"{block.id} does not run (exit {out.returncode}); run it in a test, or mark it "
        f"<!-- not-run: why --> or <!-- run-by: tests/... -->\n{out.stdout}\n{out.stderr}"
    )
    assert "Traceback" not in out.stderr, f"{block.id}:\n{out.stderr}"


def _named_tests(text: str) -> list[str]:
    return re.findall(r"tests/[\w/.-]+\.py", text)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "not-run"], ids=lambda b: b.id)
def test_a_block_not_run_says_why_and_names_real_tests(block: Block) -> None:
    assert len(block.why.split()) >= 3, f"{block.id}: say why it cannot run"
    for name in _named_tests(block.why):
        assert (ROOT / name).is_file(), f"{block.id} names {name}, which does not exist"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run-by"], ids=lambda b: b.id)
def test_a_block_run_elsewhere_names_a_test_that_reads_its_page(block: Block) -> None:
    [name] = _named_tests(block.why)
    test = ROOT / name
    assert test.is_file(), f"{block.id} names {name}, which does not exist"
    assert f'"{block.path}"' in test.read_text(), f"{name} does not read {block.path}"


def test_markers_sit_right_before_a_block() -> None:
    """A marker a blank line or a paragraph away from its block would mark nothing."""
    for page in pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*<!-- (not-run|run-by):", line):
                following = lines[i + 1] if i + 1 < len(lines) else ""
                assert following.lstrip().startswith(("```", "~~~")), f"{page}:{i + 1}"


def test_a_failing_block_fails(tmp_path: Path) -> None:
    """The runner reports a block that exits non-zero (so an unmarked broken block fails)."""
    broken = Block(path="README.md", line=1, lang="sh", code="false\necho never\n", kind="run")
    out = _run(["bash", "-e", "-o", "pipefail", "-c", shell_commands(broken)], tmp_path)
    assert out.returncode != 0 and "never" not in out.stdout

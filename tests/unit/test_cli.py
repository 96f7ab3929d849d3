"""The ``sluice`` dispatcher: every option of every command has help, ``--help`` needs no
extra, and a command whose extra is missing answers one line naming it (exit 2).

The installs without an extra are simulated here (its packages set to ``None`` in
``sys.modules``: importing one raises :class:`ModuleNotFoundError`, ``find_spec`` finds
none); tests/integration/install builds the real ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.facade import EXTRA_OF
from pipeline.lake.jobargs import parser as lake_parser

ROOT = Path(__file__).resolve().parents[2]
BUS_SUBCOMMANDS = ("keygen", "register", "dead", "requeue")
LAKE_JOBS = tuple(
    next(a for a in lake_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
)
#: every command line that takes --help
COMMAND_LINES = (
    [[name] for name in cli.COMMANDS]
    + [["bus", sub] for sub in BUS_SUBCOMMANDS]
    + [["lake", job] for job in LAKE_JOBS]
)


class Captured(Exception):
    """Raised in place of parsing: the parser is what the test wanted."""


def _parser_of(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    seen: list[argparse.ArgumentParser] = []

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        seen.append(self)
        raise Captured

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        with pytest.raises(Captured):
            cli.main([*argv, "--help"])
    return seen[0]


def _options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield parser.prog, action


@pytest.mark.parametrize(
    "argv", [[n] for n in cli.COMMANDS] + [["bus", s] for s in BUS_SUBCOMMANDS], ids=" ".join
)
def test_every_option_has_help(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    options = list(_options(_parser_of(argv, monkeypatch)))
    assert options, argv
    bare = [f"{prog} {'/'.join(a.option_strings) or a.dest}" for prog, a in options if not a.help]
    assert not bare, f"options without help text: {bare}"


def test_help_logs_nothing_before_the_usage() -> None:
    """``sluice serve --help`` printed an INFO line (the allocator tuning) before its usage."""
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.startswith("usage: sluice serve")


#: Runs command lines in one interpreter without the packages ``BLOCKED`` names: prints
#: each one's exit code, stdout and stderr (log lines included) as JSON.
RUNNER = """
import contextlib, io, json, logging, sys
for module in BLOCKED:
    sys.modules[module] = None

class Now(logging.StreamHandler):
    stream = property(lambda self: sys.stderr, lambda self, value: None)

logging.basicConfig(handlers=[Now()], level=logging.INFO)
from pipeline.cli import main
results = []
for argv in LINES:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code or 0
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def _without(
    extras: set[str], lines: list[list[str]], *, blocked: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> list[tuple[int, str, str]]:  # fmt: skip
    modules = sorted(m for m, extra in EXTRA_OF.items() if extra in extras) + list(blocked)
    code = f"BLOCKED = {modules!r}\nLINES = {lines!r}\n{RUNNER}"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=True, env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    return [tuple(r) for r in json.loads(out.stdout)]


def _needs(command: str, module: str, extra: str) -> tuple[int, str, str]:
    return (
        2,
        "",
        f"{command} needs {module}, which is not installed: pip install 'sluice[{extra}]'\n",
    )


ALL_EXTRAS = {"serve", "lake", "airflow", "demo"}


def test_every_help_answers_on_the_core_install() -> None:
    results = _without(ALL_EXTRAS, [[*line, "--help"] for line in COMMAND_LINES])
    for line, (code, out, err) in zip(COMMAND_LINES, results, strict=True):
        assert (code, err) == (0, ""), line
        assert out.startswith(f"usage: sluice {' '.join(line)}"), (line, out[:200])


@pytest.mark.parametrize(
    ("missing", "argv", "answer"),
    [
        (ALL_EXTRAS, ["serve"], _needs("sluice serve", "pyarrow", "serve")),
        (ALL_EXTRAS, ["spark"], _needs("sluice spark", "pyspark", "lake")),
        (ALL_EXTRAS, ["lake", "audit", "--stream", "chain:x"],
         _needs("sluice lake audit", "pyarrow", "lake")),
        (ALL_EXTRAS, ["demo"], _needs("sluice demo", "rich", "demo")),
        ({"lake", "airflow", "demo"}, ["lake", "canonical", "--stream", "chain:x"],
         _needs("sluice lake canonical", "pyspark", "lake")),
        ({"airflow", "demo"}, ["demo", "--check"], _needs("sluice demo", "rich", "demo")),
    ],
    ids=["core serve", "core spark", "core lake", "core demo", "serve lake", "lake demo"],
)  # fmt: skip
def test_a_command_without_its_extra_answers_one_line(
    missing: set[str], argv: list[str], answer: tuple[int, str, str]
) -> None:
    assert _without(missing, [argv]) == [answer]


def test_an_extras_module_missing_where_no_check_looks_is_one_line_too(tmp_path: Path) -> None:
    """The dispatcher's backstop: a package half there (one of its modules missing)."""
    env = {"SLUICE_VAR_DIR": str(tmp_path / "var"), "SLUICE_LAKE_URI": str(tmp_path / "lake")}
    env["SLUICE_REDIS_URL"] = "redis://127.0.0.1:1/0"  # nothing there: not needed
    [(code, _, err)] = _without(
        set(), [["lake", "audit", "--stream", "chain:x"]], blocked=("pyarrow.dataset",), env=env
    )
    assert code == 2
    assert err.splitlines()[-1] == (
        "sluice lake needs pyarrow, which is not installed: pip install 'sluice[lake]'"
    )
    assert "Traceback" not in err

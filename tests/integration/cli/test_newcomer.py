"""The CLI as a newcomer meets it, through the real ``sluice`` command.

Help that lists every subcommand and names each flag's SLUICE_* variable,
with no docstring markup; settings read only by the commands that use them;
one line and the usage exit code for each mistake; one short, rate-limited
line from a subscriber whose server is down; the docs' examples true.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.runtime.ports import free_port
from tests.integration.cli.test_bad_input import _one_line, sluice
from tests.support.docblocks import SHELL, page_blocks
from tests.support.poll import until_sync
from tests.support.userenv import user_env

ROOT = Path(__file__).resolve().parents[3]


def _ok(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    return out.stdout


def test_help_lists_every_bus_subcommand(tmp_path: Path) -> None:
    top = _ok(sluice(["--help"], {}, tmp_path))
    [bus_line] = [line for line in top.splitlines() if line.strip().startswith("bus ")]
    for sub in ("keygen", "register", "dead", "requeue"):
        assert sub in bus_line, bus_line
    bus = _ok(sluice(["bus", "--help"], {}, tmp_path))
    for sub in ("keygen", "register", "dead", "requeue"):
        assert f"sluice bus {sub}" in bus, bus


#: Flags that override a setting, and the variable each must name in its help.
FLAG_VARIABLES = {
    ("bus",): {
        "--twin": "SLUICE_BUS_TWIN",
        "--listen": "SLUICE_BUS_LISTEN",
        "--directory": "SLUICE_BUS_DIRECTORY",
        "--key": "SLUICE_BUS_KEY_FILE",
        "--redis": "SLUICE_REDIS_URL",
        "--legacy-peers": "SLUICE_BUS_LEGACY_PEERS",
    },
    ("bus", "dead"): {"--redis": "SLUICE_REDIS_URL"},
    ("bus", "requeue"): {"--redis": "SLUICE_REDIS_URL"},
    ("bus", "register"): {"--redis": "SLUICE_REDIS_URL"},
    ("node",): {
        "--name": "SLUICE_NODE_NAME",
        "--workers": "SLUICE_NODE_WORKERS",
        "--listen": "SLUICE_NODE_LISTEN",
    },
    ("serve",): {
        "--host": "SLUICE_SERVE_HOST",
        "--port": "SLUICE_SERVE_PORT",
        "--stream": "SLUICE_SERVE_STREAM",
        "--dialogue-port": "SLUICE_SERVE_DIALOGUE_PORT",
    },
    ("produce",): {"--stream": "SLUICE_SERVE_STREAM"},
    ("subscribe",): {"--token": "SLUICE_SERVE_TOKEN"},
}


def _option_help(text: str, flag: str) -> str:
    """The help block of ``flag`` in argparse output (its line and the indented ones after)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\s+{flag}\b", line))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if re.match(r"\s+-", line) or not line.startswith(" " * 10):
            break
        block.append(line)
    return " ".join(" ".join(block).split())


@pytest.mark.parametrize("command", list(FLAG_VARIABLES), ids=" ".join)
def test_flags_name_their_variable(command: tuple[str, ...], tmp_path: Path) -> None:
    text = _ok(sluice([*command, "--help"], {"COLUMNS": "100"}, tmp_path))
    for flag, variable in FLAG_VARIABLES[command].items():
        assert variable in _option_help(text, flag), (flag, _option_help(text, flag))


HELP_COMMANDS = [
    ["serve"], ["subscribe"], ["produce"], ["node"], ["bus"], ["bus", "dead"], ["lake"],
    *[["lake", job] for job in ("archive", "archive-streams", "canonical", "trim", "replay",
                                "audit", "maintain", "backfill")],
]  # fmt: skip


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_help_has_no_docstring_markup(command: list[str], tmp_path: Path) -> None:
    text = _ok(sluice([*command, "--help"], {}, tmp_path))
    for markup in ("``", ":class:", ":mod:", ":func:", ":meth:", ":data:"):
        assert markup not in text, (markup, text)


@pytest.mark.parametrize(
    "job", ["archive", "archive-streams", "canonical", "trim", "replay", "audit", "maintain",
            "backfill"],
)  # fmt: skip
def test_lake_jobs_describe_themselves_and_every_option(job: str, tmp_path: Path) -> None:
    text = _ok(sluice(["lake", job, "--help"], {"COLUMNS": "100"}, tmp_path))
    usage, _, rest = text.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert description and not description.startswith("options"), text
    for flag in re.findall(r"\[?(--[a-z-]+)", usage):
        help_ = _option_help(text, flag)
        metavar = help_.split()[1:2]  # "--stream STREAM the chain stream..."
        words = help_.split()[1 + (metavar == [metavar[0].upper()] if metavar else 0) :]
        assert words, f"{job} {flag} has no help: {help_!r}"


def test_help_and_other_commands_work_with_a_bad_setting(redis_url: str, tmp_path: Path) -> None:
    bad = {"SLUICE_SERVE_PORT": "eighty", "SLUICE_LAKE_URI": ""}
    _ok(sluice(["--help"], bad, tmp_path))
    _ok(sluice(["bus", "--help"], bad, tmp_path))
    _ok(sluice(["bus", "keygen", "--out", str(tmp_path / "k.key")], bad, tmp_path))
    _ok(sluice(["bus", "dead", "--redis", redis_url], bad, tmp_path))
    # the command that uses the setting still refuses it, in one line
    _one_line(sluice(["serve"], bad, tmp_path), "serve_port", "SLUICE_SERVE_PORT")


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    out = sluice(["produce"], {"SLUICE_CONFIG": "/nonexistent.toml"}, tmp_path)
    _one_line(out, "/nonexistent.toml", "SLUICE_CONFIG")


def test_an_unknown_variable_is_reported_like_the_same_key_in_sluice_toml(tmp_path: Path) -> None:
    from_env = sluice(["produce"], {"SLUICE_SERVE_STREEM": "x"}, tmp_path)
    _one_line(from_env, "unknown setting 'serve_streem'", "SLUICE_SERVE_STREEM")
    toml = tmp_path / "sluice.toml"
    toml.write_text('[sluice]\nserve_streem = "x"\n')
    from_file = sluice(["produce"], {"SLUICE_CONFIG": str(toml)}, tmp_path)
    _one_line(from_file, "unknown setting 'serve_streem'", str(toml))


def test_subscribe_refuses_a_negative_block(tmp_path: Path) -> None:
    out = sluice(["subscribe", "--from", "-1"], {}, tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --from: must be a non-negative number" in out.stderr.splitlines()[-1]


def test_a_subscriber_retrying_a_dead_server_logs_short_rate_limited_lines(
    tmp_path: Path,
) -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"  # nothing listens there
    out = sluice(
        ["subscribe", "--url", url, "--retries", "3"],
        {"SLUICE_LOG_LEVEL": "INFO"},
        tmp_path,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    warnings = [line for line in lines if "WARNING" in line]
    assert len(warnings) == 1, lines  # 4 failed attempts, one line
    assert len(warnings[0]) < 200 and "cannot connect" in warnings[0], warnings[0]
    assert lines[-1] == f"sluice subscribe: no block after 3 reconnections to {url}"


def test_missing_java_is_one_clear_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "SLUICE_VAR_DIR": str(tmp_path / "var")}
    full = {k: v for k, v in user_env().items() if k != "JAVA_HOME"}
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "spark", "--port", str(free_port())],
        env={**full, "SLUICE_CONFIG": os.devnull, **env},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs Java" in lines[0] and "no java on PATH" in lines[0], lines


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["archive", "--stream", "s", "--start-ms", "10", "--end-ms", "5"], "--start-ms 10"),
        (["archive", "--stream", "s", "--start-ms", "-1", "--end-ms", "5"], "--start-ms -1"),
        (["archive-streams", "--stream", "s", "--start-ms", "7", "--end-ms", "7"], "start < end"),
        (["replay", "--stream", "s", "--from", "5", "--to", "1"], "--from 5 --to 1"),
    ],
)
def test_a_bad_lake_range_exits_2(args: list[str], needle: str, tmp_path: Path) -> None:
    env = {"SLUICE_LAKE_URI": str(tmp_path / "lake"), "SLUICE_STREAMS": "s"}
    _one_line(sluice(["lake", *args], env, tmp_path), needle)


#: ``sluice`` as its console script runs it (``main()`` reads sys.argv), with a mark written
#: by the interpreter's teardown: a lake process must leave without it (pipeline.cli._leave).
#: Ctrl-C handled as Python does by default even where the suite runs with SIGINT ignored
#: (started as a background job of a non-interactive shell: its children inherit that, and
#: Python installs no Ctrl-C handler over an ignored SIGINT)
_SLUICE_MARKING_TEARDOWN = (
    "import atexit, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "atexit.register(lambda: sys.stderr.write('interpreter teardown\\n'))\n"
    "from pipeline.cli import main\n"
    "sys.exit(main())\n"
)


def test_ctrl_c_in_a_lake_job_exits_130_with_one_line(redis_url: str, tmp_path: Path) -> None:
    """...and leaves without the interpreter's teardown (pipeline.cli._leave: before, only a
    finished lake job did). The child handles SIGINT itself: a suite run in the background
    of a script ignored SIGINT, and so did the job (2026-11-30, 60 s without an exit)."""
    hold = tmp_path / "hold"
    hold.write_text("maintain")  # the job holds right before its Spark work (jobs.HOLD_ENV)
    env = {
        **user_env(),
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_LAKE_URI": str(tmp_path / "lake"),
        "SLUICE_VAR_DIR": str(tmp_path / "var"),
        "SLUICE_TEST_HOLD_FILE": str(hold),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLUICE_MARKING_TEARDOWN, "lake", "maintain"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        until_sync(
            lambda: hold.read_text().startswith("pid:") or proc.poll() is not None,
            "the job reached its hold point",
            within_s=120,
        )
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    first, *rest = err.strip().splitlines()
    assert first.startswith("INFO sluice lake maintain"), err  # the job's story: what ran
    assert rest == ["sluice lake: interrupted"], err


def test_the_bus_guide_example_keeps_its_files_out_of_git() -> None:
    [block] = page_blocks("docs/guide/bus.md", SHELL, "bus keygen --out")
    paths = set(re.findall(r"--(?:out|key|directory) (\S+)", block))
    paths |= set(re.findall(r"cat > (\S+)", block))
    assert paths
    for path in paths:
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path], check=False)
        assert ignored.returncode == 0, f"{path} is not git-ignored"


def test_the_lake_guide_repeats_one_lake_interval_when_it_says_so() -> None:
    [block] = page_blocks("docs/guide/lake.md", SHELL, "sluice spark >")
    calls = [line for line in block.splitlines() if "sluice lake archive" in line]
    assert all("$(date" not in line for line in calls), calls
    assert len(calls) != len(set(calls))  # the "same call again" is the same interval

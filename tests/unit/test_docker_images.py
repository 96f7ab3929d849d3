"""What the compose files run exists in the image they run it in.

For docker/compose.yaml and docker/compose.production.yaml: every program a
Sluice-image service or health check starts is installed by a package of the
image (``sluice[all]`` at constraints.txt: scripts/constraints.py's closure);
every ``sluice`` command line parses with that command's own parser; every
``airflow`` command line (and the Celery app of the workers' health check)
parses with Airflow's parser under the file's executor; Spark's classes are in
pyspark's jars; every file of docker/ a service names is copied into the image.
And the image's build reads setup.py, so its wheel carries the Airflow folders.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata as md
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import COMMANDS
from pipeline.errors import ConfigError
from tests.support.compose import ROOT, argv_of, env_of, render

FILES = ("compose.yaml", "compose.production.yaml")
CREDENTIALS = {
    name: "x"
    for name in (
        "SLUICE_REDIS_PASSWORD",
        "SLUICE_POSTGRES_PASSWORD",
        "SLUICE_S3_ACCESS_KEY",
        "SLUICE_S3_SECRET_KEY",
        "SLUICE_SERVE_TOKEN",
    )
}
IMAGE = "sluice:local"
HOME = "/opt/sluice"  # the Dockerfile's WORKDIR


def _image_services(file: str) -> dict[str, dict[str, Any]]:
    services = render(ROOT / "docker" / file, CREDENTIALS)["services"]
    return {n: s for n, s in services.items() if s.get("image") == IMAGE}


def _health_argv(service: dict[str, Any]) -> list[str]:
    test = [str(t) for t in service.get("healthcheck", {}).get("test") or []]
    if test[:1] == ["CMD-SHELL"]:
        return shlex.split(test[1].replace("$$", "$"))
    return test[1:] if test[:1] == ["CMD"] else []


def _lines(file: str) -> list[tuple[str, list[str]]]:
    """``(service, argv)`` of everything each Sluice-image service starts: its process
    (entrypoint + command, the image's ENTRYPOINT ``sluice`` when it sets none) and its
    health check."""
    out = []
    for name, service in _image_services(file).items():
        entry = argv_of(service, "entrypoint") or ["sluice"]
        out.append((name, entry + argv_of(service, "command")))
        if _health_argv(service):
            out.append((name, _health_argv(service)))
    return out


def _programs_of_the_image() -> set[str]:
    """The programs the image's packages install (and the interpreter's)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        constraints = importlib.import_module("constraints")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    programs = {"python", "sh", "/bin/sh", *project["scripts"]}
    for name in constraints.closure(extras=("all",)):
        for file in md.distribution(name).files or ():
            if str(file).startswith("../../../bin/"):
                programs.add(file.name)
    return programs


@pytest.mark.parametrize("file", FILES)
def test_every_program_is_installed_in_the_image(file: str) -> None:
    programs = _programs_of_the_image()
    assert {"sluice", "airflow", "celery", "spark-class"} <= programs
    for name, argv in _lines(file):
        assert argv[0] in programs, f"{file}: {name} runs {argv[0]}, which the image lacks"


@pytest.mark.parametrize("file", FILES)
def test_every_file_a_service_names_is_in_the_image(file: str) -> None:
    copied = {
        target
        for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY docker/")
        for target in line.split()[1:-1]
    }
    for name, argv in _lines(file):
        for word in argv:
            for path in re.findall(rf"{HOME}/(docker/[\w.-]+)", word):
                assert path in copied and (ROOT / path).is_file(), f"{file}: {name} needs {path}"


@contextlib.contextmanager
def _parsers_made() -> Iterator[list[argparse.ArgumentParser]]:
    made: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.__init__

    def record(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    argparse.ArgumentParser.__init__ = record  # type: ignore[method-assign]
    try:
        yield made
    finally:
        argparse.ArgumentParser.__init__ = original  # type: ignore[method-assign]


def _sluice_parser(command: str) -> argparse.ArgumentParser:
    """The parser ``sluice COMMAND --help`` builds (run in this process)."""
    module = importlib.import_module(COMMANDS[command][0])
    with (
        _parsers_made() as parsers,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(SystemExit),
    ):
        module.main(["--help"])
    [parser] = [p for p in parsers if p.prog == f"sluice {command}"]
    return parser


@pytest.mark.parametrize("file", FILES)
def test_every_sluice_command_line_parses(file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SLUICE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")
    lines = [(n, argv) for n, argv in _lines(file) if argv[0] == "sluice"]
    assert {argv[1] for _, argv in lines} >= {"serve", "produce", "node", "bus", "spark"}
    for name, argv in lines:
        assert argv[1] in COMMANDS, f"{file}: {name}: sluice has no command {argv[1]!r}"
        parser = _sluice_parser(argv[1])
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                parser.parse_args(argv[2:])
            except SystemExit:
                pytest.fail(f"{file}: {name}: {' '.join(argv)}: {err.getvalue().strip()}")


@pytest.mark.parametrize("file", FILES)
def test_every_services_sluice_settings_load(file: str) -> None:
    """Sluice refuses a SLUICE_* variable it does not know: none of a service's may be one."""
    from pipeline.settings import Settings

    for name, service in _image_services(file).items():
        env = {k: v for k, v in env_of(service).items() if k.startswith("SLUICE_")}
        try:
            Settings.load({**env, "SLUICE_CONFIG": "/dev/null"})
        except ConfigError as exc:
            pytest.fail(f"{file}: {name}: {exc}")


@pytest.mark.parametrize("file", FILES)
def test_spark_classes_are_in_pysparks_jars(file: str) -> None:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    classes = {
        name
        for jar in jars.glob("spark-core_*.jar")
        for name in zipfile.ZipFile(jar).namelist()
        if name.endswith(".class")
    }
    started = [argv[1] for _, argv in _lines(file) if argv[0] == "spark-class"]
    assert len(started) >= 2
    for cls in started:
        assert cls.replace(".", "/") + ".class" in classes, f"{file}: no {cls}"


PROBE = """
import importlib, json, sys
from airflow.cli import cli_parser
parser, bad = cli_parser.get_parser(), []
for argv in json.loads(sys.argv[1]):
    try:
        parser.parse_args(argv)
    except SystemExit:
        bad.append(argv)
apps = [a for a in json.loads(sys.argv[2])
        if not hasattr(importlib.import_module(a.rpartition(".")[0]), a.rpartition(".")[2])]
print(json.dumps({"bad": bad, "apps": apps}))
"""


def _airflow_lines(file: str) -> tuple[str, list[list[str]], list[str]]:
    """The file's executor, its ``airflow`` command lines, and the Celery apps it names."""
    services = _image_services(file)
    executors = {env_of(s).get("AIRFLOW__CORE__EXECUTOR") for s in services.values()} - {None}
    [executor] = executors
    lines = [argv[1:] for _, argv in _lines(file) if argv[0] == "airflow"]
    apps = [argv[argv.index("--app") + 1] for _, argv in _lines(file) if argv[0] == "celery"]
    return str(executor), lines, apps


@pytest.mark.parametrize("file", FILES)
def test_every_airflow_command_line_parses_under_its_executor(file: str, tmp_path: Path) -> None:
    executor, lines, apps = _airflow_lines(file)
    assert ["db", "migrate"] in lines and ["scheduler"] in lines
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE_"))}
    env.update(
        AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__EXECUTOR=executor,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(lines), json.dumps(apps)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"bad": [], "apps": []}, f"{file} ({executor}): {result}"


def test_the_images_wheel_carries_the_airflow_folders(tmp_path: Path) -> None:
    """Built from what the Dockerfile copies before it installs, as its RUN does."""
    src = tmp_path / "src"
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("RUN pip install"):
            break
        if line.startswith("COPY "):
            *sources, dest = line.split()[1:]
            for source in sources:
                path, target = ROOT / source, src / dest
                if dest.endswith("/"):  # into the directory, under its own name
                    target = target / path.name
                if path.is_dir():
                    shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [wheel] = (tmp_path / "dist").glob("sluice-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pipeline/airflow_folders/dags/sluice_archive.py" in names
    assert "pipeline/airflow_folders/plugins/sluice_coverage.html" in names

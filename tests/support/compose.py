"""The compose files of docker/ as Compose renders them, for the tests that check them.

No Docker engine runs here, but ``config`` needs none: ``docker compose config``
(the CLI plugin) or, where that is missing, Debian's ``docker-compose config``
(scripts/ensure-compose.sh installs it). Without either, :func:`render` reads
the YAML itself (anchors merged) and fills ``${VAR...}`` from the environment
given, and the callers' validation tests skip with that reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def compose_cli() -> list[str] | None:
    """The Compose command of this machine, or None."""
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def config(path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``compose -f PATH config ARGS`` with ``env`` as the only SLUICE_* variables."""
    cli = compose_cli()
    assert cli is not None
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [*cli, "-f", str(path), "config", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**clean, **env}, check=False,
    )  # fmt: skip


#: ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``, not the escaped ``$${...}``
_VAR = re.compile(r"(?<!\$)\$\{(\w+)(?::?([-?])([^}]*))?\}")


def _fill(match: re.Match[str], env: dict[str, str]) -> str:
    name, sep, rest = match.groups()
    return env.get(name) or (rest if sep == "-" else "")


def render(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The file as Compose renders it (anchors merged, variables filled), else as YAML reads
    it with ``${VAR...}`` filled from ``env`` (empty when absent)."""
    env = env or {}
    if compose_cli() is None:
        text = _VAR.sub(lambda m: _fill(m, env), path.read_text())
        doc: dict[str, Any] = yaml.safe_load(text)
        return doc
    out = config(path, env)
    assert out.returncode == 0, f"compose config of {path.name} failed:\n{out.stderr}"
    rendered: dict[str, Any] = yaml.safe_load(out.stdout)
    return rendered


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def mounts_of(service: dict[str, Any]) -> set[tuple[str, str]]:
    """``(source, target)`` of each volume (a bind mount's source as written or resolved)."""
    out = set()
    for volume in service.get("volumes") or ():
        if isinstance(volume, str):
            source, _, target = volume.partition(":")
            out.add((source, target.split(":")[0]))
        else:
            out.add((volume.get("source", ""), volume["target"]))
    return out


def argv_of(service: dict[str, Any], key: str) -> list[str]:
    """A service's ``entrypoint`` or ``command`` as a list (a string split like a shell)."""
    value = service.get(key) or []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]

"""What the demo needs from the machine, each missing piece said in one line.

:func:`missing` returns those lines (empty: all there); the command prints
them and exits 2 instead of failing half-way through start-up with a
traceback.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.local import postgres as localpostgres
from pipeline.local import s3 as localstore
from pipeline.runtime.ports import port_free

#: Free disk the demo wants under var/ (the lake, logs, Airflow's SQLite, Spark's scratch).
MIN_FREE_BYTES = 2 << 30


def java_version() -> str | None:
    """``java -version``'s first line, or None when there is no working java."""
    exe = shutil.which("java")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "-version"], capture_output=True, timeout=30, check=False, text=True
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0] if done.returncode == 0 and lines else None


def git_ignored(path: Path, root: Path) -> bool | None:
    """Whether git ignores ``path`` in the checkout at ``root`` (None: not a git checkout)."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    if not path.absolute().is_relative_to(root.absolute()):
        return None  # outside the checkout: git add . never sees it
    done = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "-q", str(path)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def missing(
    root: Path, demo_dir: Path, ports: Iterable[tuple[int, str]], *, lake: str = "local"
) -> list[str]:
    """One line per missing prerequisite."""
    problems: list[str] = []
    if lake == "s3" and not localstore.binary_path().exists():
        problems.append(
            f"versitygw (the demo's S3 server) is not built: make install builds it into "
            f"{localstore.binary_path()}"
        )
    if java_version() is None:
        problems.append(
            "Java is missing: Spark needs Java 17 or 21 (Debian: apt-get install openjdk-17-jre-headless)"
        )
    if shutil.which("redis-server") is None:
        problems.append("redis-server is missing (Debian: apt-get install redis-server)")
    try:
        localpostgres.bin_dir()
    except ConfigError:
        problems.append(
            "PostgreSQL is missing: Airflow keeps its metadata there "
            "(Debian: apt-get install postgresql)"
        )
    for module, extra in (("airflow", "airflow"), ("pyspark", "lake"), ("deltalake", "lake")):
        if importlib.util.find_spec(module) is None:
            problems.append(
                f"{module} is not installed: pip install -e '.[{extra}]' (or make install)"
            )
    if not (Path(sys.executable).parent / "airflow").exists():
        problems.append(f"no airflow command next to {sys.executable} (make install)")
    for port, what in ports:
        if not port_free(port):
            problems.append(f"port {port} ({what}) is in use")
    probe = demo_dir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        problems.append(
            f"only {free / 2**30:.1f} GiB free under {probe}: the demo wants "
            f"{MIN_FREE_BYTES / 2**30:.0f} GiB"
        )
    if git_ignored(demo_dir / "bus" / "twin1.key", root) is False:
        problems.append(
            f"{demo_dir} is not git-ignored: the demo writes private keys there "
            "(add var/ to .gitignore or set SLUICE_VAR_DIR outside the checkout)"
        )
    return problems

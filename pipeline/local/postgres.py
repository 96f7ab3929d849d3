"""A private PostgreSQL server: Airflow's metadata database in the tests and the demo.

Debian's ``postgresql`` package (``/usr/lib/postgresql/<major>/bin``): the
cluster is made with ``initdb --auth trust`` in a temporary directory and
``postgres`` runs as a child process on a free loopback port, its Unix
socket in that directory too, so nothing of the machine's own PostgreSQL is
touched. PostgreSQL refuses to run as root: as root, the directory is handed
to the ``postgres`` user and the programs run as that user.

Nothing here fakes PostgreSQL; it is the real server, started and stopped.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.local.proc import LocalProcess
from pipeline.runtime.ports import free_port

INSTALL_HINT = (
    "PostgreSQL's server programs were not found under /usr/lib/postgresql/*/bin or on PATH. "
    "Install them (Debian/Ubuntu: 'apt-get install postgresql', macOS: 'brew install postgresql')."
)
#: The superuser of a private cluster (trust authentication on loopback only).
USER = "postgres"


def bin_dir() -> Path:
    """The directory of ``initdb`` and ``postgres`` (the newest Debian major, else PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise ConfigError(INSTALL_HINT)
    return Path(initdb).parent


def run_as() -> str | None:
    """The user PostgreSQL's programs run as: ``postgres`` when we are root (they refuse
    root), else None (ourselves)."""
    return USER if os.geteuid() == 0 else None


def _as_user() -> dict[str, Any]:
    user = run_as()
    return {"user": user} if user is not None else {}


def reachable_dir(directory: Path) -> Path:
    """``directory``, or a stand-in under the system's temporary directory when the user
    the server runs as cannot reach it (a checkout under a 0700 directory of root's).

    The stand-in's name is derived from ``directory``, so a cluster made there
    is found again by the next start.
    """
    user = run_as()
    if user is None or _reachable(pwd.getpwnam(user).pw_uid, directory):
        return directory
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"sluice-postgres-{digest}"


def _reachable(uid: int, directory: Path) -> bool:
    """Whether ``uid`` may pass through every existing ancestor of ``directory``."""
    for parent in directory.resolve().parents:
        try:
            st = parent.stat()
        except FileNotFoundError:
            continue  # made by init_cluster, with our umask's search bit
        if st.st_uid != uid and not st.st_mode & 0o001:
            return False
    return True


def _run(argv: list[str]) -> None:
    # cwd "/": initdb changes back to the caller's directory, which its user may not reach
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd="/", **_as_user())
    if done.returncode != 0:
        raise ConfigError(f"{Path(argv[0]).name} failed: {done.stderr.strip()[-500:]}")


def init_cluster(directory: Path) -> Path:
    """``initdb --auth trust`` into ``directory/data`` (made when missing); returns it.

    ``directory`` is handed to the user the server runs as (it must be able to
    reach it: not under a 0700 directory of another user).
    """
    directory.mkdir(parents=True, exist_ok=True)
    user = run_as()
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    data = directory / "data"
    _run(
        [str(bin_dir() / "initdb"), "-D", str(data), "--auth", "trust", "-U", USER,
         "-E", "UTF8", "--no-sync"],
    )  # fmt: skip
    return data


def server_argv(data: Path, port: int, socket_dir: Path) -> list[str]:
    """The ``postgres`` command of a private server: loopback only, no durability work."""
    return [
        str(bin_dir() / "postgres"), "-D", str(data), "-p", str(port),
        "-k", str(socket_dir), "-c", "listen_addresses=127.0.0.1",
        # a throwaway cluster: no durability work on a busy machine
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        "-c", "max_connections=200",
    ]  # fmt: skip


class LocalPostgres(LocalProcess):
    """One ``postgres`` child process with its cluster in a temporary directory."""

    stop_signal = signal.SIGINT  # "fast" shutdown
    stop_wait_s = 30.0

    def __init__(self, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.directory: Path | None = None
        super().__init__()

    def url(self, database: str, driver: str = "psycopg2") -> str:
        """A SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+{driver}://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        # Not under pytest's 0700 temp root: the postgres user must reach the directory.
        self.directory = Path(tempfile.mkdtemp(prefix="sluice-postgres-"))
        data = init_cluster(self.directory)
        log = (self.directory / "postgres.log").open("ab")
        self.proc = subprocess.Popen(
            server_argv(data, self.port, self.directory),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            **_as_user(),
        )
        log.close()
        bindir = bin_dir()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(
                    f"postgres exited with {self.proc.returncode}; see {self.directory}/postgres.log"
                )
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                check=False,
            )
            if ready.returncode == 0:
                return self
            time.sleep(0.1)
        self.stop()
        raise ConfigError(f"postgres on port {self.port} did not accept connections in {timeout}s")

    def create_database(self, name: str, *, template: str = "") -> str:
        """Create database ``name`` (a copy of database ``template`` if given, which nobody
        may be connected to); returns its psycopg2 URL."""
        argv = [str(bin_dir() / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER]
        self._run([*argv, *(("--template", template) if template else ()), name])
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), waiting for exit; removes the cluster. Safe to call twice."""
        super().stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def _run(self, argv: list[str]) -> None:
        _run(argv)

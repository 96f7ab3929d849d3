"""A private ``redis-server`` process: used by ``make demo`` and by the test fixtures.

It runs from PATH on a free loopback port in its own directory. Nothing here
fakes Redis: it is the real server, started and stopped as a child process.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from pipeline.errors import ConfigError, RedisUnavailable
from pipeline.local.proc import LocalProcess
from pipeline.runtime.ports import free_port

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: "
    "'apt-get install redis-server', macOS: 'brew install redis') or point "
    "SLUICE_REDIS_URL / SLUICE_TEST_REDIS_URL at a running server."
)


class LocalRedis(LocalProcess):
    """One ``redis-server`` child process in ``directory``.

    ``aof=True`` turns on the append-only file so data survives :meth:`restart`
    and even :meth:`kill`.
    """

    def __init__(self, directory: Path, *, port: int | None = None, aof: bool = False) -> None:
        self.directory = Path(directory)
        self.port = port or free_port()
        self.aof = aof
        super().__init__()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            raise ConfigError(INSTALL_HINT)
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            exe,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            "--appendfsync", "always" if self.aof else "no",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisUnavailable(
                    f"redis-server exited with {self.proc.returncode}; see {self.directory}/redis.log"
                )
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisUnavailable(f"redis-server on port {self.port} did not answer in {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

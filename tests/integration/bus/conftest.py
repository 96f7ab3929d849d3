"""Twins for bus tests: each with its own real redis-server, key pair and port.

``twins(n)`` builds the directory file for ``n`` twins; each twin can run its
bus in-process (:meth:`Twin.start_bus`) or as a real ``sluice bus`` child
process (:meth:`Twin.spawn`), which a test may kill -9.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.bus.client import BusClient
from pipeline.bus.config import BusConfig
from pipeline.bus.directory import FileDirectory
from pipeline.bus.process import BusProcess
from pipeline.bus.server import BusServer
from pipeline.bus.signing import Signer
from pipeline.local.redisserver import LocalRedis
from pipeline.redisio.durability import Durability
from pipeline.runtime.ports import free_port
from tests.support.poll import until

ROOT = Path(__file__).resolve().parents[3]
FIRST_TWIN = 1001

#: The bus tests' name for the one poller of the tests (tests/support/poll.py).
eventually = until


@dataclass
class Twin:
    id: int
    redis: LocalRedis
    port: int
    signer: Signer
    key_file: Path
    directory_file: Path
    bus: BusProcess | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_file: Path | None = None
    closers: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.redis.url

    def config(self, **overrides: Any) -> BusConfig:
        values: dict[str, Any] = {
            "twin": self.id,
            "listen": f"127.0.0.1:{self.port}",
            "retry_base_s": 0.05,
            "retry_max_s": 0.5,
            "scrub_interval_s": 0.1,
            "http_workers": 16,
        }
        values.update(overrides)
        return BusConfig(**values)

    async def start_bus(self, durability: Durability | None = None, **overrides: Any) -> BusProcess:
        directory = FileDirectory.load(self.directory_file)
        self.bus = BusProcess(
            self.config(**overrides),
            redis_url=self.url,
            directory=directory,
            signer=self.signer,
            durability=durability,
        )
        await self.bus.start()
        return self.bus

    async def stop_bus(self) -> None:
        if self.bus is not None:
            await self.bus.stop()
            self.bus = None

    def spawn(self, *extra: str) -> subprocess.Popen[bytes]:
        """Run ``sluice bus`` for this twin as a child process; return once it listens."""
        assert self.proc is None or self.proc.poll() is not None
        self._close_pipe()  # of the previous child, if any
        self.log_file = self.key_file.with_suffix(".log")
        env = {
            **os.environ,
            "SLUICE_BUS_RETRY_BASE_S": "0.05",
            "SLUICE_BUS_RETRY_MAX_S": "0.5",
            "SLUICE_LOG_LEVEL": "WARNING",
        }
        env.pop("PYTHONASYNCIODEBUG", None)
        args = [
            sys.executable, "-m", "pipeline.cli", "bus",
            "--twin", str(self.id),
            "--listen", f"127.0.0.1:{self.port}",
            "--directory", str(self.directory_file),
            "--key", str(self.key_file),
            "--redis", self.url,
            *extra,
        ]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env=env
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "listening" (or EOF if it died)
        if b"listening" not in line:
            self.proc.wait(5)
            self._close_pipe()
            raise RuntimeError(f"bus {self.id} did not start: {self.log_file.read_text()}")
        return self.proc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_pipe()

    def terminate(self) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            finally:
                self._close_pipe()
        self._close_pipe()
        return self.proc.returncode if self.proc else None

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def client(self) -> BusClient:
        client = BusClient.from_url(self.url, max_connections=32)
        self.closers.append(client)
        return client

    def server(self, **kwargs: Any) -> BusServer:
        server = BusServer.from_url(self.url, **kwargs)
        self.closers.append(server)
        return server


@pytest.fixture
async def twins(
    redis_factory: Callable[..., LocalRedis], tmp_path: Path
) -> AsyncIterator[Callable[[int], list[Twin]]]:
    made: list[Twin] = []

    def make(n: int) -> list[Twin]:
        directory_file = tmp_path / "twins.json"
        new = []
        for i in range(n):
            signer = Signer.generate()
            key_file = tmp_path / f"twin{FIRST_TWIN + i}.key"
            signer.write(key_file)
            new.append(
                Twin(
                    id=FIRST_TWIN + i,
                    redis=redis_factory(),
                    port=free_port(),
                    signer=signer,
                    key_file=key_file,
                    directory_file=directory_file,
                )
            )
        doc = {
            str(t.id): {"url": f"http://127.0.0.1:{t.port}", "key": t.signer.public_key}
            for t in new
        }
        directory_file.write_text(json.dumps(doc))
        made.extend(new)
        return new

    yield make
    for twin in made:
        await twin.stop_bus()
        twin.kill()
        for closer in twin.closers:
            await closer.close()

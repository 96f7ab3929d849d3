"""``sluice spark``: a local Spark Connect server with Delta, for lake jobs to share.

The server is the ``SparkConnectServer`` class of the ``spark-connect`` jar
that ships in the pyspark wheel, started with pyspark's own ``spark-submit``
as a child JVM with the same settings as every lake session
(:func:`pipeline.lake.spark.session.spark_conf`: Delta extension and catalog, the
cached Delta jars) and this interpreter as ``PYSPARK_PYTHON``, so its Python
workers import pyarrow and ``pipeline`` (the ``redis-streams`` data source).

Lifecycle guarantees a caller can rely on:

- :meth:`ConnectServer.start` returns once the gRPC port accepts connections
  (or raises :class:`SparkUnavailable` with the tail of the log when the JVM
  exits or does not listen within ``ready_timeout_s``);
- the JVM runs in its own process group and gets SIGTERM when the process
  that started it dies (Linux ``PR_SET_PDEATHSIG``), so it never outlives
  its owner;
- :meth:`ConnectServer.stop` sends SIGTERM to the group (Spark's shutdown
  hooks stop the context and its Python workers), then SIGKILL after
  :data:`STOP_GRACE_S`; safe to call twice.

The JVM's output (Spark's log4j lines, Ivy) goes to a log file, never to the
terminal or a task log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from pipeline.errors import SparkUnavailable
from pipeline.lake.spark.session import probe, require_java, spark_conf
from pipeline.runtime.parentdeath import bound_to_parent
from pipeline.runtime.ports import port_free
from pipeline.settings import Settings

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Seconds the JVM may take to listen (a cold start with Ivy resolution is slow).
READY_TIMEOUT_S = 180.0
#: Seconds between SIGTERM and SIGKILL when stopping the server.
STOP_GRACE_S = 15.0
#: Lines of the log quoted when the server fails to start.
LOG_TAIL = 15


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (``bin/spark-submit``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


class ConnectServer:
    """One local Spark Connect server process; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        *,
        log_path: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int | None = None,
        master: str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.host = host
        self.port = port if port is not None else settings.spark.connect_port
        self.master = master or settings.spark.master
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def command(self) -> list[str]:
        conf = {
            **spark_conf(self.settings),
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.port.maxRetries": "0",
        }
        cmd = [
            str(spark_home() / "bin" / "spark-submit"),
            "--class", SERVER_CLASS,
            "--name", "sluice-connect",
            "--master", self.master,
            "--driver-memory", self.settings.spark.driver_memory,
        ]  # fmt: skip
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd

    def start(self) -> ConnectServer:
        """Start the JVM and wait until it listens; raises SparkUnavailable if it does not."""
        if self.proc is not None:
            raise RuntimeError("the server was started already")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        env.pop("SPARK_REMOTE", None)
        self.proc = subprocess.Popen(
            bound_to_parent(self.command()),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise SparkUnavailable(
                    f"the Spark Connect server exited with code {self.proc.returncode} "
                    f"before listening on {self.url}; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                probe(self.url, timeout_s=1.0)
                return
            except SparkUnavailable:
                pass
            if time.monotonic() > deadline:
                raise SparkUnavailable(
                    f"the Spark Connect server did not listen on {self.url} within "
                    f"{self.ready_timeout_s:g}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = LOG_TAIL) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """Stop the JVM and everything it started; returns its exit code. Safe to call twice."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace_s)
        # Python workers the JVM forked share its group: take any straggler down.
        _signal_group(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def __enter__(self) -> ConnectServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --- the command ---------------------------------------------------------------


def _parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice spark",
        description="run a local Spark Connect server with Delta for the lake jobs "
        "(point them at it with SLUICE_SPARK_REMOTE=<printed URL>)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port",
        type=int,
        default=settings.spark.connect_port,
        help="Spark Connect port (SLUICE_SPARK_CONNECT_PORT; default: %(default)s)",
    )
    parser.add_argument("--master", default=settings.spark.master, help="Spark master")
    parser.add_argument(
        "--log-file",
        default=str(Path(settings.var_dir) / "spark-connect.log"),
        help="where the JVM's output goes",
    )
    return parser


def _say(text: str, stream: IO[str] | None = None) -> None:
    print(text, file=stream or sys.stderr, flush=True)  # noqa: T201


def main(argv: Sequence[str]) -> int:
    """Start the server, print its URL, and run until SIGTERM/SIGINT; then stop the JVM."""
    settings = Settings.load()
    try:
        args = _parser(settings).parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    require_java()  # one line, before anything starts
    if not port_free(args.port, args.host):
        # The readiness check is a TCP connect: it would take the other program for ours.
        _say(f"sluice spark: port {args.port} on {args.host} is in use; choose another with --port")
        return 2
    server = ConnectServer(
        settings, host=args.host, port=args.port, master=args.master, log_path=args.log_file
    )
    stopping = ready = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if not ready:  # still starting: abandon the start (its cleanup stops the JVM)
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        _say(f"sluice spark: starting ({args.master}), log {args.log_file}")
        server.start()
        ready = True
        _say(server.url, sys.stdout)
        _say(f"sluice spark: listening; export SLUICE_SPARK_REMOTE={server.url}")
        while not stopping and server.alive():
            time.sleep(0.2)
        if not stopping:
            _say(f"sluice spark: the server exited; log {args.log_file}:\n{server.log_tail()}")
            return 1
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _say("sluice spark: stopped")

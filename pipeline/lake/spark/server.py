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
- a task's fatal error (a ``java.lang.OutOfMemoryError``) fails that task's
  job only: by default Spark exits the JVM that ran the task, which with a
  local master is the server every job shares;
- ``sluice spark`` starts the Python workers of the lake jobs' shared session
  before it prints its URL (:func:`warm_workers`), and when its JVM exits on
  its own it says why in one line (:func:`exit_cause`: exit code or signal,
  and the log line naming the cause).

The JVM's output (Spark's log4j lines, Ivy) goes to a log file, never to the
terminal or a task log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

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
#: Bytes of one start's log searched for why the JVM exited.
CAUSE_SCAN_BYTES = 32 << 20
#: Seconds ``sluice spark`` gives its Python workers to start before it prints its URL anyway.
WARM_TIMEOUT_S = 300.0


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
        #: where this start's lines begin in the log (it is appended to across starts)
        self._log_from = 0

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def command(self) -> list[str]:
        conf = {
            **spark_conf(self.settings),
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.port.maxRetries": "0",
            # A local master runs every job's tasks in this one JVM, and by default a task's
            # fatal error (a java.lang.OutOfMemoryError) exits it (code 52, after its shutdown
            # hooks): one job out of heap stopped the server every other job shares (issue 33,
            # "the restarted sluice spark stopped by itself"). Now only that task fails.
            "spark.executor.killOnFatalError.depth": "0",
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
        self._log_from = self._log.tell()
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

    def exit_cause(self) -> str:
        """Why the JVM exited, in one line (:func:`exit_cause`); empty while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_from)
                text = log.read(CAUSE_SCAN_BYTES).decode(errors="replace")
        except OSError:
            text = ""
        return exit_cause(self.proc.returncode, text)

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


#: Exit codes a Spark JVM gives itself (``SparkExitCode``).
_SPARK_EXITS = {50: "an uncaught exception", 52: "out of memory"}
#: Lines of a JVM's log that say why it stopped, most telling first.
_CAUSES = (
    re.compile(r"Uncaught exception in thread"),
    re.compile(r"java\.lang\.OutOfMemoryError.*"),
    re.compile(r"RECEIVED SIGNAL \w+"),
)


def exit_cause(code: int, log: str) -> str:
    """Why a server's JVM exited, in one line: its exit code or signal, what Spark's code
    means, and the log line that names the cause (the first error of the fatal kind).

    >>> exit_cause(-9, "")
    'killed by SIGKILL'
    """
    if code < 0:
        text = f"killed by {_signal_name(-code)}"
    elif code > 128 and _signal_name(code - 128):
        text = f"exit code {code}: {_signal_name(code - 128)}, its shutdown hooks ran"
    else:
        meaning = _SPARK_EXITS.get(code)
        text = f"exit code {code}" + (f": {meaning}" if meaning else "")
    lines = log.splitlines()
    for pattern in _CAUSES:
        for at, line in enumerate(lines):
            found = pattern.search(line)
            if found is None:
                continue
            said = line[found.start() :].strip()
            if said.startswith("Uncaught") and at + 1 < len(lines):
                said += ": " + lines[at + 1].strip()  # the exception, on the next line
            return f"{text} ({said[:300]})"
    return text


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return ""


def warm_workers(
    url: str, master: str, jobs_url: str = "", timeout_s: float = WARM_TIMEOUT_S
) -> float:
    """Start the server's Python workers for the lake jobs' session; the seconds it took.

    The server starts a Python worker daemon per session (its imports: pyarrow,
    redis-py, the data source) on the first Python task; the lake jobs share
    one session per URL they are given (``jobs_url``, default ``url``:
    :func:`~pipeline.lake.spark.session.shared_session_id`), so one small
    Python task per core in that session, run now by a child Connect client of
    ``url``, spares the first job that start (~160 s on a loaded machine).
    Raises :class:`SparkUnavailable` (one line) when it fails.
    """
    from pipeline.lake.spark.session import shared_session_id

    found = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master.strip())
    cores = os.cpu_count() or 2
    slots = cores if found is None or found.group(1) == "*" else int(found.group(1))
    target = f"{url}/;session_id={shared_session_id(jobs_url or url)}"
    began = time.monotonic()
    try:
        subprocess.run(
            [sys.executable, "-m", "pipeline.lake.spark.server", "--warm", target, str(slots)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=timeout_s, check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SparkUnavailable(f"not warm within {timeout_s:g}s") from None
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise SparkUnavailable(said[-1][:300] if said else f"exit code {exc.returncode}") from None
    return time.monotonic() - began


def _warm_client(url: str, slots: int) -> None:
    """``--warm``: one Python task per slot in the shared session of ``url``."""
    from pipeline.lake.spark.session import close_session, connect_session

    spark = connect_session(url)
    try:
        spark.range(0, slots, 1, slots).mapInArrow(_same, "id long").collect()
    finally:
        close_session(spark)


def _same(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


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
        try:
            # the jobs' URL may name this server otherwise (in docker/: sc://spark-connect:15002)
            took = warm_workers(server.url, args.master, settings.spark.remote)
            _say(f"sluice spark: Python workers started in {took:.1f}s")
        except SparkUnavailable as exc:  # the first job starts them itself: slower, not broken
            _say(f"sluice spark: could not start the Python workers ahead ({exc})")
        ready = True
        _say(server.url, sys.stdout)
        _say(f"sluice spark: listening; export SLUICE_SPARK_REMOTE={server.url}")
        while not stopping and server.alive():
            time.sleep(0.2)
        if not stopping:
            _say(
                f"sluice spark: the server exited ({server.exit_cause()}); log {args.log_file}:"
                f"\n{server.log_tail()}"
            )
            return 1
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _say("sluice spark: stopped")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--warm"]:
        _warm_client(sys.argv[2], int(sys.argv[3]))

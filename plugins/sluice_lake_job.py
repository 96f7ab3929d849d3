"""Run one lake job as a child process: ``python -m pipeline.lake.cli JOB ...``.

With ``SLUICE_SPARK_REMOTE`` set the child is a light Spark Connect client
(a Python process of ~100 MB that starts in about a second, no JVM of its
own); without it the child starts its own local JVM.

Stopping: :func:`stop_running_jobs` (what ``LakeJobOperator.on_kill`` calls
when a task is marked failed or times out) sends SIGTERM to every job this
process runs; the job interrupts its Spark work and exits without committing.

The child's story lines (``LEVEL message``, see ``pipeline.lake.cli``) are
logged at their own level, so a WARNING of the job is a WARNING of the task.

Why a child process and not an in-process SparkSession: a task on
LocalExecutor runs in a forked, supervised worker process. A JVM started
there (py4j gateway, Spark driver) outlives a killed task, holds a 2 GB heap
per worker, and a second task in the same process would reuse a session whose
master or settings may differ. One child per task gives each job a clean
interpreter and JVM, an enforced wall-clock limit, and one process group that
is killed as a whole on timeout, on task termination (SIGTERM arrives as an
exception and the ``finally`` kills the group) and, on Linux, when the task
process itself dies (``PR_SET_PDEATHSIG``). The child's stderr (its logging
and Spark's) streams into the task log line by line; its stdout is one JSON
document, the job's result, which becomes the task's XCom value.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from pipeline.errors import LakeJobError

log = logging.getLogger(__name__)

#: The module every job goes through (its ``main(argv)`` is ``sluice lake``).
CLI_MODULE = "pipeline.lake.cli"
#: Lines of the child's stderr kept for the error message of a failed job.
TAIL_LINES = 40
#: Largest stdout accepted from a job (its JSON result).
MAX_STDOUT = 4 << 20
#: Seconds between SIGTERM and SIGKILL when stopping a job.
KILL_GRACE_S = 10.0
#: Level names a job's stderr line may start with.
LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}

#: Jobs this process is running now (what :func:`stop_running_jobs` stops).
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()

#: Child bootstrap: ask Linux for SIGTERM when the task process dies
#: (PR_SET_PDEATHSIG; done in the child itself, as ``preexec_fn`` is unsafe in
#: a threaded parent), exit if that parent is already gone, then run the CLI.
_BOOT = """\
import ctypes, os, runpy, signal, sys
parent, module = int(sys.argv.pop(1)), sys.argv.pop(1)
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
if os.getppid() != parent:
    sys.exit("sluice lake job: the task process that started this job is gone")
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def run_lake_job(
    job: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 1800.0,
    python: str | None = None,
    module: str = CLI_MODULE,
    report_codes: frozenset[int] = frozenset(),
) -> Any:
    """Run ``python -m pipeline.lake.cli JOB ARGS`` and return its parsed JSON stdout.

    ``module`` replaces ``pipeline.lake.cli`` (any module with a ``__main__`` guard).
    ``report_codes`` are exit codes that still carry a JSON result (``audit``
    exits 1 when it found problems): with one of them and a JSON stdout the
    result is returned, without JSON it is a failure like any other.
    ``env`` is added on top of this process's environment (``SLUICE_*``
    settings for the job). Raises :class:`LakeJobError` on a non-zero exit
    (with the last lines of stderr, where the CLI prints its error), on
    timeout (the whole process group is killed first) and on stdout that is
    not JSON.
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    cmd = [python or sys.executable, "-c", _BOOT, str(os.getpid()), module, job, *args]
    log.info("lake job: python -m %s %s", module, " ".join([job, *args]))
    proc = _spawn(cmd, {**os.environ, **(env or {})})
    output = _Output(proc)
    returncode = _wait(job, proc, output, timeout_s)
    if not output.join(timeout=5.0):
        # Something the job started still holds its pipes: stop the whole group.
        _killpg(proc.pid)
        output.join()
    return _result(job, returncode, output, report_codes)


def _spawn(cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start the job in its own process group and count it among the running jobs."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    return proc


class _Output:
    """The job's pipes, read by two threads: stderr logged line by line (its tail kept), stdout kept."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.out = bytearray()
        self._readers = [
            threading.Thread(target=_pump_stderr, args=(proc.stderr, self.tail), daemon=True),
            threading.Thread(target=_pump_stdout, args=(proc.stdout, self.out), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self.tail)

    def join(self, timeout: float = KILL_GRACE_S) -> bool:
        """Join both readers within ``timeout`` seconds in all; True when both finished."""
        return _join(self._readers, timeout)


def _wait(job: str, proc: subprocess.Popen[bytes], output: _Output, timeout_s: float) -> int:
    """The job's exit code; on timeout, or when this task is stopped mid-job, the job is stopped."""
    try:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            output.join()
            raise LakeJobError(
                f"lake job {job!r} exceeded its {timeout_s:g}s limit and was killed",
                returncode=proc.returncode,
                stderr_tail=output.stderr_tail,
            ) from None
    finally:
        if proc.poll() is None:  # task terminated (SIGTERM -> exception) mid-job
            _stop(proc)
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


def _result(job: str, returncode: int, output: _Output, report_codes: frozenset[int]) -> Any:
    """The job's JSON result, or the :class:`LakeJobError` its exit code and output say."""
    out, stderr_tail = output.out, output.stderr_tail
    if returncode in report_codes and out.strip():
        try:
            return parse_result(job, out.decode("utf-8", "replace"), stderr_tail=stderr_tail)
        except LakeJobError:
            pass  # no result after all: report the exit code below
    if returncode in (143, -signal.SIGTERM):
        raise LakeJobError(
            f"lake job {job!r} was stopped (SIGTERM) before it committed",
            returncode=returncode,
            stderr_tail=stderr_tail,
        )
    if returncode != 0:
        raise LakeJobError(
            f"lake job {job!r} failed with exit code {returncode}: {_error_line(output.tail)}",
            returncode=returncode,
            stderr_tail=stderr_tail,
        )
    if len(out) > MAX_STDOUT:
        raise LakeJobError(
            f"lake job {job!r} printed more than {MAX_STDOUT} bytes on stdout",
            returncode=returncode,
            stderr_tail=stderr_tail,
        )
    return parse_result(job, out.decode("utf-8", "replace"), stderr_tail=stderr_tail)


def parse_result(job: str, stdout: str, *, stderr_tail: str = "") -> Any:
    """The JSON result of a job: the whole stdout, or else its last non-empty line."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    if lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    raise LakeJobError(
        f"lake job {job!r} did not print a JSON result (stdout: {text[-200:]!r})",
        returncode=0,
        stderr_tail=stderr_tail,
    )


def _error_line(tail: Sequence[str]) -> str:
    """The CLI's own error line (``sluice lake: ...``), not the JVM's shutdown chatter after it."""
    for line in reversed(tail):
        if line.startswith(("sluice ", "sluice:")):
            return line
    return tail[-1] if tail else "(no output)"


def stop_running_jobs() -> int:
    """SIGTERM every lake job this process runs (then SIGKILL after the grace); returns how many.

    Safe to call from a signal handler (Airflow calls ``on_kill`` from its
    SIGTERM handler): it only signals and waits on the children.
    """
    with _RUNNING_LOCK:
        running = [proc for proc in _RUNNING if proc.poll() is None]
    for proc in running:
        log.warning("stopping lake job pid %d (task killed)", proc.pid)
        _stop(proc)
    return len(running)


def forward_line(line: str) -> None:
    """Log one stderr line of a job at its own level (``LEVEL message``), else as INFO."""
    level, _, rest = line.partition(" ")
    number = LEVELS.get(level)
    if number is not None and rest:
        log.log(number, "%s", rest)
    elif line.startswith("sluice "):
        log.error("%s", line)
    else:
        log.info("| %s", line)


def _pump_stderr(stream: IO[bytes], tail: collections.deque[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            tail.append(line)
            forward_line(line)
    stream.close()


def _pump_stdout(stream: IO[bytes], out: bytearray) -> None:
    while chunk := stream.read(65536):
        if len(out) <= MAX_STDOUT:
            out.extend(chunk)
    stream.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job's process group, then SIGKILL it after a grace period."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure nothing it started (a JVM) stays behind.
        _killpg(proc.pid)
        return


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _join(threads: Sequence[threading.Thread], timeout: float = KILL_GRACE_S) -> bool:
    """Join the pipe readers within ``timeout`` seconds in all; True when all finished."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)

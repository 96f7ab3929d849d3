"""How one lake job stops: SIGTERM handling, and the archive locks a stop releases.

See :class:`Stopper`. A job that writes a stream holds its archive lock
(:mod:`pipeline.lake.lock`) through :func:`stream_lock`, which tells the
stopper, so that a stop releases the lock before the process exits.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

from pipeline.errors import JobCancelled
from pipeline.lake.spark.lazyspark import LazySpark
from pipeline.settings import Settings

log = logging.getLogger("pipeline.lake.job")

EXIT_CANCELLED = 143
#: Longest a stopped job takes to exit (interrupt, lock release), in seconds.
STOP_GRACE_S = 5.0


class Stopper:
    """SIGTERM handling of one job: stop at once, commit nothing further.

    The handler itself only sets :attr:`stopping` and starts a thread (it
    never raises into whatever library call the main thread is in: some
    swallow exceptions). That thread interrupts this job's Spark operations
    (on Connect by tag, so the blocked call in the main thread fails at once),
    releases the archive lock and ends the process with exit code 143 after
    at most :data:`STOP_GRACE_S`. :meth:`check` (called before every final
    commit, with the lock's own check) raises :class:`JobCancelled` once
    stopping, so nothing is logged as archived after the signal.
    """

    def __init__(self, spark: LazySpark | None) -> None:
        self.spark = spark
        #: the archive lock each thread holds (archive-streams holds several, one per worker)
        self._locks: dict[int, Any] = {}
        self.stopping = threading.Event()

    @property
    def lock(self) -> Any:
        """The archive lock the calling thread holds, or None."""
        return self._locks.get(threading.get_ident())

    @lock.setter
    def lock(self, lock: Any) -> None:
        if lock is None:
            self._locks.pop(threading.get_ident(), None)
        else:
            self._locks[threading.get_ident()] = lock

    def install(self) -> Callable[[], None]:
        try:
            previous = signal.signal(signal.SIGTERM, self._handler)
        except ValueError:  # not the main thread (in-process callers): no signal handling
            return lambda: None

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        return restore

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        threading.Thread(target=self._stop, args=(signum,), name="sluice-stop", daemon=True).start()

    def _stop(self, signum: int) -> None:
        log.error("stopped by signal %d: interrupting the job; nothing more is committed", signum)
        deadline = threading.Timer(STOP_GRACE_S, lambda: os._exit(EXIT_CANCELLED))
        deadline.daemon = True
        deadline.start()
        if self.spark is not None:
            self.spark.interrupt()
        for lock in list(self._locks.values()):
            lock.release()
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        os._exit(EXIT_CANCELLED)

    def check(self) -> None:
        if self.stopping.is_set():
            raise JobCancelled("stopped by SIGTERM before it committed")
        if self.lock is not None:
            self.lock.check()


@contextmanager
def stream_lock(settings: Settings, stopper: Stopper, stream: str, owner: str) -> Iterator[Any]:
    """Hold ``stream``'s archive lock in the settings' lake; the stopper knows it, so a stop
    releases it."""
    from pipeline.lake.lock import StreamLock

    with StreamLock(
        settings.redis.url, stream, lake=settings.lake, owner=owner,
        wait_s=settings.lake.lock_wait_s,
    ) as lock:  # fmt: skip
        if lock.waited_s > 0.5:
            log.info("waited %.1fs for the archive lock of %s", lock.waited_s, stream)
        stopper.lock = lock
        try:
            yield lock
        finally:
            stopper.lock = None

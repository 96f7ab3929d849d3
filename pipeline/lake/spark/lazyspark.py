"""A stand-in for a job's SparkSession that starts the real one on first use.

A lake job that never touches Spark (an interval already archived, or with
nothing in Redis) never starts a JVM or opens a Connect channel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pipeline.settings import Settings

log = logging.getLogger("pipeline.lake.job")

#: Seconds between two looks for a lost Connect server while :meth:`LazySpark.rejoin` waits.
REJOIN_POLL_S = 1.0
#: Seconds one such look (a TCP connect) may take.
REJOIN_PROBE_S = 1.0
#: Most times one job rejoins a lost Connect server; lost once more, its streams fail.
MAX_REJOINS = 5


class LazySpark:
    """Stands in for a SparkSession and builds the real one on first use.

    Jobs receive it where they take ``spark``; a job that never touches Spark
    (an interval already archived, a job that finds nothing to do) never
    starts a JVM or opens a Connect channel. On a Connect server every
    operation of this job carries :attr:`tag`, so :meth:`interrupt` stops this
    job's work and nobody else's.
    """

    def __init__(self, settings: Settings, app_name: str) -> None:
        self._settings = settings
        self._app_name = app_name
        self._session: Any = None
        self._guard = threading.RLock()
        #: threads that added :attr:`tag` to the (Connect) session
        self._tagged: set[int] = set()
        self.tag = ""
        #: seconds it took to get the session (0 when never started)
        self.start_s = 0.0
        #: sessions dropped after their Connect server was lost (:meth:`rejoin`)
        self.generation = 0
        self._rejoining = threading.Lock()
        self._gave_up = ""

    @property
    def started(self) -> bool:
        """True once the session was built (and still after :meth:`close`)."""
        return self.start_s > 0

    @property
    def mode(self) -> str:
        if self._settings.spark.remote:
            return "Spark Connect " + str(self._settings.spark.remote)
        return "local Spark " + str(self._settings.spark.master)

    def get(self) -> Any:
        """The session, built on first use; safe from several threads (one is built).

        A Connect session's tags belong to the thread that adds them, so each
        thread that uses the session adds this job's tag for itself.
        """
        with self._guard:
            if self._session is None:
                from pipeline.lake.spark.session import build_session, is_connect, job_tag

                began = time.perf_counter()
                session = build_session(self._settings, app_name=self._app_name)
                if is_connect(session):
                    self.tag = job_tag()
                self._session = session
                self.start_s = max(time.perf_counter() - began, 1e-6)
                log.info("%s session ready in %.2fs", self.mode, self.start_s)
            session = self._session
            if self.tag and threading.get_ident() not in self._tagged:
                session.addTag(self.tag)
                self._tagged.add(threading.get_ident())
        return session

    def rejoin(self, seen: int, wait_s: float, check: Callable[[], None]) -> bool:
        """After the Connect server was lost: wait up to ``wait_s`` for it to listen again,
        then drop the session, so the next use builds one on the server that is back.

        ``seen`` is the :attr:`generation` the caller's failed work ran on. Threads that
        lost the same server wait for the first one's outcome: True when a session newer
        than ``seen`` can be built (the server is back), False when the server did not
        come back in time (then at once for every later caller too). ``check`` is called
        while waiting (a stop raises out of it). A local session never rejoins, nor a job
        that never reached its server (a server down from the start is one line at once).
        """
        from pipeline.errors import SparkUnavailable
        from pipeline.lake.spark.session import probe

        url = self._settings.spark.remote
        if not url or not self.started:
            return False
        with self._rejoining:
            if self.generation != seen:
                return True
            if self._gave_up:
                return False
            if self.generation >= MAX_REJOINS:
                self._gave_up = f"lost {self.generation + 1} times in one job"
                log.error("the Spark Connect server at %s: %s", url, self._gave_up)
                return False
            began = time.monotonic()
            log.warning(
                "the Spark Connect server at %s went away: waiting up to %.0fs for it to "
                "come back", url, wait_s,
            )  # fmt: skip
            while True:
                check()
                try:
                    probe(url, timeout_s=REJOIN_PROBE_S)
                    break
                except SparkUnavailable:
                    if time.monotonic() - began >= wait_s:
                        self._gave_up = f"not back within {wait_s:g}s"
                        log.error("the Spark Connect server at %s: %s", url, self._gave_up)
                        return False
                    time.sleep(REJOIN_POLL_S)
            with self._guard:
                # The old client is left to the garbage collector: closing it would wait on
                # release calls to the server it lost.
                self._session = None
                self._tagged.clear()
                self.generation += 1
            log.info(
                "the Spark Connect server at %s is back after %.1fs: resuming", url,
                time.monotonic() - began,
            )  # fmt: skip
            return True

    @property
    def gave_up(self) -> str:
        """Why :meth:`rejoin` stopped waiting (empty while it never did)."""
        return self._gave_up

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy/pickle probes: never start Spark for them
            raise AttributeError(name)
        return getattr(self.get(), name)

    def interrupt(self) -> None:
        """Stop this job's running Spark operations (best effort, bounded by the client's retries)."""
        session = self._session
        if session is None:
            return
        try:
            if self.tag:
                session.interruptTag(self.tag)
            else:
                session.sparkContext.cancelAllJobs()
        except Exception as exc:  # noqa: BLE001 - the job fails already; say why the interrupt did not land
            log.warning("could not interrupt the Spark work: %s", str(exc).splitlines()[0][:200])

    def close(self) -> None:
        session, self._session = self._session, None
        self._tagged.clear()
        if session is None:
            return
        from pipeline.lake.spark.session import close_session

        try:
            close_session(session)
        except Exception as exc:  # noqa: BLE001 - closing a dead server's channel must not hide the result
            log.debug("closing the Spark session failed: %s", exc)

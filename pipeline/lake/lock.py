"""The archive lock of a stream in one lake: one job at a time writes the stream's rows there.

A Redis lease (``SET key token NX PX ttl``) under :func:`pipeline.keys.archive_lock`,
renewed by a background thread every ``ttl / 3`` while the job runs and
released with a compare-and-delete, so a job only ever extends or frees its
own lease. Archive, canonical and trim of one stream take it; two Airflow
tasks on the same stream and lake (a backfill next to the scheduled run, a
manual trigger) therefore run one after the other instead of racing their
Delta commits. A waiter polls for at most ``wait_s`` seconds and then fails
with a :class:`LockBusy` naming the holder.

The key names the lake as well as the stream (:func:`lake_id`: its URI, and
the S3 endpoint of a lake on object storage), so jobs of two lakes that
archive the same Redis stream (two deployments on one Redis) never wait for
each other: their commits go to different tables. The key keeps the stream
name as its hash tag, so it lives in the stream's slot on a Redis Cluster.

If renewal fails (Redis down, or the lease expired because the process
stalled for longer than the TTL) :meth:`StreamLock.check` raises, and jobs call
it right before their last commit, so a job that lost its lease never
records an interval another job may be writing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from types import TracebackType
from typing import Any

from pipeline import keys
from pipeline.errors import LockBusy, LockLost, RedisUnavailable
from pipeline.redisio.conn import UNAVAILABLE, Role, connect_sync
from pipeline.settings import LakeSettings

log = logging.getLogger(__name__)

#: Lease length; renewed every third of it.
TTL_MS = 60_000
#: Seconds between two attempts of a waiting job.
POLL_S = 0.5

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def lake_id(lake: LakeSettings) -> str:
    """What tells a lake from another in its archive locks: a digest of its address.

    The URI (a local lake's is absolute already) and, on object storage, the
    endpoint: one bucket name on two S3 servers is two lakes.
    """
    address = lake.uri.rstrip("/")
    if lake.remote:
        address = f"{lake.s3_endpoint or 'aws'} {address}"
    return hashlib.sha256(address.encode()).hexdigest()[:16]


class StreamLock:
    """The archive lock of one stream of one lake, as a context manager; see the module docstring."""

    def __init__(
        self,
        redis_url: str,
        stream: str,
        *,
        lake: LakeSettings,
        owner: str = "",
        wait_s: float = 600.0,
        ttl_ms: int = TTL_MS,
    ) -> None:
        if ttl_ms < 1000:
            raise ValueError("ttl_ms must be at least 1000")
        self.stream = stream
        self.lake = lake.uri
        self.key = keys.archive_lock(stream, lake_id(lake))
        self.wait_s = wait_s
        self.ttl_ms = ttl_ms
        label = owner or "job"
        self.token = f"{label}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._client: Any = connect_sync(redis_url, Role.LAKE)
        self._stop = threading.Event()
        self._lost: str | None = None
        self._renewer: threading.Thread | None = None
        #: seconds spent waiting for the lock
        self.waited_s = 0.0

    def acquire(self) -> None:

        began = time.monotonic()
        deadline = began + self.wait_s
        announced = False
        while True:
            try:
                if self._client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                    break
                holder = self._client.get(self.key)
            except UNAVAILABLE as exc:
                raise RedisUnavailable(
                    f"redis unavailable taking the lock of {self.stream!r}: {exc}"
                ) from exc
            holder_text = holder.decode(errors="replace") if holder else "?"
            if time.monotonic() >= deadline:
                raise LockBusy(
                    f"stream {self.stream!r} is locked by {holder_text} "
                    f"(waited {self.wait_s:g}s for its archive lock in the lake at {self.lake})"
                )
            if not announced:
                log.info(
                    "stream %s: waiting for its archive lock in the lake at %s (held by %s)",
                    self.stream, self.lake, holder_text,
                )  # fmt: skip
                announced = True
            time.sleep(POLL_S)
        self.waited_s = time.monotonic() - began
        self._renewer = threading.Thread(target=self._renew, name="sluice-lock-renew", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        import redis

        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            try:
                ok = self._client.eval(_RENEW, 1, self.key, self.token, self.ttl_ms)
            except redis.RedisError as exc:
                self._lost = f"renewing the archive lock of {self.stream!r} failed: {exc}"
                return
            if not ok:
                self._lost = f"the archive lock of {self.stream!r} expired and was taken or freed"
                return

    def check(self) -> None:
        """Raise :class:`LockLost` if this job no longer holds the lock (call before committing)."""
        if self._lost is not None:
            raise LockLost(self._lost)

    def release(self) -> None:
        import redis

        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5.0)
            self._renewer = None
            try:
                self._client.eval(_RELEASE, 1, self.key, self.token)
            except redis.RedisError as exc:  # it expires after the TTL anyway
                log.warning("stream %s: could not release the archive lock: %s", self.stream, exc)
        self._client.close()

    def __enter__(self) -> StreamLock:
        try:
            self.acquire()
        except BaseException:
            self._client.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

"""A real redis-server made to refuse writes: ``maxmemory`` reached under ``noeviction``.

``with refusing(url): ...`` fills the server with keys until a write gets
``OOM command not allowed when used memory > 'maxmemory'``, holds it there (the
limit lowered below what is used, so keys expiring meanwhile cannot let a write
in), and on exit deletes the fillers and lifts the limit. Reads and deletes go on
working throughout, as on a full production server.

``with misconf(url): ...`` makes the server refuse writes with ``MISCONF`` (an
RDB save failed while ``stop-writes-on-bgsave-error`` is on): its directory is
deleted (the server's working directory: moving it would not do) with what it
holds, so use it on a private server only; a save point is set and a ``BGSAVE``
fails. On exit the save point is dropped (which lifts the refusal) and an empty
directory made again at the path.

``with noreplicas(url): ...`` makes every write get ``NOREPLICAS Not enough good
replicas to write.`` (``min-replicas-to-write 1`` on a server with no replica), as a
master does while its replicas are away; reads go on. On exit the setting is 0 again.

``with replica(url, spare_url): ...`` turns the server into a replica (``REPLICAOF``
the spare, a second real server that first copied its data), so every write gets
``READONLY You can't write against a read only replica``, as a client still pointed
at a demoted master sees during a failover; reads go on. Writes are paused
(``CLIENT PAUSE WRITE``) while the roles swap, so the spare holds every write and
nothing is lost; on exit ``REPLICAOF NO ONE`` makes it a master again.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis
from redis.exceptions import OutOfMemoryError

FILLER = b"x" * (128 << 10)


class Refusal:
    """Fill a Redis until it refuses writes (:meth:`start`), then free it (:meth:`end`)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.fillers: list[str] = []

    def start(self) -> None:
        self.client.config_set("maxmemory-policy", "noeviction")
        used = int(self.client.info("memory")["used_memory"])
        self.client.config_set("maxmemory", used + (4 << 20))
        while len(self.fillers) < 1000:
            name = f"test:filler:{len(self.fillers)}"
            try:
                self.client.set(name, FILLER)
            except OutOfMemoryError:
                used = int(self.client.info("memory")["used_memory"])
                self.client.config_set("maxmemory", used // 2)
                return
            self.fillers.append(name)
        raise AssertionError("redis never refused a write")

    def end(self) -> None:
        if self.fillers:
            self.client.delete(*self.fillers)  # DEL works while writes are refused
        self.client.config_set("maxmemory", 0)
        self.client.close()


@contextmanager
def refusing(url: str) -> Iterator[Refusal]:
    refusal = Refusal(url)
    refusal.start()
    try:
        yield refusal
    finally:
        refusal.end()


@contextmanager
def misconf(url: str) -> Iterator[None]:
    client = redis.Redis.from_url(url)
    directory = str(client.config_get("dir")["dir"])
    shutil.rmtree(directory)
    try:
        client.config_set("save", "3600 1")
        client.bgsave()
        deadline = time.monotonic() + 30
        while client.info("persistence")["rdb_last_bgsave_status"] != "err":
            if time.monotonic() > deadline:
                raise AssertionError("the RDB save did not fail")
            time.sleep(0.05)
        yield
    finally:
        client.config_set("save", "")
        os.makedirs(directory, exist_ok=True)
        client.close()


def _until(cond: Callable[[], bool], what: str, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {within_s}s")
        time.sleep(0.05)


@contextmanager
def replica(url: str, spare_url: str) -> Iterator[None]:
    client = redis.Redis.from_url(url)
    spare = redis.Redis.from_url(spare_url)
    parts, spare_parts = urlsplit(url), urlsplit(spare_url)
    try:
        spare.replicaof(parts.hostname, parts.port)

        def caught_up() -> bool:
            info = spare.info("replication")
            return bool(
                info.get("master_link_status") == "up"
                and int(info.get("slave_repl_offset", -1))
                == int(client.info("replication")["master_repl_offset"])
            )

        _until(lambda: spare.info("replication").get("master_link_status") == "up", "spare synced")
        client.client_pause(30_000, all=False)  # writes wait; the spare catches up
        try:
            _until(caught_up, "spare caught up")
            spare.replicaof("NO", "ONE")
            client.replicaof(spare_parts.hostname, spare_parts.port)
        finally:
            client.client_unpause()
        yield
    finally:
        client.replicaof("NO", "ONE")
        spare.replicaof("NO", "ONE")
        client.close()
        spare.close()


@contextmanager
def noreplicas(url: str) -> Iterator[None]:
    client = redis.Redis.from_url(url)
    try:
        client.config_set("min-replicas-to-write", 1)
        yield
    finally:
        client.config_set("min-replicas-to-write", 0)
        client.close()

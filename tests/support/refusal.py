"""A real redis-server made to refuse writes: ``maxmemory`` reached under ``noeviction``.

``with refusing(url): ...`` fills the server with keys until a write gets
``OOM command not allowed when used memory > 'maxmemory'``, holds it there (the
limit lowered below what is used, so keys expiring meanwhile cannot let a write
in), and on exit deletes the fillers and lifts the limit. Reads and deletes go on
working throughout, as on a full production server.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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

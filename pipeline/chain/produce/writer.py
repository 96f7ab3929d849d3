"""The writes of ``sluice produce``: blocks appended idempotently, retried through outages.

A block that cannot be written (Redis away, moving or refusing writes, or too
few replicas took it) is retried with backoff, one log line when the outage
starts and one when it ends, for up to ``retry_for`` seconds; then
:class:`~pipeline.errors.ProducerGaveUp`. The append is idempotent (a script
compares with the stream's last entry), so a retry after a write whose answer
was lost never duplicates a block. Every attempt is told to the writer's
:class:`~pipeline.chain.produce.probes.WriteRecord` (``/healthz``, ``/metrics``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from redis.exceptions import NoScriptError, RedisError, ResponseError

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, decode_block, encode_block
from pipeline.chain.produce.generator import linked_chain
from pipeline.chain.produce.probes import WriteRecord
from pipeline.errors import BadBatch, NotReplicated, ProducerGaveUp
from pipeline.loggate import LogGate
from pipeline.redisio.conn import UNAVAILABLE, Role, checkpoint, connect, pipe_evalsha, unavailable
from pipeline.redisio.durability import Durability

log = logging.getLogger(__name__)
T = TypeVar("T")

#: XADD unless the stream's last entry is this very block (a retried write that had landed).
_APPEND = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if last then
  local f = last[2]
  for i = 1, #f, 2 do
    if f[i] == ARGV[1] and f[i + 1] == ARGV[2] then return last[1] end
  end
end
return redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
"""

#: Entries first read back to go on from a stream's head; more while the chain they link is
#: shorter than ``--reorg-depth`` + 1 blocks (replaced branches sit among them), up to
#: :data:`RESUME_ENTRIES_MAX`. Reorgs reach no deeper than the linked blocks.
RESUME_ENTRIES = 256
RESUME_ENTRIES_MAX = 16_384
#: Retried until ``--retry-for`` runs out: Redis away, moving or refusing writes (see
#: :func:`~pipeline.redisio.conn.unavailable`), or a write too few replicas took.
_RETRIED: tuple[type[BaseException], ...] = (*UNAVAILABLE, NotReplicated, RedisError)
BACKOFF_START_S = 0.1
BACKOFF_MAX_S = 2.0


class BlockWriter:
    """Appends blocks idempotently, retrying through outages (bounded by ``retry_for``)."""

    def __init__(
        self, url: str, stream: str, retry_for: float, durability: Durability | None = None
    ) -> None:
        self.client = connect(url, Role.PRODUCER)
        self.key = keys.stream(stream)
        self.retry_for = retry_for
        self.script = self.client.register_script(_APPEND)
        self.durability = durability or Durability()
        self.record = WriteRecord()
        self._gate = LogGate(log)

    async def _write(self, data: bytes) -> None:
        """One append; with a durability setting, ``WAIT`` on its connection after it
        (:class:`NotReplicated` when too few replicas took it: retried like an outage,
        the append being idempotent)."""
        if not self.durability.on:
            await self.script(keys=[self.key], args=[ENTRY_FIELD, data])
            return
        async with self.client.pipeline(transaction=False) as pipe:
            pipe_evalsha(pipe, self.script.sha, [self.key], [ENTRY_FIELD, data])
            self.durability.add_waits(pipe, self.client, [self.key])
            results = await pipe.execute(raise_on_error=False)
        if isinstance(results[0], NoScriptError):  # a restarted or promoted server
            await self.client.script_load(_APPEND)
            raise NotReplicated("script not loaded: loaded, retrying") from results[0]
        if isinstance(results[0], Exception):
            raise results[0]
        failure = self.durability.check(results[1:])
        if failure is not None:
            raise failure

    async def append(self, block: Block) -> bool:
        """Write one block; True if an outage was ridden out on the way."""
        data = encode_block(block)
        _, rode_out = await self._retrying(lambda: self._write(data), f"writing block {block.num}")
        self.record.written += 1
        return rode_out

    async def _retrying(self, op: Callable[[], Awaitable[T]], doing: str) -> tuple[T, bool]:
        """``op()``'s result, retried through outages; and whether one was ridden out."""
        delay = BACKOFF_START_S
        while True:
            try:
                result = await op()
            except _RETRIED as exc:
                checkpoint(exc)
                if isinstance(exc, RedisError) and not unavailable(exc):
                    raise  # e.g. WRONGTYPE: retrying cannot help
                lasted = self.record.failed(exc, doing)
                if lasted > self.retry_for:
                    raise ProducerGaveUp(
                        f"redis unavailable for {self.retry_for:.0f}s: {exc}"
                    ) from exc
                self._gate.failed(
                    "redis", "redis unavailable (%s: %s); retrying %s", type(exc).__name__, exc, doing
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            self._gate.ended("redis", "redis is back")
            return result, self.record.succeeded()

    async def recent(self, count: int) -> tuple[list[Block], bool]:
        """The stream's last ``count`` valid blocks, oldest first (entries that do not decode
        skipped); and whether that was the whole stream."""
        entries, _ = await self._retrying(
            lambda: self.client.xrevrange(self.key, count=count), "reading the stream's head"
        )
        blocks = []
        for _, fields in reversed(entries or []):
            try:
                blocks.append(decode_block(cast(bytes, (fields or {})[ENTRY_FIELD])))
            except (BadBatch, KeyError, TypeError):
                continue
        return blocks, len(entries or []) < count

    async def resume_from(self, reorg_depth: int) -> list[Block]:
        """The stream's last entries, enough to link ``reorg_depth`` + 1 blocks below its head
        (fewer if the stream or its links end first, or at :data:`RESUME_ENTRIES_MAX`)."""
        count, linked = RESUME_ENTRIES, -1
        while True:
            recent, whole = await self.recent(count)
            was, linked = linked, len(linked_chain(recent))
            if whole or linked > reorg_depth or linked == was or count >= RESUME_ENTRIES_MAX:
                return recent  # (linked == was: more entries brought no deeper ancestor)
            count = min(count * 4, RESUME_ENTRIES_MAX)

    async def trimmed_empty(self) -> str | None:
        """The stream's last entry id when it once held entries but holds none now (trimmed
        below its head: the chain is in the lake only), else None."""
        try:
            info, _ = await self._retrying(
                lambda: self.client.xinfo_stream(self.key), "reading the stream's state"
            )
        except ResponseError:
            return None  # no such stream: a new chain
        last = info.get("last-generated-id", b"0-0")
        last = last.decode() if isinstance(last, bytes) else str(last)
        return last if info.get("length", 0) == 0 and last != "0-0" else None

    async def close(self) -> None:
        await self.client.aclose()


__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_START_S",
    "BlockWriter",
    "RESUME_ENTRIES",
    "RESUME_ENTRIES_MAX",
]

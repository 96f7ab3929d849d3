"""Chain-stream reads that leave oversized entries in Redis.

Every read ``sluice serve`` makes of the chain stream's entries (the live
tailer, the tail index, a catch-up's tail pages and replay) goes through one
Lua script, :data:`RANGE_READ`: it walks the range one entry at a time inside
Redis and sends an entry whose values add up to more than
:data:`~pipeline.blockcodec.MAX_ENTRY_BYTES` as its id and size only. A hostile
20 MB entry costs Redis a copy, never the server's event loop the seconds of
socket reads that would stall live delivery while catch-ups run. Where a reader
needs only where the stream begins and ends (the tail index's refresh, the live
tailer's start, the status page), :data:`ENDS` answers with ids alone: the
stream's first or newest entry may be hostile too. The scripts only read: they
run on replicas too, and each touches one key (one Cluster slot).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis.asyncio as aioredis

from pipeline.blockcodec import MAX_ENTRY_BYTES
from pipeline.chain.planning import Entries
from pipeline.errors import BadBatch
from pipeline.redisio.conn import checkpoint, pipe_evalsha

#: Entries of KEYS[1] from ARGV[1] (an XRANGE min: an id, or ``(`` and an id) up to
#: ARGV[2] (an XRANGE max), at most ARGV[3] of them, and no more once ARGV[5] bytes are
#: taken (one entry at least). An entry whose values add up to more than ARGV[4] bytes
#: comes back as {id, size}: it never leaves Redis.
RANGE_READ = """
local out, lo, hi = {}, ARGV[1], ARGV[2]
local n, max, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
for _ = 1, n do
  local e = redis.call('XRANGE', KEYS[1], lo, hi, 'COUNT', 1)
  if #e == 0 then break end
  local id, fields, size = e[1][1], e[1][2], 0
  lo = '(' .. id
  for j = 2, #fields, 2 do size = size + #fields[j] end
  if size > max then
    out[#out + 1] = {id, size}
  else
    out[#out + 1] = e[1]
    budget = budget - size
    if budget <= 0 then break end
  end
end
return out
"""
#: Bytes of entries one script call sends at most (past the one entry it always sends).
READ_BYTES = 2 * MAX_ENTRY_BYTES

#: The length of KEYS[1], the id of its first entry and the id of its ARGV[1]-th newest
#: entry (its newest for 1; the oldest when it holds fewer): ids only, never an entry.
#: ``false`` (None) for an id of an empty or absent stream.
ENDS = """
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
local hi, back = '+', false
for _ = 1, tonumber(ARGV[1]) do
  local e = redis.call('XREVRANGE', KEYS[1], hi, '-', 'COUNT', 1)[1]
  if not e then break end
  back = e[1]
  hi = '(' .. back
end
return {redis.call('XLEN', KEYS[1]), first and first[1] or false, back}
"""
#: What :data:`ENDS` says: the stream's length, its first entry's id, the id asked for.
Ends = tuple[int, bytes | None, bytes | None]

Refused = Callable[[bytes, Exception], None]


class FilteredReads:
    """XRANGE over one stream key through :data:`RANGE_READ`.

    An oversized entry is handed to ``refused`` (with a :class:`BadBatch`) and
    comes back with no fields (``{}``), so a caller's position still moves past
    it and its decoder refuses it like any entry without a block.
    """

    __slots__ = ("_ends", "_key", "_redis", "_refused", "_script")

    def __init__(self, redis: aioredis.Redis, key: str, refused: Refused | None = None) -> None:
        self._redis = redis
        self._key = key
        self._refused = refused
        self._script = redis.register_script(RANGE_READ)
        self._ends = redis.register_script(ENDS)

    async def page(
        self, lo: str | bytes, hi: str | bytes, count: int = 1 << 30
    ) -> tuple[Entries, bool]:
        """One script call: up to ``count`` entries of ``[lo, hi]`` (XRANGE bounds), and
        whether it stopped at its byte budget (:data:`READ_BYTES`) with more to read."""
        reply = await self._script(
            keys=[self._key], args=[lo, hi, count, MAX_ENTRY_BYTES, READ_BYTES]
        )
        checkpoint()
        return self.parse(reply, count)

    def queue(self, pipe: Any, lo: str | bytes, hi: str | bytes, count: int) -> None:
        """Queue :meth:`page`'s call on ``pipe`` (any layout); :meth:`parse` its reply.

        A server that lost the script answers :class:`NoScriptError` (execute the
        pipeline with ``raise_on_error=False``): :meth:`load` it, then queue again.
        """
        pipe_evalsha(
            pipe, self._script.sha, [self._key], [lo, hi, count, MAX_ENTRY_BYTES, READ_BYTES]
        )

    async def load(self) -> None:
        """Load the scripts into the server (after a :class:`NoScriptError`)."""
        await self._redis.script_load(RANGE_READ)
        await self._redis.script_load(ENDS)
        checkpoint()

    async def ends(self, back: int = 1) -> Ends:
        """The stream's length, its first entry's id and its ``back``-th newest entry's id
        (:data:`ENDS`: no entry leaves Redis)."""
        reply = await self._ends(keys=[self._key], args=[back])
        checkpoint()
        return self.parse_ends(reply)

    def queue_ends(self, pipe: Any, back: int = 1) -> None:
        """Queue :meth:`ends`' call on ``pipe`` (as :meth:`queue`); :meth:`parse_ends` its reply."""
        pipe_evalsha(pipe, self._ends.sha, [self._key], [back])

    @staticmethod
    def parse_ends(reply: Any) -> Ends:
        length, first, back = cast(list[Any], reply)
        return int(length), first or None, back or None

    def parse(self, reply: Any, count: int) -> tuple[Entries, bool]:
        """The script's reply as entries (oversized ones refused, with no fields) and ``more``."""
        out: Entries = []
        taken = 0
        for entry_id, fields in cast(list[list[Any]], reply):
            if isinstance(fields, int):
                if self._refused is not None:
                    self._refused(
                        entry_id, BadBatch(f"entry of {fields} bytes: at most {MAX_ENTRY_BYTES}")
                    )
                out.append((entry_id, {}))
                continue
            values = fields[1::2]
            taken += sum(len(v) for v in values)
            out.append((entry_id, dict(zip(fields[::2], values, strict=True))))
        return out, taken >= READ_BYTES and len(out) < count

    async def range(self, lo: str | bytes, hi: str | bytes, count: int | None = None) -> Entries:
        """Like ``XRANGE key lo hi COUNT count`` (``count`` None: the whole range)."""
        out: Entries = []
        while True:
            entries, more = await self.page(lo, hi, 1 << 30 if count is None else count - len(out))
            out += entries
            if not more:
                return out
            lo = b"(" + entries[-1][0]


__all__ = ["ENDS", "RANGE_READ", "READ_BYTES", "Ends", "FilteredReads"]

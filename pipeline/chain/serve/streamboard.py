"""The chain as the status page's tail sees it, pure: head, recent blocks and reorgs of a stream.

:class:`StreamBoard` takes a chain stream's entries in id order and keeps
what ``/status.json`` shows of it, bounded (:data:`RECENT_BLOCKS`,
:data:`RECENT_REORGS`); :func:`peek_header` reads an entry's number and hashes
without decoding the rest. No I/O of its own: :mod:`pipeline.chain.serve.statusboard` feeds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD
from pipeline.redisio.conn import parse_entry_id

#: Blocks and reorgs kept per stream for the page.
RECENT_BLOCKS = 12
RECENT_REORGS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class SeenBlock:
    """One block as the tail saw it; raw bytes, turned into text only for the page."""

    num: int
    hash: bytes
    parent: bytes
    #: The Redis entry id: its milliseconds are when Redis stored the block.
    entry_id: bytes
    #: Blocks this one replaced (0: it extended the chain).
    reorg: int = 0

    @property
    def ms(self) -> int:
        return parse_entry_id(self.entry_id)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reorg:
    ms: int
    #: The head before and the first block of the new branch.
    old_head: int
    new_num: int
    depth: int


def peek_header(data: bytes) -> tuple[int, bytes, bytes]:
    """``num``, ``hash``, ``parent`` of an ``encode_block`` entry without decoding the rest.

    Raises ``ValueError`` when the data is not such a map.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    unpacker.feed(data)
    found: dict[str, Any] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in ("num", "hash", "parent"):
                found[key] = unpacker.unpack()
                if len(found) == 3:
                    break
            else:
                unpacker.skip()
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a block entry: {exc}") from exc
    num, hash_, parent = found.get("num"), found.get("hash"), found.get("parent")
    if not isinstance(num, int) or not isinstance(hash_, bytes) or not isinstance(parent, bytes):
        raise ValueError("block entry without num, hash and parent")
    return num, hash_, parent


class StreamBoard:
    """Head, recent blocks and reorgs of one chain stream, from the entries it is shown (bounded)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = keys.stream(name)
        self.last_id: bytes | None = None
        self.head: SeenBlock | None = None
        self.recent: deque[SeenBlock] = deque(maxlen=RECENT_BLOCKS)
        self.reorgs: deque[Reorg] = deque(maxlen=RECENT_REORGS)
        self.reorg_count = 0
        self.blocks_seen = 0
        self.invalid = 0

    def see(self, entry_id: bytes, fields: Mapping[bytes, bytes]) -> None:
        """Take the next entry of the stream (in id order)."""
        self.last_id = entry_id
        try:
            num, hash_, parent = peek_header(fields[ENTRY_FIELD])
        except (KeyError, ValueError):
            self.invalid += 1
            return
        self.blocks_seen += 1
        head, depth = self.head, 0
        if head is not None:
            if num <= head.num:
                depth = head.num - num + 1
            elif num == head.num + 1 and parent != head.hash:
                depth = 1
        block = SeenBlock(num=num, hash=hash_, parent=parent, entry_id=entry_id, reorg=depth)
        if depth and head is not None:
            self.reorg_count += 1
            self.reorgs.append(Reorg(ms=block.ms, old_head=head.num, new_num=num, depth=depth))
        self.head = block
        self.recent.append(block)

    def to_json(self) -> dict[str, Any]:
        return {
            "head": _block_json(self.head) if self.head else None,
            "recent": [_block_json(b) for b in reversed(self.recent)],
            "reorgs": [
                {"ms": r.ms, "old_head": r.old_head, "new_num": r.new_num, "depth": r.depth}
                for r in reversed(self.reorgs)
            ],
            "reorg_count": self.reorg_count,
            "blocks_seen": self.blocks_seen,
            "invalid": self.invalid,
        }


def _block_json(b: SeenBlock) -> dict[str, Any]:
    return {
        "num": b.num,
        "hash": "0x" + b.hash.hex(),
        "parent": "0x" + b.parent.hex(),
        "entry_id": b.entry_id.decode(),
        "ms": b.ms,
        "reorg": b.reorg,
    }


__all__ = ["RECENT_BLOCKS", "RECENT_REORGS", "Reorg", "SeenBlock", "StreamBoard", "peek_header"]

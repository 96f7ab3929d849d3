"""Which streams carry blocks: what ``SLUICE_CHAIN_STREAMS`` declares, and what the entries say.

The declaration is the rule. ``lake.chain_streams`` holds stream names and
glob patterns (``*``, ``?``, ``[...]``, Redis' ``SCAN MATCH`` syntax); a
stream is a chain stream when one of them matches it (:func:`matches`), and
only then does the lake decode its entries into ``blocks``, mark its
canonical chain, keep its unmarked blocks in Redis, and ``sluice serve``
serve it. A stream is never re-typed by what it holds: a chain stream with
a hostile entry stays one, and a plain stream that once carried a block
stays plain.

The entries only catch a slip in the declaration, before any work:
:func:`mismatch` takes how a few of the stream's entries look (its first and
last in Redis, :func:`look`) and names the contradiction, when every one of
them contradicts the declaration: blocks in a stream the setting does not
name, or not one ``block`` field in a stream it does. A stream whose
sampled entries disagree with each other is left to its declaration (a
chain stream's odd entry is archived raw, as always). Pure: no I/O, the
callers read the entries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from pipeline.blockcodec.block import ENTRY_FIELD, decode_block
from pipeline.errors import BadBatch

#: Characters that make a ``SLUICE_STREAMS`` / ``SLUICE_CHAIN_STREAMS`` item a pattern.
GLOB = frozenset("*?[")
#: The setting that declares chain streams, as its refusals name it.
SETTING = "SLUICE_CHAIN_STREAMS"


def is_pattern(item: str) -> bool:
    """True when a ``SLUICE_STREAMS`` / ``SLUICE_CHAIN_STREAMS`` item is a glob pattern."""
    return any(ch in GLOB for ch in item)


def matches(items: Sequence[str], stream: str) -> bool:
    """True when ``stream`` is one of ``items`` or matches one of their patterns."""
    return any(item == stream or (is_pattern(item) and fnmatchcase(stream, item)) for item in items)


class Look(enum.Enum):
    """How one stream entry looks."""

    #: its ``block`` field holds a valid block
    BLOCK = "block"
    #: a ``block`` field that is not a valid block (a chain stream's bad entry)
    BROKEN = "broken"
    #: no ``block`` field
    PLAIN = "plain"


def look(fields: Mapping[Any, Any]) -> Look:
    """How an entry's ``fields`` (as redis-py returns them: bytes or str names) look."""
    data = fields.get(ENTRY_FIELD, fields.get(ENTRY_FIELD.decode()))
    if data is None:
        return Look.PLAIN
    try:
        decode_block(data)
    except BadBatch:
        return Look.BROKEN
    return Look.BLOCK


def declared(chain_streams: Sequence[str]) -> str:
    """The setting as a refusal quotes it: ``SLUICE_CHAIN_STREAMS (a, b*)``."""
    return f"{SETTING} ({', '.join(chain_streams) or 'empty'})"


def mismatch(chain_streams: Sequence[str], stream: str, looks: Sequence[Look]) -> str | None:
    """One line naming the contradiction between the declaration and ``looks``, else None.

    ``looks``: how sampled entries of ``stream`` look (none: nothing to check).
    """
    if not looks:
        return None
    setting = declared(chain_streams)
    if matches(chain_streams, stream):
        if all(seen is Look.PLAIN for seen in looks):
            return (
                f"stream {stream!r} is a chain stream by {setting} but its {_which(looks)} "
                f"in Redis {'is' if len(looks) == 1 else 'are'} not blocks (no "
                f"{ENTRY_FIELD.decode()!r} field): take it out of {SETTING} or fix the name"
            )
        return None
    if all(seen is Look.BLOCK for seen in looks):
        return (
            f"stream {stream!r} holds blocks (its {_which(looks)} in Redis) but {setting} "
            f"does not name it: add it to {SETTING}"
        )
    return None


def not_chain(chain_streams: Sequence[str], stream: str, why: str) -> str | None:
    """One line refusing ``stream`` to a chain-only command (``why``), unless it is declared."""
    if matches(chain_streams, stream):
        return None
    return f"stream {stream!r} is not a chain stream by {declared(chain_streams)}: {why}"


def _which(looks: Sequence[Look]) -> str:
    return "one entry" if len(looks) == 1 else "first and last entries"


__all__ = ["GLOB", "SETTING", "Look", "declared", "is_pattern", "look", "matches", "mismatch",
           "not_chain"]  # fmt: skip

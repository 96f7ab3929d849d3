"""The archive's block decoder: a block's header without decoding its body, one payload at a time.

The lake's tables need four things of a chain block: ``num``, ``hash``,
``parent`` and ``weight``. :func:`block_head` reads those from the msgpack map
of :func:`pipeline.blockcodec.encode_block` and steps over ``updates``,
``deletes``, ``batches`` and ``subbatches`` in C (``Unpacker.skip``) without
building them, so its cost does not grow with the number of updated keys
(about 1 us for a block of 60 updates, against 15-25 us for a full
:func:`~pipeline.blockcodec.decode_block`).

What it checks, and so what "valid block" means in the lake:

- the payload is exactly one well-formed msgpack object (no trailing bytes),
  a map whose keys are strings;
- ``num`` is a non-negative int within int64, ``hash`` and ``parent`` are 32
  bytes, ``weight`` is absent, nil, or at most 32 bytes;
- ``updates`` / ``batches`` are maps and ``deletes`` / ``subbatches`` arrays
  when present.

It does not look inside those four containers (that a value of ``updates``
is bytes, say): a payload :func:`decode_block` would refuse for such a detail
is archived as a valid block. Every payload :func:`block_head` refuses,
:func:`decode_block` refuses too (with the same message when the payload has
one fault). A whole page of common blocks is read at once, with numpy, by
:func:`pipeline.lake.intake.pageheads.page_heads`, which leaves the rest to
:class:`HeadReader`.
"""

from __future__ import annotations

import msgpack

from pipeline.blockcodec import HASH_LEN, MAX_BLOCK_NUM, WEIGHT_BYTES
from pipeline.errors import BadBatch

#: (num, hash, parent, weight as 32 bytes big-endian or None)
Head = tuple[int, bytes, bytes, bytes | None]

#: First bytes of a msgpack map (fixmap, map16, map32) and of an array.
MAP_BYTES = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_ARRAY = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
#: body key -> (allowed first bytes, the message decode_block gives)
_BODY = {
    "updates": (MAP_BYTES, "updates must map str keys to bytes"),
    "batches": (MAP_BYTES, "batches must map str prefixes to bytes ids"),
    "deletes": (_ARRAY, "deletes must be a list of str"),
    "subbatches": (_ARRAY, "subbatches must be a list"),
}
_ZERO_WEIGHT = bytes(WEIGHT_BYTES)


class HeadReader:
    """Reads block heads one payload at a time, reusing one ``msgpack.Unpacker``.

    Not thread-safe: one reader per thread (the data source keeps one per
    partition). A payload that fails leaves the reader usable.
    """

    __slots__ = ("_base", "_unpacker")

    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
        self._base = 0

    def head(self, data: bytes) -> Head:
        """``(num, hash, parent, weight32)`` of one payload; :class:`BadBatch` if not a block.

        ``weight32`` is :func:`pipeline.blockcodec.weight_bytes32` of the weight
        (None when the block has none). See the module docstring for what is checked.
        """
        try:
            return self._head(data)
        except BadBatch:
            self._reset()
            raise
        except msgpack.OutOfData as exc:
            self._reset()
            raise BadBatch("not msgpack: Unpack failed: incomplete input") from exc
        except Exception as exc:  # msgpack raises several unrelated types
            self._reset()
            raise BadBatch(f"not msgpack: {exc}") from exc

    def _reset(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
        self._base = 0

    def _head(self, data: bytes) -> Head:
        unpacker = self._unpacker
        base = self._base
        unpacker.feed(data)
        try:
            size = unpacker.read_map_header()
        except (ValueError, TypeError) as exc:  # not a map: tell "not msgpack" from "not a map"
            _check_one_object(data)
            raise BadBatch("block must be a map") from exc
        num = hash_ = parent = weight = None
        wrong: str | None = None
        for _ in range(size):
            key = unpacker.unpack()
            if key == "num":
                num = unpacker.unpack()
            elif key == "hash":
                hash_ = unpacker.unpack()
            elif key == "parent":
                parent = unpacker.unpack()
            elif key == "weight":
                weight = unpacker.unpack()
            else:
                rule = _BODY.get(key) if isinstance(key, str) else None
                if rule is not None and data[unpacker.tell() - base] not in rule[0]:
                    wrong = key  # reported after the payload proved well-formed
                unpacker.skip()
        end = unpacker.tell() - base
        if end != len(data):
            raise BadBatch("not msgpack: unpack(b) received extra data.")
        self._base = base + end
        if wrong is not None:
            raise BadBatch(_BODY[wrong][1])
        if num is None or hash_ is None or parent is None:
            missing = "num" if num is None else "hash" if hash_ is None else "parent"
            raise BadBatch(f"block is missing {missing!r}")
        if not isinstance(num, int) or isinstance(num, bool) or num < 0:
            raise BadBatch(f"block num must be a non-negative int, got {num!r}")
        if num > MAX_BLOCK_NUM:
            raise BadBatch(f"block num {num} is past {MAX_BLOCK_NUM} (the lake stores int64)")
        return num, _hash(hash_, "hash"), _hash(parent, "parent"), _weight32(weight)


def block_head(data: bytes) -> Head:
    """:meth:`HeadReader.head` with a fresh reader (for one-off calls)."""
    return HeadReader().head(data)


def _check_one_object(data: bytes) -> None:
    try:
        msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise BadBatch(f"not msgpack: {exc}") from exc


def _hash(value: object, name: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != HASH_LEN:
        raise BadBatch(f"block {name} must be {HASH_LEN} bytes")
    return value


def _weight32(value: object) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, bytes):
        raise BadBatch("block weight must be msgpack bin (big-endian bytes)")
    if len(value) > WEIGHT_BYTES:
        raise BadBatch(f"block weight must fit in {WEIGHT_BYTES * 8} bits")
    return _ZERO_WEIGHT[len(value) :] + value


__all__ = ["MAP_BYTES", "Head", "HeadReader", "block_head"]

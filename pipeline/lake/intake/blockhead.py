"""The archive's hot-path block decoder: a block's header without decoding its body.

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
one fault).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from pipeline.blockcodec import HASH_LEN, MAX_BLOCK_NUM, WEIGHT_BYTES
from pipeline.errors import BadBatch

#: (num, hash, parent, weight as 32 bytes big-endian or None)
Head = tuple[int, bytes, bytes, bytes | None]

_MAP = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_ARRAY = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
#: body key -> (allowed first bytes, the message decode_block gives)
_BODY = {
    "updates": (_MAP, "updates must map str keys to bytes"),
    "batches": (_MAP, "batches must map str prefixes to bytes ids"),
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


@dataclass(frozen=True, slots=True)
class PageHeads:
    """Heads of a page of payloads read at once (:func:`page_heads`), as numpy arrays.

    Row ``i`` is meaningful only where ``ok[i]``; elsewhere the payload is not in
    the layout the vectorized reader knows and :meth:`HeadReader.head` decides.
    """

    ok: np.ndarray[Any, np.dtype[np.bool_]]
    num: np.ndarray[Any, np.dtype[np.int64]]
    #: (n, 32) uint8: hash and parent bytes
    hash: np.ndarray[Any, np.dtype[np.uint8]]
    parent: np.ndarray[Any, np.dtype[np.uint8]]
    #: (n, 32) uint8: the weight as 32 bytes big-endian; ``has_weight`` False: no weight
    weight: np.ndarray[Any, np.dtype[np.uint8]]
    has_weight: np.ndarray[Any, np.dtype[np.bool_]]


#: What :func:`encode_block` writes around the head, byte for byte.
_NUM_KEY = b"\x87\xa3num"
_HASH_KEY = b"\xa4hash\xc4\x20"
_PARENT_KEY = b"\xa6parent\xc4\x20"
_UPDATES_KEY = b"\xa7updates"
#: the pairs after ``updates`` when ``deletes``, ``batches`` and ``subbatches`` are empty
_TAIL = b"\xa7deletes\x90\xa7batches\x80\xaasubbatches\x90"
_WEIGHT_KEY = b"\xa6weight\xc4"
#: extra bytes after the type byte of a msgpack uint (positive fixint: 0)
_UINT_EXTRA = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_MAP_FIRST = np.zeros(256, dtype=np.bool_)
_MAP_FIRST[list(_MAP)] = True
_SHORTEST = len(_NUM_KEY) + 1 + 2 * HASH_LEN + len(_HASH_KEY) + len(_PARENT_KEY)
_SHORTEST += len(_UPDATES_KEY) + 1 + len(_TAIL)
#: zero bytes after a page's payloads: the widest read of :func:`page_heads`
_PAD = 64


def page_heads(payloads: pa.Array) -> PageHeads:
    """Block heads of a binary array at once, where the payload is laid out as
    :func:`~pipeline.blockcodec.encode_block` writes a block whose ``deletes``,
    ``batches`` and ``subbatches`` are empty (the common block).

    Exactly what :meth:`HeadReader.head` returns, wherever ``ok``: the head's
    bytes are checked and read with numpy at the places that layout puts
    them, the ``updates`` map is stepped over by msgpack in C (one call per
    payload), and the bytes after it must be that layout's, to the last byte.
    Anything else (null, another layout, a fault) is left to :class:`HeadReader`.
    """
    n = len(payloads)
    empty = np.zeros(n, dtype=np.bool_)
    zeros = np.zeros((n, HASH_LEN), dtype=np.uint8)
    out = PageHeads(empty, np.zeros(n, np.int64), zeros, zeros.copy(), zeros.copy(), empty.copy())
    if n == 0:
        return out
    payloads = pa.concat_arrays([payloads.cast(pa.binary())])  # rebase a slice's buffers
    _, offsets_buf, values_buf = payloads.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1).astype(np.int64)
    start, end = offsets[:-1], offsets[1:]
    if values_buf is None or offsets[-1] == 0:
        return out
    size = int(offsets[-1])
    # Padded, so that reads past a short payload's end stay in bounds (their rows are not ok).
    buf = np.zeros(size + _PAD, dtype=np.uint8)
    buf[:size] = np.frombuffer(values_buf, dtype=np.uint8, count=size)
    last = size - 1
    ok = np.asarray(payloads.is_valid()) & (end - start >= _SHORTEST)
    start = start.clip(0, max(last, 0))  # (a null or empty last payload starts at the end)

    def at(pos: np.ndarray[Any, Any], width: int = 1) -> np.ndarray[Any, Any]:
        windows = np.lib.stride_tricks.as_strided(
            buf, shape=(size, width), strides=(1, 1), writeable=False
        )
        picked: np.ndarray[Any, Any] = windows[pos.clip(0, max(last, 0))]
        return picked

    def match(pos: np.ndarray[Any, Any], pattern: bytes) -> np.ndarray[Any, Any]:
        want = np.frombuffer(pattern, dtype=np.uint8)
        same: np.ndarray[Any, Any] = np.all(at(pos, len(pattern)) == want, axis=1)
        return same

    header = buf[np.minimum(start, last)]
    ok &= (header == 0x87) | (header == 0x88)
    ok &= match(start + 1, _NUM_KEY[1:])
    kind = buf[np.minimum(start + 5, last)].astype(np.int64)
    extra = np.full(n, -1, dtype=np.int64)
    extra[kind < 0x80] = 0
    for first, width in _UINT_EXTRA.items():
        extra[kind == first] = width
    ok &= extra >= 0
    digits = at(start + 6, 8).astype(np.uint64)
    num = np.where(kind < 0x80, kind, 0).astype(np.uint64)
    for first, width in _UINT_EXTRA.items():
        value = np.zeros(n, dtype=np.uint64)
        for b in range(width):
            value = (value << np.uint64(8)) | digits[:, b]
        num = np.where(kind == first, value, num)
    ok &= num <= np.uint64(MAX_BLOCK_NUM)
    pos = start + 6 + np.maximum(extra, 0)
    ok &= match(pos, _HASH_KEY)
    hashes = at(pos + len(_HASH_KEY), HASH_LEN)
    pos = pos + len(_HASH_KEY) + HASH_LEN
    ok &= match(pos, _PARENT_KEY)
    parents = at(pos + len(_PARENT_KEY), HASH_LEN)
    pos = pos + len(_PARENT_KEY) + HASH_LEN
    ok &= match(pos, _UPDATES_KEY)
    updates = pos + len(_UPDATES_KEY)
    ok &= _MAP_FIRST[buf[np.minimum(updates, last)]]
    ok &= updates < end
    # Step over each updates map (small ones in numpy, the rest in C); where it ends
    # the layout's last bytes must follow.
    after = _walk_maps(buf, size, updates, end, ok)
    rest = ok & (after < 0)
    if rest.any():
        after = np.where(rest, _skip_maps(values_buf, updates, end, rest), after)
    ok &= after >= 0
    tail_end = after + len(_TAIL)
    ok &= tail_end <= end
    ok &= match(np.maximum(after, 0), _TAIL)
    weighted = header == 0x88
    ok &= np.where(weighted, True, tail_end == end)
    ok &= np.where(weighted, match(tail_end, _WEIGHT_KEY), True)
    size_at = tail_end + len(_WEIGHT_KEY)
    length = buf[np.minimum(size_at, last)].astype(np.int64)
    ok &= np.where(weighted, (length <= WEIGHT_BYTES) & (size_at + 1 + length == end), True)
    # The weight's bytes, right-aligned in 32: byte j of 32 is payload byte end - 32 + j.
    weight = at(end - WEIGHT_BYTES, WEIGHT_BYTES)
    weight = np.where(np.arange(WEIGHT_BYTES) >= WEIGHT_BYTES - length[:, None], weight, 0)
    return PageHeads(
        ok=ok,
        num=num.astype(np.int64),
        hash=hashes.astype(np.uint8),
        parent=parents.astype(np.uint8),
        weight=weight.astype(np.uint8),
        has_weight=weighted & ok,
    )


#: Longest ``updates`` map :func:`_walk_maps` steps over (one numpy pass per pair).
_WALK_MAX = 8


def _walk_maps(
    buf: np.ndarray[Any, Any],
    size: int,
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    ok: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Where the map at ``starts[i]`` ends, for maps msgpack's grammar reads one way only:
    a fixmap of at most :data:`_WALK_MAX` pairs of fixstr/str8 keys and bin8/16/32 values
    (what :func:`encode_block` writes for a small ``updates``). -1 for any other row
    (:func:`_skip_maps` decides those)."""
    n = len(starts)
    after = np.full(n, -1, dtype=np.int64)
    top = size + _PAD - 5

    def byte(pos: np.ndarray[Any, Any], k: int = 0) -> np.ndarray[Any, Any]:
        picked: np.ndarray[Any, Any] = buf[np.clip(pos + k, 0, top)].astype(np.int64)
        return picked

    header = byte(starts)
    count = np.where((header & 0xF0) == 0x80, header & 0x0F, -1)
    good = ok & (count >= 0) & (count <= _WALK_MAX)
    pos = starts + 1
    for pair in range(int(count[good].max(initial=0))):
        step = good & (pair < count)
        key = byte(pos)
        fixstr = (key & 0xE0) == 0xA0
        key_len = np.where(fixstr, key & 0x1F, np.where(key == 0xD9, byte(pos, 1), -1))
        good &= ~step | (key_len >= 0)
        pos = np.where(step, pos + np.where(fixstr, 1, 2) + np.maximum(key_len, 0), pos)
        kind = byte(pos)
        b1, b2, b3, b4 = byte(pos, 1), byte(pos, 2), byte(pos, 3), byte(pos, 4)
        value_len = np.select(
            [kind == 0xC4, kind == 0xC5, kind == 0xC6],
            [b1, (b1 << 8) | b2, (b1 << 24) | (b2 << 16) | (b3 << 8) | b4],
            -1,
        )
        head = np.select([kind == 0xC4, kind == 0xC5], [2, 3], 5)
        good &= ~step | (value_len >= 0)
        pos = np.where(step, pos + head + np.maximum(value_len, 0), pos)
        good &= pos <= ends
    after[good] = pos[good]
    return after


def _skip_maps(
    values: pa.Buffer,
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    ok: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Where the msgpack object at ``starts[i]`` ends (at most ``ends[i]``), or -1.

    One unpacker reads the page's buffer front to back (``read_bytes`` steps to
    the next start): three C calls per payload. A payload the unpacker fails
    on, or reads past its end, gets -1, and a fresh unpacker resumes after it.
    """
    after = np.full(len(starts), -1, dtype=np.int64)
    size = values.size

    def fresh(at: int) -> Any:
        unpacker = msgpack.Unpacker(max_buffer_size=max(size - at, 1))
        unpacker.feed(values.slice(at))
        return unpacker

    unpacker, base, pos = fresh(0), 0, 0
    for i in np.flatnonzero(ok).tolist():
        begin, stop = int(starts[i]), int(ends[i])
        if begin < pos:  # the unpacker went past: start over here (never for valid payloads)
            unpacker, base, pos = fresh(begin), begin, begin
        try:
            if begin > pos:
                unpacker.read_bytes(begin - pos)
            unpacker.skip()
            pos = base + unpacker.tell()
        except Exception:  # noqa: BLE001 (msgpack raises several types; HeadReader decides)
            unpacker, base, pos = fresh(stop), stop, stop
            continue
        if pos <= stop:
            after[i] = pos
    return after


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


__all__ = ["Head", "HeadReader", "PageHeads", "block_head", "page_heads"]

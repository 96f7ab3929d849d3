"""The archive's hot-path block decoder: the heads of a whole page of payloads at once, with numpy.

:func:`page_heads` reads the heads of the payloads laid out as
:func:`~pipeline.blockcodec.encode_block` writes the common block (empty
``deletes``, ``batches`` and ``subbatches``) with one numpy pass per field
over the page, and leaves every other payload to
:class:`~pipeline.lake.intake.blockhead.HeadReader`, whose answer it equals
wherever it reads one. Nothing here calls a function per payload, except
msgpack's C step over an ``updates`` map too long for numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from pipeline.blockcodec import HASH_LEN, MAX_BLOCK_NUM, WEIGHT_BYTES
from pipeline.lake.intake.blockhead import MAP_BYTES


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
_MAP_FIRST[list(MAP_BYTES)] = True
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
    # Each step below reads one field of every payload of the page at once (numpy over
    # the page, no call per payload): the steps run once a page whatever its size.
    n = len(payloads)
    empty = np.zeros(n, dtype=np.bool_)
    zeros = np.zeros((n, HASH_LEN), dtype=np.uint8)
    out = PageHeads(empty, np.zeros(n, np.int64), zeros, zeros.copy(), zeros.copy(), empty.copy())
    if n == 0:
        return out
    payloads = pa.concat_arrays([payloads.cast(pa.binary())])  # rebase a slice's buffers
    page = _Page.of(payloads)
    if page is None:
        return out
    ok = np.asarray(payloads.is_valid()) & page.long_enough
    header = page.buf[np.minimum(page.start, page.last)]
    ok &= (header == 0x87) | (header == 0x88)
    ok &= page.match(page.start + 1, _NUM_KEY[1:])
    fits, num, pos = _read_num(page)
    ok &= fits
    fits, hashes, parents, updates = _read_hashes(page, pos)
    ok &= fits
    after = _after_updates(page, updates, ok)
    ok &= after >= 0
    weighted = header == 0x88
    fits, weight = _read_tail(page, after, weighted)
    ok &= fits
    return PageHeads(
        ok=ok,
        num=num.astype(np.int64),
        hash=hashes.astype(np.uint8),
        parent=parents.astype(np.uint8),
        weight=weight.astype(np.uint8),
        has_weight=weighted & ok,
    )


@dataclass(slots=True)
class _Page:
    """A page's payload bytes, padded with :data:`_PAD` zero bytes so that reads past a
    short payload's end stay in bounds (its row is not ok), and each payload's bounds."""

    buf: np.ndarray[Any, Any]
    #: bytes of payloads (without the padding), and the index of the last one
    size: int
    last: int
    #: where each payload starts (within the page: a null or empty last payload starts
    #: at its end) and ends
    start: np.ndarray[Any, Any]
    end: np.ndarray[Any, Any]
    #: payloads at least as long as the shortest block of the layout
    long_enough: np.ndarray[Any, Any]
    #: the page's values buffer, for msgpack
    values: pa.Buffer

    @classmethod
    def of(cls, payloads: pa.Array) -> _Page | None:
        """The page of a rebased binary array; None when it holds no byte."""
        _, offsets_buf, values_buf = payloads.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=len(payloads) + 1)
        offsets = offsets.astype(np.int64)
        if values_buf is None or offsets[-1] == 0:
            return None
        size = int(offsets[-1])
        buf = np.zeros(size + _PAD, dtype=np.uint8)
        buf[:size] = np.frombuffer(values_buf, dtype=np.uint8, count=size)
        start, end = offsets[:-1], offsets[1:]
        long_enough = end - start >= _SHORTEST
        start = start.clip(0, max(size - 1, 0))
        return cls(buf, size, size - 1, start, end, long_enough, values_buf)

    def at(self, pos: np.ndarray[Any, Any], width: int = 1) -> np.ndarray[Any, Any]:
        """The ``width`` bytes at each position, as rows of an (n, width) array."""
        windows = np.lib.stride_tricks.as_strided(
            self.buf, shape=(self.size, width), strides=(1, 1), writeable=False
        )
        picked: np.ndarray[Any, Any] = windows[pos.clip(0, max(self.last, 0))]
        return picked

    def match(self, pos: np.ndarray[Any, Any], pattern: bytes) -> np.ndarray[Any, Any]:
        """Where the bytes at each position are ``pattern``."""
        want = np.frombuffer(pattern, dtype=np.uint8)
        same: np.ndarray[Any, Any] = np.all(self.at(pos, len(pattern)) == want, axis=1)
        return same

    def byte(self, pos: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The byte at each position (the last byte of the page past its end)."""
        picked: np.ndarray[Any, Any] = self.buf[np.minimum(pos, self.last)]
        return picked


def _read_num(
    page: _Page,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(fits, num as uint64, position after it) of each payload's ``num``: a msgpack uint
    within :data:`MAX_BLOCK_NUM`, right after the map header and its key."""
    n = len(page.start)
    kind = page.byte(page.start + 5).astype(np.int64)
    extra = np.full(n, -1, dtype=np.int64)
    extra[kind < 0x80] = 0
    for first, width in _UINT_EXTRA.items():
        extra[kind == first] = width
    digits = page.at(page.start + 6, 8).astype(np.uint64)
    num = np.where(kind < 0x80, kind, 0).astype(np.uint64)
    for first, width in _UINT_EXTRA.items():
        value = np.zeros(n, dtype=np.uint64)
        for b in range(width):
            value = (value << np.uint64(8)) | digits[:, b]
        num = np.where(kind == first, value, num)
    fits = (extra >= 0) & (num <= np.uint64(MAX_BLOCK_NUM))
    return fits, num, page.start + 6 + np.maximum(extra, 0)


def _read_hashes(
    page: _Page, pos: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(fits, hash, parent, where ``updates`` starts) of each payload: the hash and
    parent pairs at ``pos``, then the ``updates`` key and a map header."""
    fits = page.match(pos, _HASH_KEY)
    hashes = page.at(pos + len(_HASH_KEY), HASH_LEN)
    pos = pos + len(_HASH_KEY) + HASH_LEN
    fits &= page.match(pos, _PARENT_KEY)
    parents = page.at(pos + len(_PARENT_KEY), HASH_LEN)
    pos = pos + len(_PARENT_KEY) + HASH_LEN
    fits &= page.match(pos, _UPDATES_KEY)
    updates = pos + len(_UPDATES_KEY)
    fits &= _MAP_FIRST[page.byte(updates)]
    fits &= updates < page.end
    return fits, hashes, parents, updates


def _after_updates(
    page: _Page, updates: np.ndarray[Any, Any], ok: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """Where each ``ok`` row's ``updates`` map ends (-1: it does not end in its payload):
    small ones stepped over in numpy, the rest in C."""
    after = _walk_maps(page.buf, page.size, updates, page.end, ok)
    rest = ok & (after < 0)
    if rest.any():
        after = np.where(rest, _skip_maps(page.values, updates, page.end, rest), after)
    return after


def _read_tail(
    page: _Page, after: np.ndarray[Any, Any], weighted: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(fits, weight as 32 bytes) of each payload: after ``updates`` the layout's last
    bytes (:data:`_TAIL`), then a ``weight`` pair where ``weighted``, to the payload's end."""
    end = page.end
    tail_end = after + len(_TAIL)
    fits = tail_end <= end
    fits &= page.match(np.maximum(after, 0), _TAIL)
    fits &= np.where(weighted, True, tail_end == end)
    fits &= np.where(weighted, page.match(tail_end, _WEIGHT_KEY), True)
    size_at = tail_end + len(_WEIGHT_KEY)
    length = page.byte(size_at).astype(np.int64)
    fits &= np.where(weighted, (length <= WEIGHT_BYTES) & (size_at + 1 + length == end), True)
    # The weight's bytes, right-aligned in 32: byte j of 32 is payload byte end - 32 + j.
    weight = page.at(end - WEIGHT_BYTES, WEIGHT_BYTES)
    weight = np.where(np.arange(WEIGHT_BYTES) >= WEIGHT_BYTES - length[:, None], weight, 0)
    return fits, weight


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


__all__ = ["PageHeads", "page_heads"]

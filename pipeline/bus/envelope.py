"""The reliable-message-bus envelope (seed 002): its fields and its JSON codec.

Pure code: bytes in, :class:`Envelope` or :class:`~pipeline.errors.EnvelopeError`
out. No asyncio, no Redis. What makes an envelope valid (its limits, the field
checks, bounded JSON) is :mod:`pipeline.bus.envelope_rules`; the names of it a
caller needs are exported here too (see ``__all__``).

The JSON object has exactly the seed's fields::

    ver uid cmd exp try dat src dst ret shm now err

``try`` is a Python keyword, so the attribute is ``try_``; on the wire it is
``try``. Only ``ver``, ``cmd``, ``dst`` and ``ret`` are required of a
request; the other fields default to their zero value (what a client that
leaves them out means). Unknown extra fields are ignored.

Every decode is bounded before it allocates: size (``max_size``), nesting
(:data:`MAX_DEPTH`, checked by a scan that never recurses), names
(:data:`MAX_NAME`), fan-out (:data:`MAX_DESTINATIONS`) and integers
(``0 <= n <= MAX_INT``). Whatever the bytes, the decoders here return a value
or raise :class:`EnvelopeError`; nothing else escapes (no ``RecursionError``).
:func:`decode` takes one of two paths, the usual envelope's (:func:`_fast`,
msgspec) or the general one (:func:`loads`, then :func:`from_dict`); both judge
alike, and ``tests/unit/bus/test_envelope_fast.py`` compares them.

Replies are decoded with ``reply=True``, which is lenient the way the seed
lets a handler be: "swap ``dst`` and ``src``" done literally gives
``src = [1002]`` and ``dst = 1001``; both shapes are accepted and normalised
to ``src: int`` and ``dst: [int]``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

import msgspec

from pipeline.bus.envelope_rules import (
    CMD_BAD,
    MAX_DEPTH,
    MAX_DESTINATIONS,
    MAX_INT,
    MAX_NAME,
    RESERVED_PREFIX,
    RESERVED_RET_PREFIX,
    VERSION,
    check_cmd,
    check_data,
    fail,
    is_int,
    is_twin,
    loads,
    ret_problem,
    twin_list,
    valid_cmd,
)
from pipeline.errors import EnvelopeError

__all__ = [
    "MAX_DEPTH",
    "MAX_DESTINATIONS",
    "MAX_INT",
    "MAX_NAME",
    "MAX_SKEW_S",
    "RESERVED_PREFIX",
    "RESERVED_RET_PREFIX",
    "VERSION",
    "Envelope",
    "deadline",
    "decode",
    "encode_data",
    "from_dict",
    "is_twin",
    "load_trusted",
    "loads",
    "salvage",
    "sent_at",
    "valid_cmd",
]

#: Seconds a client's ``now`` may run ahead of the bus's clock; beyond it counts from receipt.
MAX_SKEW_S = 300
#: A ``now`` this large is in milliseconds (in seconds it would be the year 5138).
_MS_THRESHOLD = 10**11

_RET_SALVAGE = re.compile(rb'"ret"\s*:\s*"([^"\\\x00-\x1f]+)"')
_CMD_SALVAGE = re.compile(rb'"cmd"\s*:\s*"([^"\\\x00-\x1f]{1,256})"')


@dataclass(slots=True, kw_only=True)
class Envelope:
    """One bus message, request or reply, with the seed's fields."""

    ver: int = VERSION
    uid: str = ""
    cmd: str = ""
    exp: int = 0
    try_: int = 0
    dat: str = ""
    src: int = 0
    dst: list[int] = field(default_factory=list)
    ret: str = ""
    shm: str = ""
    now: int = 0
    err: str = ""
    #: Not on the wire: times a bus server handed this request to a handler again after
    #: one died holding it (0: the first delivery; see :mod:`pipeline.bus.handling`).
    redelivered: int = field(default=0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, in the seed's field order."""
        return {
            "ver": self.ver,
            "uid": self.uid,
            "cmd": self.cmd,
            "exp": self.exp,
            "try": self.try_,
            "dat": self.dat,
            "src": self.src,
            "dst": list(self.dst),
            "ret": self.ret,
            "shm": self.shm,
            "now": self.now,
            "err": self.err,
        }

    def encode(
        self,
        *,
        uid: str | None = None,
        src: int | None = None,
        dst: list[int] | None = None,
        try_: int | None = None,
        ret: str | None = None,
    ) -> bytes:
        """Compact JSON in the seed's field order; a field given here replaces this
        envelope's in the output (``env.encode(ret=r) == env.copy(ret=r).encode()``,
        without the copy: the bus rewrites these fields of every message it passes on).
        """
        try_ = self.try_ if try_ is None else try_
        src = self.src if src is None else src
        dst = self.dst if dst is None else dst
        ver, exp, now = self.ver, self.exp, self.now
        if (
            type(ver) is int
            and type(exp) is int
            and type(try_) is int
            and type(src) is int
            and type(now) is int
            and (len(dst) == 1 and type(dst[0]) is int or all(type(d) is int for d in dst))
        ):
            text = _string
            shm, err = self.shm, self.err
            return (
                _LAYOUT
                % (
                    ver,
                    text(self.uid if uid is None else uid),
                    text(self.cmd),
                    exp,
                    try_,
                    text(self.dat),
                    src,
                    ",".join(map(str, dst)),
                    text(self.ret if ret is None else ret),
                    text(shm) if shm else '""',
                    now,
                    text(err) if err else '""',
                )
            ).encode()
        # something built by hand with another type (a bool, a float): the general encoder
        doc = self.to_dict()
        changes = {"uid": uid, "src": src, "dst": dst, "try": try_, "ret": ret}
        doc.update((k, v) for k, v in changes.items() if v is not None)
        return _ENCODER.encode(doc).encode()

    @property
    def data(self) -> bytes:
        """``dat`` decoded (validated at decode time, so this does not fail for decoded envelopes)."""
        return base64.b64decode(self.dat)

    def with_data(self, payload: bytes) -> Envelope:
        return replace(self, dat=encode_data(payload))

    def copy(self, **changes: Any) -> Envelope:
        if "try" in changes:
            changes["try_"] = changes.pop("try")
        # What dataclasses.replace does, without its per-call field introspection
        # (copies are made several times per message on the bus's hot path).
        values = {name: getattr(self, name) for name in _FIELD_NAMES}
        values.update(changes)
        return Envelope(**values)


_FIELD_NAMES = tuple(f.name for f in fields(Envelope))
#: Compact JSON (one encoder: ``json.dumps`` with separators builds one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"))
#: A string's JSON text, exactly as ``_ENCODER`` writes it inside an object (its fast
#: path for a lone ``str``: no dict walk).
_string = _ENCODER.encode
#: ``_ENCODER.encode(env.to_dict())`` for integer fields, as one format (several times
#: faster than walking the dict; the same bytes).
_LAYOUT = (
    '{"ver":%d,"uid":%s,"cmd":%s,"exp":%d,"try":%d,"dat":%s,"src":%d,"dst":[%s],'
    '"ret":%s,"shm":%s,"now":%d,"err":%s}'
)


def encode_data(payload: bytes | str) -> str:
    """Base64 text for ``dat``."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return base64.b64encode(raw).decode("ascii")


def from_dict(doc: Any, *, reply: bool = False, client: bool = False) -> Envelope:
    """Validate a decoded JSON value; raise :class:`EnvelopeError` with the text for ``err``.

    ``client``: a request as a client wrote it (``msgbus.system.local``), whose
    ``ret`` may not name a bus queue; the bus itself sets ``ret`` to
    ``msgbus.system.reply`` on the copy a handler gets.
    """
    if not isinstance(doc, dict):
        raise fail("not a JSON object")
    if doc.get("ver") != VERSION or not is_int(doc.get("ver")):
        raise fail(f"ver must be {VERSION}")
    cmd = check_cmd(doc.get("cmd"))
    dst = twin_list(doc.get("dst"), "dst", lenient=reply)
    if reply and len(dst) != 1:
        raise fail("a reply must have exactly one dst")
    src_raw = doc.get("src", 0)
    if reply and isinstance(src_raw, list) and len(src_raw) == 1:
        src_raw = src_raw[0]
    if not is_int(src_raw):
        raise fail("src must be a twin id")
    ret = doc.get("ret", "")
    problem = ret_problem(ret, reply=reply, client=client)
    if problem:
        raise fail(problem)
    get = doc.get
    exp, try_, now = get("exp", 0), get("try", 0), get("now", 0)
    if not (  # the usual case in one test; the loop says which field is wrong
        type(exp) is int
        and type(try_) is int
        and type(now) is int
        and 0 <= exp <= MAX_INT
        and 0 <= try_ <= MAX_INT
        and 0 <= now <= MAX_INT
    ):
        for name, value in (("exp", exp), ("try", try_), ("now", now)):
            if not is_int(value):
                raise fail(f"{name} must be an integer >= 0 and < 2^63")
    uid, shm, err, dat = get("uid", ""), get("shm", ""), get("err", ""), get("dat", "")
    if not (type(uid) is str and type(shm) is str and type(err) is str and type(dat) is str):
        for name, value in (("uid", uid), ("shm", shm), ("err", err), ("dat", dat)):
            if not isinstance(value, str):
                raise fail(f"{name} must be a string")
    if len(uid) > MAX_NAME:
        raise fail("uid must be at most 256 characters")
    check_data(dat)
    return Envelope(
        ver=VERSION,
        uid=uid,
        cmd=cmd,
        exp=exp,
        try_=try_,
        dat=dat,
        src=src_raw,
        dst=dst,
        ret=ret,
        shm=shm,
        now=now,
        err=err,
    )


class _Wire(msgspec.Struct):
    """The usual envelope's JSON types, for :func:`_fast` (msgspec checks them in C)."""

    ver: int = 0
    uid: str = ""
    cmd: str = ""
    exp: int = 0
    try_: int = msgspec.field(default=0, name="try")
    dat: str = ""
    src: int = 0
    dst: list[int] = msgspec.field(default_factory=list)
    ret: str = ""
    shm: str = ""
    now: int = 0
    err: str = ""


_WIRE = msgspec.json.Decoder(_Wire)


def _fast(data: bytes, *, reply: bool, client: bool) -> Envelope | None:
    """The envelope when ``data`` is a valid one of the usual shape, else None.

    Accepts only what :func:`from_dict` (after :func:`loads`) accepts, with the
    same result; anything else (an error, the lenient reply shapes, a lone
    surrogate, non-UTF-8 text) returns None and takes the general path, which
    decides and words the refusal. About four times faster than that path.
    """
    try:
        w = _WIRE.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):  # (ValidationError is a DecodeError)
        return None
    dst, cmd, ret, dat = w.dst, w.cmd, w.ret, w.dat
    if not (
        w.ver == VERSION
        and 0 < len(dst) <= (1 if reply else MAX_DESTINATIONS)
        and all(0 <= d <= MAX_INT for d in dst)
        and 0 <= w.src <= MAX_INT
        and 0 <= w.exp <= MAX_INT
        and 0 <= w.try_ <= MAX_INT
        and 0 <= w.now <= MAX_INT
        and len(w.uid) <= MAX_NAME
        and 0 < len(cmd) <= MAX_NAME
        and not cmd.startswith(RESERVED_PREFIX)
        and not CMD_BAD.search(cmd)
        and not ret_problem(ret, reply=reply, client=client)
    ):
        return None
    if dat:
        try:
            base64.b64decode(dat, validate=True)
        except (binascii.Error, ValueError):
            return None
    return Envelope(
        ver=VERSION,
        uid=w.uid,
        cmd=cmd,
        exp=w.exp,
        try_=w.try_,
        dat=dat,
        src=w.src,
        dst=dst,
        ret=ret,
        shm=w.shm,
        now=w.now,
        err=w.err,
    )


def decode(
    raw: bytes | str, *, reply: bool = False, client: bool = False, max_size: int = 1 << 20
) -> Envelope:
    """Parse and validate one envelope; raise :class:`EnvelopeError` on any defect.

    ``reply`` and ``client`` as in :func:`from_dict`. The usual envelope (bounded
    in size and nesting, the usual types) takes :func:`_fast`; the rest, the general path.
    """
    if (
        type(raw) is bytes
        and len(raw) <= max_size
        and raw.isascii()  # (msgspec does not check the UTF-8 of what it skips)
        and raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH
        and b"\\u" not in raw
    ):
        env = _fast(raw, reply=reply, client=client)
        if env is not None:
            return env
    return from_dict(loads(raw, max_size=max_size), reply=reply, client=client)


def load_trusted(raw: bytes | str) -> Envelope:
    """Decode an envelope this bus validated and stored itself (backlog, outbox).

    No validation beyond the shape, but never anything other than
    :class:`EnvelopeError` on a corrupt entry (anyone with access to Redis can
    write one), so a caller can set it aside instead of failing.
    """
    try:
        doc = json.loads(raw)
        return Envelope(
            ver=doc["ver"],
            uid=doc["uid"],
            cmd=doc["cmd"],
            exp=doc["exp"],
            try_=doc["try"],
            dat=doc["dat"],
            src=doc["src"],
            dst=list(doc["dst"][:1]) or [0],
            ret=doc["ret"],
            shm=doc["shm"],
            now=doc["now"],
            err=doc["err"],
        )
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise EnvelopeError(f"corrupt stored envelope: {exc!r}") from exc


def salvage(raw: bytes, *, max_size: int = 1 << 20) -> tuple[str, str]:
    """``(ret, cmd)`` read from an envelope that failed validation, ``""`` where unreadable.

    Lets the bus answer a malformed request on its ``ret`` queue when that
    much can still be read, even from JSON that does not parse (or is too
    large to parse: then its first and last 64 KiB are searched).
    """
    ret = cmd = ""
    try:
        doc = loads(raw, max_size=max_size)
    except EnvelopeError:
        doc = None
    if isinstance(doc, dict):
        if isinstance(doc.get("ret"), str):
            ret = doc["ret"]
        if isinstance(doc.get("cmd"), str) and len(doc["cmd"]) <= MAX_NAME:
            cmd = doc["cmd"]
    else:
        ends = (raw[: 1 << 16], raw[-(1 << 16) :])  # the seed puts ret near the end
        found = [
            next((m for m in map(pattern.search, ends) if m), None)
            for pattern in (_RET_SALVAGE, _CMD_SALVAGE)
        ]
        ret, cmd = (m.group(1).decode("utf-8", "replace") if m else "" for m in found)
    if ret_problem(ret):
        # Never answer on a ret the request was refused for: a reserved name would loop
        # (msgbus.system.local) or feed a handler, an over-long one is no queue of the caller.
        ret = ""
    return ret, cmd


def sent_at(now: int, *, received: float) -> float:
    """The client's ``now`` as epoch seconds the bus can count from.

    ``0`` (not filled) is ``received``; a value in milliseconds is divided
    down; a time more than :data:`MAX_SKEW_S` ahead of ``received`` (a wrong
    clock, an absurd value) is ``received``, so no deadline lies further out
    than ``received + MAX_SKEW_S + max_exp``.
    """
    if now >= _MS_THRESHOLD:
        now //= 1000
    if now == 0 or now > received + MAX_SKEW_S:
        return received
    return float(now)


def deadline(env: Envelope, *, received: float, default_exp: int, max_exp: int) -> float:
    """Absolute expiry (epoch seconds): ``now + exp``, ``exp`` 0 meaning ``default_exp``.

    ``now`` is read by :func:`sent_at`; ``exp`` is capped at ``max_exp``.
    """
    exp = min(env.exp or default_exp, max_exp)
    return sent_at(env.now, received=received) + exp

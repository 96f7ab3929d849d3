"""The reliable-message-bus envelope (seed 002): field names, types, JSON codec, validation.

Pure code: bytes in, :class:`Envelope` or :class:`~pipeline.errors.EnvelopeError`
out. No asyncio, no Redis.

The JSON object has exactly the seed's fields::

    ver uid cmd exp try dat src dst ret shm now err

``try`` is a Python keyword, so the attribute is ``try_``; on the wire it is
``try``. Only ``ver``, ``cmd``, ``dst`` and ``ret`` are required of a
request; the other fields default to their zero value (what a client that
leaves them out means). Unknown extra fields are ignored.

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
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.errors import EnvelopeError

VERSION = 1
#: Commands under ``system.`` would collide with the bus's own queues (``msgbus.system.*``).
RESERVED_PREFIX = "system."
MAX_NAME = 256
#: Most destinations one request may fan out to.
MAX_DESTINATIONS = 64

_INT_FIELDS = ("exp", "try", "now")
_STR_FIELDS = ("uid", "shm", "err", "dat")
_CMD_BAD = re.compile(r"[\s\x00-\x1f\x7f]")
_RET_SALVAGE = re.compile(rb'"ret"\s*:\s*"([^"\\\x00-\x1f]{1,256})"')
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

    def encode(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @property
    def data(self) -> bytes:
        """``dat`` decoded (validated at decode time, so this does not fail for decoded envelopes)."""
        return base64.b64decode(self.dat)

    def with_data(self, payload: bytes) -> Envelope:
        return replace(self, dat=encode_data(payload))

    def copy(self, **changes: Any) -> Envelope:
        if "try" in changes:
            changes["try_"] = changes.pop("try")
        return replace(self, **changes)


def encode_data(payload: bytes | str) -> str:
    """Base64 text for ``dat``."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return base64.b64encode(raw).decode("ascii")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(text: str) -> EnvelopeError:
    return EnvelopeError(text, public=f"invalid envelope: {text}")


def _twin_list(value: Any, name: str, *, lenient: bool) -> list[int]:
    if lenient and _is_int(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise _fail(f"{name} must be a non-empty list of twin ids")
    if len(value) > MAX_DESTINATIONS:
        raise _fail(f"{name} has more than {MAX_DESTINATIONS} destinations")
    if not all(_is_int(v) and v >= 0 for v in value):
        raise _fail(f"{name} must be a non-empty list of twin ids")
    return list(value)


def _check_cmd(cmd: Any) -> str:
    if not isinstance(cmd, str) or not cmd:
        raise _fail("cmd must be a non-empty string")
    if len(cmd) > MAX_NAME or _CMD_BAD.search(cmd):
        raise _fail("cmd must be at most 256 printable characters without spaces")
    if cmd.startswith(RESERVED_PREFIX):
        raise _fail("cmd 'system.*' is reserved for the bus")
    return cmd


def valid_cmd(cmd: Any) -> bool:
    """True when ``cmd`` would pass validation."""
    try:
        _check_cmd(cmd)
    except EnvelopeError:
        return False
    return True


def _check_data(dat: str) -> None:
    try:
        base64.b64decode(dat, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _fail("dat must be valid base64") from exc


def from_dict(doc: Any, *, reply: bool = False) -> Envelope:
    """Validate a decoded JSON value; raise :class:`EnvelopeError` with the text for ``err``."""
    if not isinstance(doc, dict):
        raise _fail("not a JSON object")
    if doc.get("ver") != VERSION or not _is_int(doc.get("ver")):
        raise _fail(f"ver must be {VERSION}")
    cmd = _check_cmd(doc.get("cmd"))
    dst = _twin_list(doc.get("dst"), "dst", lenient=reply)
    if reply and len(dst) != 1:
        raise _fail("a reply must have exactly one dst")
    src_raw = doc.get("src", 0)
    if reply and isinstance(src_raw, list) and len(src_raw) == 1:
        src_raw = src_raw[0]
    if not _is_int(src_raw) or src_raw < 0:
        raise _fail("src must be a twin id")
    ret = doc.get("ret", "")
    if not isinstance(ret, str) or len(ret) > MAX_NAME or (not reply and not ret):
        raise _fail("ret must be a non-empty string of at most 256 characters")
    ints: dict[str, int] = {}
    for name in _INT_FIELDS:
        value = doc.get(name, 0)
        if not _is_int(value) or value < 0:
            raise _fail(f"{name} must be an integer >= 0")
        ints[name] = value
    strs: dict[str, str] = {}
    for name in _STR_FIELDS:
        value = doc.get(name, "")
        if not isinstance(value, str):
            raise _fail(f"{name} must be a string")
        strs[name] = value
    _check_data(strs["dat"])
    return Envelope(
        ver=VERSION,
        uid=strs["uid"],
        cmd=cmd,
        exp=ints["exp"],
        try_=ints["try"],
        dat=strs["dat"],
        src=src_raw,
        dst=dst,
        ret=ret,
        shm=strs["shm"],
        now=ints["now"],
        err=strs["err"],
    )


def decode(raw: bytes | str, *, reply: bool = False, max_size: int = 1 << 20) -> Envelope:
    """Parse and validate one envelope; raise :class:`EnvelopeError` on any defect."""
    if len(raw) > max_size:
        raise _fail(f"envelope larger than {max_size} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail("not valid JSON") from exc
    return from_dict(doc, reply=reply)


def load_trusted(raw: bytes | str) -> Envelope:
    """Decode an envelope this bus validated and stored itself (backlog, outbox): no checks."""
    doc = json.loads(raw)
    return Envelope(
        ver=doc["ver"],
        uid=doc["uid"],
        cmd=doc["cmd"],
        exp=doc["exp"],
        try_=doc["try"],
        dat=doc["dat"],
        src=doc["src"],
        dst=doc["dst"],
        ret=doc["ret"],
        shm=doc["shm"],
        now=doc["now"],
        err=doc["err"],
    )


def salvage(raw: bytes) -> tuple[str, str]:
    """``(ret, cmd)`` read from an envelope that failed validation, ``""`` where unreadable.

    Lets the bus answer a malformed request on its ``ret`` queue when that
    much can still be read, even from JSON that does not parse.
    """
    ret = cmd = ""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        if isinstance(doc.get("ret"), str) and 0 < len(doc["ret"]) <= MAX_NAME:
            ret = doc["ret"]
        if isinstance(doc.get("cmd"), str) and len(doc["cmd"]) <= MAX_NAME:
            cmd = doc["cmd"]
        return ret, cmd
    found = [pattern.search(raw[: 1 << 16]) for pattern in (_RET_SALVAGE, _CMD_SALVAGE)]
    ret, cmd = (m.group(1).decode("utf-8", "replace") if m else "" for m in found)
    return ret, cmd


def deadline(env: Envelope, *, received: float, default_exp: int, max_exp: int) -> float:
    """Absolute expiry (epoch seconds): ``now + exp``, ``exp`` 0 meaning ``default_exp``.

    ``now`` 0 (not filled) counts from ``received``; ``exp`` is capped at ``max_exp``.
    """
    exp = min(env.exp or default_exp, max_exp)
    start = env.now or received
    return float(start + exp)


_RET_SLOT = b'"ret":""'


def answer_parts(reply: Envelope) -> tuple[bytes, bytes]:
    """``reply`` encoded with ``ret`` cut out: ``(head, tail)`` around the JSON string of ``ret``.

    ``head + json.dumps(ret).encode() + tail`` is ``reply.copy(ret=ret).encode()``
    (up to string escaping), for a ``ret`` only Redis knows (see ``BusStore.deliver_reply``).
    ``"ret":""`` occurs once in the encoding: a quote inside a JSON string is escaped.
    """
    head, slot, tail = reply.copy(ret="").encode().partition(_RET_SLOT)
    if not slot:
        raise ValueError("encoded envelope has no empty ret field")
    return head + b'"ret":', tail


def error_reply(env: Envelope, text: str, *, about: int, me: int) -> Envelope:
    """The answer a caller gets when the bus itself fails a request.

    Like every answer on ``ret`` it carries ``src`` = the destination it is
    about and ``dst`` = ``[me]``, so a client can match answers to destinations.
    """
    return env.copy(src=about, dst=[me], err=text or "error", now=int(time.time()), dat="")

"""What makes an envelope valid (seed 002): its limits, its field checks, bounded JSON.

Pure code, and no :class:`~pipeline.bus.envelope.Envelope` is built here: the
codec (:mod:`pipeline.bus.envelope`) runs these checks on both of its decode
paths, so the two judge alike. Every check raises
:class:`~pipeline.errors.EnvelopeError` with the text a caller gets in ``err``,
or returns the problem as text; nothing else escapes (no ``RecursionError``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from pipeline.errors import EnvelopeError

VERSION = 1
#: Commands under ``system.`` would collide with the bus's own queues (``msgbus.system.*``).
RESERVED_PREFIX = "system."
#: A request's ``ret`` may not name a bus queue: the answer would become a new request
#: (``msgbus.system.local``) or land in a handler's queue (``msgbus.$cmd``).
RESERVED_RET_PREFIX = "msgbus."
MAX_NAME = 256
#: Most destinations one request may fan out to.
MAX_DESTINATIONS = 64
#: Deepest JSON nesting accepted; an envelope needs 2 (the object and ``dst``).
MAX_DEPTH = 16
#: Largest integer in any field (int64, what every client language can hold).
MAX_INT = 2**63 - 1

#: What a ``cmd`` may not hold: whitespace and control characters.
CMD_BAD = re.compile(r"[\s\x00-\x1f\x7f]")
#: JSON strings (skipped) and brackets (counted) for the nesting scan.
_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
#: json.loads's own decoder settings, without its whitespace scans (see loads()).
_DECODER = json.JSONDecoder()


def fail(text: str) -> EnvelopeError:
    """The refusal of an invalid envelope: ``text`` is what the caller reads in ``err``."""
    return EnvelopeError(text, public=f"invalid envelope: {text}")


def is_int(value: Any) -> bool:
    """A JSON integer in ``0..MAX_INT`` (booleans are not integers here)."""
    if type(value) is int:  # the usual case, and the cheap test
        return 0 <= value <= MAX_INT
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def is_twin(value: Any) -> bool:
    """True for a valid twin id."""
    return is_int(value)


def twin_list(value: Any, name: str, *, lenient: bool) -> list[int]:
    """``value`` as a non-empty list of at most :data:`MAX_DESTINATIONS` twin ids.

    ``lenient`` (a reply) also takes one bare twin id.
    """
    if type(value) is list and len(value) == 1:  # the usual case
        (only,) = value
        if type(only) is int and 0 <= only <= MAX_INT:
            return [only]
    if lenient and is_int(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise fail(f"{name} must be a non-empty list of twin ids")
    if len(value) > MAX_DESTINATIONS:
        raise fail(f"{name} has more than {MAX_DESTINATIONS} destinations")
    for v in value:
        if not is_int(v):
            raise fail(f"{name} must be a non-empty list of twin ids")
    return list(value)


def check_cmd(cmd: Any) -> str:
    """``cmd`` when it names a handler's queue a client may use."""
    if not isinstance(cmd, str) or not cmd:
        raise fail("cmd must be a non-empty string")
    if len(cmd) > MAX_NAME or CMD_BAD.search(cmd):
        raise fail("cmd must be at most 256 printable characters without spaces")
    if cmd.startswith(RESERVED_PREFIX):
        raise fail("cmd 'system.*' is reserved for the bus")
    return cmd


def valid_cmd(cmd: Any) -> bool:
    """True when ``cmd`` would pass validation."""
    try:
        check_cmd(cmd)
    except EnvelopeError:
        return False
    return True


def check_data(dat: str) -> None:
    """Refuse a ``dat`` that is not valid base64 (empty is valid)."""
    if not dat:
        return
    try:
        base64.b64decode(dat, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise fail("dat must be valid base64") from exc


def ret_problem(ret: object, *, reply: bool = False, client: bool = True) -> str:
    """Why ``ret`` cannot be answered on ("" when it can): one rule for decoding and salvage."""
    if not isinstance(ret, str) or len(ret) > MAX_NAME or (not reply and not ret):
        return "ret must be a non-empty string of at most 256 characters"
    if client and ret.startswith(RESERVED_RET_PREFIX):
        return "ret 'msgbus.*' is reserved for the bus"
    return ""


def _check_nesting(raw: bytes) -> None:
    depth = 0
    for match in _NESTING.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise fail(f"JSON nested deeper than {MAX_DEPTH}")
        elif token in (b"]", b"}"):
            depth -= 1


def loads(raw: bytes | str, *, max_size: int) -> Any:
    """``json.loads`` bounded in size and nesting; :class:`EnvelopeError` on any defect.

    The nesting scan runs only when the text holds more brackets than
    :data:`MAX_DEPTH` (an envelope holds two), so it costs nothing on the usual path.
    """
    if len(raw) > max_size:
        raise fail(f"envelope larger than {max_size} bytes")
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        _check_nesting(data)
    try:
        # The usual case, twice as fast as json.loads: UTF-8 text that is one JSON
        # value from its first byte to its last. Anything else (leading or trailing
        # whitespace, UTF-16, an error) takes json.loads, which decides as before.
        text = data.decode()
        value, end = _DECODER.raw_decode(text)
        if end == len(text):
            return value
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        pass
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise fail("not valid JSON") from exc

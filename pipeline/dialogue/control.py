"""The flow-control extension's control messages (see WIRE.md, "Flow control").

Control messages travel as ordinary Dialogue ``Message`` packets whose data
starts with :data:`PREFIX`. ``0xc1`` is the one byte msgpack never uses, so no
msgpack-encoded payload (routed messages are msgpack) can be mistaken for one.
They are recognised only by a side that enabled the extension; a seed-only
peer never sends them and never receives them.

- HELLO: ``PREFIX b"H" u8 version u32 window``: "I grant credit; my initial
  window per duplex direction is ``window`` bytes."
- GRANT: ``PREFIX b"G"`` then entries ``u8 side, u32 id, u32 credit``:
  ``side`` 0 is a duplex the *receiver* of the grant opened, 1 one the *sender*
  of the grant opened; ``credit`` more bytes may be sent on it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pipeline.errors import RemoteProtocolError

PREFIX = b"\xc1DLG"
VERSION = 1
_HELLO = struct.Struct(">BI")
_ENTRY = struct.Struct(">BII")
_HELLO_KIND = b"H"
_GRANT_KIND = b"G"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    window: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    #: (local_to_receiver, id, credit) triples.
    entries: tuple[tuple[bool, int, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unknown:
    """A control kind from a newer version: ignored for forward compatibility."""

    kind: bytes


def is_control(data: bytes) -> bool:
    return data[:4] == PREFIX


def encode_hello(window: int) -> bytes:
    return PREFIX + _HELLO_KIND + _HELLO.pack(VERSION, window)


def encode_grant(entries: list[tuple[bool, int, int]]) -> bytes:
    """``entries`` as the *sender* of the grant sees them: (we_opened_it, id, credit)."""
    body = b"".join(_ENTRY.pack(1 if ours else 0, pid, credit) for ours, pid, credit in entries)
    return PREFIX + _GRANT_KIND + body


def decode(data: bytes) -> Hello | Grant | Unknown:
    kind, body = data[4:5], data[5:]
    try:
        if kind == _HELLO_KIND:
            version, window = _HELLO.unpack(body[: _HELLO.size])
            if version < 1 or window == 0:
                raise RemoteProtocolError("bad flow-control hello", public="bad control message")
            return Hello(window=window)
        if kind == _GRANT_KIND:
            if len(body) % _ENTRY.size:
                raise RemoteProtocolError("truncated grant", public="bad control message")
            entries = tuple(
                (side == 0, pid, credit)
                for side, pid, credit in _ENTRY.iter_unpack(body)
                if side in (0, 1) or _bad_side(side)
            )
            return Grant(entries=entries)
    except struct.error as exc:
        raise RemoteProtocolError(
            f"bad control message: {exc}", public="bad control message"
        ) from exc
    return Unknown(kind=kind)


def _bad_side(side: int) -> bool:
    raise RemoteProtocolError(f"grant side {side} is not 0 or 1", public="bad control message")

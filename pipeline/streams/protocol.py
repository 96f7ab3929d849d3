"""The stream protocol: requests to the stream service and its replies. Pure codec.

A stream-protocol message is the payload of a routed message, msgpack
``[kind, field, ...]`` with fields in the dataclass order below. Requests
that act on one stream's entries (``Push``, ``Pull``) are sent to that
stream's address (``Init.address``); the others go to the service address.

=================  ===========================================  =====================
request            fields                                       reply
=================  ===========================================  =====================
``CreateStream``   request_id, name                             ``Init``
``Push``           request_id, data (one or more entries)       ``PushConfirm``
``Pull``           request_id, index, limit, wait_ms            ``Messages`` (+ next_index)
``GetIndex``       request_id, client_id, stream                ``Index``
``SaveIndex``      request_id, client_id, stream, index         ``Index`` (monotonic)
``Lease``          request_id, stream, holder, ttl_ms           ``Ok`` or ``Error``
``Release``        request_id, stream, holder                   ``Ok``
``DeadLetter``     request_id, stream, index, data, reason      ``Ok``
``Attempts``       request_id, stream, key, op                  ``Index`` (the count)
=================  ===========================================  =====================

``Attempts`` keeps a consumer's crash counters in Redis (``op`` ``incr``
adds one and answers the new count, ``clear`` forgets ``key`` and answers 0),
so a message that kills its consumer's process is recognised after a restart.

Any request can be answered with ``Error{request_id, code, message}``.
Indexes are Redis entry ids, opaque to clients; ``""`` means "none saved".
A repeated ``Push.request_id`` gets the first push's indexes back
(``status`` :data:`DUPLICATE`). ``Messages.messages`` travels flat:
``[index, data, index, data, ...]``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from pipeline.errors import (
    LeaseHeld,
    PayloadTooLarge,
    RedisUnavailable,
    RemoteProtocolError,
    StreamError,
    StreamNotFound,
)

#: Most entries in one Push or one Messages reply.
MAX_BATCH = 10_000
MAX_TEXT = 1024


class Kind(enum.IntEnum):
    CREATE = 1
    INIT = 2
    PUSH = 3
    PUSH_CONFIRM = 4
    PULL = 5
    MESSAGES = 6
    GET_INDEX = 7
    SAVE_INDEX = 8
    INDEX = 9
    LEASE = 10
    RELEASE = 11
    DEAD_LETTER = 12
    OK = 13
    ERROR = 14
    ATTEMPTS = 15


class ErrorCode(enum.StrEnum):
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    LEASE_HELD = "lease_held"
    TOO_LARGE = "too_large"
    UNAVAILABLE = "unavailable"


NEW = 1
DUPLICATE = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateStream:
    request_id: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Init:
    request_id: str
    name: str
    #: Local address (on the service's node) to send Push and Pull for this stream to.
    address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Push:
    request_id: str
    data: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PushConfirm:
    request_id: str
    status: int
    indexes: tuple[str, ...]

    @property
    def index(self) -> str:
        return self.indexes[-1] if self.indexes else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pull:
    request_id: str
    index: str
    limit: int
    wait_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Messages:
    request_id: str
    messages: tuple[tuple[str, bytes], ...]
    #: Where the next pull starts: past every entry this reply covers, including
    #: entries the service moved to the dead-letter stream (too large to route).
    next_index: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetIndex:
    request_id: str
    client_id: str
    stream: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveIndex:
    request_id: str
    client_id: str
    stream: str
    index: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Index:
    request_id: str
    client_id: str
    stream: str
    index: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    request_id: str
    stream: str
    holder: str
    ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    request_id: str
    stream: str
    holder: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    request_id: str
    stream: str
    index: str
    data: bytes
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempts:
    request_id: str
    stream: str
    key: str
    #: :data:`INCR` or :data:`CLEAR`
    op: str


INCR = "incr"
CLEAR = "clear"


@dataclass(frozen=True, slots=True, kw_only=True)
class Ok:
    request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Error:
    request_id: str
    code: str
    message: str

    def exception(self) -> StreamError | PayloadTooLarge | RemoteProtocolError:
        """The local exception this error reply stands for."""
        text = f"stream service: {self.message}"
        if self.code == ErrorCode.NOT_FOUND:
            return StreamNotFound(text)
        if self.code == ErrorCode.LEASE_HELD:
            return LeaseHeld(text)
        if self.code == ErrorCode.TOO_LARGE:
            return PayloadTooLarge(text)
        if self.code == ErrorCode.UNAVAILABLE:
            return RedisUnavailable(text)
        if self.code == ErrorCode.BAD_REQUEST:
            return RemoteProtocolError(text)
        return StreamError(text)


StreamMessage = (
    CreateStream
    | Init
    | Push
    | PushConfirm
    | Pull
    | Messages
    | GetIndex
    | SaveIndex
    | Index
    | Lease
    | Release
    | DeadLetter
    | Attempts
    | Ok
    | Error
)

_CLASSES: dict[Kind, type[Any]] = {
    Kind.CREATE: CreateStream,
    Kind.INIT: Init,
    Kind.PUSH: Push,
    Kind.PUSH_CONFIRM: PushConfirm,
    Kind.PULL: Pull,
    Kind.MESSAGES: Messages,
    Kind.GET_INDEX: GetIndex,
    Kind.SAVE_INDEX: SaveIndex,
    Kind.INDEX: Index,
    Kind.LEASE: Lease,
    Kind.RELEASE: Release,
    Kind.DEAD_LETTER: DeadLetter,
    Kind.OK: Ok,
    Kind.ERROR: Error,
    Kind.ATTEMPTS: Attempts,
}
_KINDS: dict[type[Any], Kind] = {cls: kind for kind, cls in _CLASSES.items()}
_FIELDS: dict[Kind, tuple[str, ...]] = {
    kind: tuple(f.name for f in fields(cls)) for kind, cls in _CLASSES.items()
}
_REPLIES = (Init, PushConfirm, Messages, Index, Ok, Error)


def is_reply(message: StreamMessage) -> bool:
    return isinstance(message, _REPLIES)


def encode(message: StreamMessage) -> bytes:
    kind = _KINDS[type(message)]
    body: list[Any] = [int(kind)]
    for name in _FIELDS[kind]:
        value = getattr(message, name)
        if name == "messages":  # flat [index, data, index, data, ...]
            value = [x for pair in value for x in pair]
        elif isinstance(value, tuple):
            value = list(value)
        body.append(value)
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return data


def _bad(reason: str) -> RemoteProtocolError:
    """``reason`` is our own text about the peer's bytes: safe to send back."""
    text = f"malformed stream message: {reason}"
    return RemoteProtocolError(text, public=text)


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _bad(f"{name} must be a string of at most {MAX_TEXT} characters")
    return value


def _int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(f"{name} must be an integer")
    return value


def _check(kind: Kind, name: str, value: Any, max_payload: int) -> Any:
    if name in ("limit", "wait_ms", "ttl_ms", "status"):
        return _int(value, name)
    if name == "data" and kind == Kind.DEAD_LETTER:
        if not isinstance(value, bytes):
            raise _bad("data must be bytes")
        return value
    if name == "data":
        if not isinstance(value, list) or not value or len(value) > MAX_BATCH:
            raise _bad(f"data must be a list of 1..{MAX_BATCH} entries")
        for item in value:
            if not isinstance(item, bytes):
                raise _bad("data entries must be bytes")
            if len(item) > max_payload:
                text = f"entry of {len(item)} bytes exceeds {max_payload}"
                raise PayloadTooLarge(text, public=text)
        return tuple(value)
    if name == "indexes":
        if not isinstance(value, list) or len(value) > MAX_BATCH:
            raise _bad("indexes must be a list")
        return tuple(_text(i, "index") for i in value)
    if name == "messages":
        if not isinstance(value, list) or len(value) > 2 * MAX_BATCH or len(value) % 2:
            raise _bad("messages must be a flat list of index, bytes pairs")
        indexes, datas = value[::2], value[1::2]
        if not all(type(i) is str and len(i) <= MAX_TEXT for i in indexes):
            raise _bad("a message index must be a short string")
        if not all(type(d) is bytes for d in datas):
            raise _bad("a message's data must be bytes")
        return tuple(zip(indexes, datas, strict=True))
    return _text(value, name)


def peek_request_id(data: bytes) -> str:
    """The request id of a message too large (or too broken) to decode, or ``""``."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) or 1, max_str_len=MAX_TEXT)
    unpacker.feed(data)
    try:
        if unpacker.read_array_header() < 2:
            return ""
        unpacker.skip()
        rid = unpacker.unpack()
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException):
        return ""
    return rid if isinstance(rid, str) else ""


def decode(data: bytes, *, max_payload: int = 1 << 20) -> StreamMessage:
    """Parse one stream-protocol message; raises RemoteProtocolError (or PayloadTooLarge)."""
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            max_bin_len=max_payload,
            max_str_len=MAX_TEXT * 4,
            max_array_len=2 * MAX_BATCH + 8,
            max_map_len=0,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        if "exceeds max_bin_len" in str(exc):
            text = f"stream entry exceeds {max_payload} bytes"
            raise PayloadTooLarge(text, public=text) from exc
        raise RemoteProtocolError(
            f"malformed stream message: {exc!r}", public="malformed stream message: bad msgpack"
        ) from exc
    if not isinstance(obj, list) or not obj:
        raise _bad("not a non-empty array")
    raw_kind = obj[0]
    if not isinstance(raw_kind, int) or isinstance(raw_kind, bool):
        raise _bad("kind must be an integer")
    try:
        kind = Kind(raw_kind)
    except ValueError as exc:
        raise _bad(f"unknown kind {raw_kind}") from exc
    names = _FIELDS[kind]
    if len(obj) != len(names) + 1:
        raise _bad(f"{kind.name} takes {len(names)} fields, got {len(obj) - 1}")
    values = {n: _check(kind, n, v, max_payload) for n, v in zip(names, obj[1:], strict=True)}
    message: StreamMessage = _CLASSES[kind](**values)
    return message


__all__ = [
    "CLEAR",
    "INCR",
    "Attempts",
    "DUPLICATE",
    "NEW",
    "CreateStream",
    "DeadLetter",
    "Error",
    "ErrorCode",
    "GetIndex",
    "Index",
    "Init",
    "Kind",
    "Lease",
    "Messages",
    "Ok",
    "Pull",
    "Push",
    "PushConfirm",
    "Release",
    "SaveIndex",
    "StreamMessage",
    "decode",
    "encode",
    "is_reply",
]


def size_bound(request: StreamMessage) -> int | None:
    """An upper bound of ``request``'s encoded size when it is a well-formed push or pull
    (what :func:`decode` would accept, entries included);
    None for anything else, which then goes through the codec."""
    if isinstance(request, Push):
        data = request.data
        if not 0 < len(data) <= MAX_BATCH or set(map(type, data)) != {bytes}:
            return None
        # msgpack: at most 5 header bytes per bin, 3 for the array, small ints and short strs.
        return sum(map(len, data)) + 5 * len(data) + len(request.request_id) + 16
    if isinstance(request, Pull):
        return len(request.index) + len(request.request_id) + 32
    return None

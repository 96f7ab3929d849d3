"""Routed messages: addresses, routes and the one wire codec every transport uses.

Pure code: bytes in, objects out; no asyncio, no Redis.

Wire form, version 1 (msgpack)::

    [1, onward_route, return_route, payload]
    route   = [[type, value], ...]      type: int 0..255, value: bytes
    payload = bytes

Address types: 0 local worker name (UTF-8), 1 TCP ``host:port``, 2 stream
address (value = msgpack ``[onward_stream, return_stream]``, see
:class:`StreamAddress`). Unknown types decode fine (a node refuses to route
them, it does not refuse to parse them).

:func:`TransportMessage.decode` never raises anything but
:class:`~pipeline.errors.RemoteProtocolError` (or its subclass
:class:`~pipeline.errors.PayloadTooLarge`): malformed bytes from a peer are a
remote protocol error with a clear reason, never a crash.

Route text (for settings and CLI): hops separated by ``,``; a hop is a local
worker name, ``tcp:HOST:PORT`` or ``stream:ONWARD/RETURN``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from pipeline.errors import LocalProtocolError, PayloadTooLarge, RemoteProtocolError

VERSION = 1
#: Most hops a route may have (onward or return).
MAX_HOPS = 32
#: Longest address value, in bytes.
MAX_ADDRESS_LEN = 1024
#: Longest stream name inside a stream address.
MAX_STREAM_NAME = 200


class AddressType(enum.IntEnum):
    """The type of an :class:`Address`: a local worker, a TCP ``host:port``, a stream pair."""

    LOCAL = 0
    TCP = 1
    STREAM = 2


@dataclass(frozen=True, slots=True)
class Address:
    """One hop: an address type and an opaque value."""

    type: int
    value: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.type, int) or isinstance(self.type, bool):
            raise LocalProtocolError(f"address type must be an int, not {self.type!r}")
        if not 0 <= self.type <= 255:
            raise LocalProtocolError(f"address type {self.type} out of range 0..255")
        if not isinstance(self.value, bytes):
            raise LocalProtocolError(f"address value must be bytes, not {type(self.value)}")
        if len(self.value) > MAX_ADDRESS_LEN:
            raise LocalProtocolError(f"address value longer than {MAX_ADDRESS_LEN} bytes")

    @classmethod
    def local(cls, name: str) -> Address:
        """The address of local worker ``name``."""
        if not name:
            raise LocalProtocolError("empty worker name")
        return cls(AddressType.LOCAL, name.encode())

    @property
    def is_local(self) -> bool:
        return self.type == AddressType.LOCAL

    def __str__(self) -> str:
        if self.type == AddressType.LOCAL:
            return self.value.decode(errors="replace")
        if self.type == AddressType.TCP:
            return "tcp:" + self.value.decode(errors="replace")
        if self.type == AddressType.STREAM:
            try:
                sa = StreamAddress.from_address(self)
            except RemoteProtocolError:
                return f"stream:<invalid {self.value.hex()}>"
            return f"stream:{sa.onward_stream}/{sa.return_stream}"
        return f"{self.type}:{self.value.hex()}"

    def __repr__(self) -> str:
        return f"Address({str(self)!r})"


def _hop(item: Address | str) -> Address:
    return item if isinstance(item, Address) else Address.local(item)


class Route(tuple[Address, ...]):
    """An immutable sequence of addresses; ``str`` items mean local worker names."""

    __slots__ = ()

    def __new__(cls, hops: Iterable[Address | str] = ()) -> Route:
        if type(hops) is Route:
            return hops
        given = tuple(hops)
        if all(type(hop) is Address for hop in given):
            return cls._make(given)  # type: ignore[arg-type]
        return cls._make(tuple(_hop(h) for h in given))

    @classmethod
    def _make(cls, items: tuple[Address, ...]) -> Route:
        if len(items) > MAX_HOPS:
            raise LocalProtocolError(f"route longer than {MAX_HOPS} hops")
        return tuple.__new__(cls, items)

    @property
    def first(self) -> Address:
        if not self:
            raise LocalProtocolError("empty route")
        return self[0]

    def rest(self) -> Route:
        """The route without its first hop."""
        return tuple.__new__(Route, self[1:])

    def prepend(self, address: Address | str) -> Route:
        return Route._make((_hop(address), *self))

    def __repr__(self) -> str:
        return f"Route({[str(a) for a in self]!r})"


@dataclass(frozen=True, slots=True)
class StreamAddress:
    """Seed 001 address (type 2): where a message goes and where replies come back."""

    onward_stream: str
    return_stream: str

    def __post_init__(self) -> None:
        for name in (self.onward_stream, self.return_stream):
            if not isinstance(name, str) or not name or len(name) > MAX_STREAM_NAME:
                raise LocalProtocolError(f"invalid stream name {name!r} in stream address")

    def reversed(self) -> StreamAddress:
        return StreamAddress(self.return_stream, self.onward_stream)

    def to_address(self) -> Address:
        value: bytes = msgpack.packb([self.onward_stream, self.return_stream], use_bin_type=True)
        return Address(AddressType.STREAM, value)

    @classmethod
    def from_address(cls, address: Address) -> StreamAddress:
        if address.type != AddressType.STREAM:
            raise RemoteProtocolError(f"address type {address.type} is not a stream address")
        try:
            pair = msgpack.unpackb(address.value, raw=False)
            onward, ret = pair
            return cls(onward, ret)
        except (ValueError, TypeError, LocalProtocolError, msgpack.UnpackException) as exc:
            raise RemoteProtocolError(f"malformed stream address: {exc}") from exc


class TransportMessage(NamedTuple):
    """A routed message: where it goes, how to answer, and opaque bytes (immutable).

    A named tuple rather than a frozen dataclass: nodes build several per
    routed message, and a tuple is about three times cheaper to create.
    """

    onward_route: Route
    return_route: Route
    payload: bytes

    def encode(self) -> bytes:
        data: bytes = msgpack.packb(self.to_obj(), use_bin_type=True)
        return data

    def to_obj(self) -> list[Any]:
        """The wire form before msgpack packing (for codecs that embed a message)."""
        return [
            VERSION,
            [[a.type, a.value] for a in self.onward_route],
            [[a.type, a.value] for a in self.return_route],
            self.payload,
        ]

    @classmethod
    def decode(cls, data: bytes, *, max_payload: int = 1 << 20) -> TransportMessage:
        """Parse wire bytes; raises :class:`RemoteProtocolError` with a reason on any defect."""
        if len(data) > max_payload + 64 * MAX_HOPS + 2 * MAX_HOPS * MAX_ADDRESS_LEN:
            raise PayloadTooLarge(f"message of {len(data)} bytes exceeds the limit")
        obj = unpack_bounded(data, max_payload=max_payload, what="message")
        return cls.from_obj(obj, max_payload=max_payload)

    @classmethod
    def from_obj(cls, obj: Any, *, max_payload: int = 1 << 20) -> TransportMessage:
        if not isinstance(obj, list) or len(obj) != 4:
            raise RemoteProtocolError("malformed message: not a 4-item array")
        version, onward, ret, payload = obj
        if version != VERSION or isinstance(version, bool):
            raise RemoteProtocolError(f"unsupported message version {version!r}")
        if not isinstance(payload, bytes):
            raise RemoteProtocolError("malformed message: payload is not bytes")
        if len(payload) > max_payload:
            raise PayloadTooLarge(f"payload of {len(payload)} bytes exceeds {max_payload}")
        return cls(_route_from(onward, "onward"), _route_from(ret, "return"), payload)


def unpack_bounded(data: bytes, *, max_payload: int, what: str) -> Any:
    """msgpack-decode ``data`` with every container and string bounded.

    Binaries may hold a payload of up to ``max_payload`` bytes; strings and
    arrays are bounded by the route limits, and maps and extensions are
    refused. Raises :class:`PayloadTooLarge` or :class:`RemoteProtocolError`
    (naming ``what``) on any defect, never another exception.
    """
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            max_bin_len=max(max_payload, MAX_ADDRESS_LEN),
            max_str_len=MAX_ADDRESS_LEN,
            max_array_len=max(MAX_HOPS, 4),
            max_map_len=0,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        if "exceeds max_bin_len" in str(exc):
            raise PayloadTooLarge(f"{what} payload exceeds {max_payload} bytes") from exc
        raise RemoteProtocolError(f"malformed {what}: {type(exc).__name__} {exc}") from exc


def _route_from(obj: Any, which: str) -> Route:
    if not isinstance(obj, list):
        raise RemoteProtocolError(f"malformed message: {which} route is not an array")
    if len(obj) > MAX_HOPS:
        raise RemoteProtocolError(f"malformed message: {which} route longer than {MAX_HOPS} hops")
    hops: list[Address] = []
    for item in obj:
        if not (type(item) is list and len(item) == 2):
            raise RemoteProtocolError(f"malformed message: {which} hop is not a [type, value] pair")
        kind, value = item
        key = (kind, value) if type(kind) is int and type(value) is bytes else None
        address = _ADDRESSES.get(key) if key is not None else None
        if address is None:
            if key is None:
                raise RemoteProtocolError(f"malformed message: bad {which} hop types")
            try:
                address = Address(kind, value)
            except LocalProtocolError as exc:
                raise RemoteProtocolError(f"malformed message: {exc}") from exc
            if len(_ADDRESSES) >= _ADDRESS_CACHE:
                _ADDRESSES.clear()
            _ADDRESSES[key] = address
        hops.append(address)
    return tuple.__new__(Route, hops)


#: Decoded addresses repeat (the same few routes over and over): reuse them.
_ADDRESS_CACHE = 4096
_ADDRESSES: dict[tuple[int, bytes] | None, Address] = {}


def parse_hop(text: str) -> Address:
    """``name`` | ``tcp:HOST:PORT`` | ``stream:ONWARD/RETURN``."""
    text = text.strip()
    if text.startswith("tcp:"):
        return Address(AddressType.TCP, text[4:].encode())
    if text.startswith("stream:"):
        onward, sep, ret = text[7:].partition("/")
        if not sep:
            raise LocalProtocolError(f"stream hop needs ONWARD/RETURN: {text!r}")
        return StreamAddress(onward, ret).to_address()
    return Address.local(text)


def parse_route(text: str) -> Route:
    """Route text as settings and the CLI write it, e.g. ``stream:b/a,echo``."""
    return Route(parse_hop(part) for part in text.split(",") if part.strip())


__all__ = [
    "MAX_HOPS",
    "VERSION",
    "Address",
    "AddressType",
    "Route",
    "StreamAddress",
    "TransportMessage",
    "parse_hop",
    "parse_route",
]

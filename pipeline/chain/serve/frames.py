"""Notification frames of live blocks: encoded once per block and shared by every subscriber.

A frame is the UTF-8 text of one JSON-RPC notification: the subscription's
prefix (``{"jsonrpc":"2.0","method":...,"params":{"subscription":"0x1","result":``),
one result object of the block, then :data:`~pipeline.chain.jsonrpc.NOTIFICATION_SUFFIX`
(the Dialogue feed sends bare results: prefix and suffix empty).

The live hub publishes each block once; resumption hands every live
subscriber with the same dialect and key filter the *same*
:class:`~pipeline.chain.planning.Emit` (:meth:`~pipeline.chain.produce.producer.LiveBlock.emit`).
:func:`frames_for` keeps that emit's frames by prefix, so subscribers with
equal subscription ids (ids count from ``0x1`` on every connection) send the
same bytes objects: one encoding per block, dialect, filter and id, not one
per subscriber, and a slow subscriber's queue holds references, not copies.
Bounded: at most :data:`SHAPES_PER_BLOCK` prefixes per emit; past that a
subscriber's frames are encoded for it alone, as in catch-up.

Shared frames are :class:`~pipeline.chain.burst.SharedFrames`: with their
websocket frames built once too (``wire``), so a connection with nothing
queued sends them with one ``transport.write`` of bytes every such
subscriber shares (see :class:`pipeline.chain.serve.wsconn.Connection`).

Pure: no I/O.
"""

from __future__ import annotations

from pipeline.chain.burst import SharedFrames
from pipeline.chain.planning import Emit

#: Distinct notification prefixes whose frames one live emit keeps.
SHAPES_PER_BLOCK = 64


def encode_frames(emit: Emit, prefix: str, suffix: str) -> tuple[bytes, ...]:
    """The frames of ``emit`` for one subscription, encoded now (nothing shared)."""
    return tuple([(prefix + result + suffix).encode() for result in emit.results])


def frames_for(emit: Emit, prefix: str, suffix: str) -> SharedFrames | tuple[bytes, ...]:
    """The frames of ``emit``, shared through ``emit.frames`` when it has that cache.

    ``suffix`` must be determined by ``prefix`` (the cache is keyed by prefix
    alone): the JSON-RPC envelope's suffix for a non-empty prefix, "" for "".
    The bytes equal :func:`encode_frames`'s whether they came from the cache or not;
    a cached entry is :class:`~pipeline.chain.burst.SharedFrames`.
    """
    cache = emit.frames
    if cache is None:
        return encode_frames(emit, prefix, suffix)
    hit = cache.get(prefix)
    if hit is None:
        if len(cache) >= SHAPES_PER_BLOCK:
            return encode_frames(emit, prefix, suffix)
        hit = cache[prefix] = SharedFrames.of(encode_frames(emit, prefix, suffix))
    return hit


__all__ = ["SHAPES_PER_BLOCK", "encode_frames", "frames_for"]

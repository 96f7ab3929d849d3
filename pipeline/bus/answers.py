"""The answers the bus writes itself, not a handler: refusals, error replies, laid-out replies.

Pure code on :class:`~pipeline.bus.envelope.Envelope` values: no I/O. Every
answer on a caller's ``ret`` carries ``src`` = the twin it is about, so a
client can match answers to destinations.
"""

from __future__ import annotations

import time

from pipeline.bus.envelope import Envelope

_RET_SLOT = b'"ret":""'


def answer_parts(reply: Envelope) -> tuple[bytes, bytes]:
    """``reply`` encoded with ``ret`` cut out: ``(head, tail)`` around the JSON string of ``ret``.

    ``head + json.dumps(ret).encode() + tail`` is ``reply.copy(ret=ret).encode()``
    (up to string escaping), for a ``ret`` only Redis knows (see ``BusStore.deliver_reply``).
    ``"ret":""`` occurs once in the encoding: a quote inside a JSON string is escaped.
    """
    head, slot, tail = reply.encode(ret="").partition(_RET_SLOT)
    if not slot:
        raise ValueError("encoded envelope has no empty ret field")
    return head + b'"ret":', tail


def refusal(request: Envelope, text: str, *, me: int) -> Envelope:
    """The reply this bus sends in place of a handler that cannot get ``request``."""
    return request.copy(src=me, dst=[request.src], dat="", now=int(time.time()), err=text)


def error_reply(env: Envelope, text: str, *, about: int, me: int) -> Envelope:
    """The answer a caller gets when the bus itself fails a request.

    Like every answer on ``ret`` it carries ``src`` = the destination it is
    about and ``dst`` = ``[me]``, so a client can match answers to destinations.
    """
    return env.copy(src=about, dst=[me], err=text or "error", now=int(time.time()), dat="")

"""The backlog's two ends outside the queue loops: what a bus resends when it becomes
active (:func:`resend_pending`), and the answers to requests past their deadline
(:func:`scrub`).

A request pending at a restart may have reached its peer before it (its
handler may have run): it is resent as :meth:`Outbound.pending_request` builds
it, so should it never get through again it ends ``delivery unknown``, never
``remote unreachable``. A peer that got it answers the resend 409, which counts
as delivered; the backlog lists requests by deadline, so the most urgent go
first.
"""

from __future__ import annotations

import logging

from pipeline import keys
from pipeline.bus import answers, envelope
from pipeline.bus.forward import Forwarder
from pipeline.bus.outbound import Outbound
from pipeline.bus.queues import QueueHandlers
from pipeline.bus.store import BusStore
from pipeline.errors import EnvelopeError

log = logging.getLogger("pipeline.bus.process")

#: The ``err`` of a request answered by the scrubber: no reply before its ``exp``.
EXPIRED_TEXT = "request expired"


async def resend_pending(store: BusStore, forwarder: Forwarder, twin: int, limit: int) -> None:
    """Hand ``forwarder`` every pending request (for another twin) and unsent reply."""
    requests = await store.pending_requests(limit)
    for uid, body, expires in requests:
        try:
            request = envelope.load_trusted(body)
        except EnvelopeError:
            continue  # the scrubber sets it aside
        if request.dst[0] == twin:
            continue  # went to msgbus.system.remote in the same transaction
        await forwarder.submit(
            Outbound.pending_request(uid, request.dst[0], body, expires, request.try_)
        )
    replies = await store.outbox_items(limit)
    for outbox_id, raw in replies:
        try:
            item = Outbound.from_json(outbox_id, raw)
        except (ValueError, KeyError, TypeError, RecursionError):
            log.error("bus: dropping corrupt outbox entry %s", outbox_id)
            await store.drop_outbox(outbox_id)
            continue
        await forwarder.submit(item)
    if requests or replies:
        log.info("bus: resending %d requests, %d replies", len(requests), len(replies))


async def scrub(store: BusStore, queues: QueueHandlers, twin: int, now: float) -> int:
    """Answer backlog entries past their deadline with ``err = "request expired"``, and
    forget old replay-protection entries; returns how many callers were answered."""
    uids = await store.expired(now, 500)
    answered = 0
    if uids:
        originals = await store.backlog(uids)
        async with store.fenced() as pipe:
            for uid, original in zip(uids, originals, strict=True):
                if original is None:
                    pipe.zrem(keys.bus_expiry(), uid)
                    continue
                try:
                    request = envelope.load_trusted(original)
                except EnvelopeError:
                    queues.corrupt_in(pipe, uid, original)
                    continue
                fail = answers.error_reply(request, EXPIRED_TEXT, about=request.dst[0], me=twin)
                await store.finish_in(pipe, uid, request.ret, fail.encode())
                answered += 1
            await pipe.execute()
    await store.forget_seen(now)
    return answered

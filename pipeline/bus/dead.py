"""Dead letters: messages the bus set aside instead of retrying them forever.

A message lands in ``msgbus.system.dead`` (:func:`pipeline.keys.bus_dead`)
when the bus cannot or must not handle it:

* its handling failed :data:`MAX_ATTEMPTS` times (a poison message), or the
  bus stopped that many times while handling it;
* it cannot be answered: an invalid request without a usable ``ret``, a
  ``ret`` holding something other than a list (the answer is kept here), an
  invalid reply nobody waits for, a corrupt backlog entry.

Each entry is one list element, newest first::

    {"queue": "...", "reason": "...", "at": 1764133200, "attempts": 3,
     "size": 1024, "truncated": false}
    <the message bytes, at most BODY_MAX of them>

The header is one line of JSON, then ``\\n``, then the message exactly as it
was (so a requeue pushes the same bytes). The list keeps the newest
:data:`LIST_MAX` entries. Pure code: no Redis here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

#: Handling attempts before a message is set aside.
MAX_ATTEMPTS = 3
#: Entries kept in the dead-letter list (older ones are trimmed).
LIST_MAX = 1000
#: Bytes of a message kept in its entry (larger ones are cut and marked ``truncated``).
BODY_MAX = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    queue: str
    reason: str
    at: int
    attempts: int
    size: int
    truncated: bool
    body: bytes

    def header(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "reason": self.reason,
            "at": self.at,
            "attempts": self.attempts,
            "size": self.size,
            "truncated": self.truncated,
        }


def entry(queue: str, reason: str, body: bytes, *, attempts: int = 0) -> bytes:
    """The list element for ``body`` set aside from ``queue``."""
    head = {
        "queue": queue,
        "reason": reason[:1000],
        "at": int(time.time()),
        "attempts": attempts,
        "size": len(body),
        "truncated": len(body) > BODY_MAX,
    }
    return json.dumps(head).encode() + b"\n" + body[:BODY_MAX]


def parse(raw: bytes) -> DeadLetter:
    """Read one list element back; ``ValueError`` when it is not one."""
    head, sep, body = raw.partition(b"\n")
    try:
        doc = json.loads(head) if sep else None
    except RecursionError as exc:  # anyone can write to the list: never more than ValueError
        raise ValueError("not a dead-letter entry") from exc
    if not isinstance(doc, dict):
        raise ValueError("not a dead-letter entry")
    return DeadLetter(
        queue=str(doc.get("queue", "")),
        reason=str(doc.get("reason", "")),
        at=int(doc.get("at", 0)),
        attempts=int(doc.get("attempts", 0)),
        size=int(doc.get("size", len(body))),
        truncated=bool(doc.get("truncated", False)),
        body=body,
    )

"""What the bus sends to a peer, and what can become of it: :class:`Outbound`, :class:`Outcome`.

An outbound item is an envelope for one peer's ``/zbus-remote`` (a request)
or ``/zbus-reply`` (a reply), with its deadline and ``try`` budget; its JSON
form is the outbox entry a restart resends (:meth:`Outbound.to_json`). Plain
data: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum


class Kind(StrEnum):
    REQUEST = "remote"
    REPLY = "reply"


class Outcome(Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"  # the peer said no: final
    UNREACHABLE = "unreachable"  # never reached the peer (it cannot have acted on it)
    UNKNOWN = "unknown"  # an attempt may have reached the peer: it may have acted on it
    EXPIRED = "expired"  # its deadline passed before it was sent, or the peer said so (410)


#: What a caller's ``err`` starts with when a request could not be delivered in time.
#: "remote unreachable": no attempt reached the peer; retrying cannot run it twice.
#: "delivery unknown": an attempt may have reached it (sent, then the connection broke or
#: the answer timed out); retry only a request that is safe to run twice.
UNREACHABLE_TEXT = "remote unreachable"
UNKNOWN_TEXT = "delivery unknown"


@dataclass(order=True, slots=True)
class Outbound:
    """One envelope to POST. ``id`` is its outbox field."""

    due: float
    id: str = field(compare=False)
    kind: Kind = field(compare=False)
    to: int = field(compare=False)
    body: bytes = field(compare=False)
    deadline: float = field(compare=False)
    tries: int = field(compare=False)
    uid: str = field(compare=False)
    resent: bool = field(default=False, compare=False)
    attempt: int = field(default=0, compare=False)
    last_error: str = field(default="", compare=False)
    #: An attempt may have reached the peer (or the item was pending at a restart).
    maybe_delivered: bool = field(default=False, compare=False)
    #: The request's reply came (its caller has the answer): no copy of it goes out again.
    answered: bool = field(default=False, compare=False)

    @classmethod
    def pending_request(
        cls, uid: str, to: int, body: bytes, deadline: float, tries: int
    ) -> Outbound:
        """A request of the backlog, resent after a restart: an attempt before the
        restart may have reached the peer, so it may have been delivered (it ends
        ``delivery unknown``, never ``remote unreachable``)."""
        return cls(
            due=0.0,
            id=f"req:{uid}",
            kind=Kind.REQUEST,
            to=to,
            body=body,
            deadline=deadline,
            tries=tries,
            uid=uid,
            resent=True,
            maybe_delivered=True,
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind.value,
                "to": self.to,
                "body": self.body.decode(),
                "deadline": self.deadline,
                "tries": self.tries,
                "uid": self.uid,
            }
        ).encode()

    @classmethod
    def from_json(cls, outbox_id: str, raw: bytes) -> Outbound:
        doc = json.loads(raw)
        return cls(
            due=0.0,
            id=outbox_id,
            kind=Kind(doc["kind"]),
            to=int(doc["to"]),
            body=str(doc["body"]).encode(),
            deadline=float(doc["deadline"]),
            tries=int(doc["tries"]),
            uid=str(doc["uid"]),
            resent=True,
            maybe_delivered=True,
        )


#: One item's outcome and its error text ("" when delivered).
Judged = tuple[Outcome, str]
#: One item's final outcome (and error text when not delivered).
Final = tuple[Outbound, Outcome, str]
#: Called once per POST with the final outcomes of its items (those not retried).
Done = Callable[[list[Final]], Awaitable[None]]

"""Writes that count only once replicas hold them: ``WAIT`` after stream pushes and XADDs.

Redis replicates asynchronously: a master acknowledges a write before any replica
has it, and a write acknowledged by a master that dies at once is lost when its
replica takes over. With ``SLUICE_REDIS_MIN_REPLICAS=n`` (default 0: off) every
write on this path is followed, on the *same connection* (one pipeline), by
``WAIT n timeout``; fewer than ``n`` acknowledgements within
``SLUICE_REDIS_MIN_REPLICAS_TIMEOUT_MS`` make the write *failed, may have
happened* (:class:`NotReplicated`): the caller retries it (stream pushes are
idempotent by request id, block appends by hash) or reports it, never counts it
as done.

On a Redis Cluster the ``WAIT`` goes to the master owning the written key (redis-py's
``target_nodes``), so the cluster pipeline sends it on the connection that carried
the write. ``WAIT`` does not make a write atomic with its replication: a master that
dies between the two still lost it, and the caller sees the failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import NotReplicated
from pipeline.redisio.conn import is_cluster


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must hold a write (0: the master's reply is enough)."""

    min_replicas: int = 0
    timeout_ms: int = 1000

    @property
    def on(self) -> bool:
        return self.min_replicas > 0

    def add_waits(self, pipe: Any, client: Any, written: Iterable[str]) -> int:
        """Append ``WAIT`` to ``pipe`` after the writes of keys ``written``: one on a single
        server or Sentinel, one per master owning them on a cluster. Returns how many."""
        if not is_cluster(client):
            pipe.execute_command("WAIT", self.min_replicas, self.timeout_ms)
            return 1
        nodes = {}
        for key in written:
            node = client.get_node_from_key(key)
            nodes[node.name] = node
        for node in nodes.values():
            pipe.execute_command("WAIT", self.min_replicas, self.timeout_ms, target_nodes=node)
        return len(nodes)

    def check(self, acks: Iterable[Any]) -> NotReplicated | None:
        """The error for ``WAIT`` replies ``acks`` (an int each, or the exception it raised)."""
        for ack in acks:
            if isinstance(ack, BaseException):
                return NotReplicated(f"WAIT failed: {ack!r}")
            if int(ack) < self.min_replicas:
                return NotReplicated(
                    f"{int(ack)} of {self.min_replicas} replicas acknowledged the write "
                    f"within {self.timeout_ms} ms"
                )
        return None


__all__ = ["Durability"]

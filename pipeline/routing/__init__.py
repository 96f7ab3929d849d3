"""Routing: addresses, routes, transport messages, workers and the node that owns them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "Address": "pipeline.routing.message",
    "AddressType": "pipeline.routing.message",
    "Route": "pipeline.routing.message",
    "TransportMessage": "pipeline.routing.message",
    "Context": "pipeline.routing.workerbase",
    "Node": "pipeline.routing.node",
    "Transport": "pipeline.routing.node",
    "Worker": "pipeline.routing.workerbase",
    "WorkerContext": "pipeline.routing.workerbase",
}

__all__ = [
    "Address",
    "AddressType",
    "Context",
    "Node",
    "Route",
    "Transport",
    "TransportMessage",
    "Worker",
    "WorkerContext",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.routing.message import (
        Address as Address,
    )
    from pipeline.routing.message import (
        AddressType as AddressType,
    )
    from pipeline.routing.message import (
        Route as Route,
    )
    from pipeline.routing.message import (
        TransportMessage as TransportMessage,
    )
    from pipeline.routing.node import (
        Node as Node,
    )
    from pipeline.routing.node import (
        Transport as Transport,
    )
    from pipeline.routing.workerbase import (
        Context as Context,
    )
    from pipeline.routing.workerbase import (
        Worker as Worker,
    )
    from pipeline.routing.workerbase import (
        WorkerContext as WorkerContext,
    )

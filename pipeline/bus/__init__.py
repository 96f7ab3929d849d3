"""The reliable message bus (seed 002): the Python client and handler server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "BusClient": "pipeline.bus.client",
    "BusServer": "pipeline.bus.server",
    "Envelope": "pipeline.bus.envelope",
}

__all__ = [
    "BusClient",
    "BusServer",
    "Envelope",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.bus.client import (
        BusClient as BusClient,
    )
    from pipeline.bus.envelope import (
        Envelope as Envelope,
    )
    from pipeline.bus.server import (
        BusServer as BusServer,
    )

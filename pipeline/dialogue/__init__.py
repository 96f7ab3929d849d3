"""Dialogue (seed 003): many conversations over one TCP connection or websocket."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "Connection": "pipeline.dialogue.connection",
    "ConnectionLimits": "pipeline.dialogue.limits",
    "DialogueServer": "pipeline.dialogue.server",
    "Duplex": "pipeline.dialogue.duplex",
    "Role": "pipeline.dialogue.states",
}

__all__ = [
    "Connection",
    "ConnectionLimits",
    "DialogueServer",
    "Duplex",
    "Role",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.dialogue.connection import (
        Connection as Connection,
    )
    from pipeline.dialogue.duplex import (
        Duplex as Duplex,
    )
    from pipeline.dialogue.limits import (
        ConnectionLimits as ConnectionLimits,
    )
    from pipeline.dialogue.server import (
        DialogueServer as DialogueServer,
    )
    from pipeline.dialogue.states import (
        Role as Role,
    )

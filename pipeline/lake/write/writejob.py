"""One archive run's interval as both writers take it (:mod:`~pipeline.lake.write.arrowwrite` via
:mod:`~pipeline.lake.archive`, and :mod:`~pipeline.lake.write.sparkwrite`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipeline.lake.write.heights import Heights
from pipeline.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteJob:
    """Entries of ``stream`` (Redis key ``key``) with ids in ``[start_ms-0, end_ms-0)``."""

    settings: Settings
    stream: str
    key: str
    start_ms: int
    end_ms: int
    #: a chain stream: its entries are blocks (``blocks`` is written too)
    chain: bool
    #: the ``archived_at`` of every row this run writes
    archived_at: datetime
    #: ``lap(stage)`` / ``lap(stage, seconds)``: the run's stage timer
    lap: Callable[..., None]
    #: a shared job's :class:`pipeline.lake.write.arrowbatch.SharedWrites` (None: write alone)
    shared: Any = None
    #: the blocks the writers set aside (:mod:`pipeline.lake.write.heights`), summed
    heights: Heights = field(default_factory=Heights)

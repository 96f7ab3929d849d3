"""The ``sluice_archive`` DAG runs as the coverage board shows them, and links into Airflow's UI.

Pure: the runs are read by the board's host (the Airflow plugin), which
builds :class:`RunInfo` values; this module only names them and their pages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

#: The DAG whose runs archive the streams.
DAG_ID = "sluice_archive"
#: Newest DAG runs shown.
DAG_RUNS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """One run of :data:`DAG_ID`: its state, type and data interval (ms since the epoch)."""

    run_id: str
    state: str | None
    run_type: str | None
    start_ms: int | None
    end_ms: int | None
    #: The ``shards`` task's output: which mapped ``archive`` task (a shard's index)
    #: archived which stream.
    shards: tuple[tuple[str, ...], ...] | None = None

    @property
    def streams(self) -> tuple[str, ...] | None:
        """The run's streams, in the order of its shards (None: not known)."""
        return None if self.shards is None else tuple(s for shard in self.shards for s in shard)


def shard_lists(value: object) -> tuple[tuple[str, ...], ...] | None:
    """The ``shards`` XCom as stored (JSON, possibly still a JSON string: a list of lists of
    stream names); None if it is not one."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(
        isinstance(shard, list) and all(isinstance(v, str) for v in shard) for shard in value
    ):
        return tuple(tuple(shard) for shard in value)
    return None


def epoch_ms(moment: datetime | None) -> int | None:
    """``moment`` in milliseconds since the epoch; None stays None."""
    return int(moment.timestamp() * 1000) if moment is not None else None


def run_path(run_id: str) -> str:
    """The DAG run's page in Airflow's UI, relative to the UI's root."""
    return f"/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"


def log_path(run_id: str, stream: str, run: RunInfo | None) -> str:
    """The ``archive`` task of ``stream`` in that run (its log tab), relative to the UI's root.

    The archive task is mapped over the run's shards of streams; the ``shards``
    task's output says which map index archived ``stream``. Unknown (the run is
    not in the metadata database, or it never got that far): the list of the
    run's mapped archive tasks.
    """
    base = f"{run_path(run_id)}/tasks/archive/mapped"
    for index, shard in enumerate(run.shards if run is not None and run.shards else ()):
        if stream in shard:
            return f"{base}/{index}"
    return base


__all__ = ["DAG_ID", "DAG_RUNS", "RunInfo", "epoch_ms", "log_path", "run_path", "shard_lists"]

"""Everything ``coverage.json`` reports, built at most once per snapshot window for every viewer.

Theory of operation: the board owns three sources and builds one snapshot of
them per :data:`SNAPSHOT_TTL_S`, however many viewers poll it.

- ``archive_log``, read with delta-rs in a worker thread at most once per
  :data:`LAKE_TTL_S` (:class:`~pipeline.board.source.Source`: stale-while-refresh);
- the archive DAG's runs, read through the host in a worker thread at most once
  per :data:`AIRFLOW_TTL_S`;
- Redis's hot window, one pipelined ``XINFO STREAM`` per snapshot
  (:class:`~pipeline.board.hotwindow.HotWindow`).

A source that fails is reported in the JSON (``lake.error``, ``redis.error``,
``airflow.error``) and the rest is still served; bad settings are reported too
(``error``), never raised. The coverage numbers come from the same pure
functions as the status page of ``sluice serve``
(:mod:`pipeline.chain.serve.coverage`), so both views agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pipeline import __version__
from pipeline.board.archivelog import (
    ArchiveLogReader,
    LakeView,
    LoggedInterval,
    lake_errors,
)
from pipeline.board.hotwindow import HotStream, HotWindow, RedisView
from pipeline.board.runs import DAG_ID, DAG_RUNS, RunInfo, log_path, run_path
from pipeline.board.source import Source, one_line
from pipeline.chain.serve.coverage import Archived, coverage
from pipeline.lake.intake.streamset import is_chain, is_configured, is_pattern
from pipeline.lifecycle import run_every
from pipeline.runtime.snapshot import SharedSnapshot
from pipeline.settings import LakeSettings, Settings

#: Every viewer within this window gets the same snapshot.
SNAPSHOT_TTL_S = 2.0
#: ``archive_log`` is read at most this often (a slow lake: at most 10% of the time).
LAKE_TTL_S = 5.0
#: The DAG runs are read at most this often.
AIRFLOW_TTL_S = 2.0
#: How long the first snapshot waits for a source's first read.
FIRST_WAIT_S = 5.0

#: One snapshot as JSON (what ``json.dumps`` takes).
Json = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """What the board asks of the orchestrator whose UI shows it (Airflow, in the plugin).

    ``read_runs`` and ``redis_url`` are blocking: the board calls them in a
    worker thread.
    """

    #: The newest runs of :data:`~pipeline.board.runs.DAG_ID` plus the runs named, by run id.
    read_runs: Callable[[Iterable[str]], dict[str, RunInfo]]
    #: What ``read_runs`` raises when it cannot read: reported in one line.
    run_errors: tuple[type[BaseException], ...]
    #: The path of the UI's root, without a trailing slash (links are relative to it).
    ui_base: Callable[[], str]
    #: The Redis URL for these settings and where it came from (``ConfigError``: shown).
    redis_url: Callable[[Settings], tuple[str, str]]


def _load_settings() -> Settings:
    return Settings.load()


class CoverageBoard:
    """Everything ``coverage.json`` reports, with the caches that keep it cheap.

    Build it on the event loop that serves it (the Redis client belongs to
    that loop). ``load_settings`` is a loader so a bad ``SLUICE_*`` value is
    reported on the page instead of raised.
    """

    def __init__(self, host: Host, load_settings: Callable[[], Settings] | None = None) -> None:
        self._host = host
        self._load_settings = load_settings or _load_settings
        self._settings: Settings | None = None
        self._settings_error: str | None = None
        self._lake: Source[LakeView] | None = None
        self._hot: HotWindow | None = None
        self._runs = Source("airflow metadata", self._read_runs, AIRFLOW_TTL_S, host.run_errors)
        self._snapshot = SharedSnapshot(self._build, SNAPSHOT_TTL_S)
        #: Snapshots built (not served): what viewers cost.
        self.builds = 0

    @property
    def lake_reads(self) -> int:
        """Reads of ``archive_log`` started so far."""
        return self._lake.reads if self._lake is not None else 0

    async def body(self) -> bytes:
        """The JSON of the current snapshot, rebuilt at most once per :data:`SNAPSHOT_TTL_S`."""
        return await self._snapshot.get()

    async def close(self) -> None:
        """Close the Redis client and wait for reads under way; every step runs."""
        steps = [self._runs.close]
        if self._hot is not None:
            steps.insert(0, self._hot.close)
        if self._lake is not None:
            steps.append(self._lake.close)
        await run_every(steps)

    def _read_runs(self) -> dict[str, RunInfo]:
        lake = self._lake.value if self._lake is not None else None
        named = {
            row.run_id
            for rows in (lake.newest.values() if lake else ())
            for row in rows
            if row.run_id
        }
        return self._host.read_runs(named)

    def _ensure_settings(self) -> Settings | None:
        """The settings, loaded once; None (and ``_settings_error``) when they are bad."""
        if self._settings is None and self._settings_error is None:
            from pipeline.errors import ConfigError

            try:
                settings = self._load_settings()
                reader = ArchiveLogReader(settings.lake)
            except ConfigError as exc:
                self._settings_error = one_line(exc)
            else:
                self._settings = settings
                self._lake = Source("archive_log", reader.read, LAKE_TTL_S, lake_errors())
                self._hot = HotWindow(lambda: self._host.redis_url(settings))
        return self._settings

    async def _build(self) -> Json:
        self.builds += 1
        now_ms = int(time.time() * 1000)
        base: Json = {
            "version": __version__,
            "now_ms": now_ms,
            "dag_id": DAG_ID,
            "ui_base": self._host.ui_base(),
            "dag_path": f"/dags/{DAG_ID}",
        }
        settings = self._ensure_settings()
        if settings is None:
            return {**base, "error": f"sluice settings: {self._settings_error}", "streams": []}
        assert self._lake is not None and self._hot is not None
        await self._lake.fresh(FIRST_WAIT_S)
        await self._runs.fresh(FIRST_WAIT_S)
        lake = self._lake.value or LakeView()
        runs = self._runs.value or {}
        names = _stream_names(settings.lake, lake)
        redis_view = await self._hot.read(names)
        hot = redis_view.get("streams", {})
        return {
            **base,
            **self._sources_json(settings, redis_view),
            "streams": [
                _stream_json(settings.lake, name, lake, hot.get(name), runs, now_ms)
                for name in names
            ],
            "dag_runs": _runs_json(runs),
            # What viewers cost: snapshots built and source reads, since the board was made.
            "stats": {
                "builds": self.builds,
                "lake_reads": self.lake_reads,
                "airflow_reads": self._runs.reads,
            },
        }

    def _sources_json(self, settings: Settings, redis_view: RedisView) -> Json:
        """Where each source stands (its error and read age) and the lake's settings."""
        assert self._lake is not None
        return {
            "lake": {
                "uri": settings.lake.uri,
                "error": self._lake.error,
                "read_age_s": self._lake.age_s,
            },
            "redis": redis_view,
            "airflow": {"error": self._runs.error, "read_age_s": self._runs.age_s},
            "hot_retention_s": settings.lake.hot_retention_s,
            "archive_cron": settings.lake.archive_cron,
        }


def _stream_names(lake: LakeSettings, view: LakeView) -> list[str]:
    """The configured names and the archived streams (a pattern's streams once archived),
    sorted by name: a page of many streams is read by name, not in ``archive_log``'s order."""
    configured = (*lake.streams, *lake.chain_streams)
    return sorted({*(n for n in configured if not is_pattern(n)), *view.archived})


def _stream_json(
    lake: LakeSettings,
    name: str,
    view: LakeView,
    hot: HotStream | None,
    runs: dict[str, RunInfo],
    now_ms: int,
) -> Json:
    """One stream: what Redis holds, the lake's coverage of it, its newest archive runs."""
    from pipeline.redisio.conn import parse_entry_id

    first_id = hot["first_id"] if hot else None
    last_id = hot["last_id"] if hot else None
    return {
        "name": name,
        "chain": is_chain(lake, name),
        "configured": is_configured(lake, name),
        "redis": hot,
        "coverage": coverage(
            view.archived.get(name, Archived()),
            first_ms=parse_entry_id(first_id)[0] if first_id else None,
            last_ms=parse_entry_id(last_id)[0] if last_id else None,
            now_ms=now_ms,
            hot_retention_s=lake.hot_retention_s,
        ),
        "archive_runs": [_row_json(row, name, runs) for row in view.newest.get(name, ())],
    }


def _row_json(row: LoggedInterval, stream: str, runs: dict[str, RunInfo]) -> Json:
    run = runs.get(row.run_id) if row.run_id else None
    return {
        "run_id": row.run_id,
        "start_ms": row.start_ms,
        "end_ms": row.end_ms,
        "entries": row.entries,
        "blocks": row.blocks,
        "archived_at_ms": row.archived_at_ms,
        "state": run.state if run else None,
        "run_path": run_path(row.run_id) if row.run_id else None,
        "log_path": log_path(row.run_id, stream, run) if row.run_id else None,
    }


def _runs_json(runs: dict[str, RunInfo]) -> list[Json]:
    """The newest :data:`~pipeline.board.runs.DAG_RUNS` runs, newest first."""
    newest = sorted(runs.values(), key=lambda r: r.end_ms or 0, reverse=True)
    return [
        {
            "run_id": run.run_id,
            "state": run.state,
            "run_type": run.run_type,
            "start_ms": run.start_ms,
            "end_ms": run.end_ms,
            "streams": list(run.streams) if run.streams is not None else None,
            "run_path": run_path(run.run_id),
        }
        for run in newest[:DAG_RUNS]
    ]


__all__ = ["AIRFLOW_TTL_S", "FIRST_WAIT_S", "LAKE_TTL_S", "SNAPSHOT_TTL_S", "CoverageBoard", "Host"]

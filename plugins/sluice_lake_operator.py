"""``LakeJobOperator``: one lake job as an Airflow task that stops its job when the task is killed.

Why an operator and not ``@task``: under Airflow 3.3 "Mark failed" (and an
execution timeout) makes the task runner call the operator's ``on_kill`` from
its SIGTERM handler, and a ``@task`` has only the no-op ``on_kill`` of
``BaseOperator``: the job would run on until Airflow's SIGKILL about 5 s
later and could still commit. This operator's ``on_kill`` sends SIGTERM to
the job at once (:func:`sluice_lake_job.stop_running_jobs`); the job
interrupts its Spark work (on a Connect server only its own operations) and
exits without writing its ``archive_log`` row.

Arguments: ``job`` (``archive``, ``canonical``, ``trim``, ``maintain``...),
``stream`` (templated, mappable with ``.expand(stream=...)``), ``interval``
(add ``--start-ms/--end-ms/--run-id`` from the run's data interval) and
``extra_args`` (templated, e.g. ``["--retain-hours", "{{ params.retain_hours }}"]``).
The job's JSON result is the task's XCom; its WARNING lines are task-log
warnings and their count is logged once more at the end.

The archive DAG's operators (see ``dags/sluice_archive.py``):

- :class:`ArchiveStreamsOperator` archives the run's data interval of every
  stream in one job (``sluice lake archive-streams``: one process, one Spark
  session), with ``--catchup`` on scheduled and manual runs (each stream's
  earlier holes in ``archive_log`` first, oldest first, at most
  :data:`pipeline.lake.catchup.CATCHUP_MAX_STEPS` per stream; backfill runs
  archive only their own interval). A stream that fails there does not fail
  the task: the job reports it, and the task logs its error; when every
  stream failed, the task fails (nothing was archived; Airflow retries it).
- :class:`StreamArchiveOperator`, mapped over the streams, is each stream's
  result in Airflow: on its first try it takes the stream's result from that
  job (no job of its own); when the stream failed there, and on every retry,
  it archives the stream in a job of its own and fails with the stream's
  error if that fails too. So results, failures and retries stay per stream.
- :class:`TrimStreamsOperator` trims every stream in one job (``sluice lake
  trim-streams``); each stream's result is in its XCom and log lines.

The per-stream ``archive`` tasks start no job in a healthy run, so the DAG
does not bound them (``max_active_tis_per_dag``); only the tasks that start
Spark jobs are bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from sluice_dag_common import interval_ms, job_env, load_settings
from sluice_lake_job import CLI_MODULE, run_lake_job, stop_running_jobs

from pipeline.errors import LakeJobError

log = logging.getLogger(__name__)


class LakeJobOperator(BaseOperator):
    """Run ``sluice lake JOB`` for this task; see the module docstring."""

    template_fields: Sequence[str] = ("stream", "extra_args")
    ui_color = "#c6e2ff"

    def __init__(
        self,
        *,
        job: str,
        stream: str | None = None,
        interval: bool = False,
        extra_args: Sequence[str] = (),
        report_codes: Sequence[int] = (),
        module: str = CLI_MODULE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.stream = stream
        self.interval = interval
        self.extra_args = list(extra_args)
        self.report_codes = tuple(report_codes)
        #: the module the child runs (tests substitute a stand-in job)
        self.module = module
        self._killed = False

    def job_args(self, context: Any) -> list[str]:
        """The job's arguments."""
        args: list[str] = []
        if self.stream:
            args += ["--stream", str(self.stream)]
        if self.interval:
            start_ms, end_ms = interval_ms(
                context.get("data_interval_start"), context.get("data_interval_end")
            )
            args += ["--start-ms", str(start_ms), "--end-ms", str(end_ms)]
            args += ["--run-id", str(context["run_id"])]
        return args + [str(a) for a in self.extra_args]

    def execute(self, context: Any) -> Any:
        result = self.run_job(context)
        if isinstance(result, dict) and result.get("warnings"):
            log.warning("lake job %s logged %d warning(s); see above", self.job, result["warnings"])
        return result

    def run_job(self, context: Any) -> Any:
        """Run this task's job with :meth:`job_args`; its JSON result."""
        if self._killed:  # killed before the job started: start none
            raise LakeJobError(
                f"lake job {self.job!r} was stopped (task killed)", returncode=None, stderr_tail=""
            )
        settings = load_settings()
        return run_lake_job(
            self.job,
            self.job_args(context),
            env=job_env(settings),
            timeout_s=float(settings.lake.job_timeout_s),
            report_codes=frozenset(self.report_codes),
            module=self.module,
        )

    def on_kill(self) -> None:
        self._killed = True
        stopped = stop_running_jobs()
        log.warning("task killed: stopped %d running lake job(s)", stopped)


def _is_backfill(context: Any) -> bool:
    run_type = getattr(context.get("dag_run"), "run_type", None)
    return str(getattr(run_type, "value", run_type)) == "backfill"


class StreamsJobOperator(LakeJobOperator):
    """One lake job over several streams (``archive-streams``, ``trim-streams``).

    ``streams`` is templated (an XComArg of the streams read at run start
    works). The XCom is the job's result: ``streams`` (each stream's result or
    ``error``) and ``failed``. A stream that fails does not fail the task (its
    per-stream task handles it); when every stream failed, the task fails.
    """

    template_fields: Sequence[str] = ("streams", "extra_args")
    #: what the job does to a stream, for the log lines ("archive", "trim")
    verb = "job"
    #: what becomes of a stream that failed in the job (said after the failed ones)
    retry_note = ""

    def __init__(self, *, streams: Any = (), **kwargs: Any) -> None:
        kwargs.setdefault("report_codes", (1,))  # some stream failed: the result still counts
        super().__init__(**kwargs)
        self.streams = streams

    def names(self) -> list[str]:
        """The streams this task's job covers."""
        streams = self.streams
        return [streams] if isinstance(streams, str) else [str(name) for name in streams or ()]

    def job_args(self, context: Any) -> list[str]:
        names = self.names()
        if not names:
            raise ValueError(f"task {self.task_id}: no stream to {self.verb}")
        return [a for name in names for a in ("--stream", name)] + [str(a) for a in self.extra_args]

    def execute(self, context: Any) -> Any:
        result = super().execute(context)
        failed = list(result.get("failed") or ()) if isinstance(result, dict) else []
        for name in failed:
            log.error(
                "stream %s failed: %s", name, (_stream_result(result, name) or {}).get("error")
            )
        if failed and set(failed) >= set(self.names()):
            # Nothing was done: the task is failed, not green with warnings.
            raise LakeJobError(
                f"every stream of the job failed ({len(failed)}): {', '.join(failed)}",
                returncode=1,
                stderr_tail="",
            )
        if failed:
            log.warning(
                "%d stream(s) failed in this job: %s%s",
                len(failed), ", ".join(failed), self.retry_note,
            )  # fmt: skip
        return result


class ArchiveStreamsOperator(StreamsJobOperator):
    """``sluice lake archive-streams`` of the run's data interval; see the module docstring."""

    verb = "archive"
    retry_note = "; each one's archive task archives it again"

    def __init__(self, *, catchup: bool = True, **kwargs: Any) -> None:
        super().__init__(job="archive-streams", interval=True, **kwargs)
        self.catchup = catchup

    def job_args(self, context: Any) -> list[str]:
        names = self.names()
        if not names:
            raise ValueError(f"task {self.task_id}: no stream to archive")
        start_ms, end_ms = interval_ms(
            context.get("data_interval_start"), context.get("data_interval_end")
        )
        args = [a for name in names for a in ("--stream", name)]
        args += ["--start-ms", str(start_ms), "--end-ms", str(end_ms)]
        args += ["--run-id", str(context["run_id"]), *map(str, self.extra_args)]
        # Backfill runs archive only their own interval: the backfill covers the others.
        return args + (["--catchup"] if self.catchup and not _is_backfill(context) else [])


class TrimStreamsOperator(StreamsJobOperator):
    """``sluice lake trim-streams``: every stream of the run trimmed in one job.

    Each stream's result is in the XCom (``streams``) and logged on its own
    line. When a stream failed, the others are trimmed and the task fails
    (naming it), so Airflow retries it: a trim is idempotent and costs milliseconds.
    """

    verb = "trim"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(job="trim-streams", **kwargs)

    def execute(self, context: Any) -> Any:
        result = super().execute(context)
        streams = result.get("streams") if isinstance(result, dict) else None
        for name, mine in (streams or {}).items():
            if isinstance(mine, dict) and "error" not in mine:
                log.info(
                    "stream %s: trimmed %s entries below %r", name, mine.get("trimmed"),
                    mine.get("min_id"),
                )  # fmt: skip
        failed = list(result.get("failed") or ()) if isinstance(result, dict) else []
        if failed:
            raise LakeJobError(
                f"trim failed for {len(failed)} stream(s): {', '.join(failed)}",
                returncode=1,
                stderr_tail="",
            )
        return result


def _shared_results(context: Any, task_id: str) -> Any:
    """The shared job's result (``task_id``'s XCom) on a task's first try; None on a retry,
    which archives every stream of its shard again (each one's done intervals are skipped)."""
    ti = context.get("ti")
    if ti is None or int(getattr(ti, "try_number", 1) or 1) > 1:
        return None
    return ti.xcom_pull(task_ids=task_id, map_indexes=-1)


class StreamArchiveOperator(ArchiveStreamsOperator):
    """One shard of the run's streams, mapped over ``streams``; see the module docstring.

    ``batch_task_id`` names the :class:`ArchiveStreamsOperator` task of the
    run. Each stream of the shard gets its log line from the shared job's
    result; the streams that failed there (all of them on a retry) are archived
    by one job of this task. The XCom is the list of the shard's per-stream
    results (``caught_up`` and ``warnings`` included), the same whichever job
    archived a stream. A stream that still fails fails the task, naming it.
    """

    template_fields: Sequence[str] = ("streams", "extra_args")

    def __init__(self, *, batch_task_id: str = "archive_streams", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_task_id = batch_task_id
        #: the streams this task's own job archives (those the shared job did not)
        self._redo: list[str] | None = None

    def names(self) -> list[str]:
        return self._redo if self._redo is not None else super().names()

    def execute(self, context: Any) -> Any:
        shard = super().names()
        shared = _shared_results(context, self.batch_task_id)
        results: dict[str, dict[str, Any]] = {}
        redo: list[str] = []
        for stream in shard:
            mine = _stream_result(shared, stream) if shared is not None else None
            if mine is not None and "error" not in mine:
                _log_archived(stream, self.batch_task_id, mine)
                results[stream] = mine
                continue
            if shared is not None:
                error = (mine or {}).get("error", "no result for it")
                log.warning(
                    "stream %s: %s: %s; archiving it here", stream, self.batch_task_id, error
                )
            redo.append(stream)
        if redo:
            self._redo = redo
            try:
                result = LakeJobOperator.execute(self, context)
            finally:
                self._redo = None
            failed = {}
            for stream in redo:
                mine = _stream_result(result, stream)
                if mine is None or "error" in mine:
                    failed[stream] = (mine or {}).get("error", "no result")
                else:
                    _log_archived(stream, "this task", mine)
                    results[stream] = mine
            if failed:
                raise LakeJobError(
                    f"archive failed for {len(failed)} of {len(shard)} stream(s): "
                    + "; ".join(f"{name!r}: {error}" for name, error in failed.items()),
                    returncode=1,
                    stderr_tail="",
                )
        return [results[stream] for stream in shard]


def _log_archived(stream: str, by: str, mine: dict[str, Any]) -> None:
    log.info(
        "stream %s: archived by %s: %s entries read, %s in the lake for the interval, "
        "%s blocks, %s invalid", stream, by, mine.get("read"), mine.get("entries"),
        mine.get("blocks"), mine.get("invalid"),
    )  # fmt: skip
    _log_caught_up(stream, mine)
    if mine.get("warnings"):
        log.warning("stream %s: %d warning(s), see %s", stream, mine["warnings"], by)


def _log_caught_up(stream: str, mine: dict[str, Any]) -> None:
    """Log what the job archived of earlier intervals before the run's own (``--catchup``)."""
    caught = [c for c in mine.get("caught_up") or () if isinstance(c, dict)]
    if caught:
        log.info(
            "stream %s: caught up %d earlier interval(s) first: %d entries read, %d in the lake, "
            "%d blocks", stream, len(caught), sum(int(c.get("read") or 0) for c in caught),
            sum(int(c.get("entries") or 0) for c in caught),
            sum(int(c.get("blocks") or 0) for c in caught),
        )  # fmt: skip


def _stream_result(result: Any, stream: str) -> dict[str, Any] | None:
    streams = result.get("streams") if isinstance(result, dict) else None
    mine = streams.get(stream) if isinstance(streams, dict) else None
    return mine if isinstance(mine, dict) else None


class AuditOperator(LakeJobOperator):
    """``sluice lake audit`` of one chain stream, judged: see ``dags/sluice_audit.py``.

    Gaps are logged as a warning and returned; a broken parent link or a
    duplicate canonical height fails the task without retries.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("report_codes", (1,))
        super().__init__(job="audit", **kwargs)

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import AirflowFailException

        report: dict[str, Any] = super().execute(context)
        stream = self.stream
        gaps = report.get("gaps") or []
        broken = report.get("broken_links") or []
        duplicates = report.get("duplicates") or []
        if gaps:
            log.warning("stream %s: %d gap(s) in the archive: %s", stream, len(gaps), gaps[:20])
        if broken or duplicates:
            raise AirflowFailException(
                f"stream {stream}: canonical chain is inconsistent: broken parent links at "
                f"{broken[:5]}, duplicate canonical heights at {duplicates[:5]}"
            )
        log.info(
            "stream %s: %s canonical blocks %s..%s, continuous: %s",
            stream, report.get("canonical_count"), report.get("first"), report.get("last"),
            not gaps,
        )  # fmt: skip
        return report


class ReplayOperator(LakeJobOperator):
    """``sluice lake replay`` of the block range the run's params name (``sluice_replay``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(job="replay", **kwargs)

    def job_args(self, context: Any) -> list[str]:
        params = context["params"]
        stream, target = str(params["stream"]), str(params.get("target") or "")
        from_num, to_num = int(params["from_num"]), int(params["to_num"])
        if to_num < from_num:
            raise ValueError(f"to_num {to_num} is below from_num {from_num}")
        args = ["--stream", stream, "--from", str(from_num), "--to", str(to_num)]
        return args + (["--target", target] if target else [])

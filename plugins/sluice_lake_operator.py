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

``catchup`` (with ``interval``, for ``archive``): before its own interval the
task archives the holes ``archive_log`` shows for the stream since its first
row, oldest first, at most :data:`sluice_dag_common.CATCHUP_MAX_STEPS` per
task, one job per interval-wide step (see
:func:`sluice_dag_common.archive_steps`). So an interval the scheduler skipped
(``catchup=False`` skips the intervals a long run overran) or whose run
failed is archived by the next run, and coverage has no hole that would stop
trim (chain streams too: the canonical walk marks blocks filled in below
canonical ones). Backfill runs archive only their own interval (the backfill covers the
rest). The XCom is then the own interval's result with ``caught_up`` (one
summary per earlier step) and ``warnings`` summed over all steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from sluice_dag_common import archive_steps, interval_ms, job_env, load_settings
from sluice_lake_job import CLI_MODULE, run_lake_job, stop_running_jobs

from pipeline.errors import LakeJobError

log = logging.getLogger(__name__)

#: What the XCom keeps of each catch-up step.
CAUGHT_UP_FIELDS = ("start_ms", "end_ms", "read", "entries", "blocks", "invalid", "warnings")


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
        catchup: bool = False,
        extra_args: Sequence[str] = (),
        report_codes: Sequence[int] = (),
        module: str = CLI_MODULE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.stream = stream
        self.interval = interval
        self.catchup = catchup
        self.extra_args = list(extra_args)
        self.report_codes = tuple(report_codes)
        #: the module the child runs (tests substitute a stand-in job)
        self.module = module
        self._killed = False

    def job_args(self, context: Any, step: tuple[int, int] | None = None) -> list[str]:
        """The job's arguments; ``step`` replaces the run's data interval (a catch-up step)."""
        args: list[str] = []
        if self.stream:
            args += ["--stream", str(self.stream)]
        if self.interval:
            start_ms, end_ms = step or interval_ms(
                context.get("data_interval_start"), context.get("data_interval_end")
            )
            args += ["--start-ms", str(start_ms), "--end-ms", str(end_ms)]
            args += ["--run-id", str(context["run_id"])]
        return args + [str(a) for a in self.extra_args]

    def steps(self, context: Any, settings: Any) -> list[tuple[int, int]] | None:
        """The catch-up steps of this task (own interval last), or None when it has none."""
        if not (self.catchup and self.interval and self.stream):
            return None
        run_type = getattr(context.get("dag_run"), "run_type", None)
        if str(getattr(run_type, "value", run_type)) == "backfill":
            return None  # the backfill's own runs cover the other intervals
        from pipeline.lake.trim import logged_intervals

        start_ms, end_ms = interval_ms(
            context.get("data_interval_start"), context.get("data_interval_end")
        )
        return archive_steps(logged_intervals(settings.lake, str(self.stream)), start_ms, end_ms)

    def execute(self, context: Any) -> Any:
        settings = load_settings()
        steps = self.steps(context, settings)
        if steps is not None and len(steps) > 1:
            log.info(
                "stream %s: archiving %d earlier interval(s) no run archived yet, first [%d, %d)",
                self.stream, len(steps) - 1, *steps[0],
            )  # fmt: skip
        caught_up: list[dict[str, Any]] = []
        warnings = 0
        earlier: list[tuple[int, int]] = list(steps[:-1]) if steps else []
        own: tuple[int, int] | None = steps[-1] if steps else None
        # Catching up must not eat the task's execution timeout (job limit + 120 s):
        # past half the job limit the remaining earlier steps wait for the next run.
        budget = time.monotonic() + settings.lake.job_timeout_s / 2
        for done, step in enumerate(earlier):
            if time.monotonic() > budget:
                log.warning(
                    "stream %s: %d earlier interval(s) left for the next run (time budget)",
                    self.stream, len(earlier) - done,
                )  # fmt: skip
                break
            result = self._run(context, settings, step)
            if isinstance(result, dict):
                warnings += int(result.get("warnings") or 0)
                caught_up.append({k: result.get(k) for k in CAUGHT_UP_FIELDS})
        result = self._run(context, settings, own)
        if isinstance(result, dict):
            warnings += int(result.get("warnings") or 0)
        if isinstance(result, dict) and steps is not None:
            result = {**result, "caught_up": caught_up, "warnings": warnings}
        if warnings:
            log.warning("lake job %s logged %d warning(s); see above", self.job, warnings)
        return result

    def _run(self, context: Any, settings: Any, step: tuple[int, int] | None) -> Any:
        if self._killed:  # killed between two steps: start no further job
            raise LakeJobError(
                f"lake job {self.job!r} was stopped (task killed)", returncode=None, stderr_tail=""
            )
        return run_lake_job(
            self.job,
            self.job_args(context, step),
            env=job_env(settings),
            timeout_s=float(settings.lake.job_timeout_s),
            report_codes=frozenset(self.report_codes),
            module=self.module,
        )

    def on_kill(self) -> None:
        self._killed = True
        stopped = stop_running_jobs()
        log.warning("task killed: stopped %d running lake job(s)", stopped)


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

    def job_args(self, context: Any, step: tuple[int, int] | None = None) -> list[str]:
        params = context["params"]
        stream, target = str(params["stream"]), str(params.get("target") or "")
        from_num, to_num = int(params["from_num"]), int(params["to_num"])
        if to_num < from_num:
            raise ValueError(f"to_num {to_num} is below from_num {from_num}")
        args = ["--stream", stream, "--from", str(from_num), "--to", str(to_num)]
        return args + (["--target", target] if target else [])

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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from sluice_dag_common import interval_ms, job_env, load_settings
from sluice_lake_job import CLI_MODULE, run_lake_job, stop_running_jobs

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

    def job_args(self, context: Any) -> list[str]:
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
        settings = load_settings()
        result = run_lake_job(
            self.job,
            self.job_args(context),
            env=job_env(settings),
            timeout_s=float(settings.lake_job_timeout_s),
            report_codes=frozenset(self.report_codes),
            module=self.module,
        )
        warnings = int(result.get("warnings") or 0) if isinstance(result, dict) else 0
        if warnings:
            log.warning("lake job %s logged %d warning(s); see above", self.job, warnings)
        return result

    def on_kill(self) -> None:
        stopped = stop_running_jobs()
        log.warning("task killed: stopped %d running lake job(s)", stopped)

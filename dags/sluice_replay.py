"""``sluice_replay``: republish a block range from Delta into a Redis stream (manual).

Trigger it with params ``stream``, ``from_num``, ``to_num`` and optionally
``target`` (the stream to write to; empty = the lake job's default). It reads
the canonical blocks ``from_num..to_num`` of ``stream`` with the JVM-free
reader and XADDs them, one block per entry, in order. It runs as a lake job
child through ``ReplayOperator``: marking the task failed stops the job at once.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import Param, dag
from sluice_dag_common import default_args, load_settings
from sluice_lake_operator import ReplayOperator

_settings = load_settings()


@dag(
    dag_id="sluice_replay",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    # Manual only: unpaused so that a trigger runs (a paused DAG's run sits queued, silently).
    is_paused_upon_creation=False,
    default_args={**default_args(_settings), "retries": 0},
    params={
        "stream": Param("chain:demo", type="string", minLength=1, description="archived stream"),
        "from_num": Param(0, type="integer", minimum=0, description="first block number"),
        "to_num": Param(0, type="integer", minimum=0, description="last block number"),
        "target": Param(
            "", type="string", description="stream to republish into (empty: job default)"
        ),
    },
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_replay() -> None:
    # An operator, not @task: "Mark failed" reaches its on_kill, which stops the job.
    ReplayOperator(task_id="replay")


sluice_replay()

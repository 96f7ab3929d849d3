"""``sluice_replay``: republish a block range from Delta into a Redis stream (manual).

Trigger it with params ``stream``, ``from_num``, ``to_num`` and optionally
``target`` (the stream to write to; empty = the lake job's default). It reads
the canonical blocks ``from_num..to_num`` of ``stream`` with the JVM-free
reader and XADDs them, one block per entry, in order.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from sluice_dag_common import default_args, lake_job, load_settings

_settings = load_settings()


@dag(
    dag_id="sluice_replay",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
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
    @task
    def replay() -> dict[str, Any]:
        params = get_current_context()["params"]
        stream, target = str(params["stream"]), str(params.get("target") or "")
        from_num, to_num = int(params["from_num"]), int(params["to_num"])
        if to_num < from_num:
            raise ValueError(f"to_num {to_num} is below from_num {from_num}")
        args = ["--stream", stream, "--from", str(from_num), "--to", str(to_num)]
        if target:
            args += ["--target", target]
        result: dict[str, Any] = lake_job("replay", *args)
        return result

    replay()


sluice_replay()

"""The archive DAG's runs as the board shows them: links into Airflow's UI and the shards XCom."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pipeline.board.runs import RunInfo, epoch_ms, log_path, run_path, shard_lists

RUN_ID = "scheduled__2026-01-01T00:05:00+00:00"
QUOTED = "scheduled__2026-01-01T00%3A05%3A00%2B00%3A00"


def test_the_run_s_page_quotes_its_id() -> None:
    assert run_path(RUN_ID) == f"/dags/sluice_archive/runs/{QUOTED}"


def test_the_log_link_names_the_stream_s_map_index_when_known() -> None:
    base = f"/dags/sluice_archive/runs/{QUOTED}/tasks/archive/mapped"
    run = RunInfo(
        run_id=RUN_ID, state="success", run_type="scheduled", start_ms=0, end_ms=1,
        shards=(("a", "b"), ("c",)),
    )  # fmt: skip
    assert log_path(RUN_ID, "b", run) == f"{base}/0"  # the shard's task, not the position
    assert log_path(RUN_ID, "c", run) == f"{base}/1"
    assert run.streams == ("a", "b", "c")
    # A stream the run did not archive, a run without the streams output, an unknown run.
    assert log_path(RUN_ID, "d", run) == base
    unmapped = RunInfo(run_id=RUN_ID, state=None, run_type=None, start_ms=None, end_ms=None)
    assert log_path(RUN_ID, "a", unmapped) == base
    assert log_path(RUN_ID, "a", None) == base


def test_the_shards_output_as_stored() -> None:
    assert shard_lists([["a", "b"], ["c"]]) == (("a", "b"), ("c",))
    assert shard_lists(json.dumps([["a"]])) == (("a",),)
    assert shard_lists(json.dumps([["a"]]).encode()) == (("a",),)
    assert shard_lists([]) == ()
    assert shard_lists("not json") is None
    assert shard_lists(["a", "b"]) is None  # a run's streams list (before shards): no link
    assert shard_lists([[1, 2]]) is None
    assert shard_lists({"a": 1}) is None
    assert shard_lists(None) is None


def test_epoch_ms() -> None:
    assert epoch_ms(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1000
    assert epoch_ms(None) is None

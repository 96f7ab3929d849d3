"""The plugin module in-process: its pure link and row helpers, and bad settings on the page.

These import the plugin (and so Airflow) inside the tests, after the session's
``airflow_home`` fixture configured Airflow: an import at collection time
would fix Airflow's configuration for every later test of the session.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

PLUGINS = str(Path(__file__).resolve().parents[3] / "plugins")


@pytest.fixture
def plugin(airflow_home: Path) -> ModuleType:
    if PLUGINS not in sys.path:  # Airflow adds it in its own processes
        sys.path.append(PLUGINS)
    import sluice_coverage

    return sluice_coverage


def test_links_name_the_run_and_the_stream_s_map_index(plugin: ModuleType) -> None:
    run_id = "scheduled__2026-01-01T00:05:00+00:00"
    quoted = "scheduled__2026-01-01T00%3A05%3A00%2B00%3A00"
    assert plugin.run_path(run_id) == f"/dags/sluice_archive/runs/{quoted}"
    run = plugin.RunInfo(
        run_id=run_id, state="success", run_type="scheduled", start_ms=0, end_ms=1,
        shards=(("a",), ("b",)),
    )  # fmt: skip
    base = f"/dags/sluice_archive/runs/{quoted}/tasks/archive/mapped"
    assert plugin.log_path(run_id, "b", run) == f"{base}/1"
    # A stream the run did not archive, a run without the streams output, an unknown run.
    assert plugin.log_path(run_id, "c", run) == base
    unmapped = plugin.RunInfo(run_id=run_id, state=None, run_type=None, start_ms=None, end_ms=None)
    assert plugin.log_path(run_id, "a", unmapped) == base
    assert plugin.log_path(run_id, "a", None) == base


def test_shards_output_as_stored(plugin: ModuleType) -> None:
    assert plugin._shard_lists([["a", "b"]]) == (("a", "b"),)
    assert plugin._shard_lists(json.dumps([["a"]])) == (("a",),)
    assert plugin._shard_lists("not json") is None
    assert plugin._shard_lists([[1, 2]]) is None
    assert plugin._shard_lists({"a": 1}) is None


def test_newest_rows_first_and_bounded(plugin: ModuleType) -> None:
    rows = [
        plugin.LoggedInterval(
            run_id=f"r{i}",
            start_ms=i * 10,
            end_ms=i * 10 + 10,
            entries=1,
            blocks=1,
            archived_at_ms=None,
        )  # fmt: skip
        for i in (3, 1, 4, 0, 2)
    ]
    newest = plugin.newest_rows(rows, limit=3)
    assert [r.run_id for r in newest] == ["r4", "r3", "r2"]


async def test_bad_settings_are_shown_not_raised(plugin: ModuleType) -> None:
    from pipeline.settings import Settings

    board = plugin.CoverageBoard(lambda: Settings.load(env={"SLUICE_HOT_RETENTION_S": "-5"}))
    try:
        data = json.loads(await board.body())
    finally:
        await board.close()
    assert data["streams"] == []
    assert data["error"].startswith("sluice settings: setting 'hot_retention_s'"), data
    assert board.builds == 1


async def test_a_lake_store_that_is_down_is_shown_in_one_line_with_the_read_age(
    plugin: ModuleType, s3_lake: dict[str, object]
) -> None:
    from pipeline.runtime.ports import free_port
    from pipeline.settings import Settings

    down = {**s3_lake, "lake_s3_endpoint": f"http://127.0.0.1:{free_port()}"}
    board = plugin.CoverageBoard(lambda: Settings.load(env={}, **down))
    try:
        data = json.loads(await board.body())
    finally:
        await board.close()
    lake = data["lake"]
    assert lake["error"].startswith("archive_log: cannot read the lake table"), lake
    assert "refused the connection" in lake["error"] and "\n" not in lake["error"], lake
    assert "internal error" not in lake["error"]
    assert "read_age_s" in lake  # the page shows how old the lake read it shows is

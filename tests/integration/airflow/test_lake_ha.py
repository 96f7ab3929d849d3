"""The lake's chain jobs on Redis beyond one server: canonical marking, the trim an Airflow
task runs through the Redis hook (after a master's death) and replay, on Sentinel and
Cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.blockcodec import decode_block
from pipeline.lake.archive import archive_interval
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.replay import replay
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from tests.integration.lake.helpers import chain, publish, settings_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.mark.parametrize("layout", ["sentinel", "cluster"])
def test_canonical_then_trim_through_the_hook_after_a_failover_then_replay(
    spark: Any,
    airflow_home: Path,
    lake_uri: str,
    layout: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sluice_dag_common import job_env
    from sluice_lake_job import run_lake_job

    group = request.getfixturevalue(
        {"sentinel": "redis_sentinels", "cluster": "redis_cluster"}[layout]
    )
    url = group.ready_url()
    blocks = chain(0, 10)
    client = redisconn.connect_sync(url, Role.CLI)
    try:
        publish(client, "c", blocks, first_ms=1000)  # 1000..1009
        client.xadd(keys.stream("c"), {b"block": b"late"}, id="5000-0")  # not archived
        settings = settings_for(url, lake_uri)
        archive_interval(spark, settings, "c", 1000, 1010)
        assert mark_canonical(spark, settings, "c").marked == 10
        group.wait_replicated()
        dead = group.kill_master(keys.stream("c")) if layout == "cluster" else group.kill_master()
        try:
            group.wait_failed_over(dead)
            # The Airflow task's path: the URL from the connection's extra, the job a child.
            conn = {"conn_type": "redis", "host": "ignored", "extra": {"url": url}}
            monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", json.dumps(conn))
            env = {**job_env(settings), "SLUICE_LAKE_URI": lake_uri}
            assert env["SLUICE_REDIS_URL"] == url
            trimmed = run_lake_job(
                "trim", ["--stream", "c", "--now-ms", str(10**13)], env=env, timeout_s=240
            )
            assert trimmed["trimmed"] == 10, trimmed
            assert [e[0] for e in client.xrange(keys.stream("c"))] == [b"5000-0"]
            out = replay(settings, "c", 0, 9, target_stream="copy")
            assert (out.published, out.skipped, out.missing) == (10, 0, 0)
            assert replay(settings, "c", 0, 9, target_stream="copy").published == 0
            copied = [decode_block(f[b"block"]) for _, f in client.xrange(keys.stream("copy"))]
            assert [b.hash for b in copied] == [b.hash for b in blocks]
        finally:
            group.heal()
    finally:
        client.close()

"""``sluice lake backfill`` and ``sluice lake replay`` through the real command, off a terminal.

Real Redis, a local lake, the session's Spark Connect server. The backfill
covers every interval of the archive cron in its range with one contiguous
run of ``archive_log`` rows, says its progress in ``progress:`` lines on
stderr (stdout stays one JSON line), and a rerun reads nothing. Replay tells
its progress the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.blockcodec import encode_block
from pipeline.lake.backfill import parse_time
from tests.integration.lake.helpers import append_blocks, chain
from tests.support.lakejob import job_env, log_rows, run_job

T0 = parse_time("2026-01-01T00:00:00Z", "t")
MIN = 60_000


def env_for(redis_url: str, lake_uri: str, tmp_path: Path, remote: str = "") -> dict[str, str]:
    return job_env(redis_url, lake_uri, tmp_path, remote, SLUICE_ARCHIVE_CRON="* * * * *")


def sluice(env: dict[str, str], *args: str, timeout: float = 240) -> tuple[int, Any, str]:
    """``sluice lake ARGS`` as a person types it."""
    return run_job(env, "lake", *args, timeout=timeout, module="pipeline.cli")


@pytest.mark.spark
def test_backfill_covers_every_interval_once_and_a_rerun_reads_nothing(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    # 80 blocks, one every 750 ms from 00:00: minute 0 holds them, minutes 1 and 2 nothing
    # (an interval with nothing in Redis is logged without Spark: one Spark write in all).
    pipe = redis_client.pipeline(transaction=False)
    for i, block in enumerate(chain(0, 80)):
        pipe.xadd(keys.stream("c"), {"block": encode_block(block)}, id=f"{T0 + i * 750}-0")
    pipe.execute()
    env = env_for(redis_url, lake_uri, tmp_path, spark_remote)
    since, until = "2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z"

    code, doc, err = sluice(env, "backfill", "--stream", "c", "--since", since, "--until", until)
    assert code == 0, err
    assert (doc["intervals"], doc["covered"], doc["entries"], doc["blocks"]) == (3, 0, 80, 80)
    assert "Traceback" not in err
    # off a terminal: plain progress lines, the last one with every interval done
    progress = [line for line in err.splitlines() if "progress:" in line]
    assert progress and progress[-1].startswith("INFO progress: 3/3 intervals (100%), 80 entries")
    assert "entries/s" in progress[-1]
    rows = log_rows(lake_uri, "c")
    assert [(a, b) for a, b, _ in rows] == [(T0 + i * MIN, T0 + (i + 1) * MIN) for i in range(3)]
    assert [n for _, _, n in rows] == [80, 0, 0]

    # A rerun over the same range: every interval is archived already, no Spark.
    code, again, err = sluice(env, "backfill", "--stream", "c", "--since", since, "--until", until)
    assert code == 0, err
    assert (again["intervals"], again["covered"], again["spark"]) == (0, 3, "not started")
    # From the coverage (the default): the run holding the oldest entry in Redis ends at
    # 00:03, so it starts there and goes on up to --until, contiguously.
    code, more, err = sluice(env, "backfill", "--stream", "c", "--until", "2026-01-01T00:05:00Z")
    assert code == 0, err
    assert (more["intervals"], more["covered"], more["start_ms"]) == (2, 0, T0 + 3 * MIN), err
    assert "the end of the lake's coverage of what Redis holds" in err
    rows = log_rows(lake_uri, "c")
    assert [(a, b) for a, b, _ in rows] == [(T0 + i * MIN, T0 + (i + 1) * MIN) for i in range(5)]


def test_replay_tells_its_progress(
    redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    append_blocks(lake_uri, "c", chain(0, 3000))
    env = env_for(redis_url, lake_uri, tmp_path)
    code, doc, err = sluice(
        env, "replay", "--stream", "c", "--from", "0", "--to", "2999", "--target", "copy"
    )
    assert code == 0, err
    assert (doc["published"], doc["missing"]) == (3000, 0)
    assert redis_client.xlen(keys.stream("copy")) == 3000
    progress = [line for line in err.splitlines() if "progress:" in line]
    assert progress[-1].startswith("INFO progress: 3,000/3,000 blocks (100%), "), err
    assert "blocks/s" in progress[-1]
    # A rerun publishes nothing (the blocks are in the target) and still ends its progress.
    code, doc, err = sluice(
        env, "replay", "--stream", "c", "--from", "0", "--to", "2999", "--target", "copy"
    )
    assert code == 0 and (doc["published"], doc["skipped"]) == (0, 3000), err


BAD = [
    ("unknown stream", ["--stream", "nope"], ["unknown stream 'nope'", "SLUICE_STREAMS"]),
    ("until before since",
     ["--stream", "c", "--since", "2026-01-02T00:00Z", "--until", "2026-01-01T00:00Z"],
     ["--until 2026-01-01T00:00:00Z is not after --since 2026-01-02T00:00:00Z"]),
    ("bad since", ["--stream", "c", "--since", "last tuesday"], ["--since: not an ISO 8601 time"]),
    ("bad until", ["--stream", "c", "--until", "2026-13-01"], ["--until: not an ISO 8601 time"]),
    ("both starts", ["--stream", "c", "--since", "2026-01-01", "--from-coverage"],
     ["exclude each other"]),
]  # fmt: skip


@pytest.mark.parametrize(("args", "needles"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_backfill_bad_input_is_one_line_and_exit_2(
    args: list[str], needles: list[str], redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    code, doc, err = sluice(env_for(redis_url, lake_uri, tmp_path), "backfill", *args, timeout=60)
    assert code == 2 and doc is None, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]

from __future__ import annotations

from pipeline.intervals import covered_until, merge_intervals


def test_merge_intervals() -> None:
    assert merge_intervals([(5, 10), (0, 5), (20, 30), (25, 26), (7, 7)]) == [(0, 10), (20, 30)]
    assert merge_intervals([]) == []


def test_coverage_stops_at_a_gap_and_needs_the_oldest_entry() -> None:
    log = [(0, 100), (100, 200), (250, 300)]
    assert covered_until(log, 0) == 200
    assert covered_until(log, 150) == 200
    assert covered_until(log, 200) is None  # the oldest entry sits in the gap
    assert covered_until(log, 260) == 300
    assert covered_until([], 5) is None


def test_trim_streams_with_redis_gone_names_every_stream_and_tries_few(tmp_path: object) -> None:
    """Streams are trimmed several at once; once Redis is found gone, the ones not started
    yet are recorded as not tried with that cause (each would wait and fail the same way)."""
    import contextlib

    from pipeline.lake.trimstreams import WORKERS, trim_streams
    from pipeline.runtime.ports import free_port
    from pipeline.settings import Settings

    settings = Settings.load(
        env={}, redis_url=f"redis://127.0.0.1:{free_port()}/0", lake_uri=f"{tmp_path}/lake"
    )
    names = [f"events:t{i}" for i in range(3 * WORKERS)]
    result, ok = trim_streams(
        settings, names, locked=lambda _: contextlib.nullcontext(), check=lambda: None
    )
    assert not ok and list(result["streams"]) == names and result["failed"] == names
    errors = [result["streams"][name]["error"] for name in names]
    skipped = [e for e in errors if e.startswith("not tried: ")]
    assert len(skipped) >= len(names) - WORKERS, errors
    assert all("unavailable" in e for e in errors), errors

"""Archive -> canonical (with a reorg) -> audit -> safe trim -> replay, on real Redis + Spark + Delta."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline import keys
from pipeline.blockcodec import decode_block
from pipeline.errors import LakeError
from pipeline.lake.archive import archive_interval
from pipeline.lake.audit import audit
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.maintain import maintain
from pipeline.lake.replay import replay
from pipeline.lake.storage.reader import LakeReader
from pipeline.lake.trim import safe_trim
from tests.integration.lake.helpers import chain, publish, settings_for

pytestmark = pytest.mark.spark


def test_reorg_canonical_audit_trim_replay(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    settings = settings_for(redis_url, lake_uri)
    main = chain(0, 10)
    fork = chain(7, 11, branch="fork", parent=main[6].hash)
    publish(redis_client, "c", main, first_ms=1000)  # 1000..1009
    publish(redis_client, "c", fork, first_ms=1010)  # 1010..1013

    archive_interval(spark, settings, "c", 1000, 1010)
    first = mark_canonical(spark, settings, "c")
    assert (first.head_num, first.head_hash, first.marked, first.unmarked) == (
        9,
        main[9].hash,
        10,
        0,
    )

    archive_interval(spark, settings, "c", 1010, 1014)
    second = mark_canonical(spark, settings, "c")
    assert (second.head_num, second.head_hash, second.marked, second.unmarked) == (
        10,
        fork[3].hash,
        4,
        3,
    )
    reader = LakeReader(lake_uri)
    version = reader.version
    assert [r.hash for b in reader.iter_canonical("c", 0) for r in b] == [
        b.hash for b in main[:7] + fork
    ]
    reorged = reader.find_hash("c", main[8].hash)
    assert reorged is not None and not reorged.canonical

    again = mark_canonical(spark, settings, "c")
    assert (again.marked, again.unmarked, again.head_num) == (0, 0, 10)
    reader.refresh()
    assert reader.version == version  # nothing to change: no commit at all

    report = audit(settings, "c")
    assert report.ok and (report.first, report.last, report.canonical_count) == (0, 10, 11)
    assert report.gaps == () and report.broken_links == ()

    # Trim: entries added after the archive runs are not covered and must survive every trim.
    redis_client.xadd(keys.stream("c"), {b"block": b"late"}, id="1014-0")
    redis_client.xadd(keys.stream("c"), {b"block": b"later"}, id="5000-0")
    held = safe_trim(settings.replace(hot_retention_s=3600), "c", now_ms=1005 + 3_600_000)
    assert (held.min_id, held.trimmed) == ("1005-0", 5)  # hot retention is the lower bound here
    for now_ms in (2000, 10**6, 10**13):
        result = safe_trim(settings, "c", now_ms=now_ms)
        # 1014 while archived entries remain; None once the oldest entry is unarchived.
        assert result.covered_to_ms in (1014, None)
        left = [e[0].decode() for e in redis_client.xrange(keys.stream("c"))]
        assert {"1014-0", "5000-0"} <= set(left)
    assert [e[0] for e in redis_client.xrange(keys.stream("c"))] == [b"1014-0", b"5000-0"]
    assert safe_trim(settings, "c", now_ms=10**13).trimmed == 0
    # A stream whose oldest entry is in no archived interval is never trimmed.
    redis_client.xadd(keys.stream("plain"), {b"a": b"1"}, id="1-0")
    assert safe_trim(settings, "plain", now_ms=10**13).trimmed == 0

    # Replay the canonical chain into another stream; a rerun publishes nothing twice.
    out = replay(settings, "c", 0, 12, target_stream="copy")
    assert (out.published, out.skipped, out.missing) == (11, 0, 2)
    copied = [decode_block(f[b"block"]) for _, f in redis_client.xrange(keys.stream("copy"))]
    assert [b.hash for b in copied] == [b.hash for b in main[:7] + fork]
    rerun = replay(settings, "c", 0, 10, target_stream="copy")
    assert (rerun.published, rerun.skipped) == (0, 11)
    assert redis_client.xlen(keys.stream("copy")) == 11
    with pytest.raises(LakeError, match="bad block range"):
        replay(settings, "c", 5, 4)

    # Maintenance compacts and vacuums; the JVM-free reader still reads the same chain.
    done = maintain(spark, settings, retain_hours=0)
    assert {t.table for t in done.tables} == {"stream_entries", "blocks", "archive_log"}
    blocks = next(t for t in done.tables if t.table == "blocks")
    # One live file after it (canonical marking rewrote the touched files one by one; a
    # single-file table is not rewritten); old versions' files are gone.
    assert blocks.files_after == 1 and blocks.files_added <= 1 and blocks.vacuumed > 0
    assert len(DeltaTable(settings.lake.table("blocks")).file_uris()) == 1
    reader = LakeReader(lake_uri)
    assert [r.hash for b in reader.iter_canonical("c", 0) for r in b] == [
        b.hash for b in main[:7] + fork
    ]
    assert DeltaTable(settings.lake.table("blocks")).protocol().reader_features is None

    # The CLI prints one JSON line (no Spark for audit).
    env = {**os.environ, "SLUICE_LAKE_URI": lake_uri, "SLUICE_REDIS_URL": redis_url}
    out_cli = subprocess.run(
        [sys.executable, "-m", "pipeline.lake.cli", "audit", "--stream", "c"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    line = json.loads(out_cli.stdout.strip().splitlines()[-1])
    assert (line["job"], line["ok"], line["last"], line["canonical_count"]) == (
        "audit",
        True,
        10,
        11,
    )


def test_blocks_archived_below_the_marked_chain_are_marked_and_trim_waits_for_them(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    settings = settings_for(redis_url, lake_uri)
    blocks = chain(0, 20)
    publish(redis_client, "c", blocks, first_ms=1000)  # 1000..1019
    archive_interval(spark, settings, "c", 1010, 1020)  # the later interval first
    assert mark_canonical(spark, settings, "c").marked == 10
    archive_interval(spark, settings, "c", 1000, 1010)  # then the hole below it

    # Archived but not yet marked: trim keeps them in Redis (the server serves marked rows).
    held = safe_trim(settings, "c", now_ms=10**13)
    assert (held.min_id, held.trimmed, held.covered_to_ms) == ("1000-0", 0, 1020)

    filled = mark_canonical(spark, settings, "c")
    assert (filled.marked, filled.unmarked, filled.head_num) == (10, 0, 19)
    reader = LakeReader(lake_uri)
    assert [r.hash for b in reader.iter_canonical("c", 0) for r in b] == [b.hash for b in blocks]
    assert audit(settings, "c").ok
    assert safe_trim(settings, "c", now_ms=10**13).trimmed == 20

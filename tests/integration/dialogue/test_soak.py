"""Soak: a bounded abuse mix against a real ``sluice node`` for 10 s, next to a witness peer.

The witness loses nothing and its latency stays bounded; the node stays up,
and its RSS and open file descriptors come back within a margin of the
baseline. The mix and the figures are ``tests/bench/abuse_node.py``.
"""

from __future__ import annotations

from typing import Any

from tests.bench import abuse_node

#: Generous bounds: the machine is shared, the point is "bounded", not fast.
P99_LIMIT_MS = 2000.0
RSS_MARGIN_MB = 64.0
FDS_MARGIN = 4


def test_node_soak_under_abuse(redis_url: str) -> None:
    # 10 s: ~500 witness echoes (one per 20 ms) and every abuse kind many times over;
    # longer runs are the benchmark's (make bench B=abuse).
    rows = abuse_node.run(10.0, redis_url=redis_url)
    figures: dict[str, dict[str, Any]] = {row["metric"]: row for row in rows}
    assert figures["node_alive"]["value"] == 1.0
    assert figures["witness_lost"]["value"] == 0, figures["witness_lost"]
    assert figures["witness_p50_ms"]["requests"] > 100
    assert figures["witness_p99_ms"]["value"] < P99_LIMIT_MS, rows
    rss = figures["rss_mb"]
    assert rss["value"] <= rss["baseline"] + RSS_MARGIN_MB, rss
    fds = figures["open_fds"]
    assert fds["value"] <= fds["baseline"] + FDS_MARGIN, fds
    assert fds["high"] > fds["baseline"] + 50  # the abuse did reach the node
    refusals = figures["node_refusals"]
    assert refusals.get("tcp_transport.evicted", 0) > 0
    assert refusals.get("consumer.dead_lettered", 0) > 0

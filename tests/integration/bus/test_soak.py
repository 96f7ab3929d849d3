"""Soak: the abuse mix of tests/bench/abuse_bus.py against two real ``sluice bus`` processes.

The witness client next to it must lose nothing and see its latency stay
bounded; both buses stay up, log no traceback, and their RSS and open file
descriptors come back to within a margin of their baseline.
"""

from __future__ import annotations

import pytest

from tests.bench import abuse_bus

pytestmark = pytest.mark.timeout(150)

#: 10 s: ~900 witness calls and ~1,600 abuse moves at load 8, every kind many times over
#: (longer runs are the benchmark's: make bench B=abuse).
DURATION_S = 10.0
#: Bounds, not performance figures: a stall or a leak breaks them, a slow machine does not.
MAX_LATENCY_MS = 5_000.0
#: Half of what they were over 20 s: a leak must show at the same rate to pass as before
#: (measured over 10 s: RSS 3-4 MB above the baseline, descriptors back to it).
RSS_MARGIN_MB = 32.0
FD_MARGIN = 4


def test_abuse_mix_next_to_a_witness():
    rows = {row["metric"]: row for row in abuse_bus.run(DURATION_S)}
    assert rows["witness_lost"]["value"] == 0, rows["witness_lost"]
    assert rows["witness_p50_ms"]["calls"] > 50  # the witness kept being served
    assert rows["witness_max_ms"]["value"] < MAX_LATENCY_MS
    assert rows["bus_tracebacks"]["value"] == 0
    assert rows["dead_letters"]["value"] > 0  # the mix did reach the buses
    for bus in ("bus-a", "bus-b"):
        assert rows[f"{bus}_alive"]["value"] == 1.0
        rss = rows[f"{bus}_rss_after_mb"]
        assert rss["value"] <= rss["baseline"] + RSS_MARGIN_MB, rss
        fds = rows[f"{bus}_fds_after"]
        assert fds["value"] <= fds["baseline"] + FD_MARGIN, fds

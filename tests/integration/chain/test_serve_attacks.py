"""Soak: a live witness keeps up while catch-ups flood and slow-loris peers hang (issue 21).

A real ``sluice serve`` process (tests/bench/abuse_serve_attacks.py): 64 subscriptions catching up from block 0 (48 of them on 3
connections that never read) next to 200 connections that never finish their
upgrade request. The witness, subscribed at the head, must get every block
and keep up: its delay p99 under a quarter of the attack phase (see
:data:`BACKLOG_S`; the delay itself is timed by ``make bench B=abuse``
against a quiet phase's, which this test has no use for); the stuck readers are closed with 1008 and
counted; the slow-loris peers are answered 408 and closed; resident memory
and descriptors come back within 20% of the baseline, taken after one warm-up
catch-up (the lake is empty here: no history cache; what held memory was
CPython's arenas, see pipeline/runtime/memory.py). Before the fixes: p99 10-20 s, no 1008, the slow-loris
connections held for good, RSS 1.45x the baseline after 90 s idle.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "bench"))

#: The attack phase, in seconds (longer with ``SLUICE_SOAK_S``).
PHASE_S = float(os.environ.get("SLUICE_SOAK_S", "20"))
#: A witness that keeps up has a delay that does not grow with the phase; one starved by
#: the attacks falls further behind the longer they last (before the fixes: p99 7.9 s and
#: 10-20 s over 20 s). So its p99 must stay under a quarter of the phase: a backlog, not
#: a speed (p99 0.1-0.2 s at load 4, 0.7 s at load 7, 1.3 s at load 14 with the fixes).
BACKLOG_S = PHASE_S / 4

#: make soak only (~60 s): make test keeps the shorter mix of tests/integration/chain/test_server_abuse.py
pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    import asyncio

    import abuse_serve_attacks
    from abuse_serve import _proc_status

    from tests.support.poll import until

    async def settle(pid: int, result: abuse_serve_attacks.AttackResult) -> None:
        def back() -> bool:
            result.rss_after_kb, result.fds_after = _proc_status(pid)
            return result.settled()

        # the deadline only bounds a hang: the server gives memory back every few seconds
        with contextlib.suppress(AssertionError):  # (asserted by the test, with the figures)
            await until(back, "RSS and descriptors back near the baseline", within_s=180, every_s=1)

    lake = str(tmp_path_factory.mktemp("lake"))
    return asyncio.run(
        abuse_serve_attacks.soak(PHASE_S, phases=("all",), lake_uri=lake, settle=settle)
    )


def test_the_witness_keeps_up_while_catchups_and_slowloris_attack(attacked) -> None:
    result = attacked
    assert result.server_alive and result.notes == [], result
    attack = result.phase("all")
    assert attack.missing == 0, result
    assert attack.blocks > 0
    assert attack.p99_ms < BACKLOG_S * 1000, result
    counters = result.counters
    assert counters["sluice_serve_slow_disconnects_total"] >= 1, result
    assert counters["sluice_serve_header_timeouts_total"] >= 200, result
    assert result.attacker["slowloris_opened"] >= 200, result


def test_memory_and_descriptors_come_back_after_the_attack(attacked) -> None:
    result = attacked
    assert result.server_alive and result.rss_high_kb > result.rss_base_kb * 1.2, result
    # resident memory and descriptors back within 20% of the baseline (result.settled)
    assert result.fds_after <= result.fds_base * 1.2 + 2, result
    assert result.rss_after_kb <= result.rss_base_kb * 1.2, result

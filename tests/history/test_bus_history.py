"""The bus's history checker: seeded schedules of calls under faults, judged by the handler's log.

``make test`` runs :data:`SEEDS`; ``make soak`` runs ``CHECKER_SEEDS`` more (from
1000 up; ``BUS_CHECKER_SEEDS`` for this checker alone); ``CHECKER_SEED=N`` runs
seed N alone (what a failure prints). A seed draws its variant (standby buses,
Sentinel groups: :func:`tests.history.busschedule.draw_variant`);
``BUS_CHECKER_STANDBY`` and ``BUS_CHECKER_SENTINEL`` (``1`` or ``0``) force a
part on or off for every seed. The checker's own rules are tested first, on
histories written by hand; the draws in ``test_bus_draws.py``.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.history import harness
from tests.history.buscallers import SLACK_S, Answer, Call, Loss
from tests.history.buschecker import Execution, check
from tests.history.bushandler import answer_of
from tests.history.busrun import replay_command, run_seed, variant_of
from tests.history.conftest import record

SEEDS = [43, 208, 356]  # 43 with standbys, 356 with standbys on Sentinel
STEPS = 8
PREFIX = "BUS_"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", harness.seeds(SEEDS, PREFIX))
async def test_bus_history(
    seed: int, tmp_path: Path, toxiproxy: Any, request: pytest.FixtureRequest
) -> None:
    steps = harness.steps(STEPS, PREFIX)
    variant, forced = variant_of(seed, dict(os.environ))
    replay = replay_command(seed, steps, STEPS, forced)
    try:
        report = await run_seed(seed, tmp_path, toxiproxy, steps, variant)
    except Exception as exc:  # the harness itself failed: say which seed, and how to replay it
        raise AssertionError(f"bus seed {seed} could not run: {exc!r}\nreplay: {replay}") from exc
    draws: Counter[str] = Counter(f"bus fault {fault}" for fault in report.faults)
    for kind, n in report.outcomes.items():
        draws[f"bus outcome {kind}"] += n
    lines = [report.summary(), *(f"  allowed: {line}" for line in report.allowed)]
    record(request, lines, draws)
    if report.violations:
        pytest.fail(
            harness.failure(report.summary(), report.violations, report.steps, replay),
            pytrace=False,
        )


# --- the checker's rules, on histories written by hand ---------------------------------


def _call(n: int, *answers: tuple[float, str], issued: float = 1.0) -> Call:
    call = Call(f"c{n}", exp=5, tries=3, hold_ms=0, dst=1002, issued=issued, sent=True)
    for t, err in answers:
        data = b"" if err else answer_of(call.id)
        call.answers.append(Answer(t, err, data, 1002, late=t < 0))
    return call


def _runs(*calls: int) -> list[Execution]:
    return [Execution(f"c{n}", f"1002.{i}") for i, n in enumerate(calls)]


def _at(t: float) -> list[Loss]:
    """A Redis losing its data at ``t`` (in both clocks, for these hand-written histories)."""
    return [Loss(t, t, t, t)]


def _bad(calls: list[Call], runs: list[Execution], **losses: float) -> dict[str, str]:
    sender, receiver = losses.get("sender"), losses.get("receiver")
    verdict = check(calls, runs, sender_losses=_at(sender) if sender else [],
                    receiver_losses=_at(receiver) if receiver else [])  # fmt: skip
    return {k: "; ".join(v) for k, v in verdict.violations.items()}


def test_a_history_that_keeps_the_contract_has_no_violation() -> None:
    calls = [
        _call(1, (2.0, "")),
        _call(2, (6.0, "remote unreachable: twin 1002")),
        _call(3, (6.0, "delivery unknown")),
        _call(4, (6.0, "request expired")),
        _call(5, (6.0, "request expired")),
    ]
    assert _bad(calls, _runs(1, 3)) == {}


def test_each_broken_promise_is_a_violation() -> None:
    calls = [
        _call(1, (2.0, "")),  # answered, never ran
        _call(2, (2.0, "")),  # answered, ran twice
        _call(3, (6.0, "remote unreachable")),  # unreachable, yet ran
        _call(4, (6.0, "delivery unknown")),  # at most once, ran twice
        _call(5),  # no answer at all
        _call(6, (2.0, ""), (-1, "request expired")),  # answered twice
        _call(7, (-1, "")),  # answered only after the caller's wait
    ]
    calls[0].answers[0].data = answer_of("c9")
    bad = _bad(calls, _runs(2, 2, 3, 4, 4, 6, 7, 8))
    assert set(bad) == {"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"}
    assert "ran 0 time(s)" in bad["c1"] and "not its own result" in bad["c1"]
    assert "ran 2 time(s) (uids 1002.0, 1002.1)" in bad["c2"]
    assert "unreachable: the handler ran 1" in bad["c3"]
    assert "no answer within exp 5s" in bad["c5"]
    assert "answered 2 times" in bad["c6"] and "only after exp" in bad["c7"]
    assert "never made" in bad["c8"]


def test_data_loss_owes_what_the_docs_say() -> None:
    # the sender's Redis wiped at t=3 while c1 waited: no answer owed, still at most once
    assert _bad([_call(1)], _runs(1), sender=3.0) == {}
    assert "ran 2" in _bad([_call(1)], _runs(1, 1), sender=3.0)["c1"]
    assert "no answer" in _bad([_call(1, issued=4.0)], _runs(1), sender=3.0)["c1"]
    # the receiver's Redis wiped at 100 (its wall clock, as the handler's log)
    calls = [_call(2, (6.0, "")), _call(3, (6.0, "")), _call(4, (6.0, ""))]
    for call, answered in zip(calls, (101.0, 103.0, 100.2), strict=True):
        call.answers[0].wall = answered
    runs = [
        *(Execution("c2", "1002.2", t) for t in (99.0, 100.5)),  # a run again after the wipe
        *(Execution("c3", "1002.3", t) for t in (101.5, 102.0)),  # both after it: no excuse
        *(Execution("c4", "1002.4", t) for t in (99.5, 100.5)),  # again, after its answer
    ]
    verdict = check(calls, runs, sender_losses=[], receiver_losses=_at(100.0))
    assert list(verdict.violations) == ["c3"]
    assert [line[:3] for line in verdict.allowed] == ["c2:", "c4:"]
    assert "ran again 0.3s after its caller had the answer" in verdict.allowed[1]
    # nor for "remote unreachable": no attempt reached the receiver
    unreachable = _call(5, (6.0, "remote unreachable"))
    assert "c5" in _bad([unreachable], [Execution("c5", "1002.5", 99.0)], receiver=100.0)


def test_a_failover_that_lost_writes_excuses_only_runs_after_its_fence() -> None:
    # the receiver's group failed over at 100..103 and provably lost what followed the
    # fence at 100: a run from before the fence was kept (its uid survived)
    lag = [Loss(100.0, 100.0, 103.0, 103.0, partial=True)]
    runs = [
        *(Execution("c1", "1002.1", t) for t in (100.5, 104.0)),  # its first run after the fence
        *(Execution("c2", "1002.2", t) for t in (99.0, 104.0)),  # its first run before it
    ]
    calls = [_call(1, (6.0, "")), _call(2, (6.0, ""))]
    verdict = check(calls, runs, sender_losses=[], receiver_losses=lag)
    assert list(verdict.violations) == ["c2"] and [a[:3] for a in verdict.allowed] == ["c1:"]
    # the same runs after a wipe (everything lost): both excused
    wiped = check(calls, runs, sender_losses=[],
                  receiver_losses=[Loss(100.0, 100.0, 103.0, 103.0)])  # fmt: skip
    assert wiped.violations == {} and len(wiped.allowed) == 2


def test_an_answer_a_senders_failover_took_back_may_be_followed_by_another() -> None:
    # the sender's group lost what was written from 5 to 8: c1's answer at 6 was among it,
    # and the new master, holding c1 still pending, expired it; c2's answer at 4 was kept
    lag = [Loss(5.0, 5.0, 8.0, 8.0, partial=True)]
    calls = [_call(1, (6.0, ""), (-1, "request expired")),
             _call(2, (4.0, ""), (-1, "request expired"))]  # fmt: skip
    verdict = check(calls, _runs(1, 2), sender_losses=lag, receiver_losses=[])
    assert list(verdict.violations) == ["c2"] and [a[:3] for a in verdict.allowed] == ["c1:"]
    # a wipe takes no answer back: the second answer is a violation
    wiped = check(calls, _runs(1, 2), sender_losses=[Loss(5.0, 5.0, 8.0, 8.0)],
                  receiver_losses=[])  # fmt: skip
    assert set(wiped.violations) == {"c1", "c2"}


def test_a_late_answer_counts_by_when_the_bus_made_it() -> None:
    # seed 1068: pushed as the sender's failover began, so the caller waited only exp + 2;
    # the new master's bus answered 'request expired' 4 s after the push, and the caller
    # found it in ret only at the end. Made within exp + slack: no violation.
    def late(n: int, made: float) -> Call:
        call = _call(n, (-1, "request expired"))
        call.issued_wall, call.answers[0].made = 1000.0, made
        return call

    lag = [Loss(0.5, 999.5, 4.0, 1003.0, partial=True)]
    calls = [late(1, 1004.0), late(2, 1000.0 + 5 + SLACK_S + 2), late(3, 0.0)]
    verdict = check(calls, [], sender_losses=lag, receiver_losses=[])
    assert sorted(verdict.violations) == ["c2", "c3"]
    assert all("only after exp" in v[0] for v in verdict.violations.values())
    assert verdict.outcomes["expired"] == 1


def test_the_time_a_twins_redis_had_no_master_is_added_to_the_slack() -> None:
    # seed 1437: the sender's failover took 23 s to promote on a loaded machine; calls of
    # exp 2 pushed just before got 'request expired' within 1 s of the promotion, 24 s
    # after their push: in time, since no bus could write an answer meanwhile. One made
    # long after the promotion is still late, and an outage before the push adds nothing.
    def late(n: int, issued: float, made: float) -> Call:
        call = _call(n, (-1, "request expired"))
        call.exp, call.issued_wall, call.answers[0].made = 2, issued, made
        return call

    outage = [(1000.8, 1023.9)]
    calls = [
        late(1, 1000.0, 1024.0),  # 1 s after the promotion: in time
        late(2, 1000.0, 1024.0 + SLACK_S + 5),  # long after: late
        late(3, 1030.0, 1030.0 + 2 + SLACK_S + 3),  # pushed after the outage: late
    ]
    assert sorted(check(calls, [], sender_losses=[], receiver_losses=[]).violations) == [
        "c1", "c2", "c3",
    ]  # fmt: skip
    verdict = check(calls, [], sender_losses=[], receiver_losses=[], outages=outage)
    assert sorted(verdict.violations) == ["c2", "c3"]
    # two overlapping outages (both twins at once) count their union once
    both = [(1000.8, 1023.9), (1010.0, 1020.0)]
    assert sorted(check(calls, [], sender_losses=[], receiver_losses=[], outages=both).violations) == [
        "c2", "c3",
    ]  # fmt: skip

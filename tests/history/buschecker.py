"""The bus's checker: every call's answers against the handler's own log of executions.

The model is the bus's contract (docs/guide/bus.md, "What an ``err`` means";
docs/bus-standby.md): each call the bus took gets exactly one answer on its
``ret``, and the answer says how often the handler ran:

=======================================  ==========================================
the answer's ``err``                     executions of the handler for the call
=======================================  ==========================================
empty (answered)                         exactly 1, and the data is its result
``handler timed out`` / ``failed``       exactly 1
``remote unreachable``                   0: no attempt reached the peer
``destination not found``                0
``remote refused``                       0
``delivery unknown``                     0 or 1
``request expired``                      0 or 1
no answer within ``exp`` + slack         a violation (the handler: 0 or 1)
=======================================  ==========================================

and never a second answer, nor an answer made only after ``exp`` + slack (an
answer the caller did not see, found in ``ret`` at the end, counts by when the bus
stamped it: a call exposed to a loss stops waiting sooner).

Data loss changes what is owed, as the docs say it does:

- the *sender's* Redis lost its data (a wipe, a restart without persistence)
  while a call was pending: its request, its backlog entry and its ``ret`` may
  be gone: no answer is owed; the handler still runs at most once (uids are
  never reused);
- the *receiver's* Redis lost its data: a request it had taken but whose 200
  the sender never got may run again (nothing is left to prove it ran;
  docs/bus-standby.md, "Replay protection after data loss"). A run after the
  first is *allowed* (counted apart, not a violation) when the receiver lost
  its data since the run before it; the note says when it began after the
  caller already had its answer (the sender was still POSTing an answered
  request). A Sentinel failover counts as a loss only when it provably lost
  writes (:mod:`tests.history.busredis`), and then only of what was written
  after the replica was last proven whole: a run that began before that
  excuses no second one. On the sender such a failover takes back what was
  written after the fence: a caller that read its answer then may be answered
  again from the state the new master kept (``request expired``); that second
  answer is allowed, and only then.

A call whose push failed in a way that may have landed owes nothing and may run
at most once. Pure code: calls and executions in, violations out.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field

from tests.history.buscallers import SLACK_S, Answer, Call, Loss
from tests.history.bushandler import answer_of

#: err prefix -> outcome kind
KINDS = (
    ("remote unreachable", "unreachable"),
    ("delivery unknown", "unknown"),
    ("request expired", "expired"),
    ("handler timed out", "handler"),
    ("handler failed", "handler"),
    ("destination not found", "not found"),
    ("remote refused", "refused"),
)
#: outcome kind -> the executions it allows
RUNS = {
    "answered": {1},
    "handler": {1},
    "unreachable": {0},
    "not found": {0},
    "refused": {0},
    "unknown": {0, 1},
    "expired": {0, 1},
}


def kind_of(err: str) -> str:
    if not err:
        return "answered"
    return next((kind for prefix, kind in KINDS if err.startswith(prefix)), "other")


@dataclass(frozen=True, slots=True)
class Execution:
    call: str
    uid: str
    #: when it began (``time.time()`` in the handler)
    t: float = 0.0


@dataclass
class Verdict:
    violations: dict[str, list[str]] = field(default_factory=dict)
    #: outcome kind -> calls
    outcomes: Counter[str] = field(default_factory=Counter)
    #: outcome kind -> calls of it the handler ran (for the outcomes that allow 0 or 1)
    ran: Counter[str] = field(default_factory=Counter)
    #: second executions the docs allow (the receiver lost its data meanwhile)
    allowed: list[str] = field(default_factory=list)
    #: when a twin's Redis had no master, sorted (see :func:`_made_in_time`)
    outages: list[tuple[float, float]] = field(default_factory=list)

    def add(self, call: str, text: str) -> None:
        self.violations.setdefault(call, []).append(text)


def exposed(call: Call, losses: list[Loss]) -> bool:
    """Was ``call`` pending (pushed, not yet answered) while a Redis lost its data?"""
    first = call.answers[0].t if call.answers and not call.answers[0].late else math.inf
    return any(call.issued < loss.end and loss.start < first for loss in losses)


def check(
    calls: list[Call], executions: list[Execution], *, sender_losses: list[Loss],
    receiver_losses: list[Loss], outages: list[tuple[float, float]] | None = None,
) -> Verdict:  # fmt: skip
    """Every violation of the contract above (empty: the history holds). ``outages``:
    when either twin's Redis had no master (a failover), in ``time.time()``."""
    verdict = Verdict(outages=sorted(outages or []))
    runs: dict[str, list[Execution]] = {}
    for ex in executions:
        runs.setdefault(ex.call, []).append(ex)
    known = {call.id for call in calls}
    for name in sorted(set(runs) - known):
        verdict.add(name, f"the handler ran {len(runs[name])} time(s) for a call never made")
    for call in calls:
        _check_call(call, runs.get(call.id, []), verdict, sender_losses, receiver_losses)
    return verdict


def _check_call(
    call: Call, runs: list[Execution], verdict: Verdict, sender_losses: list[Loss],
    receiver_losses: list[Loss],
) -> None:  # fmt: skip
    n = len(runs)
    ran = f"the handler ran {n} time(s)" + (
        f" (uids {', '.join(sorted({r.uid for r in runs}))})" if n > 1 else ""
    )
    if call.sent is False:
        if n:
            verdict.add(call.id, f"never pushed, yet {ran}")
        return
    on_time = [a for a in call.answers if not a.late or _made_in_time(call, a, verdict.outages)]
    first = on_time[0] if on_time else None
    if len(call.answers) > 1:
        errs = ", ".join(repr(a.err or "answered") for a in call.answers)
        if first is not None and _taken_back(first, sender_losses):
            verdict.allowed.append(
                f"{call.id}: answered {len(call.answers)} times: {errs}; {ran} (its first "
                "answer came while the sender's failover was losing writes: it was among them)"
            )
        else:
            verdict.add(call.id, f"answered {len(call.answers)} times: {errs}; {ran}")
    elif call.answers and first is None:
        verdict.add(call.id, f"answered ({call.answers[0].err!r}) only after exp + slack; {ran}")
    kind = kind_of(first.err) if first is not None else "none"
    verdict.outcomes[kind] += 1
    if n and kind in ("unknown", "expired", "none"):
        verdict.ran[kind] += 1
    wiped_here = exposed(call, sender_losses) or call.sent is None
    if first is None:
        if not wiped_here and not call.answers:
            verdict.add(call.id, f"no answer within exp {call.exp}s + slack; {ran}")
        allowed = {0, 1}
    elif kind == "other":
        verdict.add(call.id, f"unexpected err {first.err!r}; {ran}")
        return
    else:
        allowed = RUNS[kind]
        if kind == "answered" and first.data != answer_of(call.id):
            verdict.add(call.id, f"answered with {first.data[:60]!r}, not its own result")
        if first.src != call.dst:
            verdict.add(call.id, f"answered from twin {first.src}, called {call.dst}")
    if n in allowed:
        return
    note = _reruns(runs, first, receiver_losses) if n > max(allowed) == 1 else None
    if note is None:
        verdict.add(call.id, f"{kind}: {ran}, allowed {sorted(allowed)}")
    else:
        verdict.allowed.append(f"{call.id}: {kind}, {ran} (after the receiver lost its data{note})")


def _reruns(runs: list[Execution], first: Answer | None, losses: list[Loss]) -> str | None:
    """What to say of runs the docs allow (each run after the first began after the
    receiver's Redis lost its data, since the run before it); None if one is not allowed."""
    note = ""
    for before, again in itertools.pairwise(runs):
        if not any(_lost_between(before, again, loss) for loss in losses):
            return None
        if first is not None and first.wall and again.t > first.wall and not note:
            note = f"; it ran again {again.t - first.wall:.1f}s after its caller had the answer"
    return note


def _made_in_time(call: Call, answer: Answer, outages: list[tuple[float, float]]) -> bool:
    """Was a late answer (found in ``ret`` at the end) made within ``exp`` + slack of the
    push? A call exposed to a loss stops waiting after ``exp`` + 2 s (nothing is owed to
    it), so an answer it did not see may still have come in time: e.g. ``request expired``
    from the new master's bus, 3 s after a failover that took the caller's wait with it.
    The bus stamps ``now`` in whole seconds, rounded down: one more second of doubt.
    The time a twin's Redis had no master between the push and the answer is added: no
    bus can answer then (bus seed 1437: Sentinel took 23 s to promote on a loaded machine,
    and the expiry answers came within 1 s of the promotion)."""
    if not (answer.made and call.issued_wall):
        return False
    down = _down_between(outages, call.issued_wall, answer.made + 1.0)
    return answer.made <= call.issued_wall + call.exp + SLACK_S + 1.0 + down


def _down_between(outages: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` within the (sorted) outages, overlaps counted once."""
    down, reached = 0.0, start
    for a, b in outages:
        a, b = max(a, reached), min(b, end)
        if b > a:
            down += b - a
            reached = b
    return down


def _taken_back(first: Answer, losses: list[Loss]) -> bool:
    """Was ``first`` written in a window whose writes a failover provably lost (so the
    sender's Redis went back to the call pending, and answered it again)?"""
    return any(loss.partial and loss.start <= first.t <= loss.end for loss in losses)


def _lost_between(before: Execution, again: Execution, loss: Loss) -> bool:
    """Could ``loss`` have taken what proved ``before`` (its uid in the seen set, written
    before the run began) by the time ``again`` began? A partial loss (a failover to a
    replica that lagged) kept everything written before it began."""
    if loss.partial and before.t < loss.wall_start:
        return False
    return before.t < loss.wall_end and loss.wall_start < again.t


__all__ = ["KINDS", "RUNS", "Execution", "Verdict", "check", "exposed", "kind_of"]

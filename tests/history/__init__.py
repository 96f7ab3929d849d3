"""Generated histories, checked against a model (docs/history-checker.md).

A *schedule* (:mod:`tests.history.schedule`) drawn from a seed, run against the
real processes (:mod:`tests.history.chainrun`) with a *nemesis* of real faults
(:mod:`tests.history.nemesis`), and a *checker* (:mod:`tests.history.checker`)
that compares what each consumer applied with a model of the heaviest chain
(:mod:`tests.history.model`). ``make test`` runs a few fixed seeds; ``make soak``
runs many (``CHECKER_SEEDS``); a failing seed prints the command that
replays it.
"""

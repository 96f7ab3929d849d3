"""Abuse mixes next to a witness client (``make bench B=abuse``).

Imports every ``tests/bench/abuse_*.py`` module and calls its
``run(duration_s) -> list[dict]`` (rows in the format of tests/bench/common.py:
witness latency p50/p99, memory high-water mark...), prints one JSON line per
figure and writes ``bench-results/abuse.json``. ``BENCH_ABUSE_S`` sets the
duration of each mix (default 60 s).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from common import Report  # noqa: E402


def main() -> int:
    duration = float(os.environ.get("BENCH_ABUSE_S", "60"))
    report = Report("abuse")
    failed = 0
    for path in sorted(HERE.glob("abuse_*.py")):
        name = path.stem
        print(f"# abuse mix {name} for {duration:g}s", file=sys.stderr, flush=True)
        try:
            # a mix's own prints go to stderr: stdout carries one line per figure, printed here
            with contextlib.redirect_stdout(sys.stderr):
                rows: list[dict[str, Any]] = importlib.import_module(name).run(duration)
        except Exception:  # noqa: BLE001 - one mix's failure is a figure; the others still run
            traceback.print_exc()
            failed = 1
            row = {"bench": "abuse", "metric": f"{name}_failed", "value": 1}
            report.rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        for row in rows:
            row.setdefault("bench", "abuse")
            row.setdefault("mix", name)
            report.rows.append(row)
            print(json.dumps(row), flush=True)
    report.save()
    return failed


if __name__ == "__main__":
    sys.exit(main())

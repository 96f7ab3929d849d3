"""Shared helpers for benchmarks: one JSON line per figure, saved to bench-results/<name>.json."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "bench-results"


class Report:
    """Collects figures of one benchmark; ``ratio`` = value / baseline."""

    def __init__(self, bench: str) -> None:
        self.bench = bench
        self.rows: list[dict[str, Any]] = []

    def emit(self, metric: str, value: float, baseline: float | None = None, **extra: Any) -> None:
        row: dict[str, Any] = {"bench": self.bench, "metric": metric, "value": round(value, 3)}
        if baseline is not None:
            row["baseline"] = round(baseline, 3)
            row["ratio"] = round(value / baseline, 3) if baseline else None
        row.update(extra)
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    def save(self) -> Path:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{self.bench}.json"
        path.write_text(json.dumps(self.rows, indent=2) + "\n")
        return path


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.start

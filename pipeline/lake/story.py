"""What a lake job says about itself: the job in one phrase, and a few summary lines."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any


def describe(args: argparse.Namespace) -> str:
    """The job in one phrase: ``archive of chain:demo [2026-..Z, 2026-..Z)``."""
    stream = getattr(args, "stream", None)
    text = str(args.job) + (f" of {stream}" if stream else "")
    if args.job == "archive-streams":
        names = list(dict.fromkeys(args.streams))
        text = "archive of " + (
            names[0] if len(names) == 1 else f"{len(names)} streams ({', '.join(names)})"
        )
    if args.job in ("archive", "archive-streams"):
        text += f" [{_iso(args.start_ms)}, {_iso(args.end_ms)}) ms [{args.start_ms}, {args.end_ms})"
    return text


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def summary_lines(job: str, result: dict[str, Any], seconds: float) -> list[str]:
    """The few lines that tell what a job did (logged at INFO after it ran)."""
    if job == "archive":
        entries = int(result.get("entries", 0))
        read = result.get("read", entries)
        lines = [
            f"stream {result.get('stream')}: {read} entries read, {entries} in the lake for the "
            f"interval, {result.get('blocks', 0)} blocks, {result.get('invalid', 0)} invalid"
            + (" (interval archived already: nothing read)" if result.get("skipped") else "")
        ]
        stages = result.get("stages") or {}
        if stages:
            lines.append("stages: " + ", ".join(f"{k} {v:.2f}s" for k, v in stages.items()))
        rate = (float(read) / seconds) if seconds > 0 and read else 0.0
        shown = f"{rate:,.0f}" if rate >= 10 or rate == 0 else f"{rate:.2g}"
        lines.append(f"done in {seconds:.2f}s ({shown} entries/s)")
        return lines
    if job == "archive-streams":
        streams = result.get("streams") or {}
        failed = list(result.get("failed") or [])
        done = [r for r in streams.values() if "error" not in r]
        # Earlier intervals a run caught up count too: a run that archived 8 of them
        # and found its own interval empty did not read "0 entries".
        caught = [c for r in done for c in r.get("caught_up") or ()]
        read = sum(int(r.get("read", 0)) for r in done + caught)
        blocks = sum(int(r.get("blocks", 0)) for r in done + caught)
        caught_read = sum(int(c.get("read") or 0) for c in caught)
        return [
            f"{len(done)} of {len(streams)} stream(s) archived"
            + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
            + f"; {read} entries read"
            + (
                f" ({caught_read} of them in {len(caught)} earlier interval(s) caught up)"
                if caught
                else ""
            )
            + f", {blocks} blocks",
            f"done in {seconds:.2f}s",
        ]
    if job == "backfill":
        start, end = int(result.get("start_ms", 0)), int(result.get("end_ms", 0))
        return [
            f"stream {result.get('stream')} [{_iso(start)}, {_iso(end)}): "
            f"{result.get('intervals', 0)} intervals archived, "
            f"{result.get('covered', 0)} were archived already; {result.get('entries', 0)} "
            f"entries ({result.get('read', 0)} read from Redis), {result.get('blocks', 0)} blocks",
            f"done in {seconds:.2f}s",
        ]
    fields = ", ".join(
        f"{k} {v}" for k, v in result.items() if isinstance(v, int | float | str) and k != "stream"
    )
    return [f"{job}: {fields}"[:400], f"done in {seconds:.2f}s"]

"""``sluice lake JOB ...``: run one lake job and print its result as one JSON line.

Jobs: ``archive --stream S --start-ms A --end-ms B [--run-id R]``,
``canonical --stream S``, ``trim --stream S [--now-ms N]``,
``replay --stream S --from N --to M [--target T]``, ``audit --stream S``,
``maintain [--retain-hours H]``. Settings come from ``Settings.load()``
(``SLUICE_LAKE_URI``, ``SLUICE_REDIS_URL``, ``SLUICE_SPARK_MASTER``...).
Exit status: 0 done (for ``audit``: and the chain is continuous), 1 the job
failed or the audit found problems, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from pipeline.settings import Settings

SPARK_JOBS = frozenset({"archive", "canonical", "maintain"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice lake", description="run one lake job")
    jobs = parser.add_subparsers(dest="job", required=True)
    archive = jobs.add_parser("archive", help="archive one interval of a stream into Delta")
    archive.add_argument("--stream", required=True)
    archive.add_argument("--start-ms", type=int, required=True)
    archive.add_argument("--end-ms", type=int, required=True)
    archive.add_argument("--run-id")
    canonical = jobs.add_parser("canonical", help="mark the canonical chain of a stream")
    canonical.add_argument("--stream", required=True)
    trim = jobs.add_parser("trim", help="trim Redis below what archive_log proves archived")
    trim.add_argument("--stream", required=True)
    trim.add_argument("--now-ms", type=int)
    replay = jobs.add_parser("replay", help="republish canonical blocks from Delta into Redis")
    replay.add_argument("--stream", required=True)
    replay.add_argument("--from", dest="from_num", type=int, required=True)
    replay.add_argument("--to", dest="to_num", type=int, required=True)
    replay.add_argument("--target")
    audit = jobs.add_parser("audit", help="check the continuity of the canonical chain")
    audit.add_argument("--stream", required=True)
    maintain = jobs.add_parser("maintain", help="OPTIMIZE and VACUUM every table")
    maintain.add_argument("--retain-hours", type=int, default=168)
    return parser


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def run(args: argparse.Namespace, settings: Settings, spark: Any = None) -> tuple[Any, bool]:
    """Run the parsed job; returns (result, ok)."""
    if args.job == "archive":
        from pipeline.lake.archive import archive_interval

        return archive_interval(
            spark, settings, args.stream, args.start_ms, args.end_ms, run_id=args.run_id
        ), True
    if args.job == "canonical":
        from pipeline.lake.canonical import mark_canonical

        return mark_canonical(spark, settings, args.stream), True
    if args.job == "maintain":
        from pipeline.lake.maintain import maintain

        return maintain(spark, settings, retain_hours=args.retain_hours), True
    if args.job == "trim":
        from pipeline.lake.trim import safe_trim

        return safe_trim(settings, args.stream, now_ms=args.now_ms), True
    if args.job == "replay":
        from pipeline.lake.replay import replay

        result = replay(
            settings, args.stream, args.from_num, args.to_num, target_stream=args.target
        )
        return result, True
    from pipeline.lake.audit import audit

    report = audit(settings, args.stream)
    return report, report.ok


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    settings = Settings.load()
    spark = None
    if args.job in SPARK_JOBS:
        from pipeline.lake.session import build_session

        spark = build_session(settings, app_name=f"sluice-lake-{args.job}")
    try:
        result, ok = run(args, settings, spark)
    finally:
        if spark is not None:
            spark.stop()
    print(json.dumps({"job": args.job, **_jsonable(result)}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    from pipeline.cli import main as sluice_main

    sys.exit(sluice_main(["lake", *sys.argv[1:]]))

"""The ``sluice lake`` command line: its parser, and the checks of its arguments before any work.

Bad input is refused here with a :class:`~pipeline.errors.ConfigError` (one
line, exit 2), before Redis, Spark or the lake is touched; see
:mod:`pipeline.lake.cli` for the jobs and what a caller can rely on.
"""

from __future__ import annotations

import argparse

from pipeline.errors import ConfigError
from pipeline.settings import Settings


def parser() -> argparse.ArgumentParser:
    """The parser of ``sluice lake JOB ...``: one subcommand per job."""
    out = argparse.ArgumentParser(
        prog="sluice lake",
        description="Run one lake job and print its result as one JSON line. Settings: "
        "SLUICE_LAKE_URI, SLUICE_REDIS_URL, SLUICE_SPARK_REMOTE (else a local Spark).",
    )
    jobs = out.add_subparsers(dest="job", required=True, metavar="JOB")
    _add_archive_jobs(jobs)
    _add_trim_jobs(jobs)
    _add_replay(jobs)
    _add_maintenance_jobs(jobs)
    return out


def _job(
    jobs: argparse._SubParsersAction[argparse.ArgumentParser], name: str, text: str
) -> argparse.ArgumentParser:
    return jobs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")


def _stream(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream", required=True, help="the stream, e.g. chain:demo")


def _streams(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stream", dest="streams", action="append", required=True, help="a stream (repeat)"
    )


def _interval(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--start-ms", type=int, required=True, help="first entry id (ms) of the interval"
    )
    p.add_argument("--end-ms", type=int, required=True, help="end (ms, excluded) of the interval")
    p.add_argument("--run-id", help="the run's id in archive_log (default: a new one)")


def _now_ms(p: argparse.ArgumentParser) -> None:
    p.add_argument("--now-ms", type=int, help="the time to trim as of, in ms (default: now)")


def _add_archive_jobs(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``archive``, ``archive-streams`` and ``canonical``."""
    archive = _job(jobs, "archive", "archive one interval of a stream into Delta")
    _stream(archive)
    _interval(archive)
    archive.add_argument(
        "--force", action="store_true", help="re-read Redis even if archive_log has the interval"
    )
    many = _job(jobs, "archive-streams", "archive one interval of several streams in one job")
    _streams(many)
    _interval(many)
    many.add_argument(
        "--catchup",
        action="store_true",
        help="archive each stream's earlier holes in archive_log first (oldest first)",
    )
    _stream(_job(jobs, "canonical", "mark the canonical chain of a stream"))


def _add_trim_jobs(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trim`` and ``trim-streams``."""
    trim = _job(jobs, "trim", "trim Redis below what archive_log proves archived")
    _stream(trim)
    _now_ms(trim)
    trims = _job(jobs, "trim-streams", "trim several streams in one job (as trim does each)")
    _streams(trims)
    _now_ms(trims)


def _add_replay(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = _job(jobs, "replay", "republish canonical blocks from Delta into Redis")
    _stream(replay)
    replay.add_argument(
        "--from", dest="from_num", type=int, required=True, help="first block number"
    )
    replay.add_argument(
        "--to", dest="to_num", type=int, required=True, help="last block number (included)"
    )
    replay.add_argument("--target", help="the stream to publish into (default: --stream)")


def _add_maintenance_jobs(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``audit``, ``maintain`` and ``backfill``."""
    _stream(_job(jobs, "audit", "check the continuity of the canonical chain"))
    maintain = _job(jobs, "maintain", "compact and VACUUM every table")
    maintain.add_argument(
        "--retain-hours",
        type=int,
        default=168,
        help="VACUUM keeps files younger than this (default: %(default)s)",
    )
    backfill = _job(
        jobs, "backfill", "archive every missing interval of a stream up to --until (default now)"
    )
    _stream(backfill)
    backfill.add_argument("--since", help="ISO time: start at the interval holding it")
    backfill.add_argument(
        "--from-coverage",
        action="store_true",
        help="start where the lake's coverage of what Redis holds ends (the default)",
    )
    backfill.add_argument("--until", help="ISO time: stop at the last interval ending by it")


def _check_ranges(args: argparse.Namespace) -> None:
    """Refuse an empty or negative interval or block range (bad input: exit 2)."""
    if args.job in ("archive", "archive-streams") and not 0 <= args.start_ms < args.end_ms:
        raise ConfigError(
            f"--start-ms {args.start_ms} --end-ms {args.end_ms}: "
            "need 0 <= start < end (the end is excluded)"
        )
    if args.job == "replay" and not 0 <= args.from_num <= args.to_num:
        raise ConfigError(
            f"--from {args.from_num} --to {args.to_num}: need 0 <= from <= to (both included)"
        )


def check_args(args: argparse.Namespace, settings: Settings) -> None:
    """Refuse bad input before any work (:class:`ConfigError`: one line, exit 2)."""
    _check_ranges(args)
    if args.job == "maintain" and args.retain_hours < settings.lake.min_retain_hours:
        raise ConfigError(
            f"--retain-hours {args.retain_hours} is below {settings.lake.min_retain_hours}: "
            "VACUUM would delete the files of an archive job still running (a job may run "
            f"up to job_timeout_s = {settings.lake.job_timeout_s} s before it commits them)"
        )
    if args.job != "backfill":
        return
    from pipeline.lake.backfill import iso, parse_time
    from pipeline.lake.intake.streamset import is_configured

    if not is_configured(settings.lake, args.stream):
        raise ConfigError(
            f"unknown stream {args.stream!r} (SLUICE_STREAMS: {', '.join(settings.lake.streams)})"
        )
    if args.since is not None and args.from_coverage:
        raise ConfigError("--since and --from-coverage exclude each other")
    args.since_ms = None if args.since is None else parse_time(args.since, "--since")
    args.until_ms = None if args.until is None else parse_time(args.until, "--until")
    if args.since_ms is not None and args.until_ms is not None and args.until_ms <= args.since_ms:
        raise ConfigError(f"--until {iso(args.until_ms)} is not after --since {iso(args.since_ms)}")

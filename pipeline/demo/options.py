"""The options of ``sluice demo``: its parser and their checks.

Apart from :mod:`pipeline.demo.app` so that ``sluice demo --help`` answers on
an install without the ``[demo]`` extra (the app loads rich; this loads none).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from pipeline.demo.plan import STREAM
from pipeline.errors import ConfigError
from pipeline.settings import Settings

#: Seconds the subscriber follows the live chain (blocks and reorgs) before the producer stops.
LIVE_S = 15.0
#: Components ``--only`` may name, in start order (redis always starts first).
ALL = ("spark", "serve", "produce", "nodes", "buses", "airflow")
#: The longest one component may take to start while it makes progress (``--start-timeout``).
START_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    check: bool
    only: tuple[str, ...]
    serve_port: int
    airflow_port: int
    spark_port: int
    deadline_s: float
    var_dir: Path
    #: for tests: stop as soon as everything is up
    up_then_stop: bool = False
    #: "local" or "s3" (an S3 server the demo runs)
    lake: str = "local"
    #: a Redis of the user's for streams, chain, nodes, lake jobs and Airflow (any URL form:
    #: redis+sentinel://, redis+cluster://); empty: the demo's own Redis holds everything
    redis: str = ""
    #: the user's Spark Connect server (``sc://``) for the lake jobs; empty: the demo starts
    #: its own (the ``spark`` component, warmed by one Delta write)
    spark: str = ""
    #: --check: seconds the subscriber follows the live chain before the producer stops
    follow_s: float = LIVE_S
    #: the longest one component may take to start, while it makes progress (past its own
    #: deadline the demo waits only while its log grows or its processes use CPU)
    start_timeout_s: float = START_TIMEOUT_S


def _ports(p: argparse.ArgumentParser, settings: Settings) -> None:
    p.add_argument(
        "--serve-port",
        type=int,
        default=settings.serve.port,
        help="the status page's port (default: %(default)s)",
    )
    p.add_argument(
        "--airflow-port",
        type=int,
        default=8080,
        help="the Airflow UI and API port (default: %(default)s)",
    )
    p.add_argument(
        "--spark-port",
        type=int,
        default=settings.spark.connect_port,
        help="the Spark Connect port (default: %(default)s)",
    )


def parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sluice demo",
        description="Run the whole system on this machine, live until Ctrl-C "
        "(--check: as a scripted scenario that exits 0 only if every check passed).",
    )
    p.add_argument("--check", action="store_true", help="run the scripted scenario and exit 0/1")
    _ports(p, settings)
    p.add_argument(
        "--only",
        default=",".join(ALL),
        help=f"comma-separated subset of {','.join(ALL)} (Redis always runs)",
    )
    p.add_argument(
        "--deadline", type=float, default=900.0, help="--check: seconds before it gives up"
    )
    p.add_argument(
        "--lake",
        choices=("local", "s3"),
        default="local",
        help="where the lake lives: a local directory, or an S3 server the demo starts "
        "(versitygw, built by make install)",
    )
    p.add_argument(
        "--redis",
        metavar="URL",
        default="",
        help="run streams, the chain, the nodes, the lake jobs and Airflow on this Redis "
        "(redis://, redis+sentinel://, redis+cluster://; best empty: the demo writes stream "
        f"{STREAM!r}); the bus twins stay on the demo's own Redis",
    )
    p.add_argument(
        "--spark",
        metavar="URL",
        default="",
        help="run the lake jobs on this Spark Connect server (sc://host:port) instead of "
        "starting one (the spark component)",
    )
    p.add_argument(
        "--follow",
        type=float,
        default=LIVE_S,
        metavar="SECONDS",
        help="--check: seconds the subscriber follows the live chain before the producer stops",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=START_TIMEOUT_S,
        metavar="SECONDS",
        help="the longest one component may take to start (default: %(default)g). Past its "
        "own deadline (Airflow 300 s) the demo keeps waiting only while the component makes "
        "progress (its log grows, its processes use CPU), and says what it waits for",
    )
    p.add_argument("--up-then-stop", action="store_true", help=argparse.SUPPRESS)
    return p


def parse(argv: list[str]) -> Options:
    settings = Settings.load()
    cli = parser(settings)
    args = cli.parse_args(argv)
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in only if s not in ALL]
    if unknown:
        cli.error(f"--only: unknown component(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    for name in ("serve_port", "airflow_port", "spark_port"):
        if not 1 <= getattr(args, name) <= 65535:
            cli.error(f"--{name.replace('_', '-')} must be a TCP port (1-65535)")
    if not 30 <= args.deadline <= 7200:
        cli.error("--deadline must be between 30 and 7200 seconds")
    if not 1 <= args.follow <= 600:
        cli.error("--follow must be between 1 and 600 seconds")
    if not 30 <= args.start_timeout <= 7200:
        cli.error("--start-timeout must be between 30 and 7200 seconds")
    if args.check and only != ALL:
        cli.error("--check runs every component; drop --only")
    if args.spark:  # the user's server stands in for the spark component
        from pipeline.lake.spark.session import parse_remote

        try:
            parse_remote(args.spark, name="--spark")
        except ConfigError as exc:
            cli.error(str(exc))
        only = tuple(s for s in only if s != "spark")
    if args.redis:
        from pipeline.redisio import check as redischeck

        redischeck.check(args.redis)  # a bad URL or layout: one line, exit 2
    return Options(
        check=args.check,
        only=only,
        serve_port=args.serve_port,
        airflow_port=args.airflow_port,
        spark_port=args.spark_port,
        deadline_s=args.deadline,
        var_dir=Path(settings.var_dir).expanduser().absolute(),
        up_then_stop=args.up_then_stop,
        lake=args.lake,
        redis=args.redis,
        spark=args.spark,
        follow_s=args.follow,
        start_timeout_s=args.start_timeout,
    )

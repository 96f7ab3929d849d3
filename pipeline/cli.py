"""The ``sluice`` command.

Each subcommand lives next to the part it runs and is imported only when
called, so ``sluice bus`` never loads Spark and ``sluice --help`` is instant.
A subcommand module exposes ``main(argv: list[str]) -> int``.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pipeline import __version__
from pipeline.cliargs import non_negative
from pipeline.errors import ConfigError, MissingExtra, SluiceError
from pipeline.facade import missing_extra, require
from pipeline.runtime import memory
from pipeline.settings import Settings

#: subcommand -> (module with ``main(argv)``, one-line help)
#: Always-on commands that read Arrow data: their allocators give memory back (pipeline.runtime.memory).
_LONG_RUNNING = frozenset({"serve"})

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("pipeline.demo", "run the whole system live on this machine (--check: as a test)"),
    "node": ("pipeline.streams.cli", "run a node: stream service, stream transport, workers"),
    "bus": (
        "pipeline.bus.cli",
        "run the reliable message bus for one twin; bus keygen|register|dead|requeue",
    ),
    "serve": ("pipeline.chain.serve.cli", "run the websocket resumption server"),
    "subscribe": ("pipeline.chain.client.cli", "subscribe to a chain stream and print updates"),
    "produce": ("pipeline.chain.produce.cli", "write a synthetic chain into a Redis stream"),
    "lake": (
        "pipeline.lake.cli",
        "run one lake job: archive, canonical, trim, replay, audit, maintain, backfill",
    ),
    "spark": ("pipeline.lake.spark.server", "run a local Spark Connect server for the lake jobs"),
}

#: command -> (the extra it needs, the packages every use of it needs): checked before it
#: runs (not for --help, which works on the core install). ``sluice lake`` checks per job.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": ("demo", ("rich",)),
    "serve": ("serve", ("pyarrow", "deltalake", "re2")),
    "lake": ("lake", ()),
    "spark": ("lake", ("pyspark",)),
}


#: A port in use or an address not on this host: bad input, not a crash.
_LISTEN_ERRORS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL)


def _usage() -> str:
    lines = [f"sluice {__version__}", "", "usage: sluice COMMAND [ARGS...]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Settings come from SLUICE_* environment variables and ./sluice.toml."]
    return "\n".join(lines)


def _log_level() -> str:
    """The log level setting, INFO while the settings do not read.

    Only the log level is read here: a subcommand reads the settings it uses
    (and reports a bad one), so ``sluice bus --help`` or ``sluice bus keygen``
    work whatever another part's setting says.
    """
    try:
        return Settings.load(parts=()).log_level.upper()
    except SluiceError:
        return "INFO"


def _wants_help(args: Sequence[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in args)


#: Commands whose process leaves with ``os._exit``, whatever its outcome (see :func:`_leave`).
_NATIVE_EXIT = frozenset({"lake"})


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"sluice: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    helping = _wants_help(rest)
    if name in _LONG_RUNNING and argv is None and not helping:  # (not in-process: tests)
        memory.system_malloc()  # runs the command again on glibc's malloc, unless set
    logging.basicConfig(
        level=_log_level(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    code = _outcome(name, rest, helping)
    if argv is None and name in _NATIVE_EXIT and not helping:
        _leave(code)
    return code


def _leave(code: int) -> NoReturn:
    """End a process of its own now, without the interpreter's teardown.

    Native thread pools (Arrow, delta-rs, the Connect client's gRPC) torn down at exit
    aborted ``sluice lake replay`` after it had printed its result ("terminate called
    without an active exception", exit -6; ``test_backfill.py::test_replay_tells_its_progress``).
    Every outcome leaves so (result, error, Ctrl-C): before, only a finished job did, and
    a failed or interrupted one still ran that teardown
    (``test_newcomer.py::test_ctrl_c_in_a_lake_job_exits_130_with_one_line`` checks it).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _outcome(name: str, rest: list[str], helping: bool) -> int:
    """Run command ``name``; its exit code, every failure of the kinds below in one line."""
    try:
        return _run(name, rest, helping)
    except MissingExtra as exc:  # its text names the command: "sluice serve needs pyarrow..."
        print(exc, file=sys.stderr)
        return 2
    except ConfigError as exc:  # bad input: one line, the usage exit code
        print(f"sluice {name}: {exc}", file=sys.stderr)
        return 2
    except SluiceError as exc:
        print(f"sluice {name}: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # an extra's package, reached where no check saw it
        missing = missing_extra(exc, f"sluice {name}", EXTRAS.get(name, (None,))[0])
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _LISTEN_ERRORS:
            raise
        # asyncio's text names the address: "error while attempting to bind on address ..."
        print(f"sluice {name}: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C in a command without its own SIGINT handling
        print(f"sluice {name}: interrupted", file=sys.stderr)
        return 130


def _run(name: str, rest: list[str], helping: bool) -> int:
    """Command ``name``: its extra checked (unless for --help), tuned, imported and run."""
    if name in EXTRAS and not helping:
        extra, packages = EXTRAS[name]
        require(f"sluice {name}", extra, packages)
    if name in _LONG_RUNNING and not helping:
        tuned = memory.tune()  # before the command's module loads pyarrow
        if tuned:
            logging.getLogger(__name__).info("allocators give memory back: %s", ", ".join(tuned))
    module = importlib.import_module(COMMANDS[name][0])
    code: int = module.main(rest)
    return code


__all__ = ["COMMANDS", "EXTRAS", "main", "non_negative"]


if __name__ == "__main__":
    sys.exit(main())

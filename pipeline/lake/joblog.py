"""A lake job's logging: its story on stderr, Spark's noise in a debug file.

See :func:`job_logging` and the module docstring of :mod:`pipeline.lake.cli`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from pipeline.settings import Settings

#: The debug log is rotated (one old copy kept) when it grows past this size.
DEBUG_LOG_MAX = 64 << 20
#: Loggers whose INFO chatter belongs in the debug file, not the story.
NOISY = ("py4j", "pyspark", "grpc", "urllib3", "deltalake", "asyncio")


class WarningCounter(logging.Handler):
    """Counts WARNING-or-worse records (the ``warnings`` of the result)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def debug_log_path(settings: Settings) -> Path:
    return Path(settings.var_dir).expanduser().absolute() / "logs" / "lake-jobs.log"


@contextmanager
def job_logging(settings: Settings, job: str) -> Iterator[tuple[WarningCounter, Path | None]]:
    """Route logs for one job; see the module docstring. Restores everything on exit."""
    path, debug, saved_fd, story = _redirect_stderr(debug_log_path(settings), job)
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), sys.stderr)
    for handler in saved[1]:
        root.removeHandler(handler)
    counter = _route(root, story, debug)
    sys.stderr = story
    try:
        yield counter, path
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(saved[0])
        for handler in saved[1]:
            root.addHandler(handler)
        sys.stderr = saved[2]
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
        if story is not saved[2]:
            story.close()
        if debug is not None:
            debug.close()


def _redirect_stderr(path: Path, job: str) -> tuple[Path | None, TextIO | None, int | None, TextIO]:
    """Open the debug file at ``path`` and point fd 2 at it.

    Returns the debug file's path and stream, the saved fd 2 and the story's
    stream (a copy of the original stderr). Without a writable var dir: no path,
    and the story stays on stderr (with what was opened before the failure).
    """
    debug: TextIO | None = None
    saved_fd: int | None = None
    story = sys.stderr
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > DEBUG_LOG_MAX:
            path.replace(path.with_suffix(".log.1"))
        debug = path.open("a", buffering=1)
        debug.write(
            f"\n==== {datetime.now(UTC).isoformat()} sluice lake {job} (pid {os.getpid()})\n"
        )
        sys.stderr.flush()
        # Children (the local JVM, Python workers) inherit fd 2: point it at the
        # debug file and keep the story on a copy of the original stderr.
        saved_fd = os.dup(2)
        os.dup2(debug.fileno(), 2)
        story = os.fdopen(os.dup(saved_fd), "w", buffering=1)
    except OSError:
        return None, debug, saved_fd, story  # no writable var dir: keep everything on stderr
    return path, debug, saved_fd, story


def _route(root: logging.Logger, story: TextIO, debug: TextIO | None) -> WarningCounter:
    """Give ``root`` the story's handler (INFO, no noise), the warning counter and, with
    ``debug``, the debug file's handler (everything); the counter."""
    out = logging.StreamHandler(story)
    out.setLevel(logging.INFO)
    out.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    out.addFilter(lambda r: r.levelno >= logging.WARNING or not r.name.startswith(NOISY))
    counter = WarningCounter()
    counter.addFilter(lambda r: not r.name.startswith(NOISY))
    root.addHandler(out)
    root.addHandler(counter)
    if debug is not None:
        file_handler = logging.StreamHandler(debug)
        file_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(file_handler)
    root.setLevel(logging.DEBUG if debug is not None else logging.INFO)
    for name in NOISY:
        logging.getLogger(name).setLevel(logging.INFO)
    return counter

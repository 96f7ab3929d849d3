"""LogGate: the first failure logged with its cause, then one line per interval with the
count suppressed, one line when the condition ends; keys independent and bounded."""

from __future__ import annotations

import logging

import pytest

from pipeline.loggate import LogGate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def lines() -> Lines:
    return Lines()


def _gate(lines: Lines, clock: Clock, **kwargs: object) -> LogGate:
    logger = logging.getLogger("test.loggate")
    logger.handlers[:] = [lines]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return LogGate(logger, 10.0, clock=clock, **kwargs)  # type: ignore[arg-type]


def test_first_logged_then_one_line_per_interval_with_the_count(lines: Lines) -> None:
    clock = Clock()
    gate = _gate(lines, clock)
    assert gate.failed("redis", "loop: redis error %s", "OOM")
    for _ in range(40):  # every 0.2 s for 8 s
        clock.now += 0.2
        assert not gate.failed("redis", "loop: redis error %s", "OOM")
    clock.now += 2.0  # 10 s after the first line
    assert gate.failed("redis", "loop: redis error %s", "OOM")
    assert [text for _, text in lines.lines] == [
        "loop: redis error OOM",
        "loop: redis error OOM (still failing after 10.0s; 40 more such line(s) suppressed)",
    ]
    assert gate.failing("redis")


def test_end_logged_once_with_duration_and_count(lines: Lines) -> None:
    clock = Clock()
    gate = _gate(lines, clock)
    assert not gate.ended("redis", "redis is back")  # nothing open: nothing said
    gate.failed("redis", "down")
    clock.now += 3.5
    gate.failed("redis", "down")
    assert gate.ended("redis", "redis is back")
    assert not gate.ended("redis", "redis is back")
    assert not gate.failing("redis")
    assert [text for _, text in lines.lines] == ["down", "redis is back (after 3.5s, 2 failure(s))"]
    gate.failed("redis", "down again")  # a new condition: logged at once
    assert lines.lines[-1][1] == "down again"


def test_keys_are_independent_and_bounded(lines: Lines) -> None:
    clock = Clock()
    gate = _gate(lines, clock, max_keys=2)
    assert gate.failed("a", "a")
    assert gate.failed("b", "b")
    assert not gate.failed("a", "a")
    assert gate.failed("c", "c")  # forgets "a", the oldest
    assert not gate.failing("a") and gate.failing("b") and gate.failing("c")
    assert gate.failed("a", "a")  # logged as a first one again


def test_levels(lines: Lines) -> None:
    clock = Clock()
    gate = _gate(lines, clock, level=logging.ERROR)
    gate.failed("k", "x")
    gate.failed("j", "y", level=logging.INFO)
    gate.ended("k", "x is over")  # a recovery is no error
    assert [level for level, _ in lines.lines] == [logging.ERROR, logging.INFO, logging.WARNING]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LogGate(logging.getLogger("x"), -1.0)
    with pytest.raises(ValueError):
        LogGate(logging.getLogger("x"), max_keys=0)


def test_forget_closes_silently(lines: Lines) -> None:
    clock = Clock()
    gate = _gate(lines, clock)
    gate.failed(("post", 7), "x")
    gate.failed(("post", 8), "y")
    gate.forget(lambda key: isinstance(key, tuple) and key[-1] == 7)
    assert not gate.failing(("post", 7)) and gate.failing(("post", 8))
    assert len(lines.lines) == 2

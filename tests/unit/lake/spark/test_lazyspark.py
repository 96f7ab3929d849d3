"""LazySpark.rejoin: how a job waits for a lost Spark Connect server (bounded), no JVM needed.

A plain TCP listener stands in for a server that is back (the wait only looks
for a listening port); the job that resumes on a real server is
tests/integration/lake/test_connect_lost.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from pipeline.errors import JobCancelled
from pipeline.lake.spark import lazyspark
from pipeline.lake.spark.lazyspark import LazySpark
from pipeline.runtime.ports import free_port
from pipeline.settings import Settings


def _lazy(port: int, *, started: bool = True) -> LazySpark:
    settings = Settings.load(config_path=os.devnull, spark_remote=f"sc://127.0.0.1:{port}")
    lazy = LazySpark(settings, "test")
    if started:
        lazy.start_s = 0.5  # as after its first session: the job had reached its server
    return lazy


def _listen(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_server_that_stays_away_fails_after_the_bound_then_at_once() -> None:
    lazy = _lazy(free_port())
    began = time.monotonic()
    assert lazy.rejoin(0, 0.3, lambda: None) is False
    assert 0.3 <= time.monotonic() - began < 3
    assert lazy.gave_up == "not back within 0.3s"
    began = time.monotonic()
    assert lazy.rejoin(0, 30, lambda: None) is False  # the next stream does not wait again
    assert time.monotonic() - began < 0.5
    assert lazy.generation == 0


def test_a_server_back_gives_one_new_session_for_every_stream_that_lost_it() -> None:
    port = free_port()
    lazy = _lazy(port)
    outcomes: list[bool] = []
    waiters = [
        threading.Thread(target=lambda: outcomes.append(lazy.rejoin(0, 30, lambda: None)))
        for _ in range(3)
    ]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.3)  # all waiting: nothing listens yet
    assert outcomes == []
    with _listen(port):
        for waiter in waiters:
            waiter.join(10)
        assert outcomes == [True, True, True]
        assert lazy.generation == 1  # one new session, not one per stream
        assert lazy.rejoin(1, 30, lambda: None) is True  # lost again, and back at once
        assert lazy.generation == 2


def test_rejoins_are_bounded_per_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazyspark, "MAX_REJOINS", 2)
    port = free_port()
    lazy = _lazy(port)
    with _listen(port):
        assert lazy.rejoin(0, 5, lambda: None) and lazy.rejoin(1, 5, lambda: None)
        assert lazy.rejoin(2, 5, lambda: None) is False
    assert lazy.gave_up == "lost 3 times in one job"


def test_no_wait_without_a_server_reached_once_or_without_connect() -> None:
    # A server down from the start is one line at once; a local session has nothing to rejoin.
    began = time.monotonic()
    assert _lazy(free_port(), started=False).rejoin(0, 30, lambda: None) is False
    local = LazySpark(Settings.load(config_path=os.devnull, spark_remote=""), "test")
    local.start_s = 0.5
    assert local.rejoin(0, 30, lambda: None) is False
    assert time.monotonic() - began < 0.5


def test_a_stop_ends_the_wait() -> None:
    lazy = _lazy(free_port())

    def stopped() -> None:
        raise JobCancelled("stopped by SIGTERM before it committed")

    with pytest.raises(JobCancelled):
        lazy.rejoin(0, 30, stopped)

"""free_port: a port is never handed out twice by one process."""

from __future__ import annotations

import itertools
import socket

import pytest

from pipeline.runtime.ports import free_port


def test_ports_are_distinct_and_bindable() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:  # the last one is free now
        sock.bind(("127.0.0.1", ports[-1]))


def test_ports_are_below_the_ephemeral_range_where_it_is_known() -> None:
    import pipeline.runtime.ports as ports

    high = ports._below_ephemeral()
    if high is None:
        pytest.skip("the kernel's ephemeral range is not known here")
    picked = [free_port() for _ in range(200)]
    assert all(ports.LOWEST <= p < high for p in picked)
    # an outgoing connection's local port comes from the ephemeral range: never one of these
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        assert client.getsockname()[1] >= high


def test_a_port_the_kernel_offers_again_is_skipped(monkeypatch) -> None:
    import pipeline.runtime.ports as ports

    monkeypatch.setattr(ports, "_below_ephemeral", lambda: None)  # the kernel picks

    first = free_port()
    # `first` twice, then the kernel's own choice for as long as asked: the kernel itself may
    # offer the just-closed `first` again, which free_port must skip too (a list ending
    # in one 0 ran out then: StopIteration, seen once in a fresh-clone run)
    offered = itertools.chain([first, first], itertools.repeat(0))
    real_socket = socket.socket

    class Repeating(real_socket):  # type: ignore[misc]
        def getsockname(self):  # the kernel offering `first` twice more, then a fresh one
            port = next(offered)
            return ("127.0.0.1", port or super().getsockname()[1])

    monkeypatch.setattr(ports.socket, "socket", Repeating)
    second = free_port()
    assert second != first

"""The harness's serve says in one line when it never started (a real ``sluice serve``)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from tests.history.nemesis import Serve


def test_a_port_held_by_another_process_is_one_line(tmp_path: Path) -> None:
    """Histories pick ports at once: one taken between the pick and serve's bind is named.

    A connection to the port succeeds (the other process answers), so only the
    process's own listening socket tells that serve is up.
    """
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env |= {"SLUICE_LAKE_URI": str(tmp_path / "lake"), "SLUICE_CONFIG": os.devnull}
    serve = Serve(env, port, tmp_path / "serve.log")
    try:
        with pytest.raises(
            RuntimeError, match=r"serve never started on :\d+ \(exit 2\): .*cannot listen"
        ):
            asyncio.run(serve.start())
    finally:
        held.close()
    assert serve.proc is not None and serve.proc.returncode == 2

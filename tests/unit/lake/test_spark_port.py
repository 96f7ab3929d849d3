"""``sluice spark`` refuses a port another program listens on, in one line, before starting a JVM."""

from __future__ import annotations

import socket
import subprocess
import sys

from pipeline.runtime.ports import port_free


def test_a_port_in_use_is_refused_in_one_line() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert not port_free(port)
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "spark", "--port", str(port)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"sluice spark: port {port} on 127.0.0.1 is in use; choose another with --port"
    ]
    assert done.stdout == ""
    assert port_free(port)

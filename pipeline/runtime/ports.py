"""Free loopback ports for the processes the demo, the tests and the benchmarks start.

The kernel may hand the same port to two ``bind(port 0)`` calls in a row once the
first socket is closed, and a caller that picks the ports of two servers before
starting either (two buses, say) would then give both one port: each would talk
to itself. So a port is never handed out twice by one process.
"""

from __future__ import annotations

import socket

_handed_out: set[int] = set()
_TRIES = 1000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago and not handed out before."""
    for _ in range(_TRIES):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError(f"no free TCP port on {host} that was not handed out already")


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on (``host``, ``port``): a bind there succeeds."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True

"""Free loopback ports for the processes the demo, the tests and the benchmarks start.

The kernel may hand the same port to two ``bind(port 0)`` calls in a row once the
first socket is closed, and a caller that picks the ports of two servers before
starting either (two buses, say) would then give both one port: each would talk
to itself. So a port is never handed out twice by one process.

A port is picked below the kernel's range of ephemeral ports where it is known
(Linux: ``ip_local_port_range``, 32768-60999 by default), at random from
:data:`LOWEST` up: the kernel gives outgoing connections their local ports from
that range, so a connection opened between the pick and the server's bind can
no longer take the server's port (two history checkers at once, each with a
few hundred Redis connections, lost a seed to "address already in use" that
way, chain seed 1602 and bus seed 1404). Elsewhere the kernel picks (``bind``
to port 0).
"""

from __future__ import annotations

import functools
import random
import socket
from pathlib import Path

_handed_out: set[int] = set()
_TRIES = 1000
#: The lowest port handed out when the ephemeral range is known.
LOWEST = 20000
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@functools.cache
def _below_ephemeral() -> int | None:
    """The first ephemeral port, if there are at least 1,000 ports from LOWEST up to it."""
    try:
        low = int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low - LOWEST >= 1000 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago and not handed out before."""
    high = _below_ephemeral()
    if high is not None:
        for _ in range(_TRIES):
            picked = random.randrange(LOWEST, high)
            if picked not in _handed_out and port_free(picked, host, reuse=False):
                _handed_out.add(picked)
                return picked
    for _ in range(_TRIES):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError(f"no free TCP port on {host} that was not handed out already")


def port_free(port: int, host: str = "127.0.0.1", *, reuse: bool = True) -> bool:
    """Whether nothing listens on (``host``, ``port``): a bind there succeeds. With
    ``reuse=False`` (no ``SO_REUSEADDR``) no socket may use the port at all, not even one
    in TIME_WAIT, as for ``bind`` to port 0 (a server that binds without it would fail)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True

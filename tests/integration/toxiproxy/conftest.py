"""The Toxiproxy fixtures (tests/support/toxiproxy.py) and a proxy in front of the test Redis."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.toxiproxy import Proxy, Toxiproxy, toxiproxy, toxiproxy_server

__all__ = ["redis_proxy", "toxiproxy", "toxiproxy_server"]


@pytest.fixture
def redis_proxy(toxiproxy: Toxiproxy, redis_url: str) -> Iterator[Proxy]:  # noqa: F811
    """A proxy named ``redis`` in front of the test's (flushed) Redis."""
    url = urlsplit(redis_url)
    yield toxiproxy.proxy("redis", url.port or 6379, url.hostname or "127.0.0.1")

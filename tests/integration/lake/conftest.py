"""Lake fixtures: the shared Spark Connect server (see :mod:`tests.integration.lake.connect`)."""

from __future__ import annotations

import pytest

from pipeline.lake.spark.server import ConnectServer
from tests.integration.lake.connect import shared_server


@pytest.fixture
def connect_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ConnectServer:
    """The session's Spark Connect server (started on first use, stopped at the end)."""
    return shared_server(request, tmp_path_factory.getbasetemp())


@pytest.fixture
def spark_remote(connect_server: ConnectServer) -> str:
    """``sc://host:port`` of the session's Spark Connect server."""
    return connect_server.url

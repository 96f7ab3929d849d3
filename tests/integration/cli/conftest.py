"""CLI fixtures: the session's shared Spark Connect server (see tests/integration/lake/connect.py)."""

from __future__ import annotations

import pytest

from tests.integration.lake.connect import shared_server


@pytest.fixture
def spark_remote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``sc://host:port`` of the session's Spark Connect server (started on first use)."""
    return shared_server(request, tmp_path_factory.getbasetemp()).url

"""The chain integration fixtures (server, client, lake writer), shared with the e2e tests."""

from tests.integration.chain.conftest import connect, serve, settings  # noqa: F401

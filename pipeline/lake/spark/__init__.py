"""Spark for the lake jobs: the session (Connect client or local), the local Connect server, and the `redis-streams` data source."""

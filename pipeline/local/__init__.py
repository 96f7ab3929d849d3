"""The private servers the demo, the tests and the benchmarks start: redis-server, PostgreSQL, versitygw, and their process lifecycle.

Never imported by a part: only `pipeline.demo`, the tests and the benchmarks use it.
"""

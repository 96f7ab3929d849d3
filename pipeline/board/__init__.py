"""The coverage board: per stream, what the lake's ``archive_log`` holds and what Redis holds.

What the Airflow coverage view (``plugins/sluice_coverage.py``) serves as
``coverage.json``, without Airflow: the plugin hands the board its
orchestrator side (:class:`pipeline.board.board.Host`: the DAG runs, the UI's
base path, the Redis URL) and mounts it. Above the parts: the board reads the
lake's storage and intake, and the chain's coverage arithmetic, so the status
page of ``sluice serve`` and the Airflow view agree.
"""

"""Airflow glue for Sluice: the Redis hook, the lake-job runner, shared DAG helpers.

``plugins/`` is on ``sys.path`` in every Airflow process (scheduler, DAG
processor, workers), so DAGs import this package directly. Nothing here
imports Spark: the lake jobs run in child processes (see :mod:`.lake_job`).
"""

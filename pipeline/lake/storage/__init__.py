"""Where the lake's data lives and how to read it without a JVM: the store (local or S3), table schemas, the blocks reader and delta-rs reads.

Imported by `pipeline.chain.history.lakeview` and the jobs; never imports Spark.
"""

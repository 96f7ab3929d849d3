"""What the lake takes from Redis: stream ids and paged reads, the block header decoders, entries as Arrow batches, and which streams a run archives (no Spark import)."""

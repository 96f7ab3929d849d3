"""Chain streams: block batches, the muxing producer, resumption and its server (seed 004)."""

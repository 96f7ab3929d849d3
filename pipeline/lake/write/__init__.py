"""Writing the lake: the Arrow and merge writers, the Spark writer, copy-on-write rewrites, block plans, and the helpers the writing jobs share."""

"""Reading chain streams: the subscriber library (ordered updates, reorgs as removals) and `sluice subscribe`."""

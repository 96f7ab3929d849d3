"""Writing chain streams: the Redis stream producer, the live websocket hub and their mux, the synthetic chain, and `sluice produce`."""

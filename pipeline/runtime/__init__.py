"""What every always-on process has: /healthz and /metrics, memory given back, parent death, free ports, shared snapshots.

Imported by the processes of the parts (node, bus, serve, spark); it knows no part.
"""

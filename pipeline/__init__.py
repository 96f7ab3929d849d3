"""Sluice: messages through Redis Streams, archived in Delta Lake, resumable over websockets."""

__version__ = "0.1.0"

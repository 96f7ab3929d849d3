"""Sluice: messages through Redis Streams, archived in Delta Lake, resumable over websockets.

The declared Python API: the settings and the exception tree here, and one
facade per part, each importing lazily (nothing here loads pyarrow, deltalake
or Spark):

- :mod:`pipeline.routing`: ``Node``, ``Worker``, ``Address``, ``Route``, ``TransportMessage``
- :mod:`pipeline.streams`: ``StreamService``, ``StreamClient``, ``Publisher``, ``Consumer``...
- :mod:`pipeline.bus`: ``BusClient``, ``BusServer``, ``Envelope``
- :mod:`pipeline.dialogue`: ``Connection``, ``DialogueServer``, ``Duplex``
- :mod:`pipeline.chain`: ``subscribe``, ``Added``, ``Removed``, the producers (needs ``[serve]``
  for the server side only)
- :mod:`pipeline.lake`: ``LakeReader`` (needs the ``[lake]`` or ``[serve]`` extra)
- ``airflow_folder("dags" | "plugins")``: Sluice's Airflow folders (``[airflow]``)

Anything else under ``pipeline`` is internal and may change.

"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy_from

__version__ = "0.1.0"  # the one version: pyproject.toml reads it ([tool.setuptools.dynamic])

# Each public name once, here: `from pipeline import X` loads X's module on first use
# (pipeline.facade.lazy_from), and type checkers read this list with the star imports below.
__all__ = [
    "__version__",
    # the settings (pipeline.settings)
    "Settings",
    "RedisSettings",
    "LakeSettings",
    "SparkSettings",
    "NodeSettings",
    "BusSettings",
    "ServeSettings",
    # the exception tree (pipeline.errors)
    "SluiceError",
    "ConfigError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "PayloadTooLarge",
    "InternalProtocolError",
    "RoutingError",
    "UnroutableMessage",
    "UnknownAddressType",
    "StreamError",
    "StreamNotFound",
    "LeaseHeld",
    "PullAborted",
    "BusError",
    "EnvelopeError",
    "SignatureError",
    "RequestExpired",
    "RemoteError",
    "CallFailed",
    "HandlerError",
    "DialogueError",
    "DialogueClosed",
    "RequestCancelled",
    "DuplexError",
    "ChainError",
    "BadBatch",
    "BadParams",
    "ResumptionError",
    "NotFound",
    "SlowConsumer",
    "PeerLeft",
    "SubscriptionLost",
    "OrderingError",
    "ChainGap",
    "MuxError",
    "LakeError",
    "LakePathError",
    "RedisUnavailable",
    "NotReplicated",
    "ProducerGaveUp",
    "ArchiveError",
    "SparkUnavailable",
    "JobCancelled",
    "LockBusy",
    "LockLost",
    "LakeJobError",
    # the Airflow folders (pipeline.airflowfolders)
    "airflow_folder",
]

if TYPE_CHECKING:
    from pipeline.airflowfolders import *
    from pipeline.errors import *
    from pipeline.settings import *
else:  # at run time each name's module loads on first use (no __getattr__ for type checkers:
    # a name not declared above is an error there, not Any)
    __getattr__, __dir__ = lazy_from(
        __name__, __all__, ("pipeline.errors", "pipeline.settings", "pipeline.airflowfolders")
    )

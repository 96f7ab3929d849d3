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

from pipeline.facade import lazy

__version__ = "0.1.0"

_EXPORTS = {
    "Settings": "pipeline.settings",
    "RedisSettings": "pipeline.settings",
    "LakeSettings": "pipeline.settings",
    "SparkSettings": "pipeline.settings",
    "NodeSettings": "pipeline.settings",
    "BusSettings": "pipeline.settings",
    "ServeSettings": "pipeline.settings",
    "SluiceError": "pipeline.errors",
    "ConfigError": "pipeline.errors",
    "ProtocolError": "pipeline.errors",
    "LocalProtocolError": "pipeline.errors",
    "RemoteProtocolError": "pipeline.errors",
    "PayloadTooLarge": "pipeline.errors",
    "InternalProtocolError": "pipeline.errors",
    "RoutingError": "pipeline.errors",
    "UnroutableMessage": "pipeline.errors",
    "UnknownAddressType": "pipeline.errors",
    "StreamError": "pipeline.errors",
    "StreamNotFound": "pipeline.errors",
    "LeaseHeld": "pipeline.errors",
    "PullAborted": "pipeline.errors",
    "BusError": "pipeline.errors",
    "EnvelopeError": "pipeline.errors",
    "SignatureError": "pipeline.errors",
    "RequestExpired": "pipeline.errors",
    "RemoteError": "pipeline.errors",
    "CallFailed": "pipeline.errors",
    "HandlerError": "pipeline.errors",
    "DialogueError": "pipeline.errors",
    "DialogueClosed": "pipeline.errors",
    "RequestCancelled": "pipeline.errors",
    "DuplexError": "pipeline.errors",
    "ChainError": "pipeline.errors",
    "BadBatch": "pipeline.errors",
    "BadParams": "pipeline.errors",
    "ResumptionError": "pipeline.errors",
    "NotFound": "pipeline.errors",
    "SlowConsumer": "pipeline.errors",
    "PeerLeft": "pipeline.errors",
    "SubscriptionLost": "pipeline.errors",
    "OrderingError": "pipeline.errors",
    "ChainGap": "pipeline.errors",
    "MuxError": "pipeline.errors",
    "LakeError": "pipeline.errors",
    "LakePathError": "pipeline.errors",
    "RedisUnavailable": "pipeline.errors",
    "NotReplicated": "pipeline.errors",
    "ProducerGaveUp": "pipeline.errors",
    "ArchiveError": "pipeline.errors",
    "SparkUnavailable": "pipeline.errors",
    "JobCancelled": "pipeline.errors",
    "LockBusy": "pipeline.errors",
    "LockLost": "pipeline.errors",
    "LakeJobError": "pipeline.errors",
    "airflow_folder": "pipeline.airflowfolders",
}

__all__ = [
    "__version__",
    "ArchiveError",
    "BadBatch",
    "BadParams",
    "BusError",
    "BusSettings",
    "CallFailed",
    "ChainError",
    "ChainGap",
    "ConfigError",
    "DialogueClosed",
    "DialogueError",
    "DuplexError",
    "EnvelopeError",
    "HandlerError",
    "InternalProtocolError",
    "JobCancelled",
    "LakeError",
    "LakeJobError",
    "LakePathError",
    "LakeSettings",
    "LeaseHeld",
    "LocalProtocolError",
    "LockBusy",
    "LockLost",
    "MuxError",
    "NodeSettings",
    "NotFound",
    "NotReplicated",
    "OrderingError",
    "PayloadTooLarge",
    "PeerLeft",
    "ProducerGaveUp",
    "ProtocolError",
    "PullAborted",
    "RedisSettings",
    "RedisUnavailable",
    "RemoteError",
    "RemoteProtocolError",
    "RequestCancelled",
    "RequestExpired",
    "ResumptionError",
    "RoutingError",
    "ServeSettings",
    "Settings",
    "SignatureError",
    "SlowConsumer",
    "SluiceError",
    "SparkSettings",
    "SparkUnavailable",
    "StreamError",
    "StreamNotFound",
    "SubscriptionLost",
    "UnknownAddressType",
    "UnroutableMessage",
    "airflow_folder",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.airflowfolders import airflow_folder as airflow_folder
    from pipeline.errors import (
        ArchiveError as ArchiveError,
    )
    from pipeline.errors import (
        BadBatch as BadBatch,
    )
    from pipeline.errors import (
        BadParams as BadParams,
    )
    from pipeline.errors import (
        BusError as BusError,
    )
    from pipeline.errors import (
        CallFailed as CallFailed,
    )
    from pipeline.errors import (
        ChainError as ChainError,
    )
    from pipeline.errors import (
        ChainGap as ChainGap,
    )
    from pipeline.errors import (
        ConfigError as ConfigError,
    )
    from pipeline.errors import (
        DialogueClosed as DialogueClosed,
    )
    from pipeline.errors import (
        DialogueError as DialogueError,
    )
    from pipeline.errors import (
        DuplexError as DuplexError,
    )
    from pipeline.errors import (
        EnvelopeError as EnvelopeError,
    )
    from pipeline.errors import (
        HandlerError as HandlerError,
    )
    from pipeline.errors import (
        InternalProtocolError as InternalProtocolError,
    )
    from pipeline.errors import (
        JobCancelled as JobCancelled,
    )
    from pipeline.errors import (
        LakeError as LakeError,
    )
    from pipeline.errors import (
        LakeJobError as LakeJobError,
    )
    from pipeline.errors import (
        LakePathError as LakePathError,
    )
    from pipeline.errors import (
        LeaseHeld as LeaseHeld,
    )
    from pipeline.errors import (
        LocalProtocolError as LocalProtocolError,
    )
    from pipeline.errors import (
        LockBusy as LockBusy,
    )
    from pipeline.errors import (
        LockLost as LockLost,
    )
    from pipeline.errors import (
        MuxError as MuxError,
    )
    from pipeline.errors import (
        NotFound as NotFound,
    )
    from pipeline.errors import (
        NotReplicated as NotReplicated,
    )
    from pipeline.errors import (
        OrderingError as OrderingError,
    )
    from pipeline.errors import (
        PayloadTooLarge as PayloadTooLarge,
    )
    from pipeline.errors import (
        PeerLeft as PeerLeft,
    )
    from pipeline.errors import (
        ProducerGaveUp as ProducerGaveUp,
    )
    from pipeline.errors import (
        ProtocolError as ProtocolError,
    )
    from pipeline.errors import (
        PullAborted as PullAborted,
    )
    from pipeline.errors import (
        RedisUnavailable as RedisUnavailable,
    )
    from pipeline.errors import (
        RemoteError as RemoteError,
    )
    from pipeline.errors import (
        RemoteProtocolError as RemoteProtocolError,
    )
    from pipeline.errors import (
        RequestCancelled as RequestCancelled,
    )
    from pipeline.errors import (
        RequestExpired as RequestExpired,
    )
    from pipeline.errors import (
        ResumptionError as ResumptionError,
    )
    from pipeline.errors import (
        RoutingError as RoutingError,
    )
    from pipeline.errors import (
        SignatureError as SignatureError,
    )
    from pipeline.errors import (
        SlowConsumer as SlowConsumer,
    )
    from pipeline.errors import (
        SluiceError as SluiceError,
    )
    from pipeline.errors import (
        SparkUnavailable as SparkUnavailable,
    )
    from pipeline.errors import (
        StreamError as StreamError,
    )
    from pipeline.errors import (
        StreamNotFound as StreamNotFound,
    )
    from pipeline.errors import (
        SubscriptionLost as SubscriptionLost,
    )
    from pipeline.errors import (
        UnknownAddressType as UnknownAddressType,
    )
    from pipeline.errors import (
        UnroutableMessage as UnroutableMessage,
    )
    from pipeline.settings import (
        BusSettings as BusSettings,
    )
    from pipeline.settings import (
        LakeSettings as LakeSettings,
    )
    from pipeline.settings import (
        NodeSettings as NodeSettings,
    )
    from pipeline.settings import (
        RedisSettings as RedisSettings,
    )
    from pipeline.settings import (
        ServeSettings as ServeSettings,
    )
    from pipeline.settings import (
        Settings as Settings,
    )
    from pipeline.settings import (
        SparkSettings as SparkSettings,
    )

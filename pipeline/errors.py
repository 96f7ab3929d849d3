"""The one exception tree of Sluice.

Every exception Sluice raises on purpose derives from :class:`SluiceError`.
Protocol errors are split the way h11 and websockets split them: a
``LocalProtocolError`` is our own misuse (a bug or bad arguments on this side),
a ``RemoteProtocolError`` is something a peer sent. Errors are converted to
wire replies at one boundary per transport, and only ``public_message`` is ever
sent to a peer: internal details stay in the logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time this module binds exception classes only (contract tests read it)
    from collections.abc import Sequence
    from typing import Any


class SluiceError(Exception):
    """Base of every error Sluice raises on purpose."""

    #: A short text that is safe to send to a peer.
    public_message: str = "internal error"

    def __init__(self, message: str = "", *, public: str | None = None) -> None:
        super().__init__(message or self.public_message)
        if public is not None:
            self.public_message = public


class ConfigError(SluiceError):
    """A setting is missing or invalid."""

    public_message = "configuration error"


class MissingExtra(ConfigError, ImportError):
    """A command or a public name needs a package of an extra that is not installed.

    The message says which and ``pip install 'sluice[EXTRA]'``; an :class:`ImportError`
    too, so ``except ImportError`` around an optional import still holds.
    """

    public_message = "an optional dependency is not installed"


class ProtocolError(SluiceError):
    """A wire protocol was violated."""

    public_message = "protocol error"


class LocalProtocolError(ProtocolError):
    """This side tried to do something the protocol forbids."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids (malformed frame, bad JSON...)."""


class PayloadTooLarge(RemoteProtocolError):
    """A message or frame exceeds the configured size limit."""

    public_message = "payload too large"


class InternalProtocolError(LocalProtocolError):
    """A bug on this side broke a protocol machine (closed at once, as websockets does).

    The exception that did it is the ``__cause__``; only ``internal error`` crosses the wire.
    """

    public_message = "internal error"


# --- routing and streams -------------------------------------------------


class RoutingError(SluiceError):
    """A routed message could not be routed."""

    public_message = "routing error"


class UnroutableMessage(RoutingError):
    """No local worker or transport for the first hop of the onward route."""

    public_message = "unroutable message"


class UnknownAddressType(RoutingError):
    """An address type with no registered transport."""

    public_message = "unknown address type"


class StreamError(SluiceError):
    """A stream service or stream client error."""

    public_message = "stream error"


class StreamNotFound(StreamError):
    """The stream does not exist (or was deleted under a consumer)."""

    public_message = "stream not found"


class LeaseHeld(StreamError):
    """Another node holds the consumer lease on this stream."""

    public_message = "stream is consumed by another node"


class PullAborted(StreamError):
    """A pull in flight was abandoned because its consumer is stopping."""

    public_message = "pull aborted"


# --- reliable message bus --------------------------------------------------


class BusError(SluiceError):
    """A reliable-message-bus error."""

    public_message = "bus error"


class EnvelopeError(BusError, RemoteProtocolError):
    """An envelope failed validation (the text goes to ``err``)."""

    public_message = "invalid envelope"


class SignatureError(BusError):
    """A bus-to-bus request is unsigned, forged, or from an unknown twin."""

    public_message = "invalid signature"


class Fenced(BusError):
    """A write of a bus whose lease another bus holds now: refused, nothing written."""

    public_message = "this bus is no longer the twin's active bus"


class RequestExpired(BusError):
    """A request outlived its ``exp``."""

    public_message = "request expired"


class PostUnanswered(BusError):
    """A POST to another bus got no answer.

    ``reached`` is False when it never connected (or the directory failed: the
    peer cannot have acted on it), True when it connected and then no whole
    answer came (the peer may have taken it).
    """

    public_message = "no answer from the remote bus"

    def __init__(self, message: str, *, reached: bool) -> None:
        super().__init__(message)
        self.reached = reached


class RemoteError(BusError):
    """The remote side answered with ``err`` set."""

    public_message = "remote error"


class CallFailed(RemoteError):
    """At least one destination answered with ``err``; ``answers`` holds all of them.

    ``answers`` are the :class:`~pipeline.bus.envelope.Envelope` answers in
    ``dst`` order (typed loosely: this module imports nothing of Sluice's).
    The public text is the first destination's own ``err``.
    """

    def __init__(self, message: str, answers: Sequence[Any]) -> None:
        super().__init__(message, public=next((a.err for a in answers if a.err), message))
        self.answers = list(answers)


# --- dialogue --------------------------------------------------------------


class DialogueError(SluiceError):
    """A Dialogue connection error."""

    public_message = "dialogue error"


class DialogueClosed(DialogueError):
    """The dialogue is closed (or closing) and cannot carry this operation."""

    public_message = "dialogue closed"


class RequestCancelled(DialogueError):
    """The peer cancelled the request or declined to answer it."""

    public_message = "request cancelled"


class DuplexError(DialogueError):
    """The peer terminated a duplex with an error; ``data`` holds its payload."""

    public_message = "duplex terminated with an error"

    def __init__(self, message: str = "", *, data: bytes = b"") -> None:
        super().__init__(message)
        self.data = data


# --- chain streams and resumption -----------------------------------------


class ChainError(SluiceError):
    """A chain-stream error."""

    public_message = "chain error"


class BadBatch(ChainError, RemoteProtocolError):
    """Bytes that do not decode to a valid block batch."""

    public_message = "invalid block batch"


class BadParams(ChainError):
    """Invalid JSON-RPC params (maps to -32602).

    The text describes the caller's own input, so it is the public message:
    raise it only with texts that name what the peer sent, never internals.
    """

    public_message = "invalid params"

    def __init__(self, message: str = "", *, public: str | None = None) -> None:
        super().__init__(message, public=public if public is not None else message or None)


class ResumptionError(ChainError):
    """A subscription cannot be resumed from the requested point."""

    public_message = "cannot resume"


class BranchUnlinked(ChainError):
    """A heavier block whose branch a subscriber's fork choice cannot link to what it sent.

    The branch forks below what the subscriber's :class:`~pipeline.chain.forkchoice.Sender`
    remembers (a reorg deeper than it holds, or below where the subscription started), or
    comes after a gap. Never reaches a client: resumption plans again from the
    subscriber's head, which finds the fork point in Redis or the lake.
    """

    public_message = "reorg"

    def __init__(self, num: int, hash: str) -> None:
        super().__init__(f"block {num} ({hash[:16]}) does not link to what was sent")
        self.num = num
        self.hash = hash


class NotFound(ChainError):
    """A block or subscription a request names does not exist; ``code`` is its JSON-RPC code.

    cardinal-rpc answers a method's own error with code -1 and an unknown
    subscription with -32000; the server keeps those codes in that dialect.
    """

    public_message = "not found"

    def __init__(self, message: str = "", *, code: int = -32000) -> None:
        super().__init__(message, public=message or None)
        self.code = code


class SlowConsumer(ChainError):
    """A subscriber fell behind its bounded send buffer."""

    public_message = "subscriber too slow"


class ReorgReconnect(SlowConsumer):
    """A reorg the cardinal-streams library cannot take on a connection it is reading.

    The library applies a ``reorg`` message in its reader at once, while blocks read
    before it may still wait in its processor, which then re-emits the old branch
    from its cache and drops the new one ("Error finding common ancestor"). The
    connection is closed instead (code 1012): the library redials from its last
    block, and resumption answers with the ``reorg`` first and the new branch after.
    A subclass of :class:`SlowConsumer` so it leaves the live path the same way.
    """

    public_message = "reorg deeper than the library holds: resubscribe from your last block"


class PeerLeft(ChainError):
    """The subscriber ended its half of a Dialogue feed duplex (ends serving it, quietly)."""

    public_message = "subscriber left"


class SubscriptionLost(ChainError):
    """The server could not be reached again within the retry budget."""

    public_message = "subscription lost"


class OrderingError(ChainError):
    """Too many blocks held out of order: resume from the last complete block."""

    public_message = "too many out-of-order blocks"


class ChainGap(OrderingError):
    """A block past the head links to nothing held: blocks were skipped, resume from the head now."""

    public_message = "blocks missing before the one received"


class MuxError(ChainError):
    """One or more transports of a ``MuxProducer`` failed; ``failures`` lists every one."""

    public_message = "producer transport failed"

    def __init__(self, failures: Sequence[tuple[str, BaseException]]) -> None:
        names = ", ".join(f"{name}: {exc!r}" for name, exc in failures)
        super().__init__(f"{len(failures)} transport(s) failed: {names}")
        self.failures = list(failures)


# --- lake ------------------------------------------------------------------


class LakeError(SluiceError):
    """A lake job failed."""

    public_message = "lake error"


class LakePathError(LakeError):
    """The lake path cannot be written or read."""


class RedisUnavailable(LakeError, StreamError):
    """Redis cannot be reached."""

    public_message = "redis unavailable"


class NotReplicated(RedisUnavailable):
    """A write the master took but fewer replicas than required acknowledged in time
    (``SLUICE_REDIS_MIN_REPLICAS``, :mod:`pipeline.redisio.durability`): it may survive a
    failover or not; retry it idempotently or report it, never count it as done."""


class ProducerGaveUp(RedisUnavailable):
    """Redis stayed unreachable for longer than the producer's ``--retry-for``."""


class ArchiveError(LakeError):
    """An archive interval could not be archived."""


class StreamKindError(ConfigError, LakeError):
    """A stream's entries contradict what ``SLUICE_CHAIN_STREAMS`` says it is.

    Raised before anything is written or trimmed: blocks in a stream the setting
    does not name, or no block in one it does (:mod:`pipeline.blockcodec.streamkind`).
    """

    public_message = "stream kind mismatch"


class SparkUnavailable(LakeError):
    """The Spark Connect server of ``SLUICE_SPARK_REMOTE`` cannot be reached or went away."""

    public_message = "spark unavailable"


class JobCancelled(LakeError):
    """A lake job was stopped (SIGTERM, "Mark failed") before it committed."""

    public_message = "job cancelled"


class LockBusy(LakeError):
    """Another job holds the stream's archive lock for longer than this job would wait."""


class LockLost(LakeError):
    """This job's lease expired or could not be renewed; it must not commit."""


class LakeJobError(LakeError):
    """A lake job child process failed, timed out, or did not print a JSON result."""

    def __init__(self, message: str, *, returncode: int | None, stderr_tail: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class HandlerError(BusError):
    """Raised by a bus handler to answer its caller with this message in ``err``.

    Any other exception from a handler is logged and answered with a generic
    ``err``, so internal details never reach a peer.
    """

    public_message = "handler error"

    def __init__(self, message: str) -> None:
        super().__init__(message, public=message)


class DemoError(SluiceError):
    """A demo component did not start, or kept dying past its restart budget."""

    public_message = "demo failed"


class DemoTimeout(DemoError):
    """A demo check's deadline passed (or it was interrupted) while waiting for a condition."""

    public_message = "demo check timed out"


class BrokenChain(DemoError):
    """The blocks the demo check collected do not link back to block 0."""

    public_message = "broken chain"

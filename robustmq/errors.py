"""Every error RobustMQ raises, in one hierarchy shared by all layers.

The storage engines, the storage node, the Meta Service and the client raise
the same classes: a node answers an error with its ``code`` and fields, and the
client rebuilds the same class with :func:`error_from_code`, so a caller sees
``OffsetOutOfRange(topic=..., partition=..., offset=...)`` whether the read ran
in-process or over the network.

::

    RobustMQError                      code            retriable
    +-- RetriableError
    |   +-- Unavailable                UNAVAILABLE     yes  node/meta down or unreachable
    |   |   +-- NotLeader              NOT_LEADER      yes  not the shard's leader (a node): refresh
    |   |                                                   metadata, retry; not the leading Meta
    |   |                                                   Service: ask ``leader`` ("" unknown)
    |   +-- Busy                       BUSY            yes  bounded queue full: back off
    |   +-- SegmentSealed              SEGMENT_SEALED  yes  refresh metadata, retry
    |   +-- RequestTimeout             TIMEOUT         yes  no answer before the deadline
    |   +-- NotEnoughReplicas          NOT_ENOUGH_REPLICAS
    |                                                  yes  acks=all: the ISR is below
    |                                                       min_insync_replicas
    |   +-- ShardFailed                SHARD_FAILED    yes  the shard's files need recovery:
    |                                                       a node restart runs it
    |   +-- ObjectStoreUnavailable     OBJECT_STORE_UNAVAILABLE
    |                                                  yes  the tier URL's store did not answer
    |   +-- DeletionPending            DELETION_PENDING
    |                                                  yes  a topic deletion is recorded; a node
    |                                                       that may still take its writes has
    |                                                       not confirmed dropping it yet
    +-- TopicNotFound                  UNKNOWN_TOPIC
    +-- ShardNotFound                  UNKNOWN_SHARD
    |   +-- IncarnationMismatch        INCARNATION_MISMATCH
    |                                  the topic was deleted and created again since
    +-- TopicAlreadyExists             TOPIC_EXISTS
    +-- ShardAlreadyExists             SHARD_EXISTS
    +-- OffsetOutOfRange               OFFSET_OUT_OF_RANGE
    +-- CorruptRecordBatch             CORRUPT_BATCH   stored bytes failed their CRC
    |   +-- CorruptObject              CORRUPT_OBJECT  a tiered object failed its checks
    +-- StaleEpoch                     STALE_EPOCH     a fenced writer
    +-- EngineClosed                   CLOSED
    +-- AuthenticationFailed           AUTHENTICATION_FAILED
    |                                  no valid identity: a wrong password, an expired, revoked
    |                                  or forged token, a certificate of another CA
    +-- AuthorizationFailed            AUTHORIZATION_FAILED
    |                                  an authenticated principal the ACLs do not allow
    +-- InvalidRequest                 INVALID_REQUEST
        +-- InvalidRecordBatch         INVALID_BATCH   not Arrow IPC, or the wrong schema
        |   +-- KeyRequired            KEY_REQUIRED    a record without a key for a
        |                                              cleanup=compact topic
        +-- RecordBatchTooLarge        BATCH_TOO_LARGE
        +-- InvalidConfig              INVALID_CONFIG
        |   +-- ObjectStoreError       OBJECT_STORE    the tier URL is wrong or refused us
        |                                              (no bucket, access denied, bad path)
        +-- OutOfOrderSequence         OUT_OF_ORDER_SEQUENCE
        +-- DuplicateSequenceMismatch  DUPLICATE_SEQUENCE_MISMATCH
        |                              a re-sent sequence carries other records than were stored
        +-- MessageTooLarge            MESSAGE_TOO_LARGE
        |                              a gRPC request or answer past its size limit
        +-- QuotaExceeded              QUOTA_EXCEEDED  a metadata quota of the Meta Service
                                                       (topics, partitions, segments per
                                                       shard, seal interval)

Errors carry fields (``topic``, ``partition``, ``shard``, ``offset``...) as
attributes and in :attr:`RobustMQError.fields`, not only in their text. A
field becomes an attribute only if its name is a plain identifier that names
nothing of the class (``code``, ``retriable``, ``message``, ``fields``,
methods): an error decoded from the wire (:func:`error_from_code`) cannot
change how the client treats it, and at most :data:`MAX_FIELDS` fields of a
wire error are kept. A
request that breaks a limit names it: ``limit`` (e.g. ``"max_tag_bytes"``),
``max``, and ``column`` / ``row`` / ``size`` where they apply.
Foreign errors (ZeroMQ, gRPC, RocksDB, boto3) are translated into these at one
place per boundary, with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "MAX_FIELDS",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "Busy",
    "CorruptObject",
    "CorruptRecordBatch",
    "DeletionPending",
    "DuplicateSequenceMismatch",
    "EngineClosed",
    "IncarnationMismatch",
    "InvalidConfig",
    "InvalidRecordBatch",
    "InvalidRequest",
    "KeyRequired",
    "MessageTooLarge",
    "NotEnoughReplicas",
    "NotLeader",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "QuotaExceeded",
    "RecordBatchTooLarge",
    "RequestTimeout",
    "RetriableError",
    "RobustMQError",
    "SegmentSealed",
    "ShardAlreadyExists",
    "ShardFailed",
    "ShardNotFound",
    "StaleEpoch",
    "TopicAlreadyExists",
    "TopicNotFound",
    "Unavailable",
    "error_from_code",
]

MAX_FIELDS = 32  # fields kept from an error decoded off the wire


class RobustMQError(Exception):
    """Base class of every RobustMQ error.

    Parameters
    ----------
    message
        A sentence a user can act on.
    **fields
        Structured context (``topic``, ``partition``, ``shard``, ``offset``,
        ...); each becomes an attribute and travels over the wire.
    """

    code: ClassVar[str] = "ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields
        for name, value in fields.items():
            if _settable(type(self), name):
                setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep fields when errors cross process boundaries (Spark pickles them).
        return (_rebuild, (type(self), self.message, self.fields))

    def again(self) -> RobustMQError:
        """A fresh copy to raise where one stored error answers many calls.

        Raising the same object again and again chains every raiser's frames
        (and whatever they hold, such as request payloads) onto its traceback.
        """
        return _rebuild(type(self), self.message, self.fields)


def _settable(cls: type[RobustMQError], name: str) -> bool:
    """Whether field ``name`` may become an attribute: an identifier, not private, naming
    nothing the class or :class:`Exception` has (``code``, ``retriable``, ``again``, ``args``)."""
    return (
        name.isidentifier()
        and not name.startswith("_")
        and name not in ("message", "fields")
        and not hasattr(cls, name)
    )


def _rebuild(cls: type[RobustMQError], message: str, fields: dict[str, Any]) -> RobustMQError:
    return cls(message, **fields)


class RetriableError(RobustMQError):
    """The request may succeed if sent again (after a refresh or a back-off)."""

    code = "RETRIABLE"
    retriable = True


class Unavailable(RetriableError):
    code = "UNAVAILABLE"


class Busy(RetriableError):
    """A bounded queue is full; the server pushes back instead of growing."""

    code = "BUSY"


class NotLeader(Unavailable):
    """The one asked does not lead: a storage node that does not lead the shard's active
    segment (refresh the metadata, retry), or a Meta Service that does not lead its etcd
    election (fields ``leader``, the leading instance's ``host:port`` or "" while unknown,
    and ``reason``). An ``Unavailable``: whatever retries that retries this, and nothing was
    done. A follower Meta Service answers every RPC but ``GetSecurityInfo`` with it (gRPC
    status ``UNAVAILABLE``)."""

    code = "NOT_LEADER"


class SegmentSealed(RetriableError):
    code = "SEGMENT_SEALED"


class RequestTimeout(RetriableError):
    code = "TIMEOUT"


class NotEnoughReplicas(RetriableError):
    """``acks=all`` was asked while the ISR is smaller than the topic's ``min_insync_replicas``.

    Raised before the append when the ISR is already too small (nothing was
    written), and after it when the ISR shrank below the minimum while the
    request waited (the records may be stored: an idempotent producer's retry
    settles it without duplicates). Fields: ``shard``, ``isr`` (its size),
    ``min_insync_replicas``, ``appended`` (whether the records were written).
    """

    code = "NOT_ENOUGH_REPLICAS"


class ShardFailed(Unavailable):
    """The shard's files no longer match what it acknowledged, so it takes no writes.

    Set when undoing a failed group commit fails (the disk refused to truncate):
    a write appended after the leftover bytes would make the file disagree with
    its index. Reads still serve everything up to the last good frame. A restart
    of the storage node re-runs recovery, which puts the files in order.
    Fields: ``shard``, ``reason``.
    """

    code = "SHARD_FAILED"


class ObjectStoreUnavailable(Unavailable):
    """The object store of the tier URL did not answer (connection refused, timeout, 5xx).

    Retriable: the store may come back. Fields: ``url`` (the tier URL or object
    URL), ``reason``.
    """

    code = "OBJECT_STORE_UNAVAILABLE"


class DeletionPending(RetriableError):
    """A topic's deletion is recorded but not complete: a node that held it and may still take
    its writes (it is alive) has not confirmed dropping it within the call's deadline.

    The topic is gone for every other call at once; the deletion completes in the
    background once those nodes confirm (their next heartbeats) or stop being alive.
    Sending the same delete again waits for it again (it does not answer
    ``TopicNotFound`` while the deletion is pending, and with ``incarnation`` it never
    deletes a topic created again under the name since). Fields: ``topic``,
    ``incarnation`` (the one being deleted), ``waiting_for`` (up to 10 node ids),
    ``waiting_count``.
    """

    code = "DELETION_PENDING"


class TopicNotFound(RobustMQError):
    code = "UNKNOWN_TOPIC"


class ShardNotFound(RobustMQError):
    code = "UNKNOWN_SHARD"


class IncarnationMismatch(ShardNotFound):
    """A read named a topic incarnation that was deleted: the topic now is a new one.

    Its offsets are another log's, so reading on at the same offset would
    mix two topics. Not retriable. Fields: ``shard``, ``incarnation`` (the one
    asked for), ``current_incarnation`` (the one the node serves).
    """

    code = "INCARNATION_MISMATCH"


class TopicAlreadyExists(RobustMQError):
    code = "TOPIC_EXISTS"


class ShardAlreadyExists(RobustMQError):
    code = "SHARD_EXISTS"


class OffsetOutOfRange(RobustMQError):
    """The offset is before the earliest retained record or past the log end."""

    code = "OFFSET_OUT_OF_RANGE"


class CorruptRecordBatch(RobustMQError):
    """Stored or received bytes failed a CRC or framing check."""

    code = "CORRUPT_BATCH"


class CorruptObject(CorruptRecordBatch):
    """A tiered segment's object failed its checks and is never served.

    Its size, Parquet footer, page checksums, record count, offsets or the
    source segment's CRC-32C recorded in it disagree with the Meta Service's
    record of the segment (truncated, overwritten or damaged in the store).
    Fields: ``url``, ``shard``, ``epoch``, ``reason``.
    """

    code = "CORRUPT_OBJECT"


class StaleEpoch(RobustMQError):
    """A writer addressed an older epoch than the shard's current one (fenced)."""

    code = "STALE_EPOCH"


class EngineClosed(RobustMQError):
    code = "CLOSED"


class AuthenticationFailed(RobustMQError):
    """The caller has no valid identity for this cluster (docs/security.md).

    A wrong user or password, a token that expired, was revoked (the user was
    removed or its password changed) or is not signed by this cluster, a
    certificate from another CA, or a plaintext client at a secured port.
    Retrying with the same credentials cannot help. Fields: ``reason``.
    """

    code = "AUTHENTICATION_FAILED"


class AuthorizationFailed(RobustMQError):
    """An authenticated principal asked for something the ACLs do not allow.

    Fields: ``principal``, ``operation`` (read, write, create, delete, alter,
    describe), ``resource_type`` (topic, group, cluster), ``resource_name``.
    Nothing was changed. An operator grants it with ``robustmq acl add``.
    """

    code = "AUTHORIZATION_FAILED"


class InvalidRequest(RobustMQError):
    """The request is malformed; sending it again will not help."""

    code = "INVALID_REQUEST"


class InvalidRecordBatch(InvalidRequest):
    """The payload is not an Arrow IPC stream of the record schema."""

    code = "INVALID_BATCH"


class KeyRequired(InvalidRecordBatch):
    """A record without a key was sent to a ``cleanup=compact`` topic; nothing of its batch was stored.

    A compacted topic keeps the latest record per key, so a record without one
    could never be found, updated or deleted. Fields: ``topic`` (or ``shard`` when
    raised by a node), ``row`` (the first keyless record in the batch),
    ``keyless`` (how many there were).
    """

    code = "KEY_REQUIRED"


class RecordBatchTooLarge(InvalidRequest):
    code = "BATCH_TOO_LARGE"


class InvalidConfig(InvalidRequest):
    code = "INVALID_CONFIG"


class ObjectStoreError(InvalidConfig):
    """The tier URL is wrong, or its store refused us: not retriable as it is.

    No such bucket or directory, access denied, an unsupported scheme, a
    malformed URL. Fields: ``url``, ``reason``.
    """

    code = "OBJECT_STORE"


class OutOfOrderSequence(InvalidRequest):
    code = "OUT_OF_ORDER_SEQUENCE"


class DuplicateSequenceMismatch(InvalidRequest):
    """An idempotent producer re-sent a sequence the shard already stored, with other records.

    The stored entry's record count or payload checksum differs from the new
    request's, so it is neither a retry nor new data: acknowledging it as a
    duplicate would drop rows silently, and storing it would duplicate them.
    Fields: ``shard``, ``producer_id``, ``sequence``, ``stored_count``, ``sent_count``.
    """

    code = "DUPLICATE_SEQUENCE_MISMATCH"


class MessageTooLarge(InvalidRequest):
    """A Meta Service request or answer is larger than gRPC's message limit on one side.

    Sending it again cannot help: ask for less (a smaller page, fewer offsets in
    one commit). Fields: ``size_bytes``, ``limit_bytes``, ``address``.
    """

    code = "MESSAGE_TOO_LARGE"


class QuotaExceeded(InvalidRequest):
    """A metadata quota of the Meta Service is reached (docs/operators.md, "Limits").

    Sending the same request again does not help until something is removed
    (a topic deleted, retention removing old segments) or an operator raises the
    quota; ``min_seal_interval_ms`` passes with time (``retry_after_ms``).
    Fields: ``quota`` (its setting's name), ``max``, and what was counted
    (``topics``, ``partitions``, ``segments``, ``shard``...).
    """

    code = "QUOTA_EXCEEDED"


def _all_subclasses(cls: type[RobustMQError]) -> list[type[RobustMQError]]:
    found: list[type[RobustMQError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


_CLASSES: list[type[RobustMQError]] = [RobustMQError, *_all_subclasses(RobustMQError)]
_BY_CODE: dict[str, type[RobustMQError]] = {cls.code: cls for cls in _CLASSES}


def error_from_code(code: str, message: str, /, **fields: Any) -> RobustMQError:
    """Rebuild the error class named by a wire ``code`` (unknown codes give the base class).

    At most :data:`MAX_FIELDS` fields are kept, those with string names; which of them
    become attributes is decided as for any error (see the module docstring).
    """
    error = _BY_CODE.get(code, RobustMQError)(message)
    for name, value in list(fields.items())[:MAX_FIELDS]:
        if isinstance(name, str):  # "code" or "message" too: kept in .fields, never passed as arguments
            error.fields[name] = value
            if _settable(type(error), name):
                setattr(error, name, value)
    return error

"""Produce and InitProducerId: Kafka producers (idempotent ones too) writing into RobustMQ topics.

Each partition's RecordBatch v2 (every codec, see ``_records``) becomes one
Arrow batch of the record schema and one produce request to the partition's
leader node, through the client's retrying ``produce`` (so a leader failover
during a Kafka produce is followed, as for a native producer). The
partitions of one Produce request are written concurrently; the answer gives
each partition's first offset, the log's own.

``acks``: Kafka's ``1`` is RobustMQ's ``"1"`` (the leader's durable append),
``-1`` (all) is ``"all"``; ``0`` is written as ``"1"`` and, as in Kafka, not
answered at all.

Idempotence: a Kafka producer id *is* a RobustMQ producer id (InitProducerId
asks the Meta Service for one, as the native producer does), and the batch's
``(producer_epoch, base_sequence)`` becomes the node's producer sequence
``producer_epoch << 32 | base_sequence``, which increases as Kafka's does
(the sequence within an epoch, and a new epoch, KIP-360's bump, above every
sequence of the old one). So a retried batch is answered with its original
offsets and stored once, across gateways and gateway restarts, because the
window lives in the storage node (1,024 batches per producer and partition,
wider than Kafka's 5). On a secured gateway, a produce carries the token the
Meta Service issued for its producer id to the producer's principal; a gateway
that holds none (the producer moved here, or this gateway restarted) asks for
one (``_sasl.Principal.producer_token``), so the producer keeps its id and
sequences. Transactions are not supported: a transactional
producer is refused at InitProducerId (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``)
and a transactional or control batch with ``INVALID_RECORD``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from robustmq.errors import AuthorizationFailed, InvalidRecordBatch, RobustMQError

from ._errors import kafka_error
from ._protocol import NO_THROTTLE, Api, ApiTable, ErrorCode, RequestHeader, make, response_module
from ._records import decode_batches

__all__ = ["node_sequence", "register"]

log = logging.getLogger("robustmq.kafka_gateway")

_ACKS = {0: "1", 1: "1", -1: "all"}


def node_sequence(producer_epoch: int, base_sequence: int) -> int:
    """The storage node's producer sequence of a Kafka batch (see the module docstring)."""
    return (producer_epoch << 32) | (base_sequence & 0xFFFFFFFF)


def _write_partition(connection: Any, topic: str, partition: int, data: bytes, acks: str) -> int:
    """Store a partition's batches; the first one's base offset (runs in the pool)."""
    gateway = connection.gateway
    batches = decode_batches(data, max_uncompressed_bytes=gateway.settings.max_uncompressed_bytes)
    first = -1
    for batch in batches:
        if batch.transactional or batch.control:
            raise InvalidRecordBatch("transactional and control batches are not supported", topic=topic)
        if batch.records.num_rows == 0:
            continue
        idempotent = batch.producer_id >= 0 and batch.base_sequence >= 0
        token = b""
        if idempotent and connection.principal is not None:  # secured: the id's own token
            token = connection.principal.producer_token(batch.producer_id) or b""
            if not token:
                _warn_unknown(
                    "answered UNKNOWN_PRODUCER_ID to %s: producer id %d is not its own (or its record "
                    "expired)",
                    connection.principal.name,
                    batch.producer_id,
                )
                raise UnknownProducer(
                    f"producer id {batch.producer_id} was not handed to {connection.principal.name} (or "
                    "so long ago that the record expired): ask InitProducerId again"
                )
        response = connection.client.produce(
            topic,
            partition,
            batch.records,
            producer_id=batch.producer_id if idempotent else -1,
            sequence=node_sequence(batch.producer_epoch, batch.base_sequence) if idempotent else -1,
            acks=acks,
            token=token,
        )
        if first < 0:
            first = int(response.base_offset)
    return first


async def _produce(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    acks = _ACKS.get(int(request.acks))
    module = response_module(0, header.api_version)

    async def one(topic: str, partition: int, data: bytes | None) -> Any:
        code, message, base = ErrorCode.none, None, -1
        if acks is None:
            code, message = ErrorCode.invalid_required_acks, f"acks={request.acks}"
        elif request.transactional_id is not None:
            code, message = ErrorCode.transactional_id_authorization_failed, "transactions are not supported"
        else:
            try:
                base = await gateway.call(
                    _write_partition, connection, topic, partition, bytes(data or b""), acks
                )
            except UnknownProducer as error:
                code, message = ErrorCode.unknown_producer_id, str(error)
            except RobustMQError as error:
                code, message = kafka_error(error), error.message
        return make(
            module.PartitionProduceResponse,
            index=partition,
            error_code=code,
            base_offset=base,
            log_append_time=None,
            log_start_offset=-1,
            record_errors=(),
            error_message=message,
        )

    answers = []
    for topic in request.topic_data:
        partitions = await asyncio.gather(
            *(one(topic.name, int(part.index), part.records) for part in topic.partition_data)
        )
        answers.append(
            make(module.TopicProduceResponse, name=topic.name, partition_responses=tuple(partitions))
        )
    if int(request.acks) == 0:
        return None
    return make(module.ProduceResponse, responses=tuple(answers), throttle_time=NO_THROTTLE)


async def _init_producer_id(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(22, header.api_version)
    producer_id, epoch, code = -1, -1, ErrorCode.none
    if request.transactional_id:
        code = ErrorCode.transactional_id_authorization_failed
    elif (
        getattr(request, "producer_id", -1) >= 0
        and getattr(request, "producer_epoch", -1) >= 0
        and (connection.principal is None or await gateway.call(_holds, connection, int(request.producer_id)))
    ):
        # KIP-360: the producer bumps its epoch after an unknown outcome; its sequences restart
        # at 0, and the node's sequence (epoch << 32 | sequence) still goes up.
        producer_id, epoch = int(request.producer_id), int(request.producer_epoch) + 1
        if epoch > 32767:
            producer_id, epoch, code = -1, -1, ErrorCode.invalid_producer_epoch
    else:
        # (secured, an id not handed to this principal, or whose record expired: a fresh one, as
        # its produces could not prove the old one)
        try:
            if connection.principal is not None:
                producer_id = await gateway.call(connection.principal.new_producer_id)
            else:
                producer_id = int((await gateway.call(connection.client.meta.init_producer_id)).producer_id)
            epoch = 0
        except RobustMQError as error:
            # Kafka's IdempotentWrite is a cluster operation: its refusal is CLUSTER_AUTHORIZATION_FAILED
            code = (
                ErrorCode.cluster_authorization_failed
                if isinstance(error, AuthorizationFailed)
                else kafka_error(error)
            )
    return make(
        module.InitProducerIdResponse,
        throttle_time=NO_THROTTLE,
        error_code=code,
        producer_id=producer_id,
        producer_epoch=epoch,
    )


_last_warning = [0.0]


def _warn_unknown(message: str, *args: object) -> None:
    """At most one warning a second: a client naming foreign ids must not flood the log."""
    now = time.monotonic()
    if now - _last_warning[0] >= 1.0:
        _last_warning[0] = now
        log.warning(message, *args)


def _holds(connection: Any, producer_id: int) -> bool:
    assert connection.principal is not None
    return connection.principal.producer_token(producer_id) is not None


class UnknownProducer(Exception):
    """A secured produce naming a producer id whose token this gateway does not hold."""


def register(table: ApiTable) -> None:
    table.add(Api(0, 3, 9, _produce))
    table.add(Api(22, 0, 4, _init_producer_id))

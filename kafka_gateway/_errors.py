"""RobustMQ errors -> Kafka error codes: the one place the gateway translates them.

Retriable errors map onto Kafka's retriable codes, so a Kafka client retries
them by itself (after refreshing its metadata where Kafka would); the rest map
onto the closest fatal code. Anything unknown is ``UNKNOWN_SERVER_ERROR`` and
is logged.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from robustmq import errors

__all__ = ["kafka_error"]

log = logging.getLogger("robustmq.kafka_gateway")

# most specific first: the first class an error is an instance of decides
_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (errors.NotEnoughReplicas, ErrorCode.not_enough_replicas),
    (errors.RequestTimeout, ErrorCode.request_timed_out),
    (errors.NotLeader, ErrorCode.not_leader_or_follower),
    (errors.SegmentSealed, ErrorCode.not_leader_or_follower),
    (errors.StaleEpoch, ErrorCode.not_leader_or_follower),
    (errors.Busy, ErrorCode.request_timed_out),
    (errors.ShardFailed, ErrorCode.kafka_storage_error),
    (errors.DeletionPending, ErrorCode.unknown_topic_or_partition),
    (errors.RetriableError, ErrorCode.not_leader_or_follower),
    (errors.TopicNotFound, ErrorCode.unknown_topic_or_partition),
    (errors.ShardNotFound, ErrorCode.unknown_topic_or_partition),
    (errors.TopicAlreadyExists, ErrorCode.topic_already_exists),
    (errors.OffsetOutOfRange, ErrorCode.offset_out_of_range),
    (errors.CorruptRecordBatch, ErrorCode.kafka_storage_error),
    (errors.AuthenticationFailed, ErrorCode.sasl_authentication_failed),
    (errors.OutOfOrderSequence, ErrorCode.out_of_order_sequence_number),
    (errors.DuplicateSequenceMismatch, ErrorCode.invalid_record),
    (errors.RecordBatchTooLarge, ErrorCode.message_too_large),
    (errors.MessageTooLarge, ErrorCode.message_too_large),
    (errors.InvalidRecordBatch, ErrorCode.invalid_record),
    (errors.QuotaExceeded, ErrorCode.policy_violation),
    (errors.InvalidConfig, ErrorCode.invalid_config),
    (errors.InvalidRequest, ErrorCode.invalid_request),
)


# An ACL refusal names the resource it is about (robustmq.security._acl): Kafka's code follows it.
_AUTHORIZATION = {
    "group": ErrorCode.group_authorization_failed,
    "cluster": ErrorCode.cluster_authorization_failed,
}


def kafka_error(error: BaseException) -> ErrorCode:
    if isinstance(error, errors.AuthorizationFailed):
        resource_type = error.fields.get("resource_type")
        return _AUTHORIZATION.get(
            resource_type if isinstance(resource_type, str) else "", ErrorCode.topic_authorization_failed
        )
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    log.error("unexpected error answered as UNKNOWN_SERVER_ERROR", exc_info=error)
    return ErrorCode.unknown_server_error

"""ApiVersions, Metadata, CreateTopics, DeleteTopics: what a Kafka client asks before it reads or writes.

Metadata names every live gateway as a broker (``_peers``: alone, the gateway
is node id ``BROKER_ID``), and the gateway answering as every partition's
leader and only replica and as the controller, so clients send records and
admin requests to the gateway they were given (AdminClient sends CreateTopics
to the controller) and group requests to the group's coordinator. Topic ids (Metadata v10+)
are a UUID derived from the topic's name and incarnation, so a topic deleted
and created again under its name has a new id, as in Kafka. Topics are never
created implicitly (``allow_auto_topic_creation`` is ignored): an unknown
topic is ``UNKNOWN_TOPIC_OR_PARTITION``.

CreateTopics maps ``num_partitions`` (-1: 1) and ``replication_factor`` (-1: 1)
and these configs onto the topic's settings: ``retention.ms``,
``retention.bytes``, ``segment.bytes``, ``segment.ms``, ``min.insync.replicas``,
``cleanup.policy`` (``delete``/``compact``), ``max.message.bytes``; any other
config is refused with ``INVALID_CONFIG`` naming it, nothing created.
"""

from __future__ import annotations

import uuid
from typing import Any

from robustmq.errors import InvalidConfig, RobustMQError, TopicNotFound

from ._errors import kafka_error
from ._protocol import NO_THROTTLE, Api, ApiTable, ErrorCode, RequestHeader, make, response_module

__all__ = ["api_versions_response", "register", "topic_id"]

_TOPIC_IDS = uuid.UUID("5d1c8a52-8f0e-4c43-9a4f-6b0b1f7e2a10")
_CONFIGS = {
    "retention.ms": ("retention_ms", int),
    "retention.bytes": ("retention_bytes", int),
    "segment.bytes": ("segment_bytes_max", int),
    "segment.ms": ("roll_interval_ms", int),
    "min.insync.replicas": ("min_insync_replicas", int),
    "cleanup.policy": ("cleanup_policy", str),
    "max.message.bytes": ("max_batch_bytes", int),
}


def topic_id(name: str, incarnation: int) -> uuid.UUID:
    return uuid.uuid5(_TOPIC_IDS, f"{name}\x00{incarnation}")


def api_versions_response(table: ApiTable, version: int, error: ErrorCode = ErrorCode.none) -> Any:
    module = response_module(18, version)
    keys = tuple(
        make(module.ApiVersion, api_key=api.key, min_version=api.min_version, max_version=api.max_version)
        for api in sorted(table.values(), key=lambda api: api.key)
    )
    return make(module.ApiVersionsResponse, error_code=error, api_keys=keys, throttle_time=NO_THROTTLE)


async def _api_versions(connection: Any, header: RequestHeader, request: Any) -> Any:
    return api_versions_response(connection.gateway.table, header.api_version)


async def _metadata(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    client = connection.client
    own = gateway.peers.own.node_id
    module = response_module(3, header.api_version)
    wanted = request.topics
    if wanted is None or (header.api_version == 0 and not wanted):
        names = [topic.name for topic in await gateway.call(client.meta.list_topics)]
    else:
        names = [topic.name for topic in wanted]
    topics = []
    for name in names:
        try:
            client.metadata.invalidate(name)
            topic = await gateway.call(client.metadata.topic, name)
        except RobustMQError as error:
            code = (
                ErrorCode.unknown_topic_or_partition
                if isinstance(error, TopicNotFound)
                else kafka_error(error)
            )
            topics.append(make(module.MetadataResponseTopic, error_code=code, name=name, partitions=()))
            continue
        partitions = tuple(
            make(
                module.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=index,
                leader_id=own,
                leader_epoch=0,
                replica_nodes=(own,),
                isr_nodes=(own,),
                offline_replicas=(),
            )
            for index in range(int(topic.config.partitions))
        )
        topics.append(
            make(
                module.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=name,
                topic_id=topic_id(name, int(topic.incarnation)),
                is_internal=False,
                partitions=partitions,
            )
        )
    brokers = tuple(
        make(module.MetadataResponseBroker, node_id=b.node_id, host=b.host, port=b.port, rack=None)
        for b in gateway.peers.live()
    )
    return make(
        module.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=brokers,
        cluster_id=gateway.settings.cluster_id,
        controller_id=own,
        topics=tuple(topics),
    )


def _topic_settings(configs: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for config in configs or ():
        if config.name not in _CONFIGS:
            raise InvalidConfig(f"topic config {config.name} is not supported by RobustMQ", field=config.name)
        name, kind = _CONFIGS[config.name]
        try:
            settings[name] = kind(config.value)
        except (TypeError, ValueError):
            raise InvalidConfig(
                f"topic config {config.name}={config.value!r} is not valid", field=config.name
            ) from None
    return settings


async def _create_topics(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(19, header.api_version)
    results = []
    for topic in request.topics:
        partitions = int(topic.num_partitions) if topic.num_partitions > 0 else 1
        replication = int(topic.replication_factor) if topic.replication_factor > 0 else 1
        created = None
        try:
            if topic.assignments:
                raise InvalidConfig("manual replica assignments are not supported", field="assignments")
            settings = _topic_settings(topic.configs)
            if not request.validate_only:
                created = await gateway.call(
                    lambda t=topic, s=settings, p=partitions, r=replication: connection.client.create_topic(
                        t.name, p, replication_factor=r, **s
                    )
                )
            code, message = ErrorCode.none, None
        except RobustMQError as error:
            code, message = kafka_error(error), error.message
        results.append(
            make(
                module.CreatableTopicResult,
                name=topic.name,
                topic_id=topic_id(topic.name, int(created.incarnation)) if created is not None else None,
                error_code=code,
                error_message=message,
                num_partitions=partitions if code == ErrorCode.none else -1,
                replication_factor=replication if code == ErrorCode.none else -1,
                configs=(),
            )
        )
    return make(module.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


async def _delete_topics(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(20, header.api_version)
    results = []
    names = list(getattr(request, "topic_names", ()) or ())
    names += [topic.name for topic in getattr(request, "topics", ()) or () if topic.name]
    for name in names:
        try:
            await gateway.call(connection.client.delete_topic, name)
            code, message = ErrorCode.none, None
        except RobustMQError as error:
            code, message = kafka_error(error), error.message
        results.append(make(module.DeletableTopicResult, name=name, error_code=code, error_message=message))
    return make(module.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))


def register(table: ApiTable) -> None:
    table.add(Api(18, 0, 3, _api_versions))
    table.add(Api(3, 1, 12, _metadata))
    table.add(Api(19, 2, 7, _create_topics))
    table.add(Api(20, 1, 5, _delete_topics))

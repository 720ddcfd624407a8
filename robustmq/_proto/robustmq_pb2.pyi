from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SegmentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVE: _ClassVar[SegmentState]
    SEALED: _ClassVar[SegmentState]
    TIERED: _ClassVar[SegmentState]
    REMOTE: _ClassVar[SegmentState]

class Acks(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACKS_LEADER: _ClassVar[Acks]
    ACKS_ALL: _ClassVar[Acks]
    ACKS_QUORUM: _ClassVar[Acks]
ACTIVE: SegmentState
SEALED: SegmentState
TIERED: SegmentState
REMOTE: SegmentState
ACKS_LEADER: Acks
ACKS_ALL: Acks
ACKS_QUORUM: Acks

class ErrorInfo(_message.Message):
    __slots__ = ("code", "message", "fields_json")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_JSON_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    fields_json: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., fields_json: _Optional[str] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("partitions", "engine", "replication_factor", "segment_bytes_max", "roll_interval_ms", "retention_bytes", "retention_ms", "cleanup_policy", "max_batch_bytes", "retention_records", "min_insync_replicas", "local_retention_ms", "local_retention_bytes")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    ROLL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    partitions: int
    engine: str
    replication_factor: int
    segment_bytes_max: int
    roll_interval_ms: int
    retention_bytes: int
    retention_ms: int
    cleanup_policy: str
    max_batch_bytes: int
    retention_records: int
    min_insync_replicas: int
    local_retention_ms: int
    local_retention_bytes: int
    def __init__(self, partitions: _Optional[int] = ..., engine: _Optional[str] = ..., replication_factor: _Optional[int] = ..., segment_bytes_max: _Optional[int] = ..., roll_interval_ms: _Optional[int] = ..., retention_bytes: _Optional[int] = ..., retention_ms: _Optional[int] = ..., cleanup_policy: _Optional[str] = ..., max_batch_bytes: _Optional[int] = ..., retention_records: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ..., local_retention_ms: _Optional[int] = ..., local_retention_bytes: _Optional[int] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("name", "config", "created_ms", "incarnation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: TopicConfig
    created_ms: int
    incarnation: int
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ..., created_ms: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("shard", "epoch", "start_offset", "end_offset", "state", "replicas", "leader", "isr", "crc32c", "size_bytes", "sealed_seq", "sealed_ms", "object_url", "object_bytes", "max_timestamp_ms", "isr_version")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEALED_SEQ_FIELD_NUMBER: _ClassVar[int]
    SEALED_MS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_URL_FIELD_NUMBER: _ClassVar[int]
    OBJECT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    ISR_VERSION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    epoch: int
    start_offset: int
    end_offset: int
    state: SegmentState
    replicas: _containers.RepeatedScalarFieldContainer[str]
    leader: str
    isr: _containers.RepeatedScalarFieldContainer[str]
    crc32c: int
    size_bytes: int
    sealed_seq: int
    sealed_ms: int
    object_url: str
    object_bytes: int
    max_timestamp_ms: int
    isr_version: int
    def __init__(self, shard: _Optional[str] = ..., epoch: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., state: _Optional[_Union[SegmentState, str]] = ..., replicas: _Optional[_Iterable[str]] = ..., leader: _Optional[str] = ..., isr: _Optional[_Iterable[str]] = ..., crc32c: _Optional[int] = ..., size_bytes: _Optional[int] = ..., sealed_seq: _Optional[int] = ..., sealed_ms: _Optional[int] = ..., object_url: _Optional[str] = ..., object_bytes: _Optional[int] = ..., max_timestamp_ms: _Optional[int] = ..., isr_version: _Optional[int] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("topic", "partition", "shard", "segments", "leader_address", "high_watermark", "incarnation", "reserved_offset", "log_start_offset", "first_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RESERVED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FIRST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    shard: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    leader_address: str
    high_watermark: int
    incarnation: int
    reserved_offset: int
    log_start_offset: int
    first_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., shard: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., leader_address: _Optional[str] = ..., high_watermark: _Optional[int] = ..., incarnation: _Optional[int] = ..., reserved_offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., first_epoch: _Optional[int] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "address", "registered_ms", "last_heartbeat_ms", "alive", "active_segments", "draining", "replica_segments", "stored_bytes", "session", "curve_key", "token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CURVE_KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    registered_ms: int
    last_heartbeat_ms: int
    alive: bool
    active_segments: int
    draining: bool
    replica_segments: int
    stored_bytes: int
    session: int
    curve_key: bytes
    token: SessionToken
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., registered_ms: _Optional[int] = ..., last_heartbeat_ms: _Optional[int] = ..., alive: _Optional[bool] = ..., active_segments: _Optional[int] = ..., draining: _Optional[bool] = ..., replica_segments: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., session: _Optional[int] = ..., curve_key: _Optional[bytes] = ..., token: _Optional[_Union[SessionToken, _Mapping]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: TopicConfig
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class TopicRequest(_message.Message):
    __slots__ = ("name", "tail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    tail: int
    def __init__(self, name: _Optional[str] = ..., tail: _Optional[int] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name", "incarnation", "record_only")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RECORD_ONLY_FIELD_NUMBER: _ClassVar[int]
    name: str
    incarnation: int
    record_only: bool
    def __init__(self, name: _Optional[str] = ..., incarnation: _Optional[int] = ..., record_only: _Optional[bool] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("incarnation", "complete", "waiting_for")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    complete: bool
    waiting_for: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, incarnation: _Optional[int] = ..., complete: _Optional[bool] = ..., waiting_for: _Optional[_Iterable[str]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("page_token", "limit")
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    page_token: str
    limit: int
    def __init__(self, page_token: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics", "next_page_token")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[Topic]
    next_page_token: str
    def __init__(self, topics: _Optional[_Iterable[_Union[Topic, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AlterTopicRequest(_message.Message):
    __slots__ = ("name", "config", "set")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: TopicConfig
    set: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ..., set: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicDescription(_message.Message):
    __slots__ = ("topic", "shards")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ...) -> None: ...

class ShardRequest(_message.Message):
    __slots__ = ("shard", "tail", "offset")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    shard: str
    tail: int
    offset: int
    def __init__(self, shard: _Optional[str] = ..., tail: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "address", "curve_key")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CURVE_KEY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    curve_key: bytes
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., curve_key: _Optional[bytes] = ...) -> None: ...

class ShardProgress(_message.Message):
    __slots__ = ("shard", "high_watermark", "log_start_offset", "reserved_offset", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RESERVED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    high_watermark: int
    log_start_offset: int
    reserved_offset: int
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., reserved_offset: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ShardDeletion(_message.Message):
    __slots__ = ("shard", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "address", "progress", "shard_count", "deleted", "stored_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    progress: _containers.RepeatedCompositeFieldContainer[ShardProgress]
    shard_count: int
    deleted: _containers.RepeatedCompositeFieldContainer[ShardDeletion]
    stored_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., progress: _Optional[_Iterable[_Union[ShardProgress, _Mapping]]] = ..., shard_count: _Optional[int] = ..., deleted: _Optional[_Iterable[_Union[ShardDeletion, _Mapping]]] = ..., stored_bytes: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("interval_ms", "deletions", "assignments_version", "lease_ms", "token", "acl_version")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    DELETIONS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    deletions: _containers.RepeatedCompositeFieldContainer[ShardDeletion]
    assignments_version: int
    lease_ms: int
    token: SessionToken
    acl_version: int
    def __init__(self, interval_ms: _Optional[int] = ..., deletions: _Optional[_Iterable[_Union[ShardDeletion, _Mapping]]] = ..., assignments_version: _Optional[int] = ..., lease_ms: _Optional[int] = ..., token: _Optional[_Union[SessionToken, _Mapping]] = ..., acl_version: _Optional[int] = ...) -> None: ...

class ClusterConfig(_message.Message):
    __slots__ = ("tier_url",)
    TIER_URL_FIELD_NUMBER: _ClassVar[int]
    tier_url: str
    def __init__(self, tier_url: _Optional[str] = ...) -> None: ...

class ListSealedRequest(_message.Message):
    __slots__ = ("after_seq", "limit", "untiered_only")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    UNTIERED_ONLY_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    limit: int
    untiered_only: bool
    def __init__(self, after_seq: _Optional[int] = ..., limit: _Optional[int] = ..., untiered_only: _Optional[bool] = ...) -> None: ...

class SealedSegment(_message.Message):
    __slots__ = ("topic", "partition", "incarnation", "segment")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    incarnation: int
    segment: Segment
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., incarnation: _Optional[int] = ..., segment: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class ListSealedResponse(_message.Message):
    __slots__ = ("segments", "last_seq")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SealedSegment]
    last_seq: int
    def __init__(self, segments: _Optional[_Iterable[_Union[SealedSegment, _Mapping]]] = ..., last_seq: _Optional[int] = ...) -> None: ...

class MarkTieredRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "epoch", "object_url", "object_bytes", "max_timestamp_ms")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OBJECT_URL_FIELD_NUMBER: _ClassVar[int]
    OBJECT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    epoch: int
    object_url: str
    object_bytes: int
    max_timestamp_ms: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ..., object_url: _Optional[str] = ..., object_bytes: _Optional[int] = ..., max_timestamp_ms: _Optional[int] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class SealSegmentRequest(_message.Message):
    __slots__ = ("shard", "epoch", "end_offset", "node_id", "incarnation", "isr", "crc32c", "size_bytes")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    shard: str
    epoch: int
    end_offset: int
    node_id: str
    incarnation: int
    isr: _containers.RepeatedScalarFieldContainer[str]
    crc32c: int
    size_bytes: int
    def __init__(self, shard: _Optional[str] = ..., epoch: _Optional[int] = ..., end_offset: _Optional[int] = ..., node_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., isr: _Optional[_Iterable[str]] = ..., crc32c: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class SealSegmentResponse(_message.Message):
    __slots__ = ("sealed", "next")
    SEALED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    sealed: Segment
    next: Segment
    def __init__(self, sealed: _Optional[_Union[Segment, _Mapping]] = ..., next: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic", "offsets")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    offsets: _containers.ScalarMap[int, int]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class GroupTopicRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class PartitionLag(_message.Message):
    __slots__ = ("topic", "partition", "committed", "high_watermark", "lag", "commit_time_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    committed: int
    high_watermark: int
    lag: int
    commit_time_ms: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., committed: _Optional[int] = ..., high_watermark: _Optional[int] = ..., lag: _Optional[int] = ..., commit_time_ms: _Optional[int] = ...) -> None: ...

class FetchOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.ScalarMap[int, int]
    def __init__(self, offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class GroupLagResponse(_message.Message):
    __slots__ = ("group", "partitions")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionLag]
    def __init__(self, group: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionLag, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("page_token", "limit")
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    page_token: str
    limit: int
    def __init__(self, page_token: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups", "next_page_token")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, groups: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("offsets_removed",)
    OFFSETS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    offsets_removed: int
    def __init__(self, offsets_removed: _Optional[int] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("node_id", "force")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    force: bool
    def __init__(self, node_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("node", "led_shards")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    led_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ..., led_shards: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateIsrRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "epoch", "node_id", "isr", "expected_isr", "expected_isr_version", "node_session")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ISR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ISR_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_SESSION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    epoch: int
    node_id: str
    isr: _containers.RepeatedScalarFieldContainer[str]
    expected_isr: _containers.RepeatedScalarFieldContainer[str]
    expected_isr_version: int
    node_session: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ..., node_id: _Optional[str] = ..., isr: _Optional[_Iterable[str]] = ..., expected_isr: _Optional[_Iterable[str]] = ..., expected_isr_version: _Optional[int] = ..., node_session: _Optional[int] = ...) -> None: ...

class ReportReplicaRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "epoch", "node_id", "crc32c", "size_bytes")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    epoch: int
    node_id: str
    crc32c: int
    size_bytes: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ..., node_id: _Optional[str] = ..., crc32c: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class NodeIdRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class AssignmentsResponse(_message.Message):
    __slots__ = ("shards", "assignments_version")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    assignments_version: int
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ..., assignments_version: _Optional[int] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "undrain")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    undrain: bool
    def __init__(self, node_id: _Optional[str] = ..., undrain: _Optional[bool] = ...) -> None: ...

class SessionClaims(_message.Message):
    __slots__ = ("principal", "curve_key", "expires_ms", "credential_version", "producer_id", "issued_ms", "certificate_sha256")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    CURVE_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_MS_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    principal: str
    curve_key: bytes
    expires_ms: int
    credential_version: int
    producer_id: int
    issued_ms: int
    certificate_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, principal: _Optional[str] = ..., curve_key: _Optional[bytes] = ..., expires_ms: _Optional[int] = ..., credential_version: _Optional[int] = ..., producer_id: _Optional[int] = ..., issued_ms: _Optional[int] = ..., certificate_sha256: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SessionToken(_message.Message):
    __slots__ = ("claims", "signature")
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    claims: bytes
    signature: bytes
    def __init__(self, claims: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class SecurityInfo(_message.Message):
    __slots__ = ("enabled", "token_public_key", "acl_version", "super_users")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUPER_USERS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    token_public_key: bytes
    acl_version: int
    super_users: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, enabled: _Optional[bool] = ..., token_public_key: _Optional[bytes] = ..., acl_version: _Optional[int] = ..., super_users: _Optional[_Iterable[str]] = ...) -> None: ...

class ScramStartRequest(_message.Message):
    __slots__ = ("user", "client_first", "mechanism")
    USER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIRST_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    user: str
    client_first: str
    mechanism: str
    def __init__(self, user: _Optional[str] = ..., client_first: _Optional[str] = ..., mechanism: _Optional[str] = ...) -> None: ...

class ScramStartResponse(_message.Message):
    __slots__ = ("exchange_id", "server_first")
    EXCHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIRST_FIELD_NUMBER: _ClassVar[int]
    exchange_id: str
    server_first: str
    def __init__(self, exchange_id: _Optional[str] = ..., server_first: _Optional[str] = ...) -> None: ...

class ScramFinishRequest(_message.Message):
    __slots__ = ("exchange_id", "client_final", "curve_key")
    EXCHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FINAL_FIELD_NUMBER: _ClassVar[int]
    CURVE_KEY_FIELD_NUMBER: _ClassVar[int]
    exchange_id: str
    client_final: str
    curve_key: bytes
    def __init__(self, exchange_id: _Optional[str] = ..., client_final: _Optional[str] = ..., curve_key: _Optional[bytes] = ...) -> None: ...

class ScramFinishResponse(_message.Message):
    __slots__ = ("server_final", "token")
    SERVER_FINAL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    server_final: str
    token: SessionToken
    def __init__(self, server_final: _Optional[str] = ..., token: _Optional[_Union[SessionToken, _Mapping]] = ...) -> None: ...

class IssueTokenRequest(_message.Message):
    __slots__ = ("curve_key", "producer_id", "producer_token")
    CURVE_KEY_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    curve_key: bytes
    producer_id: int
    producer_token: bytes
    def __init__(self, curve_key: _Optional[bytes] = ..., producer_id: _Optional[int] = ..., producer_token: _Optional[bytes] = ...) -> None: ...

class CreateUserRequest(_message.Message):
    __slots__ = ("user", "mechanism", "salt", "iterations", "stored_key", "server_key", "replace", "stored_key_sha512", "server_key_sha512")
    USER_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    STORED_KEY_FIELD_NUMBER: _ClassVar[int]
    SERVER_KEY_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    STORED_KEY_SHA512_FIELD_NUMBER: _ClassVar[int]
    SERVER_KEY_SHA512_FIELD_NUMBER: _ClassVar[int]
    user: str
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    replace: bool
    stored_key_sha512: bytes
    server_key_sha512: bytes
    def __init__(self, user: _Optional[str] = ..., mechanism: _Optional[str] = ..., salt: _Optional[bytes] = ..., iterations: _Optional[int] = ..., stored_key: _Optional[bytes] = ..., server_key: _Optional[bytes] = ..., replace: _Optional[bool] = ..., stored_key_sha512: _Optional[bytes] = ..., server_key_sha512: _Optional[bytes] = ...) -> None: ...

class DeleteUserRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: str
    def __init__(self, user: _Optional[str] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ("user", "mechanism", "iterations", "credential_version")
    USER_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    user: str
    mechanism: str
    iterations: int
    credential_version: int
    def __init__(self, user: _Optional[str] = ..., mechanism: _Optional[str] = ..., iterations: _Optional[int] = ..., credential_version: _Optional[int] = ...) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserInfo]
    def __init__(self, users: _Optional[_Iterable[_Union[UserInfo, _Mapping]]] = ...) -> None: ...

class AclBinding(_message.Message):
    __slots__ = ("principal", "resource_type", "resource_name", "pattern", "operation", "permission")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    principal: str
    resource_type: str
    resource_name: str
    pattern: str
    operation: str
    permission: str
    def __init__(self, principal: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_name: _Optional[str] = ..., pattern: _Optional[str] = ..., operation: _Optional[str] = ..., permission: _Optional[str] = ...) -> None: ...

class AuthorizeRequest(_message.Message):
    __slots__ = ("operation", "resource_type", "resource_names")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAMES_FIELD_NUMBER: _ClassVar[int]
    operation: str
    resource_type: str
    resource_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, operation: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_names: _Optional[_Iterable[str]] = ...) -> None: ...

class AuthorizeResponse(_message.Message):
    __slots__ = ("allowed", "acl_version")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    allowed: _containers.RepeatedScalarFieldContainer[bool]
    acl_version: int
    def __init__(self, allowed: _Optional[_Iterable[bool]] = ..., acl_version: _Optional[int] = ...) -> None: ...

class DeleteAclResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("principal", "resource_type", "resource_name")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    principal: str
    resource_type: str
    resource_name: str
    def __init__(self, principal: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_name: _Optional[str] = ...) -> None: ...

class ListAclsResponse(_message.Message):
    __slots__ = ("acls", "acl_version", "users", "super_users", "last_credential_version", "revoked_certificates")
    ACLS_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    SUPER_USERS_FIELD_NUMBER: _ClassVar[int]
    LAST_CREDENTIAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REVOKED_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    acl_version: int
    users: _containers.RepeatedCompositeFieldContainer[UserInfo]
    super_users: _containers.RepeatedScalarFieldContainer[str]
    last_credential_version: int
    revoked_certificates: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ..., acl_version: _Optional[int] = ..., users: _Optional[_Iterable[_Union[UserInfo, _Mapping]]] = ..., super_users: _Optional[_Iterable[str]] = ..., last_credential_version: _Optional[int] = ..., revoked_certificates: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Revocation(_message.Message):
    __slots__ = ("sha256", "principal", "serial", "not_after_ms", "revoked_ms", "revoked_by", "reason")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sha256: bytes
    principal: str
    serial: str
    not_after_ms: int
    revoked_ms: int
    revoked_by: str
    reason: str
    def __init__(self, sha256: _Optional[bytes] = ..., principal: _Optional[str] = ..., serial: _Optional[str] = ..., not_after_ms: _Optional[int] = ..., revoked_ms: _Optional[int] = ..., revoked_by: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeCertificateRequest(_message.Message):
    __slots__ = ("certificate_pem", "sha256", "reason")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: str
    sha256: bytes
    reason: str
    def __init__(self, certificate_pem: _Optional[str] = ..., sha256: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeCertificateResponse(_message.Message):
    __slots__ = ("revocation", "already")
    REVOCATION_FIELD_NUMBER: _ClassVar[int]
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    revocation: Revocation
    already: bool
    def __init__(self, revocation: _Optional[_Union[Revocation, _Mapping]] = ..., already: _Optional[bool] = ...) -> None: ...

class RevocationList(_message.Message):
    __slots__ = ("revocations",)
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    revocations: _containers.RepeatedCompositeFieldContainer[Revocation]
    def __init__(self, revocations: _Optional[_Iterable[_Union[Revocation, _Mapping]]] = ...) -> None: ...

class InitProducerIdRequest(_message.Message):
    __slots__ = ("curve_key", "transactional_id")
    CURVE_KEY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    curve_key: bytes
    transactional_id: str
    def __init__(self, curve_key: _Optional[bytes] = ..., transactional_id: _Optional[str] = ...) -> None: ...

class InitProducerIdResponse(_message.Message):
    __slots__ = ("producer_id", "token")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    token: SessionToken
    def __init__(self, producer_id: _Optional[int] = ..., token: _Optional[_Union[SessionToken, _Mapping]] = ...) -> None: ...

class QuotaEntry(_message.Message):
    __slots__ = ("principal", "produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    FETCH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    principal: str
    produce_bytes_per_s: int
    fetch_bytes_per_s: int
    requests_per_s: int
    def __init__(self, principal: _Optional[str] = ..., produce_bytes_per_s: _Optional[int] = ..., fetch_bytes_per_s: _Optional[int] = ..., requests_per_s: _Optional[int] = ...) -> None: ...

class DeleteQuotaRequest(_message.Message):
    __slots__ = ("principal",)
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    principal: str
    def __init__(self, principal: _Optional[str] = ...) -> None: ...

class DeleteQuotaResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListQuotasResponse(_message.Message):
    __slots__ = ("quotas", "acl_version")
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaEntry]
    acl_version: int
    def __init__(self, quotas: _Optional[_Iterable[_Union[QuotaEntry, _Mapping]]] = ..., acl_version: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("shard", "epoch", "acks", "producer_id", "producer_sequence", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    epoch: int
    acks: Acks
    producer_id: int
    producer_sequence: int
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., epoch: _Optional[int] = ..., acks: _Optional[_Union[Acks, str]] = ..., producer_id: _Optional[int] = ..., producer_sequence: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("shard", "offset", "max_bytes", "max_wait_ms", "max_records", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    offset: int
    max_bytes: int
    max_wait_ms: int
    max_records: int
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., max_records: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ReadByKeyRequest(_message.Message):
    __slots__ = ("shard", "key", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    key: bytes
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., key: _Optional[bytes] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ReadByTagRequest(_message.Message):
    __slots__ = ("shard", "tag", "start_offset", "max_records", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    tag: str
    start_offset: int
    max_records: int
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., tag: _Optional[str] = ..., start_offset: _Optional[int] = ..., max_records: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class OffsetForTimestampRequest(_message.Message):
    __slots__ = ("shard", "timestamp_ms", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    timestamp_ms: int
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("shards", "incarnations")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATIONS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedScalarFieldContainer[str]
    incarnations: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shards: _Optional[_Iterable[str]] = ..., incarnations: _Optional[_Iterable[int]] = ...) -> None: ...

class SealRequest(_message.Message):
    __slots__ = ("shard",)
    SHARD_FIELD_NUMBER: _ClassVar[int]
    shard: str
    def __init__(self, shard: _Optional[str] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("shard", "start_offset", "end_offset", "key", "tags", "min_timestamp_ms", "max_timestamp_ms", "max_records", "incarnation")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    MIN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    start_offset: int
    end_offset: int
    key: bytes
    tags: _containers.RepeatedScalarFieldContainer[str]
    min_timestamp_ms: int
    max_timestamp_ms: int
    max_records: int
    incarnation: int
    def __init__(self, shard: _Optional[str] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., key: _Optional[bytes] = ..., tags: _Optional[_Iterable[str]] = ..., min_timestamp_ms: _Optional[int] = ..., max_timestamp_ms: _Optional[int] = ..., max_records: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BeatRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaFetchRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "epoch", "offset", "node_id", "max_bytes", "max_wait_ms")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    epoch: int
    offset: int
    node_id: str
    max_bytes: int
    max_wait_ms: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ..., offset: _Optional[int] = ..., node_id: _Optional[str] = ..., max_bytes: _Optional[int] = ..., max_wait_ms: _Optional[int] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "epoch")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    epoch: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class ChecksumRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "start_offset", "end_offset")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    start_offset: int
    end_offset: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class ProducerSnapshotRequest(_message.Message):
    __slots__ = ("shard", "incarnation", "as_of_offset", "after_producer_id", "max_bytes")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AS_OF_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AFTER_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    shard: str
    incarnation: int
    as_of_offset: int
    after_producer_id: int
    max_bytes: int
    def __init__(self, shard: _Optional[str] = ..., incarnation: _Optional[int] = ..., as_of_offset: _Optional[int] = ..., after_producer_id: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ProducerWindow(_message.Message):
    __slots__ = ("producer_id", "entries")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    entries: bytes
    def __init__(self, producer_id: _Optional[int] = ..., entries: _Optional[bytes] = ...) -> None: ...

class ProducerSnapshotResponse(_message.Message):
    __slots__ = ("producers", "more", "last_producer_id", "log_end_offset")
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    LAST_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producers: _containers.RepeatedCompositeFieldContainer[ProducerWindow]
    more: bool
    last_producer_id: int
    log_end_offset: int
    def __init__(self, producers: _Optional[_Iterable[_Union[ProducerWindow, _Mapping]]] = ..., more: _Optional[bool] = ..., last_producer_id: _Optional[int] = ..., log_end_offset: _Optional[int] = ...) -> None: ...

class NodeRequest(_message.Message):
    __slots__ = ("correlation_id", "token", "timeout_ms", "produce", "fetch", "read_by_key", "read_by_tag", "offset_for_timestamp", "list_offsets", "seal", "status", "scan", "replica_fetch", "fence", "checksum", "producer_snapshot", "beat")
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    READ_BY_KEY_FIELD_NUMBER: _ClassVar[int]
    READ_BY_TAG_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FOR_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    LIST_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCAN_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FETCH_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    BEAT_FIELD_NUMBER: _ClassVar[int]
    correlation_id: int
    token: bytes
    timeout_ms: int
    produce: ProduceRequest
    fetch: FetchRequest
    read_by_key: ReadByKeyRequest
    read_by_tag: ReadByTagRequest
    offset_for_timestamp: OffsetForTimestampRequest
    list_offsets: ListOffsetsRequest
    seal: SealRequest
    status: StatusRequest
    scan: ScanRequest
    replica_fetch: ReplicaFetchRequest
    fence: FenceRequest
    checksum: ChecksumRequest
    producer_snapshot: ProducerSnapshotRequest
    beat: BeatRequest
    def __init__(self, correlation_id: _Optional[int] = ..., token: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., produce: _Optional[_Union[ProduceRequest, _Mapping]] = ..., fetch: _Optional[_Union[FetchRequest, _Mapping]] = ..., read_by_key: _Optional[_Union[ReadByKeyRequest, _Mapping]] = ..., read_by_tag: _Optional[_Union[ReadByTagRequest, _Mapping]] = ..., offset_for_timestamp: _Optional[_Union[OffsetForTimestampRequest, _Mapping]] = ..., list_offsets: _Optional[_Union[ListOffsetsRequest, _Mapping]] = ..., seal: _Optional[_Union[SealRequest, _Mapping]] = ..., status: _Optional[_Union[StatusRequest, _Mapping]] = ..., scan: _Optional[_Union[ScanRequest, _Mapping]] = ..., replica_fetch: _Optional[_Union[ReplicaFetchRequest, _Mapping]] = ..., fence: _Optional[_Union[FenceRequest, _Mapping]] = ..., checksum: _Optional[_Union[ChecksumRequest, _Mapping]] = ..., producer_snapshot: _Optional[_Union[ProducerSnapshotRequest, _Mapping]] = ..., beat: _Optional[_Union[BeatRequest, _Mapping]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("base_offset", "record_count", "duplicate", "high_watermark", "epoch", "throttle_ms")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_MS_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    record_count: int
    duplicate: bool
    high_watermark: int
    epoch: int
    throttle_ms: int
    def __init__(self, base_offset: _Optional[int] = ..., record_count: _Optional[int] = ..., duplicate: _Optional[bool] = ..., high_watermark: _Optional[int] = ..., epoch: _Optional[int] = ..., throttle_ms: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("start_offset", "next_offset", "high_watermark", "log_start_offset", "throttle_ms")
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_MS_FIELD_NUMBER: _ClassVar[int]
    start_offset: int
    next_offset: int
    high_watermark: int
    log_start_offset: int
    throttle_ms: int
    def __init__(self, start_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., throttle_ms: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("next_offset", "high_watermark", "scanned_records", "throttle_ms")
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SCANNED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_MS_FIELD_NUMBER: _ClassVar[int]
    next_offset: int
    high_watermark: int
    scanned_records: int
    throttle_ms: int
    def __init__(self, next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., scanned_records: _Optional[int] = ..., throttle_ms: _Optional[int] = ...) -> None: ...

class OffsetResponse(_message.Message):
    __slots__ = ("found", "offset")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    offset: int
    def __init__(self, found: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class ShardOffsetsInfo(_message.Message):
    __slots__ = ("shard", "log_start_offset", "high_watermark", "log_end_offset", "epoch")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    shard: str
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    epoch: int
    def __init__(self, shard: _Optional[str] = ..., log_start_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardOffsetsInfo]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardOffsetsInfo, _Mapping]]] = ...) -> None: ...

class SealResponse(_message.Message):
    __slots__ = ("sealed", "next")
    SEALED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    sealed: Segment
    next: Segment
    def __init__(self, sealed: _Optional[_Union[Segment, _Mapping]] = ..., next: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "shards", "uptime_ms", "queued_requests", "queued_bytes", "records_served", "records_scanned", "connections", "connections_refused", "answer_bytes_unsent", "requests_refused", "answers_lost")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SERVED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SCANNED_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_BYTES_UNSENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_LOST_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    shards: int
    uptime_ms: int
    queued_requests: int
    queued_bytes: int
    records_served: int
    records_scanned: int
    connections: int
    connections_refused: int
    answer_bytes_unsent: int
    requests_refused: int
    answers_lost: int
    def __init__(self, node_id: _Optional[str] = ..., shards: _Optional[int] = ..., uptime_ms: _Optional[int] = ..., queued_requests: _Optional[int] = ..., queued_bytes: _Optional[int] = ..., records_served: _Optional[int] = ..., records_scanned: _Optional[int] = ..., connections: _Optional[int] = ..., connections_refused: _Optional[int] = ..., answer_bytes_unsent: _Optional[int] = ..., requests_refused: _Optional[int] = ..., answers_lost: _Optional[int] = ...) -> None: ...

class ReplicaFetchResponse(_message.Message):
    __slots__ = ("start_offset", "next_offset", "high_watermark", "log_end_offset", "active_epoch", "segment_end")
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_END_FIELD_NUMBER: _ClassVar[int]
    start_offset: int
    next_offset: int
    high_watermark: int
    log_end_offset: int
    active_epoch: int
    segment_end: int
    def __init__(self, start_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., active_epoch: _Optional[int] = ..., segment_end: _Optional[int] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("log_end_offset", "segment_start")
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_START_FIELD_NUMBER: _ClassVar[int]
    log_end_offset: int
    segment_start: int
    def __init__(self, log_end_offset: _Optional[int] = ..., segment_start: _Optional[int] = ...) -> None: ...

class ChecksumResponse(_message.Message):
    __slots__ = ("crc32c", "size_bytes", "records")
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    crc32c: int
    size_bytes: int
    records: int
    def __init__(self, crc32c: _Optional[int] = ..., size_bytes: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...

class NodeResponse(_message.Message):
    __slots__ = ("correlation_id", "error", "produce", "fetch", "read", "offset", "list_offsets", "seal", "status", "replica_fetch", "fence", "checksum", "producer_snapshot", "beat")
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIST_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FETCH_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    BEAT_FIELD_NUMBER: _ClassVar[int]
    correlation_id: int
    error: ErrorInfo
    produce: ProduceResponse
    fetch: FetchResponse
    read: ReadResponse
    offset: OffsetResponse
    list_offsets: ListOffsetsResponse
    seal: SealResponse
    status: StatusResponse
    replica_fetch: ReplicaFetchResponse
    fence: FenceResponse
    checksum: ChecksumResponse
    producer_snapshot: ProducerSnapshotResponse
    beat: BeatResponse
    def __init__(self, correlation_id: _Optional[int] = ..., error: _Optional[_Union[ErrorInfo, _Mapping]] = ..., produce: _Optional[_Union[ProduceResponse, _Mapping]] = ..., fetch: _Optional[_Union[FetchResponse, _Mapping]] = ..., read: _Optional[_Union[ReadResponse, _Mapping]] = ..., offset: _Optional[_Union[OffsetResponse, _Mapping]] = ..., list_offsets: _Optional[_Union[ListOffsetsResponse, _Mapping]] = ..., seal: _Optional[_Union[SealResponse, _Mapping]] = ..., status: _Optional[_Union[StatusResponse, _Mapping]] = ..., replica_fetch: _Optional[_Union[ReplicaFetchResponse, _Mapping]] = ..., fence: _Optional[_Union[FenceResponse, _Mapping]] = ..., checksum: _Optional[_Union[ChecksumResponse, _Mapping]] = ..., producer_snapshot: _Optional[_Union[ProducerSnapshotResponse, _Mapping]] = ..., beat: _Optional[_Union[BeatResponse, _Mapping]] = ...) -> None: ...

"""The node's one place that asks the Meta Service about shards (the heartbeat aside).

The front end and the I/O workers never wait for the Meta Service: a request
that needs its answer is parked by the shard's I/O worker, which hands a
:class:`Job` to :class:`MetaControl`. A small pool of control threads
(default 2) runs each job against the Meta Service and posts a
:class:`MetaAnswer` back into that worker's queue, where it is handled in
queue order with the shard's writes. Jobs:

- ``lookup``: ``GetShard`` plus, the first time for a topic incarnation,
  ``DescribeTopic`` for its config (with ``tail = 1``: no whole chains;
  cached per topic and incarnation; an
  altered config replaces it, :meth:`MetaControl.take_configs`), to
  resolve a shard the node has not served since it started or to refresh it
  when a client names a newer epoch. Installing a memory-engine shard this
  node leads also reserves its first offsets (a ``Heartbeat`` report, see
  ``_shards``) before the answer goes back: up to three calls;
- ``probe``: ``GetShard`` just before a seal, so that a seal only pauses
  writes once the Meta Service is known to answer;
- ``seal``: ``SealSegment(epoch, end, incarnation)`` (for RF > 1 with the
  agreed ``isr``, ``crc32c`` and ``size_bytes``); the worker repeats the
  identical call until the answer is definite (the Meta Service makes an
  identical repeat idempotent, and refuses a seal of any other incarnation
  than the topic's current one);
- ``isr``: ``UpdateIsr`` of an active epoch this node leads (RF > 1);
- ``agree``: before an RF > 1 seal, ``Checksum(start, end)`` of the segment
  on this node (the engine) and on each ISR follower (``NodeCaller``, all at
  once, addresses from ``ListNodes``): the members whose length and CRC-32C
  equal the leader's are the sealed segment's ``isr``. Followers that do not
  answer are left out (they report the segment later, ``ReportReplica``).

Every job and answer names the topic incarnation it is about (-1: not known
yet, a lookup of a shard the node does not serve), so the worker drops an
answer about another incarnation than the shard it serves now: nothing of a
deleted topic can touch a re-created one. A deletion also cancels the probes
and seals of that incarnation still waiting here (:meth:`MetaControl.cancel`).

Bounded: at most ``max_jobs`` jobs wait (``submit`` returns False past that;
the worker answers ``Busy`` or retries later). When a call fails because the
Meta Service is unreachable, further calls fail fast with ``Unavailable`` for
:data:`UNREACHABLE_HOLD_S`, so a dead Meta Service costs one timeout per
window, not one per job. Each call's deadline is the control client's
``timeout_s`` (the node gives it a short one, ``control_timeout_s``), so a
job takes at most three times that.

Thread-safety: ``submit`` and ``cancel`` may be called from any thread;
answers are posted through the callable each job carries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import split_shard_name
from robustmq.errors import Busy, RequestTimeout, RobustMQError, Unavailable

from ._shards import RESERVE_RECORDS, ShardView, start_of

__all__ = ["UNREACHABLE_HOLD_S", "Agreement", "Job", "MetaAnswer", "MetaControl"]

log = logging.getLogger("robustmq.node")

UNREACHABLE_HOLD_S = 1.0
_CONFIGS = 4096  # topic configs cached (one per topic; a description can be large)


JobKind = Literal["lookup", "probe", "seal", "isr", "agree"]


@dataclass(frozen=True, slots=True)
class Agreement:
    """The replicas whose copy of ``[start, end)`` equals the leader's (it included), and its checksum.

    ``crc32c`` is None when the leader could not compute its own (then ``isr`` is the leader alone).
    """

    isr: tuple[str, ...]
    crc32c: int | None
    size_bytes: int


@dataclass(frozen=True, slots=True)
class MetaAnswer:
    """What a job found out, posted to the worker that asked (``kind`` to ``incarnation``: the job's)."""

    kind: JobKind
    shard: str
    epoch: int = -1
    end_offset: int = -1
    incarnation: int = -1
    view: ShardView | None = None  # lookup (with the config) and probe (config unset)
    sealed: pb.SealSegmentResponse | None = None
    error: RobustMQError | None = None
    segment: pb.Segment | None = None  # isr: the segment as recorded
    agreement: Agreement | None = None  # agree
    isr: tuple[str, ...] = ()  # isr: the proposal asked for, and the ISR (and version) it was based on
    expected_isr: tuple[str, ...] = ()
    expected_isr_version: int = -1


@dataclass(frozen=True, slots=True)
class Job:
    """One piece of work for the control threads; ``incarnation`` -1: not known (a first lookup)."""

    kind: JobKind
    shard: str
    deliver: Callable[[MetaAnswer], Any]
    epoch: int = -1
    end_offset: int = -1
    incarnation: int = -1
    install: bool = False  # a lookup for a shard the node will create if it holds it
    isr: tuple[str, ...] = ()  # isr: the new ISR; agree: the members to ask; seal: the agreed isr
    expected_isr: tuple[str, ...] = ()  # isr: the ISR the proposal is based on, and its version
    expected_isr_version: int = -1
    agreement: Agreement | None = None  # seal: what the replicas agreed on (RF 1: the size only)
    start_offset: int = -1  # agree: the segment's start
    engine: Any = None  # agree: the leader's engine and its name for the shard
    engine_shard: str = ""

    def answer(
        self,
        *,
        view: ShardView | None = None,
        sealed: pb.SealSegmentResponse | None = None,
        error: RobustMQError | None = None,
        segment: pb.Segment | None = None,
        agreement: Agreement | None = None,
    ) -> MetaAnswer:
        return MetaAnswer(
            self.kind,
            self.shard,
            self.epoch,
            self.end_offset,
            self.incarnation,
            view,
            sealed,
            error,
            segment,
            agreement,
            self.isr if self.kind == "isr" else (),
            self.expected_isr,
            self.expected_isr_version,
        )


class MetaControl:
    """Control threads running :class:`Job` s against the Meta Service; see the module docstring."""

    def __init__(
        self, meta: Any, node_id: str, *, threads: int = 2, max_jobs: int = 10_000, caller: Any = None
    ) -> None:
        self._meta = meta
        self._caller = caller  # a NodeCaller (agree jobs ask followers for checksums)
        self._node_id = node_id
        self.session = 0  # this process's registration (NodeInfo.session), set once registered
        self._max_jobs = max_jobs
        self._jobs: deque[Job | None] = deque()
        self._ready = threading.Condition()
        self._unreachable_until = 0.0
        self._configs: OrderedDict[str, tuple[int, pb.TopicConfig]] = OrderedDict()
        self._configs_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, name=f"rmq-control-{i}", daemon=True) for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the threads once the jobs before this call are done (or ``timeout_s``)."""
        with self._ready:
            self._jobs.extend([None] * len(self._threads))
            self._ready.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False if ``max_jobs`` are already waiting."""
        with self._ready:
            if len(self._jobs) >= self._max_jobs:
                return False
            self._jobs.append(job)
            self._ready.notify()
        return True

    def cancel(self, shard: str, incarnation: int) -> int:
        """Drop the probes and seals of ``shard`` up to ``incarnation`` still waiting (it was
        deleted); how many. One already running is refused by the Meta Service (its
        incarnation is not the topic's) and its answer is dropped by the worker."""
        with self._ready:
            kept = deque(
                job
                for job in self._jobs
                if job is None or job.kind == "lookup" or job.shard != shard or job.incarnation > incarnation
            )
            cancelled = len(self._jobs) - len(kept)
            self._jobs = kept
        return cancelled

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._ready.wait()
                job = self._jobs.popleft()
            if job is None:
                return
            try:
                answer = self._run(job)
            except Exception as error:  # a bug must not strand the worker's parked requests
                log.exception("control job %s for %s failed", job.kind, job.shard)
                answer = job.answer(error=Unavailable(f"control failed: {error}"))
            job.deliver(answer)

    def _run(self, job: Job) -> MetaAnswer:
        now = time.monotonic()
        if now < self._unreachable_until:
            error: RobustMQError = Unavailable(
                f"the Meta Service is unreachable; shard {job.shard} cannot be resolved now", shard=job.shard
            )
            return job.answer(error=error)
        if job.kind == "agree":  # node-to-node; the Meta Service only for addresses
            return job.answer(agreement=self._agree(job))
        try:
            if job.kind == "seal":
                agreed: dict[str, Any] = {}
                if job.agreement is not None:  # what the replicas agreed on (RF 1: the size only)
                    agreed = {
                        "isr": list(job.agreement.isr),
                        "crc32c": job.agreement.crc32c,
                        "size_bytes": job.agreement.size_bytes,
                    }
                sealed = self._meta.seal_segment(
                    job.shard, job.epoch, job.end_offset, self._node_id, incarnation=job.incarnation, **agreed
                )
                return job.answer(sealed=sealed)
            if job.kind == "isr":
                segment = self._meta.update_isr(
                    job.shard,
                    job.incarnation,
                    job.epoch,
                    self._node_id,
                    job.isr,
                    job.expected_isr,
                    expected_version=job.expected_isr_version if job.expected_isr_version >= 0 else None,
                    node_session=self.session,
                )
                return job.answer(segment=segment)
            info = self._meta.get_shard(job.shard)
            config = self._config(info) if job.kind == "lookup" else pb.TopicConfig()
            reserved = self._reserve(info) if job.install and config.engine == "memory" else -1
            return job.answer(view=ShardView(info, config, reserved))
        except RobustMQError as error:
            if isinstance(error, Unavailable | RequestTimeout | Busy) and "address" in error.fields:
                self._unreachable_until = time.monotonic() + UNREACHABLE_HOLD_S  # a transport failure
            return job.answer(error=error)

    def _agree(self, job: Job) -> Agreement:
        """Checksums of ``[start, end)`` here and on the followers in ``job.isr`` (module docstring)."""
        try:
            own = job.engine.checksum(job.engine_shard, job.start_offset, job.end_offset)
        except Exception as error:  # an engine without checksums, a damaged frame: the leader alone
            log.warning(
                "shard %s: no checksum of [%d, %d): %s", job.shard, job.start_offset, job.end_offset, error
            )
            return Agreement((self._node_id,), None, 0)
        agreeing = [self._node_id]
        followers = [member for member in job.isr if member != self._node_id]
        if followers and self._caller is not None:
            try:
                addresses = {node.node_id: node.address for node in self._meta.list_nodes()}
            except RobustMQError as error:
                log.warning(
                    "shard %s: no node addresses for the seal's checksums: %s", job.shard, error.message
                )
                addresses = {}
            ask = pb.ChecksumRequest(
                shard=job.shard,
                incarnation=max(job.incarnation, 0),
                start_offset=job.start_offset,
                end_offset=job.end_offset,
            )
            asked = {
                member: self._caller.request(addresses[member], "checksum", ask)
                for member in followers
                if addresses.get(member)
            }
            for member, future in asked.items():
                try:
                    theirs = future.result(self._caller.timeout_s + 5)[0].checksum
                except Exception as error:  # no answer, an error answer: not in the sealed isr
                    log.warning(
                        "shard %s: replica %s gave no checksum for the seal: %s", job.shard, member, error
                    )
                    continue
                if (theirs.crc32c, theirs.size_bytes) == (own.crc32c, own.size_bytes):
                    agreeing.append(member)
                else:
                    log.error(
                        "shard %s: replica %s holds a different copy of [%d, %d) (crc %08x, %d bytes; "
                        "the leader's crc %08x, %d bytes); it is left out of the sealed segment's isr",
                        job.shard,
                        member,
                        job.start_offset,
                        job.end_offset,
                        theirs.crc32c,
                        theirs.size_bytes,
                        own.crc32c,
                        own.size_bytes,
                    )
        return Agreement(tuple(agreeing), own.crc32c, own.size_bytes)

    def _reserve(self, info: pb.ShardInfo) -> int:
        """Reserve the first offsets of a memory-engine shard this node is about to create."""
        if info.segments[-1].leader != self._node_id:
            return -1
        start = start_of(info, self._node_id)
        reserved = start + RESERVE_RECORDS
        self._meta.heartbeat(
            self._node_id,
            "",
            [(info.shard, start, start)],
            reserved={info.shard: reserved},
            incarnations={info.shard: info.incarnation},
        )
        return reserved

    def take_configs(self, topics: Any) -> None:
        """Newer configs of cached topics (``ListTopics`` answers, after an ``AlterTopic``)."""
        with self._configs_lock:
            for topic in topics:
                cached = self._configs.get(topic.name)
                if cached is not None and cached[0] == topic.incarnation and cached[1] != topic.config:
                    config = pb.TopicConfig()
                    config.CopyFrom(topic.config)
                    self._configs[topic.name] = (topic.incarnation, config)

    def topic_config(self, info: pb.ShardInfo) -> pb.TopicConfig:
        """The topic's config at ``info``'s incarnation (cached; for the follower side's views)."""
        return self._config(info)

    def _config(self, info: pb.ShardInfo) -> pb.TopicConfig:
        """The topic's config at ``info``'s incarnation, asked once per topic and incarnation.

        Asked with ``tail = 1`` (each shard's active segment, not its whole chain), and copied
        out of the answer: a protobuf sub-message keeps its whole parent alive, and a
        description of a 1,000-partition topic is ~100 kB even so.
        """
        topic, _ = split_shard_name(info.shard)
        with self._configs_lock:
            cached = self._configs.get(topic)
        if cached is not None and cached[0] == info.incarnation:
            return cached[1]
        description = self._meta.describe_topic(topic, tail=1)
        if description.topic.incarnation != info.incarnation:  # deleted and re-created in between
            raise Unavailable(
                f"topic {topic} changed while shard {info.shard} was resolved", shard=info.shard
            )
        config = pb.TopicConfig()
        config.CopyFrom(description.topic.config)
        with self._configs_lock:
            self._configs[topic] = (info.incarnation, config)
            self._configs.move_to_end(topic)
            if len(self._configs) > _CONFIGS:
                self._configs.popitem(last=False)
        return config

"""Replication and segment life: what a node knows about each shard it serves, and how it
leads, follows, seals and fences the shard's segments.

- ``_shards``: the node's shard directory (resolution, incarnations, the chain view,
  the role and the leader's state of each shard);
- ``_control``: the control jobs, the node's one place that asks the Meta Service
  about shards (lookups, probes, seals, ISR changes, replica agreement);
- ``_replication``: the leader's state machine of one epoch (positions, ISR, high
  watermark, acks), pure: no sockets, no clocks;
- ``_leading``, ``_sealing``: the I/O worker's side of leading and sealing;
- ``_follower``, ``_replica_fetcher``, ``_follower_log``: the follower's side;
- ``_replica_serving``: what a node serves to other replicas (``ReplicaFetch``,
  ``Checksum``); ``_visibility``: what readers may see (below the high watermark);
- ``_fences``: the durable fences; ``_deadlines``: when a held request is answered.

May import: ``robustmq.storage_node.engine`` and the ``robustmq`` core. Not the node
process (``node/``), tiered reads, the Meta Service, the CLI or Spark, except for
types under ``TYPE_CHECKING``: the node's I/O workers and front end call in here.
"""

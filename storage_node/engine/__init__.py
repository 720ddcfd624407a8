"""Storage engines: one node's durable log of records on its own disk.

The :class:`StorageAdapter` interface, its three engines (``segment``,
``rocksdb``, ``memory``), their indexes (offset, time, key, tag), crash
recovery of segment files, the idempotent producers' windows, and the
:class:`StorageDriverManager` that picks a shard's engine. Byte formats are
in ``docs/format.md``.

May import: the ``robustmq`` core (records, frames, CRCs, errors). Nothing of
the node process, replication, tiered reads, the Meta Service, the CLI or
Spark: an engine knows nothing of who calls it.
"""

"""The storage node process: it wires the engines, replication and cold reads together.

The ZeroMQ front end and request routing (``_node``), the I/O workers that own
each shard's writes (``_io_worker``), the read handlers (``_reads``), long polls,
the negative cache of shards served elsewhere (``_not_here``), the heartbeat
to the Meta Service (``_heartbeat``) and the node's Prometheus metrics (``_metrics``).

May import every lower layer: ``robustmq.storage_node.engine``, ``.replication``,
``.tiered``, ``robustmq.tier`` and the ``robustmq`` core (the Meta Service's client
among it). Nothing imports it but the package's front (``robustmq.storage_node``)
and the CLI.
"""

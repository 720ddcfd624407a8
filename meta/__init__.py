"""The Meta Service: topics, segment chains, placement, node liveness, failover, group offsets.

A gRPC service (``MetaService`` in ``robustmq/_proto/robustmq.proto``, default
``127.0.0.1:7070``) over an embedded RocksDB store, or an etcd cluster shared by several
instances of which one leads (``--store etcd://...``), behind the :class:`MetaStore`
interface. Run it with ``robustmq meta`` (:func:`run_meta`) or in-process with
:class:`MetaServer`; talk to it with ``robustmq._meta_client.MetaClient``.
Record bytes never pass through it: it is asked where things are and told
what changed. Its Prometheus metrics (``--metrics-port``) are in ``_metrics``.
"""

from ._server import DEFAULT_META_PORT, MetaServer, run_meta
from ._store import MetaStore, RocksDBMetaStore

__all__ = ["DEFAULT_META_PORT", "MetaServer", "MetaStore", "RocksDBMetaStore", "run_meta"]

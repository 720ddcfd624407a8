"""Cold reads: serving offsets that live only in the object store, and dropping local copies.

Fetches and index lookups (by timestamp, key, tag) of tiered segments through a
bounded cache of row groups (``_cold_reads``, ``_cold_lookups``, ``_tier_cache``),
and the local retention that deletes a segment's local copy once it is tiered
(``_tier_retention``).

May import: ``robustmq.storage_node.engine``, ``robustmq.storage_node.replication``
(what readers may see), ``robustmq.tier`` (the object format and store) and the
``robustmq`` core. Not the node process (``node/``), except for types under
``TYPE_CHECKING``.
"""

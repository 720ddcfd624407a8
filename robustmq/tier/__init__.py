"""The tiered object format and the object store, shared by the nodes, the Meta Service,
the tiering job and the Spark source.

- ``_format``: one Parquet file per sealed segment, its metadata and checks;
- ``_store``: the object store behind a cluster's tier URL (``file://``, ``s3://``).

May import: the ``robustmq`` core (records, errors). Nothing of the servers, the
CLI or Spark, which all import it.
"""

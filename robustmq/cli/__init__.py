"""The ``robustmq`` command line: every subcommand, the demo and the embedded cluster.

- ``_main``: argument parsing and the one-line error rule (the console script
  ``robustmq`` is :func:`main`);
- ``_commands``, ``_produce``: the client commands (topics, produce, consume,
  groups, segments, nodes);
- ``_embedded``, ``_cluster``: ``robustmq server`` (one process) and ``robustmq
  cluster`` (a process per server);
- ``_demo``, ``_demo_tiering``, ``_demo_compaction``, ``_progress``: ``robustmq demo``;
- ``_doctor``: ``robustmq doctor`` (Spark's Python interpreter, Java, the Meta Service).

The top layer: it may import every other package (the client, the servers, the
Spark connector and the streaming jobs); none of them imports it.
"""

from robustmq.cli._main import OneLineArgumentParser, build_parser, main

__all__ = ["OneLineArgumentParser", "build_parser", "main"]

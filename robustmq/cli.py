"""The ``robustmq`` command line.

Common flags: ``--data-dir DIR``, ``--host`` (default 127.0.0.1),
``--meta-port`` (7070), ``--node-port`` (7101), ``--meta HOST:PORT`` (where a
client or a storage node finds the Meta Service; env ``ROBUSTMQ_META``).
Servers print ``ready`` on stdout once they accept requests and stop cleanly
on SIGTERM. Each subcommand's work lives in the module that owns it; this file
only parses arguments and turns RobustMQ errors into one-line messages.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

DEFAULT_META_PORT = 7070
DEFAULT_NODE_PORT = 7101


def _run_meta(args: argparse.Namespace) -> int:
    from robustmq.meta import run_meta

    return run_meta(data_dir=args.data_dir, host=args.host, port=args.meta_port)


def _run_node(args: argparse.Namespace) -> int:
    from robustmq.storage_node import run_storage_node

    return run_storage_node(
        data_dir=args.data_dir,
        host=args.host,
        port=args.node_port,
        meta_address=args.meta_address,
        io_workers=args.io_workers,
    )


def _run_server(args: argparse.Namespace) -> int:
    from robustmq._embedded import run_server

    return run_server(
        data_dir=args.data_dir, host=args.host, meta_port=args.meta_port, node_port=args.node_port
    )


def _client_command(name: str) -> object:
    def run(args: argparse.Namespace) -> int:
        from robustmq import _cli_client

        return int(getattr(_cli_client, name)(args))

    return run


def _demo(args: argparse.Namespace) -> int:
    from robustmq._demo import run_demo

    return run_demo(records=args.records, keep=args.keep)


def _common(parser: argparse.ArgumentParser, *, data_dir: str | None = None, meta: bool = True) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind or reach (default 127.0.0.1)")
    if meta:
        parser.add_argument(
            "--meta",
            default=None,
            metavar="HOST:PORT",
            help="the Meta Service (default $ROBUSTMQ_META or HOST:7070)",
        )
    if data_dir is not None:
        parser.add_argument("--data-dir", default=data_dir, help=f"where data lives (default {data_dir})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robustmq", description="RobustMQ-Py: a message log for Spark")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    server = commands.add_parser("server", help="run the Meta Service and one storage node")
    _common(server, data_dir="./robustmq-data", meta=False)
    server.add_argument("--meta-port", type=int, default=DEFAULT_META_PORT)
    server.add_argument("--node-port", type=int, default=DEFAULT_NODE_PORT)
    server.set_defaults(handler=_run_server)

    meta = commands.add_parser("meta", help="run the Meta Service")
    _common(meta, data_dir="./robustmq-data/meta", meta=False)
    meta.add_argument("--meta-port", type=int, default=DEFAULT_META_PORT)
    meta.set_defaults(handler=_run_meta)

    node = commands.add_parser("storage-node", help="run a storage node")
    _common(node, data_dir="./robustmq-data/node")
    node.add_argument("--node-port", type=int, default=DEFAULT_NODE_PORT)
    node.add_argument("--io-workers", type=int, default=None, help="I/O worker threads (default: CPU count)")
    node.set_defaults(handler=_run_node)

    topic = commands.add_parser("topic", help="create, list, describe or delete topics")
    actions = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=1)
    create.add_argument("--engine", choices=["segment", "rocksdb", "memory"], default="segment")
    create.add_argument("--segment-bytes", type=int, default=None)
    create.add_argument("--retention-ms", type=int, default=None)
    create.add_argument("--retention-bytes", type=int, default=None)
    create.add_argument("--cleanup", choices=["delete", "compact"], default=None)
    listing = actions.add_parser("list", help="list topics")
    describe = actions.add_parser("describe", help="partitions, leaders, offsets")
    describe.add_argument("name")
    describe.add_argument("--json", action="store_true")
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    for sub in (create, listing, describe, delete):
        _common(sub)
    topic.set_defaults(handler=_client_command("cmd_topic"))

    produce = commands.add_parser("produce", help="send lines (text or JSON) from stdin or a file")
    produce.add_argument("topic")
    produce.add_argument("--file", default="-", help="file to read (default stdin)")
    produce.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help='text: one value per line; json: {"value", "key", "tags", "headers", '
        '"timestamp", "partition"} per line',
    )
    produce.add_argument("--key-separator", default=None, help="text lines are KEY<sep>VALUE")
    produce.add_argument("--tag", action="append", default=None, help="tag every record (repeatable)")
    produce.add_argument("--acks", default="1", choices=["1", "all", "quorum"])
    _common(produce)
    produce.set_defaults(handler=_client_command("cmd_produce"))

    consume = commands.add_parser("consume", help="print records from an offset, a time or a group")
    consume.add_argument("topic")
    consume.add_argument("--from", dest="from_", default=None, metavar="earliest|latest|OFFSET")
    consume.add_argument("--from-timestamp", default=None, metavar="MS|ISO-8601")
    consume.add_argument("--group", default=None, help="start from and commit to this group's offsets")
    consume.add_argument("--partition", type=int, default=None)
    consume.add_argument("--max-records", type=int, default=None, help="exit after this many")
    consume.add_argument(
        "--idle-timeout-s", type=float, default=None, help="exit after this long without data"
    )
    consume.add_argument("--format", choices=["text", "json"], default="json")
    _common(consume)
    consume.set_defaults(handler=_client_command("cmd_consume"))

    groups = commands.add_parser("groups", help="consumer groups: committed offsets, high watermarks, lag")
    groups.add_argument("--group", default=None)
    groups.add_argument("--topic", default=None)
    groups.add_argument("--json", action="store_true")
    _common(groups)
    groups.set_defaults(handler=_client_command("cmd_groups"))

    segments = commands.add_parser("segments", help="a topic's segment chains")
    segments.add_argument("topic")
    _common(segments)
    segments.set_defaults(handler=_client_command("cmd_segments"))

    # Listed for --help; main() hands its arguments to the job's own parser.
    commands.add_parser("topic-to-delta", help="materialise topics into a Delta table (a Spark job)")

    demo = commands.add_parser("demo", help="run the end-to-end demo on an embedded node")
    demo.add_argument("--records", type=int, default=400_000, help="order events to produce")
    demo.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["topic-to-delta"]:  # the job has its own parser (and --help)
        from robustmq.streaming_jobs.topic_to_delta import main as job

        return job(arguments[1:])
    args = build_parser().parse_args(arguments)
    if hasattr(args, "meta"):
        port = DEFAULT_META_PORT
        args.meta_address = args.meta or os.environ.get("ROBUSTMQ_META") or f"{args.host}:{port}"
    from robustmq.errors import RobustMQError

    try:
        return int(args.handler(args) or 0)
    except RobustMQError as error:
        print(f"robustmq {args.command}: {error.message} [{error.code}]", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

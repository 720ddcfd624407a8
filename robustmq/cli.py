"""The ``robustmq`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from robustmq._storage_demo import run_storage_demo

    return run_storage_demo(records=args.records)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robustmq", description="RobustMQ-Py command line")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the end-to-end demo on an embedded node")
    demo.add_argument("--records", type=int, default=2_000_000, help="records to produce")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

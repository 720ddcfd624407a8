"""``robustmq quota set|list|remove``: per-principal quotas of the storage nodes.

Kafka's ``kafka-configs --entity-type users`` (``producer_byte_rate``,
``consumer_byte_rate``, ``request_percentage``) is the model (docs/operators.md, "Quotas")::

    robustmq quota set --principal user:etl --produce-bytes-per-s 2000000 --fetch-bytes-per-s 8000000
    robustmq quota set --principal '*' --requests-per-s 5000       # everyone without an entry
    robustmq quota set --principal anonymous --produce-bytes-per-s 1000000   # security off
    robustmq quota list [--json]
    robustmq quota remove --principal user:etl

``set`` replaces the principal's entry: a rate it does not name falls back to the ``*``
entry's, then to the node's ``--quota-...`` flag; 0 is no limit. An entry is checked here
before anything is sent (the Meta Service checks it again); a bad one is one line naming the
flag, exit 2, and nothing changes. The nodes apply a change with their next heartbeat.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from robustmq._client_quotas import MAX_RATE, RATE_NAMES, Quota, validated_quota
from robustmq._proto import robustmq_pb2 as pb

__all__ = ["add_quota_parser", "cmd_quota"]

_FLAG_OF = {name: "--" + name.replace("_", "-") for name in RATE_NAMES}


def _rate(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= MAX_RATE:
        raise argparse.ArgumentTypeError(f"must be from 0 (no limit) to {MAX_RATE:,}, got {value:,}")
    return value


def add_quota_parser(
    commands: argparse._SubParsersAction[Any], common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register ``quota`` and its actions; ``common`` adds the client flags (``--meta``...)."""
    quota = commands.add_parser("quota", help="set, list or remove per-principal quotas (throttling)")
    actions = quota.add_subparsers(dest="action", required=True, metavar="ACTION")
    setting = actions.add_parser("set", help="set a principal's quota entry (replaces its former one)")
    setting.add_argument(
        "--principal", required=True, help="user:NAME, 'anonymous' (security off) or '*' (the default)"
    )
    for name, flag in _FLAG_OF.items():
        setting.add_argument(flag, dest=name, type=_rate, default=None, metavar="N", help="0: no limit")
    common(setting)
    remove = actions.add_parser("remove", help="remove a principal's quota entry")
    remove.add_argument("--principal", required=True)
    common(remove)
    listing = actions.add_parser("list", help="list the quota entries")
    listing.add_argument("--json", action="store_true")
    common(listing)
    quota.set_defaults(handler=cmd_quota)


def _entry(args: argparse.Namespace) -> Quota:
    """The entry the flags name, validated here: a bad flag is an ``InvalidRequest`` naming it."""
    from robustmq.errors import InvalidRequest

    entry = pb.QuotaEntry(principal=args.principal)
    for name in RATE_NAMES:
        value = getattr(args, name)
        if value is not None:
            setattr(entry, name, value)
    if not any(entry.HasField(name) for name in RATE_NAMES):
        raise InvalidRequest(
            f"name at least one rate: {', '.join(_FLAG_OF.values())} (remove an entry with "
            "`robustmq quota remove`)"
        )
    try:
        return validated_quota(entry)
    except InvalidRequest as error:
        flag = _FLAG_OF.get(str(error.fields.get("field", "")), "--principal")
        raise InvalidRequest(f"{flag}: {error.message}", **error.fields) from None


def cmd_quota(args: argparse.Namespace) -> int:
    from robustmq._client import connect

    if args.action == "list":
        return _list(args)
    quota = _entry(args) if args.action == "set" else None  # bad input never reaches the cluster
    with connect(args.meta_address, timeout_s=args.timeout_s) as client:
        if quota is not None:
            client.meta.set_quota(quota.to_pb())
            print(f"set: {quota}")
        else:
            removed = client.meta.delete_quota(args.principal)
            print(f"{'removed' if removed else 'no quota entry for'}: {args.principal.strip()}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from robustmq._client import connect
    from robustmq.cli._commands import print_table

    with connect(args.meta_address, timeout_s=args.timeout_s) as client:
        answer = client.meta.list_quotas()
    entries = [validated_quota(entry) for entry in answer.quotas]
    if args.json:
        print(
            json.dumps(
                {
                    "acl_version": answer.acl_version,
                    "quotas": [
                        {"principal": quota.principal, **{name: getattr(quota, name) for name in RATE_NAMES}}
                        for quota in entries
                    ],
                }
            )
        )
    elif entries:
        rows = [
            [
                quota.principal,
                *("-" if (v := getattr(quota, name)) is None else str(v) for name in RATE_NAMES),
            ]
            for quota in entries
        ]
        print_table(["principal", *RATE_NAMES], rows)
    else:
        print("no quota entries: nodes apply their --quota-... flags (default: no limit)")
    return 0

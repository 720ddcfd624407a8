"""``robustmq acl add|list|remove``: the cluster's ACLs (docs/security.md, "Authorization").

Kafka's ``kafka-acls`` is the model::

    robustmq acl add --principal user:alice --topic orders --operation read
    robustmq acl add --principal user:etl --topic eu. --prefixed --operation write --operation describe
    robustmq acl add --principal '*' --topic secret --operation all --deny
    robustmq acl add --principal user:ops --cluster --operation alter
    robustmq acl add --principal user:etl --group etl --operation read
    robustmq acl list [--principal P] [--topic T | --group G | --cluster] [--json]
    robustmq acl remove --principal user:alice --topic orders --operation read

A binding is checked here before anything is sent (the Meta Service checks it again); a bad
one is one line naming the flag, exit 2, and nothing changes. ``add`` of an ACL that exists
and ``remove`` of one that does not change nothing and say so.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.security._acl import ALL_OPERATIONS, Acl, validated_acl

__all__ = ["add_acl_parser", "cmd_acl"]

_FLAGS = {
    "principal": "--principal",
    "resource_type": "--topic/--group/--cluster",
    "resource_name": "--topic/--group",
    "pattern": "--prefixed",
    "operation": "--operation",
    "permission": "--allow/--deny",
}


def add_acl_parser(
    commands: argparse._SubParsersAction[Any], common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register ``acl`` and its actions; ``common`` adds the client flags (``--meta``...)."""
    acl = commands.add_parser("acl", help="add, list or remove ACLs (who may do what)")
    actions = acl.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("add", "allow (or deny) an operation"), ("remove", "remove an ACL exactly as added")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--principal", required=True, help="user:NAME, node:NODE_ID or '*' (everyone)")
        _resource(action, required=True)
        action.add_argument(
            "--operation",
            action="append",
            required=True,
            choices=ALL_OPERATIONS,
            help="repeatable: read, write, create, delete, alter, describe or all",
        )
        action.add_argument("--prefixed", action="store_true", help="the topic or group name is a prefix")
        permission = action.add_mutually_exclusive_group()
        permission.add_argument("--allow", dest="permission", action="store_const", const="allow")
        permission.add_argument("--deny", dest="permission", action="store_const", const="deny")
        action.set_defaults(permission="allow")
        common(action)
    listing = actions.add_parser("list", help="list ACLs (all, or those of a principal or resource)")
    listing.add_argument("--principal", default="")
    _resource(listing, required=False)
    listing.add_argument("--json", action="store_true")
    common(listing)
    acl.set_defaults(handler=cmd_acl)


def _resource(parser: argparse.ArgumentParser, *, required: bool) -> None:
    resource = parser.add_mutually_exclusive_group(required=required)
    resource.add_argument("--topic", metavar="NAME", help="a topic, a prefix (--prefixed) or '*'")
    resource.add_argument("--group", metavar="NAME", help="a consumer group, a prefix or '*'")
    resource.add_argument("--cluster", action="store_true", help="the cluster (admin operations)")


def _resource_of(args: argparse.Namespace) -> tuple[str, str]:
    if args.topic is not None:
        return "topic", args.topic
    if args.group is not None:
        return "group", args.group
    return ("cluster", "cluster") if args.cluster else ("", "")


def _bindings(args: argparse.Namespace) -> list[Acl]:
    """The ACLs the flags name, validated here: a bad flag is an ``InvalidRequest`` naming it."""
    from robustmq.errors import InvalidRequest

    resource_type, resource_name = _resource_of(args)
    made = []
    for operation in dict.fromkeys(args.operation):
        binding = pb.AclBinding(
            principal=args.principal,
            resource_type=resource_type,
            resource_name=resource_name,
            pattern="prefixed" if args.prefixed else "literal",
            operation=operation,
            permission=args.permission,
        )
        try:
            made.append(validated_acl(binding))
        except InvalidRequest as error:
            flag = next((_FLAGS[name] for name in error.fields if name in _FLAGS), "")
            raise InvalidRequest(
                f"{flag}: {error.message}" if flag else error.message, **error.fields
            ) from None
    return made


def cmd_acl(args: argparse.Namespace) -> int:
    from robustmq._client import connect

    if args.action == "list":
        return _list(args)
    bindings = _bindings(args)  # before connecting: bad input never reaches the cluster
    with connect(args.meta_address, timeout_s=args.timeout_s) as client:
        for acl in bindings:
            if args.action == "add":
                present = client.meta.list_acls(acl.principal, acl.resource_type, acl.resource_name).acls
                client.meta.create_acl(acl.to_pb())
                known = any(validated_acl(other) == acl for other in present)
                print(f"{'already there' if known else 'added'}: {acl}")
            else:
                removed = client.meta.delete_acl(acl.to_pb())
                print(f"{'removed' if removed else 'no such ACL'}: {acl}")
    return 0


_KEYS = ["principal", "permission", "operation", "resource_type", "resource_name", "pattern"]


def _list(args: argparse.Namespace) -> int:
    from robustmq._client import connect
    from robustmq.cli._commands import print_table

    resource_type, resource_name = _resource_of(args)
    with connect(args.meta_address, timeout_s=args.timeout_s) as client:
        answer = client.meta.list_acls(args.principal, resource_type, resource_name)
    rows = [[getattr(acl, key) for key in _KEYS] for acl in answer.acls]
    if args.json:
        print(
            json.dumps(
                {
                    "acl_version": answer.acl_version,
                    "acls": [dict(zip(_KEYS, row, strict=True)) for row in rows],
                }
            )
        )
    elif rows:
        print_table(_KEYS, rows)
    else:
        print("no ACLs" + (" match" if args.principal or resource_type else ""))
    return 0

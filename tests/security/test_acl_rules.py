"""The rule tables: every MetaService RPC and NodeRequest body has a rule, and each rule holds.

Walks the protocol itself (the service descriptor, the ``NodeRequest.body`` oneof), so a new
RPC or body without a rule fails here. For each rule: no credential is refused (unless the
rule is unauthenticated), a principal without ACLs is refused, one with exactly the ACLs the
rule needs passes (and with any one of them missing is refused), node-only requests pass only
the node they name, meta-only ones only the Meta Service.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthenticationFailed, AuthorizationFailed
from robustmq.security._acl import (
    CLUSTER,
    META_RPC_RULES,
    NODE_REQUEST_RULES,
    Access,
    Acl,
    Authorizer,
    Rule,
    check_node_request,
    check_rpc,
)

SERVICE = pb.DESCRIPTOR.services_by_name["MetaService"]
BODIES = pb.NodeRequest.DESCRIPTOR.oneofs_by_name["body"].fields
_STRINGS = {
    "name": "orders",
    "topic": "orders",
    "shard": "orders_0",
    "group": "etl",
    "node_id": "n1",
}
BOB = "user:bob"


def _filled(message: Message) -> Message:
    """``message`` with every string field set as a real request would set it."""
    for field in message.DESCRIPTOR.fields:
        if field.type != FieldDescriptor.TYPE_STRING:
            continue
        if field.is_repeated:
            if field.name == "shards":
                getattr(message, field.name).extend(["orders_0", "audit_3"])
            continue
        setattr(message, field.name, _STRINGS.get(field.name, "x"))
    return message


def _rpc_request(method: str) -> Message:
    return _filled(getattr(pb, SERVICE.methods_by_name[method].input_type.name)())


def _node_request(body: str) -> pb.NodeRequest:
    field = pb.NodeRequest.DESCRIPTOR.fields_by_name[body]
    message = _filled(getattr(pb, field.message_type.name)())
    return pb.NodeRequest(correlation_id=1, **{body: message})


def _needed(rule: Rule, request: Any, principal: str) -> list[Acl]:
    """Exactly the ACLs ``rule`` needs for ``request``: one per (operation, resource)."""
    acls = []
    for need in rule.needs:
        names = ["orders"] if rule.any_resource else list(need.names(request))
        for name in names:
            acls.append(Acl(principal, need.resource_type, name, "literal", need.operation, "allow"))
    return acls


def _authorizer(acls: list[Acl]) -> Authorizer:
    authorizer = Authorizer()
    authorizer.update(acls, {}, version=1)
    return authorizer


def test_every_meta_rpc_has_exactly_one_rule() -> None:
    methods = set(SERVICE.methods_by_name)
    assert methods - set(META_RPC_RULES) == set(), "MetaService RPCs without an authorization rule"
    assert set(META_RPC_RULES) - methods == set(), "rules for RPCs the service does not have"


def test_every_node_request_body_has_exactly_one_rule() -> None:
    bodies = {field.name for field in BODIES}
    assert bodies - set(NODE_REQUEST_RULES) == set(), "NodeRequest bodies without an authorization rule"
    assert set(NODE_REQUEST_RULES) - bodies == set()


def test_a_method_or_body_without_a_rule_is_refused() -> None:
    with pytest.raises(AuthorizationFailed):
        check_rpc(_authorizer([]), "user:admin", "NoSuchRpc", pb.Empty())
    with pytest.raises(AuthorizationFailed):
        check_node_request(_authorizer([]), "meta", pb.NodeRequest(correlation_id=1))


def _cases() -> list[tuple[str, str, Rule]]:
    return [("rpc", name, rule) for name, rule in META_RPC_RULES.items()] + [
        ("node", name, rule) for name, rule in NODE_REQUEST_RULES.items()
    ]


def _checker(kind: str, name: str) -> tuple[Any, Any]:
    """(the body the rule reads, a function principal, authorizer -> None that checks)."""
    if kind == "rpc":
        request = _rpc_request(name)
        return request, lambda principal, authorizer: check_rpc(authorizer, principal, name, request)
    message = _node_request(name)
    return getattr(message, name), lambda principal, authorizer: check_node_request(
        authorizer, principal, message
    )


@pytest.mark.parametrize(("kind", "name", "rule"), _cases(), ids=lambda value: getattr(value, "value", value))
def test_each_rule_refuses_and_allows_whom_it_says(kind: str, name: str, rule: Rule) -> None:
    body, check = _checker(kind, name)
    nobody = _authorizer([])
    if rule.node_field is None:
        check("meta", nobody)  # the Meta Service passes every rule ...
    else:
        with pytest.raises(AuthenticationFailed):  # ... but never speaks in a node's name
            check("meta", nobody)
    if rule.access is Access.UNAUTHENTICATED:
        check(None, nobody)
        return
    with pytest.raises(AuthenticationFailed):
        check(None, nobody)
    if rule.access is Access.META_ONLY:
        for principal in ("node:n1", "user:admin", BOB):
            with pytest.raises(AuthenticationFailed):
                check(principal, nobody)
        return
    if rule.access is Access.NODE_ONLY:
        check("node:n1", nobody)
        for principal in ("user:admin", BOB):  # identity, not permission: a super user is no node
            with pytest.raises(AuthenticationFailed):
                check(principal, nobody)
        if rule.node_field is not None:
            with pytest.raises(AuthenticationFailed) as caught:
                check("node:n2", nobody)
            assert caught.value.reason == "not_this_node"
        return
    check("user:admin", nobody)  # a super user passes every ACL rule
    if rule.access is Access.AUTHENTICATED or rule.filtered:
        check(BOB, nobody)
        return
    assert rule.needs, f"{name}: an ACL rule needs something"
    with pytest.raises(AuthorizationFailed) as refused:
        check(BOB, nobody)
    assert refused.value.principal == BOB
    needed = _needed(rule, body, BOB)
    check(BOB, _authorizer(needed))
    for missing in range(len(needed)):
        with pytest.raises(AuthorizationFailed):
            check(BOB, _authorizer(needed[:missing] + needed[missing + 1 :]))
    if rule.nodes:
        check("node:n1", nobody)
    else:
        with pytest.raises(AuthorizationFailed):
            check("node:n1", nobody)  # a node is not an admin


def test_create_topic_is_allowed_by_create_on_the_cluster_too() -> None:
    request = pb.CreateTopicRequest(name="orders")
    cluster = Acl(BOB, "cluster", CLUSTER, "literal", "create", "allow")
    check_rpc(_authorizer([cluster]), BOB, "CreateTopic", request)


def test_init_producer_id_needs_write_on_some_topic_or_on_the_cluster() -> None:
    request = pb.InitProducerIdRequest()
    prefixed = Acl(BOB, "topic", "orders.", "prefixed", "write", "allow")
    check_rpc(_authorizer([prefixed]), BOB, "InitProducerId", request)
    check_rpc(
        _authorizer([Acl(BOB, "cluster", CLUSTER, "literal", "write", "allow")]),
        BOB,
        "InitProducerId",
        request,
    )
    reader = Acl(BOB, "topic", "*", "literal", "read", "allow")
    with pytest.raises(AuthorizationFailed):
        check_rpc(_authorizer([reader]), BOB, "InitProducerId", request)
    everywhere_denied = Acl(BOB, "topic", "*", "literal", "write", "deny")
    with pytest.raises(AuthorizationFailed):
        check_rpc(_authorizer([prefixed, everywhere_denied]), BOB, "InitProducerId", request)


def test_list_offsets_needs_every_topic_it_names() -> None:
    request = _node_request("list_offsets")
    only_orders = Acl(BOB, "topic", "orders", "literal", "describe", "allow")
    with pytest.raises(AuthorizationFailed) as caught:
        check_node_request(_authorizer([only_orders]), BOB, request)
    assert caught.value.resource_name == "audit"


def test_a_malformed_shard_name_is_an_invalid_request_not_a_pass() -> None:
    from robustmq.errors import InvalidRequest

    request = pb.NodeRequest(correlation_id=1, produce=pb.ProduceRequest(shard="no-partition"))
    with pytest.raises(InvalidRequest):
        check_node_request(_authorizer([Acl(BOB, "topic", "*", "literal", "all", "allow")]), BOB, request)


def test_docs_name_every_rule() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    missing = [name for name in [*META_RPC_RULES, *NODE_REQUEST_RULES] if f"`{name}`" not in text]
    assert missing == [], "docs/security.md, 'Which request needs what', lacks these"


def test_the_sealed_segment_reader_needs_read_on_the_topic_and_nothing_else() -> None:
    """The tiering job copies whole sealed segments with `replica_fetch` as the sealed-segment
    reader: a user with Read on the topic may; one without may not; a user may not fetch as a node."""
    from robustmq._node_protocol import SEALED_SEGMENT_READER
    from robustmq.security import Authorizer, check_node_request, validated_acl

    authorizer = Authorizer()
    grant = pb.AclBinding(
        principal="user:tier", resource_type="topic", resource_name="orders", operation="read"
    )
    authorizer.update([validated_acl(grant)], {}, 1)
    fetch = pb.NodeRequest(
        replica_fetch=pb.ReplicaFetchRequest(shard="orders_0", node_id=SEALED_SEGMENT_READER)
    )
    check_node_request(authorizer, "user:tier", fetch)
    with pytest.raises(AuthorizationFailed):
        check_node_request(authorizer, "user:other", fetch)
    as_node = pb.NodeRequest(replica_fetch=pb.ReplicaFetchRequest(shard="orders_0", node_id="n1"))
    with pytest.raises(AuthenticationFailed):
        check_node_request(authorizer, "user:tier", as_node)

"""The ACL model: validation, matching, deny wins, implied describe, super users, the cache."""

from __future__ import annotations

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import AuthorizationFailed, InvalidRequest
from robustmq.security._acl import Acl, Authorizer, validated_acl

ALICE = "user:alice"


def acl(
    principal: str,
    resource_type: str,
    name: str,
    operation: str,
    permission: str = "allow",
    *,
    prefixed: bool = False,
) -> Acl:
    return validated_acl(
        pb.AclBinding(
            principal=principal,
            resource_type=resource_type,
            resource_name=name,
            pattern="prefixed" if prefixed else "",
            operation=operation,
            permission=permission,
        )
    )


def authorizer(*acls: Acl, version: int = 1, **options: object) -> Authorizer:
    made = Authorizer(**options)  # type: ignore[arg-type]
    made.update(acls, {}, version)
    return made


def test_defaults_are_literal_and_allow_and_the_cluster_has_one_name() -> None:
    made = validated_acl(
        pb.AclBinding(principal=ALICE, resource_type="Topic", resource_name="orders", operation="READ")
    )
    assert (made.pattern, made.permission, made.resource_type, made.operation) == (
        "literal",
        "allow",
        "topic",
        "read",
    )
    assert acl(ALICE, "cluster", "", "alter").resource_name == "cluster"
    assert acl(ALICE, "cluster", "*", "alter").resource_name == "cluster"
    assert validated_acl(made.to_pb()) == made


@pytest.mark.parametrize(
    ("binding", "field"),
    [
        (
            pb.AclBinding(principal="alice", resource_type="topic", resource_name="t", operation="read"),
            "principal",
        ),
        (
            pb.AclBinding(principal="meta", resource_type="topic", resource_name="t", operation="read"),
            "principal",
        ),
        (
            pb.AclBinding(principal=ALICE, resource_type="table", resource_name="t", operation="read"),
            "resource_type",
        ),
        (
            pb.AclBinding(principal=ALICE, resource_type="topic", resource_name="t", operation="fly"),
            "operation",
        ),
        (
            pb.AclBinding(
                principal=ALICE,
                resource_type="topic",
                resource_name="t",
                operation="read",
                permission="maybe",
            ),
            "permission",
        ),
        (
            pb.AclBinding(
                principal=ALICE, resource_type="topic", resource_name="t", operation="read", pattern="regex"
            ),
            "pattern",
        ),
        (
            pb.AclBinding(principal=ALICE, resource_type="topic", resource_name="", operation="read"),
            "resource_name",
        ),
        (
            pb.AclBinding(principal=ALICE, resource_type="topic", resource_name="a b", operation="read"),
            "resource_name",
        ),
        (
            pb.AclBinding(
                principal=ALICE,
                resource_type="topic",
                resource_name="*",
                operation="read",
                pattern="prefixed",
            ),
            "resource_name",
        ),
        (
            pb.AclBinding(principal=ALICE, resource_type="group", resource_name="g\n", operation="read"),
            "resource_name",
        ),
        (
            pb.AclBinding(principal=ALICE, resource_type="cluster", resource_name="prod", operation="alter"),
            "resource_name",
        ),
    ],
)
def test_a_bad_binding_is_an_invalid_request_naming_the_field(binding: pb.AclBinding, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validated_acl(binding)
    assert field in caught.value.fields


def test_nothing_is_allowed_without_an_acl_but_super_users_and_meta_pass() -> None:
    empty = authorizer()
    assert not empty.authorize(ALICE, "read", "topic", "orders")
    assert empty.authorize("user:admin", "delete", "topic", "orders")
    assert empty.authorize("meta", "alter", "cluster", "cluster")
    assert authorizer(super_users=["user:root"]).authorize("user:root", "alter", "cluster", "cluster")
    assert not authorizer(super_users=["user:root"]).authorize("user:admin", "alter", "cluster", "cluster")


def test_literal_prefixed_and_star_resources_and_star_principals() -> None:
    made = authorizer(
        acl(ALICE, "topic", "orders", "read"),
        acl(ALICE, "topic", "eu.", "write", prefixed=True),
        acl("*", "group", "*", "read"),
    )
    assert made.authorize(ALICE, "read", "topic", "orders")
    assert not made.authorize(ALICE, "read", "topic", "orders2")
    assert made.authorize(ALICE, "write", "topic", "eu.orders")
    assert not made.authorize(ALICE, "write", "topic", "us.orders")
    assert not made.authorize(ALICE, "write", "topic", "eu")
    assert made.authorize("user:bob", "read", "group", "anything")
    assert not made.authorize("user:bob", "read", "topic", "orders")


def test_deny_wins_over_any_allow() -> None:
    made = authorizer(
        acl(ALICE, "topic", "*", "all"),
        acl("*", "topic", "secret.", "read", "deny", prefixed=True),
    )
    assert made.authorize(ALICE, "read", "topic", "orders")
    assert not made.authorize(ALICE, "read", "topic", "secret.salaries")
    assert made.authorize(ALICE, "write", "topic", "secret.salaries")  # only read is denied
    with pytest.raises(AuthorizationFailed) as caught:
        made.check(ALICE, "read", "topic", "secret.salaries")
    fields = caught.value.fields
    assert (fields["principal"], fields["operation"], fields["resource_type"], fields["resource_name"]) == (
        ALICE,
        "read",
        "topic",
        "secret.salaries",
    )
    assert "robustmq acl add" in caught.value.message
    assert not authorizer(
        acl(ALICE, "topic", "orders", "read"), acl(ALICE, "topic", "orders", "all", "deny")
    ).authorize(ALICE, "read", "topic", "orders")


def test_read_write_delete_alter_imply_describe_and_nothing_else() -> None:
    for operation in ("read", "write", "delete", "alter"):
        made = authorizer(acl(ALICE, "topic", "orders", operation))
        assert made.authorize(ALICE, "describe", "topic", "orders"), operation
    made = authorizer(acl(ALICE, "topic", "orders", "describe"), acl(ALICE, "topic", "orders", "create"))
    assert not made.authorize(ALICE, "read", "topic", "orders")
    assert not authorizer(acl(ALICE, "topic", "orders", "create")).authorize(
        ALICE, "describe", "topic", "orders"
    )
    # A deny of read denies read only: describe stays allowed.
    made = authorizer(acl(ALICE, "topic", "orders", "write"), acl(ALICE, "topic", "orders", "read", "deny"))
    assert made.authorize(ALICE, "describe", "topic", "orders")


def test_a_new_version_invalidates_cached_decisions() -> None:
    made = authorizer(acl(ALICE, "topic", "orders", "read"), version=1)
    assert made.authorize(ALICE, "read", "topic", "orders")  # cached now
    made.update([acl(ALICE, "topic", "orders", "read", "deny")], {}, 2)
    assert made.version == 2
    assert not made.authorize(ALICE, "read", "topic", "orders")
    made.update([], {"user:alice": 4}, 3)
    assert not made.authorize(ALICE, "read", "topic", "orders")
    assert made.credential_version(ALICE) == 4 and made.credential_version("user:bob") is None


def test_the_decision_cache_is_bounded() -> None:
    made = authorizer(acl(ALICE, "topic", "*", "read"), cache_entries=10)
    for index in range(1_000):
        assert made.authorize(ALICE, "read", "topic", f"t{index}")
    assert len(made._decisions) <= 10


def test_filter_names_keeps_what_the_principal_may_describe() -> None:
    made = authorizer(acl(ALICE, "topic", "eu.", "read", prefixed=True))
    assert made.filter_names(ALICE, "describe", "topic", ["eu.a", "us.b", "eu.c"]) == ["eu.a", "eu.c"]


def test_a_list_acls_answer_installs_acls_users_and_version() -> None:
    made = authorizer(acl(ALICE, "topic", "orders", "read"), version=1)
    answer = pb.ListAclsResponse(
        acls=[acl(ALICE, "topic", "orders", "read", "deny").to_pb()],
        acl_version=7,
        users=[pb.UserInfo(user="alice", credential_version=2)],
    )
    made.update_from(answer)
    assert made.version == 7 and made.credential_version(ALICE) == 2
    assert not made.authorize(ALICE, "read", "topic", "orders")

"""Authorization: ACL bindings, the :class:`Authorizer` that evaluates them, and the rule tables.

The model (Kafka's ``StandardAuthorizer`` is the anchor; docs/security.md, "Authorization")
-------------------------------------------------------------------------------------------
An :class:`Acl` says that a principal (``user:NAME``, ``node:NODE_ID``, or ``*`` for every
principal) may (``allow``) or may not (``deny``) do an operation (``read``, ``write``,
``create``, ``delete``, ``alter``, ``describe``, or ``all``) on a resource: a ``topic`` or a
``group`` named literally, by prefix (pattern ``prefixed``) or ``*`` (every one), or the one
``cluster`` (its name is always ``cluster``). A decision for (principal, operation, resource):

1. the Meta Service (``meta``) and every super user pass;
2. a matching ``deny`` refuses, whatever allows it (deny wins);
3. a matching ``allow`` of the operation or of ``all`` passes; ``describe`` is also allowed
   by an allow of ``read``, ``write``, ``delete`` or ``alter`` (as Kafka's implied Describe),
   never the other way round, and a deny of ``read`` does not deny ``describe``;
4. nothing matches: refused.

The rule tables
---------------
Every ``MetaService`` RPC (:data:`META_RPC_RULES`) and every ``NodeRequest`` body
(:data:`NODE_REQUEST_RULES`) has exactly one :class:`Rule`: who may call it at all
(:class:`Access`: unauthenticated, any authenticated principal, a storage node, the Meta
Service, or what the ACLs allow) and, for ACL rules, the (operation, resource) pairs it needs
with the resource names taken from the request. :func:`check_rpc` and
:func:`check_node_request` are the one place a request is judged; a method or body with no
rule is refused (and ``tests/security/test_acl_rules.py`` fails when one is added without a
rule). Identity is not authorization: a node-only request is refused to a super user, since
nobody but a node (or the Meta Service itself) may speak as one; where a request names the
node sending it (``node_id``), it must be the caller's own node id (``AuthenticationFailed``,
``reason="not_this_node"``).

Storage nodes (``node:`` principals) pass node-only rules and the rules marked
``nodes=True``: the reads a node makes of replicated data and metadata (topic and shard
metadata, node list, ACLs to cache), never an admin operation.

Thread safety: an :class:`Authorizer` may be shared by threads; :meth:`Authorizer.update`
replaces its whole state at once. Decisions are cached (at most ``cache_entries``, cleared
whenever a new version is installed), so a request costs one dict lookup once warm.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from robustmq._node_protocol import SEALED_SEGMENT_READER
from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import split_shard_name, validate_topic_name
from robustmq.errors import AuthenticationFailed, AuthorizationFailed, InvalidRequest, RobustMQError

from ._principal import META, node_id_of

__all__ = [
    "ALL_OPERATIONS",
    "CLUSTER",
    "DEFAULT_SUPER_USERS",
    "META_RPC_RULES",
    "NODE_REQUEST_RULES",
    "OPERATIONS",
    "PATTERNS",
    "PERMISSIONS",
    "RESOURCE_TYPES",
    "Access",
    "Acl",
    "Authorizer",
    "Need",
    "Rule",
    "acl_matches_filter",
    "check_node_access",
    "check_node_acls",
    "check_node_request",
    "check_rpc",
    "validated_acl",
]

OPERATIONS = ("read", "write", "create", "delete", "alter", "describe")
ALL_OPERATIONS = (*OPERATIONS, "all")
RESOURCE_TYPES = ("topic", "group", "cluster")
PATTERNS = ("literal", "prefixed")
PERMISSIONS = ("allow", "deny")
CLUSTER = "cluster"  # the name of the one cluster resource
DEFAULT_SUPER_USERS = ("user:admin",)
DEFAULT_CACHE_ENTRIES = 10_000
_IMPLY_DESCRIBE = frozenset({"read", "write", "delete", "alter"})
_PRINCIPAL = re.compile(r"(user|node):[A-Za-z0-9._@-]{1,128}")
_MAX_RESOURCE_CHARS = 255


# -- the model ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL binding, validated (:func:`validated_acl` makes them)."""

    principal: str
    resource_type: str
    resource_name: str
    pattern: str
    operation: str
    permission: str

    def to_pb(self) -> pb.AclBinding:
        return pb.AclBinding(
            principal=self.principal,
            resource_type=self.resource_type,
            resource_name=self.resource_name,
            pattern=self.pattern,
            operation=self.operation,
            permission=self.permission,
        )

    def matches_resource(self, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern == "prefixed":
            return name.startswith(self.resource_name)
        return self.resource_name in ("*", name)

    def matches_principal(self, principal: str) -> bool:
        return self.principal in ("*", principal)

    def __str__(self) -> str:
        pattern = " (prefixed)" if self.pattern == "prefixed" else ""
        return (
            f"{self.permission} {self.principal} {self.operation} "
            f"{self.resource_type} {self.resource_name}{pattern}"
        )


def _refuse(message: str, **fields: Any) -> InvalidRequest:
    return InvalidRequest(message, **fields)


def _one_of(field: str, value: str, allowed: Sequence[str]) -> str:
    value = value.strip().lower()
    if value not in allowed:
        raise _refuse(f"{field} {value[:40]!r} is not one of {', '.join(allowed)}", **{field: value[:40]})
    return value


def validated_acl(binding: pb.AclBinding) -> Acl:
    """``binding`` checked and normalized (defaults: pattern ``literal``, permission ``allow``).

    Raises :class:`~robustmq.errors.InvalidRequest` naming the bad field; nothing else.
    """
    principal = binding.principal.strip()
    if principal != "*" and not _PRINCIPAL.fullmatch(principal):
        raise _refuse(
            f"principal {principal[:80]!r} is not valid: use user:NAME, node:NODE_ID or * "
            "(NAME: 1-128 of letters, digits, '.', '_', '@', '-')",
            principal=principal[:80],
        )
    resource_type = _one_of("resource_type", binding.resource_type, RESOURCE_TYPES)
    pattern = _one_of("pattern", binding.pattern or "literal", PATTERNS)
    operation = _one_of("operation", binding.operation, ALL_OPERATIONS)
    permission = _one_of("permission", binding.permission or "allow", PERMISSIONS)
    name = binding.resource_name
    if resource_type == "cluster":
        if pattern != "literal":
            raise _refuse("the cluster is one resource: it cannot be named by a prefix", pattern=pattern)
        if name not in ("", "*", CLUSTER):
            raise _refuse(
                f"the cluster resource has no name to choose (got {name[:80]!r})", resource_name=name[:80]
            )
        name = CLUSTER
    elif name == "*":
        if pattern != "literal":
            raise _refuse("'*' already names every resource: it cannot be a prefix", resource_name=name)
    elif not name:
        raise _refuse(f"a {resource_type} ACL needs a resource name (or '*')", resource_name=name)
    elif resource_type == "topic":
        # A prefix is checked as a topic name would be: a prefix no topic can start with is a typo.
        try:
            validate_topic_name(name)
        except RobustMQError:
            raise _refuse(
                f"invalid topic name {name[:80]!r}: use 1-200 characters of A-Z a-z 0-9 . _ -",
                resource_name=name[:80],
            ) from None
    elif len(name) > _MAX_RESOURCE_CHARS or not name.isprintable():
        raise _refuse(
            f"invalid group name {name[:80]!r}: use 1-255 printable characters", resource_name=name[:80]
        )
    return Acl(principal, resource_type, name, pattern, operation, permission)


def acl_matches_filter(
    acl: Acl, principal: str = "", resource_type: str = "", resource_name: str = ""
) -> bool:
    """Whether ``acl`` is one a ``ListAcls`` filter selects ("" matches anything)."""
    return (
        (not principal or acl.principal == principal)
        and (not resource_type or acl.resource_type == resource_type)
        and (not resource_name or acl.resource_name == resource_name)
    )


class Authorizer:
    """Decides (principal, operation, resource) from a set of ACLs; see the module docstring.

    Parameters
    ----------
    super_users
        Principals that pass every ACL check (default ``user:admin``).
    cache_entries
        Decisions remembered (a bound on memory; the cache is cleared when full and on update).

    ``version`` is the ``acl_version`` of what :meth:`update` installed (0: nothing yet); the
    Meta Service bumps it with every ACL or user change and a node calls ``ListAcls`` when a
    heartbeat answer carries another. ``credential_version(user)`` is the user's current
    credential version (None: no such user), for refusing tokens of removed users or changed
    passwords.
    """

    def __init__(
        self, *, super_users: Iterable[str] = DEFAULT_SUPER_USERS, cache_entries: int = DEFAULT_CACHE_ENTRIES
    ) -> None:
        self.super_users = frozenset(super_users)
        self._cache_entries = max(1, cache_entries)
        self._lock = threading.Lock()
        self._by_type: dict[str, tuple[Acl, ...]] = {kind: () for kind in RESOURCE_TYPES}
        self._users: dict[str, int] = {}
        self._version = 0
        self._decisions: dict[tuple[str, str, str, str], bool] = {}

    @property
    def version(self) -> int:
        return self._version

    def update(self, acls: Iterable[Acl], users: Mapping[str, int], version: int) -> None:
        """Install a whole new state (every ACL, user -> credential version) at ``version``."""
        grouped: dict[str, list[Acl]] = {kind: [] for kind in RESOURCE_TYPES}
        for acl in acls:
            grouped[acl.resource_type].append(acl)
        with self._lock:
            self._by_type = {kind: tuple(items) for kind, items in grouped.items()}
            self._users = dict(users)
            self._version = version
            self._decisions = {}

    def update_from(self, answer: pb.ListAclsResponse) -> None:
        """Install what a ``ListAcls`` answer says (a node's cache; the Meta Service validated it)."""
        users = {
            user.user if user.user.startswith("user:") else f"user:{user.user}": user.credential_version
            for user in answer.users
        }
        self.update([validated_acl(binding) for binding in answer.acls], users, answer.acl_version)

    def acls(self) -> list[Acl]:
        with self._lock:
            return [acl for kind in RESOURCE_TYPES for acl in self._by_type[kind]]

    def credential_version(self, user: str) -> int | None:
        return self._users.get(user)

    def authorize(self, principal: str, operation: str, resource_type: str, resource_name: str) -> bool:
        """Whether ``principal`` may do ``operation`` on the resource (cached)."""
        if principal == META or principal in self.super_users:
            return True
        key = (principal, operation, resource_type, resource_name)
        with self._lock:
            decided = self._decisions.get(key)
            if decided is not None:
                return decided
            candidates = self._by_type.get(resource_type, ())
            version = self._version
        decided = _decide(candidates, principal, operation, resource_type, resource_name)
        with self._lock:
            if self._version == version:  # an update in between made this answer stale
                if len(self._decisions) >= self._cache_entries:
                    self._decisions.clear()
                self._decisions[key] = decided
        return decided

    def check(self, principal: str, operation: str, resource_type: str, resource_name: str) -> None:
        """:meth:`authorize`, raising :class:`~robustmq.errors.AuthorizationFailed` when refused."""
        if not self.authorize(principal, operation, resource_type, resource_name):
            raise _denied(principal, operation, resource_type, resource_name)

    def may_on_any(self, principal: str, operation: str, resource_type: str) -> bool:
        """Whether ``principal`` may do ``operation`` on at least some resource of the type.

        True when an allow ACL of the operation (or ``all``) on such a resource names the
        principal (or ``*``) and no deny of it covers every resource of the type (``*``).
        Not cached (InitProducerId asks once per producer).
        """
        if principal == META or principal in self.super_users:
            return True
        with self._lock:
            candidates = self._by_type.get(resource_type, ())
        mine = [acl for acl in candidates if acl.matches_principal(principal)]
        if any(
            acl.permission == "deny"
            and acl.operation in (operation, "all")
            and acl.pattern == "literal"
            and acl.resource_name == "*"
            for acl in mine
        ):
            return False
        return any(_allows(acl, operation) for acl in mine if acl.permission == "allow")

    def filter_names(
        self, principal: str, operation: str, resource_type: str, names: Iterable[str]
    ) -> list[str]:
        """The ``names`` ``principal`` may do ``operation`` on (ListTopics, ListGroups answers)."""
        return [name for name in names if self.authorize(principal, operation, resource_type, name)]


def _allows(acl: Acl, operation: str) -> bool:
    return acl.operation in (operation, "all") or (
        operation == "describe" and acl.operation in _IMPLY_DESCRIBE
    )


def _decide(
    candidates: Sequence[Acl], principal: str, operation: str, resource_type: str, resource_name: str
) -> bool:
    allowed = False
    for acl in candidates:
        if not (acl.matches_principal(principal) and acl.matches_resource(resource_type, resource_name)):
            continue
        if acl.permission == "deny":
            if acl.operation in (operation, "all"):
                return False
        elif not allowed and _allows(acl, operation):
            allowed = True
    return allowed


def _name_flag(resource_type: str, resource_name: str) -> str:
    return "" if resource_type == "cluster" else f" {resource_name}"


def _denied(principal: str, operation: str, resource_type: str, resource_name: str) -> AuthorizationFailed:
    return AuthorizationFailed(
        f"{principal} may not {operation} {resource_type} {resource_name!r}: no ACL allows it "
        f"(an operator grants it with `robustmq acl add --principal {principal} "
        f"--{resource_type}{_name_flag(resource_type, resource_name)} --operation {operation}`)",
        principal=principal,
        operation=operation,
        resource_type=resource_type,
        resource_name=resource_name,
    )


# -- the rule tables ----------------------------------------------------------------------


class Access(enum.Enum):
    """Who may call a request at all, before any ACL."""

    UNAUTHENTICATED = "unauthenticated"  # anyone, even without a credential
    AUTHENTICATED = "authenticated"  # any principal the cluster knows
    NODE_ONLY = "node-only"  # a storage node (node:ID) or the Meta Service
    META_ONLY = "meta-only"  # the Meta Service only
    ACL = "acl"  # what the ACLs allow (super users and meta pass)


Names = Callable[[Any], Sequence[str]]


@dataclass(frozen=True, slots=True)
class Need:
    """One (operation, resource) pair a request needs; ``names`` reads the resource names off it.

    ``or_cluster``: the same operation on the cluster also satisfies it (CreateTopic, as Kafka's
    Create on the cluster). An empty list of names needs nothing (``GroupLag`` of every topic).
    """

    operation: str
    resource_type: str
    names: Names
    or_cluster: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    """What one request needs. ``node_field``: the request field naming the sending node.

    ``filtered``: the call is open to any authenticated principal and its answer is cut to what
    ``needs`` allows per item (the handler calls :meth:`Authorizer.filter_names`).
    ``any_resource``: ``needs`` is satisfied by the operation on any resource of its type
    (:meth:`Authorizer.may_on_any`; InitProducerId).
    """

    access: Access
    needs: tuple[Need, ...] = ()
    nodes: bool = False
    node_field: str | None = None
    filtered: bool = False
    any_resource: bool = False
    note: str = ""


def _field(name: str) -> Names:
    return lambda request: [getattr(request, name)]


def _topic_of_shard(field: str) -> Names:
    def names(request: Any) -> list[str]:
        return [split_shard_name(getattr(request, field))[0]]

    return names


def _topics_of_shards(request: Any) -> list[str]:
    return sorted({split_shard_name(shard)[0] for shard in request.shards})


def _cluster(request: Any) -> list[str]:
    return [CLUSTER]


def _nonempty(field: str) -> Names:
    return lambda request: [value] if (value := getattr(request, field)) else []


def _acl_rule(*needs: Need, nodes: bool = False, note: str = "") -> Rule:
    return Rule(Access.ACL, needs, nodes=nodes, note=note)


def _node_rule(node_field: str | None = None, note: str = "") -> Rule:
    return Rule(Access.NODE_ONLY, node_field=node_field, note=note)


# A whole sealed segment copied by the tiering job (robustmq/_node_protocol.py): committed records.
SEALED_SEGMENT_READ_RULE = _acl_rule(
    Need("read", "topic", _topic_of_shard("shard")),
    note="`replica_fetch` as the sealed-segment reader (the tiering job): sealed epochs only",
)


def is_sealed_segment_read(principal: str | None, fetch: Any) -> bool:
    """A ``replica_fetch`` the tiering job sends: it names the sealed-segment reader, and its
    sender is no node (a node always fetches as itself)."""
    return fetch.node_id == SEALED_SEGMENT_READER and (principal is None or node_id_of(principal) is None)


_ALTER_CLUSTER = Need("alter", "cluster", _cluster)
_DESCRIBE_CLUSTER = Need("describe", "cluster", _cluster)

META_RPC_RULES: dict[str, Rule] = {
    "CreateTopic": _acl_rule(Need("create", "topic", _field("name"), or_cluster=True)),
    "ListTopics": Rule(
        Access.AUTHENTICATED,
        (Need("describe", "topic", lambda request: []),),
        nodes=True,
        filtered=True,
        note="answers only the topics the caller may describe",
    ),
    "DescribeTopic": _acl_rule(Need("describe", "topic", _field("name")), nodes=True),
    "DeleteTopic": _acl_rule(Need("delete", "topic", _field("name"))),
    "AlterTopic": _acl_rule(Need("alter", "topic", _field("name"))),
    "GetShard": _acl_rule(Need("describe", "topic", _topic_of_shard("shard")), nodes=True),
    "RegisterNode": _node_rule("node_id"),
    "Heartbeat": _node_rule("node_id"),
    "ListNodes": Rule(Access.AUTHENTICATED, nodes=True, note="clients need node addresses and keys"),
    "SealSegment": _node_rule(
        "node_id", note="the leader seals its own segment; an operator asks a node (body `seal`)"
    ),
    "CommitOffsets": _acl_rule(
        Need("read", "group", _field("group")), Need("read", "topic", _field("topic"))
    ),
    "FetchOffsets": _acl_rule(
        Need("describe", "group", _field("group")), Need("describe", "topic", _nonempty("topic"))
    ),
    "GroupLag": _acl_rule(
        Need("describe", "group", _field("group")), Need("describe", "topic", _nonempty("topic"))
    ),
    "ListGroups": Rule(
        Access.AUTHENTICATED,
        (Need("describe", "group", lambda request: []),),
        filtered=True,
        note="answers only the groups the caller may describe",
    ),
    "DeleteGroup": _acl_rule(Need("delete", "group", _field("group"))),
    "RemoveNode": _acl_rule(_ALTER_CLUSTER),
    "UpdateIsr": _node_rule("node_id"),
    "ReportReplica": _node_rule("node_id"),
    "ListAssignments": _node_rule("node_id"),
    "DrainNode": _acl_rule(_ALTER_CLUSTER),
    "GetClusterConfig": Rule(Access.AUTHENTICATED, nodes=True),
    "ListSealed": _acl_rule(_DESCRIBE_CLUSTER, note="the tiering job: segment metadata of every topic"),
    "MarkTiered": _acl_rule(_ALTER_CLUSTER, note="the tiering job changes a segment's state"),
    "ScramStart": Rule(Access.UNAUTHENTICATED),
    "ScramFinish": Rule(Access.UNAUTHENTICATED),
    "GetSecurityInfo": Rule(Access.UNAUTHENTICATED),
    "IssueToken": Rule(Access.AUTHENTICATED, nodes=True),
    "CreateUser": _acl_rule(_ALTER_CLUSTER),
    "DeleteUser": _acl_rule(_ALTER_CLUSTER),
    "ListUsers": _acl_rule(_DESCRIBE_CLUSTER),
    "CreateAcl": _acl_rule(_ALTER_CLUSTER),
    "DeleteAcl": _acl_rule(_ALTER_CLUSTER),
    "ListAcls": _acl_rule(_DESCRIBE_CLUSTER, nodes=True, note="nodes cache the ACLs"),
    "Authorize": Rule(
        Access.AUTHENTICATED, note="the caller's own permissions (a Kafka gateway's group checks)"
    ),
    "RevokeCertificate": _acl_rule(_ALTER_CLUSTER),
    "ListRevocations": _acl_rule(_DESCRIBE_CLUSTER),
    "SetQuota": _acl_rule(_ALTER_CLUSTER),
    "DeleteQuota": _acl_rule(_ALTER_CLUSTER),
    "ListQuotas": _acl_rule(_DESCRIBE_CLUSTER, nodes=True, note="nodes enforce the quotas"),
    "InitProducerId": Rule(
        Access.ACL,
        (Need("write", "topic", lambda request: [], or_cluster=True),),
        any_resource=True,
        note="write on any topic, or write on the cluster (Kafka's IdempotentWrite)",
    ),
}

NODE_REQUEST_RULES: dict[str, Rule] = {
    "produce": _acl_rule(Need("write", "topic", _topic_of_shard("shard"))),
    "fetch": _acl_rule(Need("read", "topic", _topic_of_shard("shard")), nodes=True),
    "read_by_key": _acl_rule(Need("read", "topic", _topic_of_shard("shard")), nodes=True),
    "read_by_tag": _acl_rule(Need("read", "topic", _topic_of_shard("shard")), nodes=True),
    "scan": _acl_rule(Need("read", "topic", _topic_of_shard("shard")), nodes=True),
    "offset_for_timestamp": _acl_rule(Need("describe", "topic", _topic_of_shard("shard")), nodes=True),
    "list_offsets": _acl_rule(Need("describe", "topic", _topics_of_shards), nodes=True),
    "seal": _acl_rule(Need("alter", "topic", _topic_of_shard("shard"))),
    "status": _acl_rule(_DESCRIBE_CLUSTER, nodes=True),
    "replica_fetch": _node_rule("node_id"),
    "fence": Rule(Access.META_ONLY),
    "checksum": _node_rule(),
    "producer_snapshot": _node_rule(),
    "beat": _node_rule(),
}


def _check_access(rule: Rule, principal: str | None, request: Any, what: str) -> bool:
    """Who may send ``request`` at all (``rule.access``, node binding); True when the ACLs must
    still decide, False when nothing more is needed. Raises ``AuthenticationFailed``."""
    if rule.access is Access.UNAUTHENTICATED:
        return False
    if principal is None:
        raise AuthenticationFailed(
            f"{what} needs a credential: log in (a user and password, or a client certificate)",
            reason="unauthenticated",
        )
    if principal == META and rule.node_field is None:
        return False  # the Meta Service may do anything, but never speak as a node (node_field)
    node_id = node_id_of(principal)
    if rule.access is Access.META_ONLY:
        raise AuthenticationFailed(
            f"{what} is the Meta Service's; {principal} may not send it", reason="not_meta"
        )
    if rule.access is Access.NODE_ONLY:
        if node_id is None:
            raise AuthenticationFailed(
                f"{what} is a storage node's request; {principal} is not a node", reason="not_a_node"
            )
        named = getattr(request, rule.node_field) if rule.node_field is not None else node_id
        if named != node_id:
            raise AuthenticationFailed(
                f"{what} names node {named[:80]!r} but comes from {principal}", reason="not_this_node"
            )
        return False
    return not (rule.access is Access.AUTHENTICATED or rule.filtered or (node_id is not None and rule.nodes))


def _check(rule: Rule, authorizer: Authorizer, principal: str | None, request: Any, what: str) -> None:
    if _check_access(rule, principal, request, what):
        assert principal is not None
        _check_needs(rule, authorizer, principal, request)


def _check_needs(rule: Rule, authorizer: Authorizer, principal: str, request: Any) -> None:
    """What the ACLs must allow for ``rule`` (after :func:`_check_access` said they decide)."""
    for need in rule.needs:
        if rule.any_resource:
            if not authorizer.may_on_any(principal, need.operation, need.resource_type) and not (
                need.or_cluster and authorizer.authorize(principal, need.operation, "cluster", CLUSTER)
            ):
                raise _denied(principal, need.operation, need.resource_type, "*")
            continue
        for name in need.names(request):
            if authorizer.authorize(principal, need.operation, need.resource_type, name):
                continue
            if need.or_cluster and authorizer.authorize(principal, need.operation, "cluster", CLUSTER):
                continue
            raise _denied(principal, need.operation, need.resource_type, name)


def check_rpc(authorizer: Authorizer, principal: str | None, method: str, request: Any) -> None:
    """Refuse the ``MetaService`` call ``method`` unless ``principal`` may make it (None: no credential).

    Raises :class:`~robustmq.errors.AuthenticationFailed` (no credential, not the node or
    service it must be) or :class:`~robustmq.errors.AuthorizationFailed` (the ACLs do not
    allow it); a method with no rule is refused. A filtered call passes here: its handler
    filters the answer with :meth:`Authorizer.filter_names`.
    """
    rule = META_RPC_RULES.get(method)
    if rule is None:
        raise AuthorizationFailed(
            f"{method} has no authorization rule: refused",
            principal=principal or "",
            operation=method,
            resource_type="",
            resource_name="",
        )
    _check(rule, authorizer, principal, request, method)


def _node_rule_of(principal: str | None, request: pb.NodeRequest) -> tuple[Rule, str]:
    kind = request.WhichOneof("body") or ""
    if kind == "replica_fetch" and is_sealed_segment_read(principal, request.replica_fetch):
        return SEALED_SEGMENT_READ_RULE, kind
    rule = NODE_REQUEST_RULES.get(kind)
    if rule is None:
        raise AuthorizationFailed(
            f"node request {kind!r} has no authorization rule: refused",
            principal=principal or "",
            operation=kind,
            resource_type="",
            resource_name="",
        )
    return rule, kind


def check_node_access(principal: str | None, request: pb.NodeRequest) -> bool:
    """Whether ``principal`` may send this node request's body at all, by its rule's access
    (node-only and Meta-only bodies, a node naming itself): raises ``AuthenticationFailed`` if
    not; returns True when the ACLs must still decide (:func:`check_node_request`)."""
    rule, kind = _node_rule_of(principal, request)
    return _check_access(rule, principal, getattr(request, kind), kind)


def check_node_acls(authorizer: Authorizer, principal: str, request: pb.NodeRequest) -> None:
    """The ACL part of :func:`check_node_request` alone, for a caller that has just had
    :func:`check_node_access` answer True for this request (the node's guard): the access
    checks are not made twice per request."""
    rule, kind = _node_rule_of(principal, request)
    _check_needs(rule, authorizer, principal, getattr(request, kind))


def check_node_request(authorizer: Authorizer, principal: str | None, request: pb.NodeRequest) -> None:
    """Refuse the node request unless ``principal`` may send its body (as :func:`check_rpc`).

    A produce's producer id is the guard's to check (against the token's claims). A
    ``replica_fetch`` as the sealed-segment reader (the tiering job) from a principal that is no
    node needs Read on the topic (:data:`SEALED_SEGMENT_READ_RULE`).
    """
    rule, kind = _node_rule_of(principal, request)
    _check(rule, authorizer, principal, getattr(request, kind), kind)

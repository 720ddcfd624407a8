"""Identity and authorization for a secured cluster: principals, session tokens, CURVE keys, ACLs
(docs/security.md)."""

from ._acl import (
    Acl,
    Authorizer,
    check_node_access,
    check_node_acls,
    check_node_request,
    check_rpc,
    validated_acl,
)
from ._curve import ClientSecurity, CurveKeyPair
from ._keybook import KeyBook, meta_lookup
from ._principal import META, node_id_of, node_principal, user_principal
from ._tokens import Claims, TokenSigner, TokenVerifier

__all__ = [
    "META",
    "Acl",
    "Authorizer",
    "Claims",
    "ClientSecurity",
    "CurveKeyPair",
    "KeyBook",
    "TokenSigner",
    "TokenVerifier",
    "check_node_access",
    "check_node_acls",
    "check_node_request",
    "check_rpc",
    "meta_lookup",
    "node_id_of",
    "node_principal",
    "user_principal",
    "validated_acl",
]

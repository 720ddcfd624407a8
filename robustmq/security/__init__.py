"""Identity for a secured cluster: principals, session tokens, CURVE keys (docs/security.md)."""

from ._curve import ClientSecurity, CurveKeyPair
from ._keybook import KeyBook, meta_lookup
from ._principal import META, node_id_of, node_principal, user_principal
from ._tokens import Claims, TokenSigner, TokenVerifier

__all__ = [
    "META",
    "Claims",
    "ClientSecurity",
    "CurveKeyPair",
    "KeyBook",
    "TokenSigner",
    "TokenVerifier",
    "meta_lookup",
    "node_id_of",
    "node_principal",
    "user_principal",
]

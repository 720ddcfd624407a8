"""Identity for a secured cluster: principals and session tokens (docs/security.md)."""

from ._principal import META, node_id_of, node_principal, user_principal
from ._tokens import Claims, TokenSigner, TokenVerifier

__all__ = [
    "META",
    "Claims",
    "TokenSigner",
    "TokenVerifier",
    "node_id_of",
    "node_principal",
    "user_principal",
]

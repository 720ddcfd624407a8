"""Login with a client certificate: a challenge signed with the certificate's key.

gRPC's Python server cannot ask for a client certificate without requiring one
(``require_client_auth=False`` does not request it at all), and password users
have none. So a certificate holder proves its identity the way a password user
does, in the same two RPCs, with ``mechanism`` :data:`MECHANISM`::

    ScramStart(user=PRINCIPAL, client_first=CERTIFICATE_PEM, mechanism="X509")
        -> exchange_id, server_first = base64(32 random bytes: the challenge)
    ScramFinish(exchange_id, client_final = base64(ECDSA signature), curve_key)
        -> a session token for the certificate's principal, bound to curve_key

The Meta Service checks that the certificate is valid now (one past its notAfter
or before its notBefore is refused saying so: ``certificate_expired``,
``certificate_not_yet_valid``), chains to the cluster CA and allows client
authentication, that none of the certificates presented is revoked (the
caller's check, ``meta/_revocations.py``), that its CN is the principal named, and
that the signature over ``CONTEXT || challenge || curve_key`` verifies with the
certificate's key. The challenge is fresh per exchange and used once, so a
signature is worth nothing later; binding ``curve_key`` keeps an eavesdropper
(who would first have to break TLS) from getting a token for its own key.
"""

from __future__ import annotations

import base64
import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from robustmq.errors import AuthenticationFailed

__all__ = ["MECHANISM", "CertificateAuthority", "sign_challenge"]

MECHANISM = "X509"
CONTEXT = b"robustmq x509 login v1\x00"
MAX_CERT_CHARS = 16_384
MAX_CHAIN = 8  # a leaf and its intermediates; their fingerprints go into the session token
# The Web PKI profile, except that a client certificate needs no subject alternative name: its
# identity is its CN (user certificates of `robustmq security add-user-cert` have none).
_LEAF_POLICY = ExtensionPolicy.webpki_defaults_ee().may_be_present(
    x509.SubjectAlternativeName, Criticality.AGNOSTIC, None
)


def _message(challenge: bytes, curve_key: bytes) -> bytes:
    return CONTEXT + challenge + curve_key


def sign_challenge(key: ec.EllipticCurvePrivateKey, server_first: str, curve_key: bytes) -> str:
    """The client's ``client_final``: its signature over the challenge and its CURVE key."""
    challenge = base64.b64decode(server_first)
    return base64.b64encode(key.sign(_message(challenge, curve_key), ec.ECDSA(hashes.SHA256()))).decode()


def _refused(message: str, reason: str = "bad_certificate") -> AuthenticationFailed:
    return AuthenticationFailed(message, reason=reason)


def _subject(certificate: x509.Certificate) -> str:
    names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    if not names:
        return "the client certificate"
    value = names[0].value
    return f"the certificate of {(value if isinstance(value, str) else value.decode())[:80]}"


def _check_validity(certificate: x509.Certificate, now: datetime.datetime) -> None:
    """Refuse a certificate outside its validity period, saying which end and when."""
    if now > certificate.not_valid_after_utc:
        raise _refused(
            f"{_subject(certificate)} expired on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: "
            "ask for a new one (robustmq security add-node / add-user-cert, or your CA)",
            reason="certificate_expired",
        )
    if now < certificate.not_valid_before_utc:
        raise _refused(
            f"{_subject(certificate)} is not valid before "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (is this machine's clock right?)",
            reason="certificate_not_yet_valid",
        )


class CertificateAuthority:
    """The Meta Service's check of client certificates against the cluster CA (``ca_pem``)."""

    def __init__(self, ca_pem: bytes) -> None:
        self._roots = x509.load_pem_x509_certificates(ca_pem)

    def chain_of(self, chain_pem: str) -> tuple[str, list[x509.Certificate]]:
        """The principal (CN) of a certificate chaining to the CA, and the certificates presented
        (leaf first); ``AuthenticationFailed`` saying why if it does not, or is not valid now."""
        if len(chain_pem) > MAX_CERT_CHARS:
            raise _refused("the client certificate is too large")
        try:
            chain = x509.load_pem_x509_certificates(chain_pem.encode())
        except ValueError:
            raise _refused("the client certificate is not a PEM certificate") from None
        if len(chain) > MAX_CHAIN:
            raise _refused(
                f"the client certificate chain has {len(chain)} certificates (at most {MAX_CHAIN})"
            )
        leaf, intermediates = chain[0], chain[1:]
        now = datetime.datetime.now(datetime.UTC)
        for certificate in chain:
            _check_validity(certificate, now)
        verifier = (
            PolicyBuilder()
            .store(Store(self._roots))
            .time(now)
            .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=_LEAF_POLICY)
            .build_client_verifier()
        )
        try:
            verifier.verify(leaf, intermediates)
        except VerificationError:
            raise _refused(
                "the client certificate is not signed by this cluster's CA (or not for client use)",
                reason="untrusted_certificate",
            ) from None
        names = leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        if not names:
            raise _refused("the client certificate has no common name: it names no principal")
        value = names[0].value
        return (value if isinstance(value, str) else value.decode()), chain

    @staticmethod
    def check_signature(
        leaf: x509.Certificate, challenge: bytes, curve_key: bytes, client_final: str
    ) -> None:
        key = leaf.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise _refused("the client certificate's key must be an EC key")
        try:
            signature = base64.b64decode(client_final, validate=True)
            key.verify(signature, _message(challenge, curve_key), ec.ECDSA(hashes.SHA256()))
        except (ValueError, InvalidSignature):
            raise _refused(
                "the certificate login's signature does not verify", reason="bad_signature"
            ) from None

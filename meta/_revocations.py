"""Revoked certificates, as stored (key ``F``), and the version nodes reload them by.

::

    key                      value
    "F" sha256(certificate)  Revocation (protobuf: fingerprint, principal, serial, notAfter,
                             when, by whom, why)
    "H"                      be64(revocation version): moves with every revocation

A certificate is named by the SHA-256 of its DER encoding (what ``openssl x509
-fingerprint -sha256`` prints): unambiguous across CAs, and known to every
holder of the certificate file. The Meta Service refuses an X509 login
presenting a revoked certificate anywhere in its chain, and every session token
issued for one (tokens of X509 logins carry the fingerprints of the chain they
were issued for, ``SessionClaims.certificate_sha256``). Nodes get the set in
``ListAcls`` answers (``revoked_certificates``) and reload it when the cluster's
``acl_version`` moves, which :attr:`RevocationTable.version` is part of.

Revocations are never removed by hand (an unrevoke would be a second way in).
At most :data:`MAX_REVOCATIONS`; past it, revocations of certificates that have
expired anyway (known ``not_after_ms`` in the past) are dropped in the same batch
as the new one, and if none has, the revocation is refused (``InvalidRequest``:
replace the CA). Everything is kept in memory too, so the check on every call is
one set look-up. Thread-safe: one lock around each change, whose batch is
durable before memory changes.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

from ._store import MetaStore, WriteSet

__all__ = ["MAX_REASON_CHARS", "MAX_REVOCATIONS", "RevocationTable", "describe", "fingerprint"]

REVOKED = b"F"
REVOCATION_VERSION_KEY = b"H"
MAX_REVOCATIONS = 10_000
MAX_REASON_CHARS = 200
MAX_CERT_CHARS = 16_384
SHA256_BYTES = 32


def fingerprint(certificate: x509.Certificate) -> bytes:
    """The SHA-256 of a certificate's DER encoding (its name in revocations and tokens)."""
    return certificate.fingerprint(hashes.SHA256())


def describe(revocation: pb.Revocation) -> str:
    """One line naming a revoked certificate, for errors and logs."""
    who = revocation.principal or "a certificate"
    when = datetime.datetime.fromtimestamp(revocation.revoked_ms / 1000, datetime.UTC)
    text = f"{who} (SHA-256 {revocation.sha256.hex()[:16]}...) was revoked on {when:%Y-%m-%d %H:%M} UTC"
    return text + (f" ({revocation.reason})" if revocation.reason else "")


def _revocation_of(request: pb.RevokeCertificateRequest, revoked_by: str) -> pb.Revocation:
    """The record a request asks for, validated (``InvalidRequest`` naming what is wrong)."""
    if len(request.reason) > MAX_REASON_CHARS or any(ord(c) < 32 for c in request.reason):
        raise InvalidRequest(
            f"the reason must be at most {MAX_REASON_CHARS} printable characters", field="reason"
        )
    record = pb.Revocation(revoked_ms=int(time.time() * 1000), revoked_by=revoked_by, reason=request.reason)
    if request.certificate_pem:
        if len(request.certificate_pem) > MAX_CERT_CHARS:
            raise InvalidRequest("the certificate is too large to be one", field="certificate_pem")
        try:
            certificate = x509.load_pem_x509_certificate(request.certificate_pem.encode())
        except ValueError:
            raise InvalidRequest(
                "certificate_pem is not a PEM certificate", field="certificate_pem"
            ) from None
        record.sha256 = fingerprint(certificate)
        if request.sha256 and request.sha256 != record.sha256:
            raise InvalidRequest("the fingerprint given is not the certificate's", field="sha256")
        names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        if names:
            value = names[0].value
            record.principal = (value if isinstance(value, str) else value.decode())[:200]
        record.serial = format(certificate.serial_number, "x")
        record.not_after_ms = int(certificate.not_valid_after_utc.timestamp() * 1000)
    elif len(request.sha256) == SHA256_BYTES:
        record.sha256 = request.sha256
    else:
        raise InvalidRequest(
            f"name the certificate: its PEM, or its SHA-256 fingerprint ({SHA256_BYTES} bytes, "
            f"got {len(request.sha256)})",
            field="sha256",
        )
    return record


class RevocationTable:
    """Revoked certificates in a :class:`MetaStore`; see the module docstring."""

    def __init__(self, store: MetaStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._revoked: dict[bytes, pb.Revocation] = {}
        for key, value in store.scan(REVOKED):
            self._revoked[key[1:]] = pb.Revocation.FromString(value)
        raw = store.get(REVOCATION_VERSION_KEY)
        self.version = 0 if raw is None else int.from_bytes(raw, "big")  # moves with every change

    def revoked(self, fingerprints: Iterable[bytes]) -> pb.Revocation | None:
        """The revocation of the first of ``fingerprints`` that is revoked, else None."""
        for sha256 in fingerprints:
            found = self._revoked.get(sha256)
            if found is not None:
                return found
        return None

    def fingerprints(self) -> list[bytes]:
        return sorted(self._revoked)

    def list(self) -> list[pb.Revocation]:
        """Every revocation, oldest first."""
        return sorted(self._revoked.values(), key=lambda record: (record.revoked_ms, record.sha256))

    def revoke(self, request: pb.RevokeCertificateRequest, revoked_by: str) -> tuple[pb.Revocation, bool]:
        """Revoke a certificate durably; (its revocation, whether it was revoked already)."""
        record = _revocation_of(request, revoked_by)
        with self._lock:
            known = self._revoked.get(record.sha256)
            if known is not None:
                return known, True
            ws = WriteSet()
            dropped: list[bytes] = []
            if len(self._revoked) >= MAX_REVOCATIONS:
                now_ms = int(time.time() * 1000)
                dropped = [sha256 for sha256, old in self._revoked.items() if 0 < old.not_after_ms < now_ms]
                if not dropped:
                    raise InvalidRequest(
                        f"{MAX_REVOCATIONS} certificates are revoked already and none has expired: "
                        "replace the cluster CA (docs/security.md, Rotation)",
                        limit=MAX_REVOCATIONS,
                    )
                for sha256 in dropped:
                    ws.delete(REVOKED + sha256)
            version = self.version + 1
            ws.put(REVOKED + record.sha256, record.SerializeToString())
            ws.put(REVOCATION_VERSION_KEY, version.to_bytes(8, "big"))
            ws.commit(self._store)
            for sha256 in dropped:
                del self._revoked[sha256]
            self._revoked[record.sha256] = record
            self.version = version
        return record, False

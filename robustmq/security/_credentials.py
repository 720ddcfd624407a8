"""Certificates for a secured cluster: ``robustmq security init|add-node|add-user-cert``, and loading them.

``init DIR`` writes a cluster CA and the first identities into ``DIR``::

    ca.pem, ca.key          the cluster CA (self-signed; keep ca.key offline once the
                            identities you need are issued)
    meta.pem, meta.key      the Meta Service: CN "meta", serverAuth + clientAuth, SAN
                            localhost, 127.0.0.1, ::1 and every --host given
    admin.pem, admin.key    CN "user:admin" (the default super user), clientAuth
    node-NAME.pem/.key      CN "node:NAME" per --node given, serverAuth + clientAuth

``add-node DIR NAME`` and ``add-user-cert DIR NAME`` issue more from the same CA;
:func:`add_etcd` issues ``etcd.pem``/``etcd.key`` (CN "etcd", serverAuth + clientAuth,
SAN loopback) for the etcd ``robustmq cluster --secure --store etcd`` starts, and
``etcd-client.pem``/``.key`` (no CN, clientAuth) that the Meta Services present to it
(etcd's JSON gateway refuses a client certificate with a CN under ``--client-cert-auth``).
Every key is EC P-256, every certificate lasts :data:`CERT_DAYS` days; keys are
written with mode 0600 and never overwritten (an existing file is an
``InvalidConfig``). The identity of a certificate is its subject common name
(:func:`certificate_principal`). An existing CA works the same: any certificate
whose CN is a principal and which chains to the ``--tls-ca`` given.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from robustmq.errors import InvalidConfig

from ._principal import META, node_principal, user_principal

__all__ = [
    "CERT_DAYS",
    "TlsFiles",
    "add_etcd",
    "add_node",
    "add_server_cert",
    "add_user_cert",
    "certificate_principal",
    "init_credentials",
    "read_certificate_file",
]

CERT_DAYS = 365
MAX_PEM_BYTES = 1 << 20  # a certificate chain or key file is a few KiB; refuse anything far larger


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM bytes of a TLS identity: the CA to trust, and optionally our own certificate and key.

    ``repr`` never shows the key.
    """

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    def __repr__(self) -> str:
        return f"TlsFiles(ca=<{len(self.ca)} bytes>, cert={'yes' if self.cert else 'no'}, key=<hidden>)"

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None) -> TlsFiles:
        """Read the PEM files; ``InvalidConfig`` naming the file that is missing or not PEM."""
        if (cert is None) != (key is None):
            raise InvalidConfig("a TLS certificate needs its key, and a key its certificate (give both)")
        return cls(
            ca=_read_pem(ca, "CERTIFICATE"),
            cert=None if cert is None else _read_pem(cert, "CERTIFICATE"),
            key=None if key is None else _read_pem(key, "PRIVATE KEY"),
        )

    @property
    def principal(self) -> str | None:
        """The principal of our certificate (its CN), None without one."""
        return None if self.cert is None else certificate_principal(self.cert)

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        if self.key is None:
            raise InvalidConfig("no TLS key was given")
        key = serialization.load_pem_private_key(self.key, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidConfig("the TLS key must be an EC key (P-256)")
        return key


def _read_pem(path: str | Path, kind: str) -> bytes:
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise InvalidConfig(f"cannot read {file}: {exc.strerror or exc}", path=str(file)) from exc
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data or kind.encode() not in data:
        raise InvalidConfig(f"{file} is not a PEM {kind.lower()} file", path=str(file))
    return data


def read_certificate_file(path: str | Path) -> str:
    """The first certificate of a PEM file (a chain's leaf), as PEM text; ``InvalidConfig`` naming
    the file if it holds none."""
    try:
        cert = x509.load_pem_x509_certificate(_read_pem(path, "CERTIFICATE"))
    except ValueError as exc:
        raise InvalidConfig(f"{path} is not a PEM certificate file", path=str(path)) from exc
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def certificate_principal(cert_pem: bytes) -> str:
    """The principal a certificate names: its subject's common name (``meta``, ``node:X``, ``user:X``)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise InvalidConfig("the TLS certificate is not a PEM certificate") from exc
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise InvalidConfig("the TLS certificate has no common name (CN): it names no principal")
    value = names[0].value
    return value if isinstance(value, str) else value.decode()


# -- issuing ---------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_new(path: Path, data: bytes, *, secret: bool) -> None:
    """Write a file that must not exist yet (keys 0600, from the first byte)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags, 0o600 if secret else 0o644)
    except FileExistsError:
        raise InvalidConfig(f"{path} exists already: not overwritten", path=str(path)) from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(_read_pem(directory / "ca.pem", "CERTIFICATE"))
    key = serialization.load_pem_private_key(_read_pem(directory / "ca.key", "PRIVATE KEY"), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidConfig(f"{directory / 'ca.key'} is not an EC key")
    return cert, key


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str | None,
    *,
    server: bool,
    hosts: Iterable[str] = (),
) -> tuple[bytes, bytes]:
    """A certificate (PEM) and its new key (PEM) for ``common_name`` (None: an empty subject, named
    by its ``hosts`` alone), signed by the CA."""
    key = _new_key()
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else [])
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    names = _subject_alt_names(hosts)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return _cert_pem(cert), _key_pem(key)


def _subject_alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _new_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "RobustMQ cluster CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_new(directory / "ca.key", _key_pem(key), secret=True)
    _write_new(directory / "ca.pem", _cert_pem(cert), secret=False)
    return cert, key


def _write_identity(directory: Path, stem: str, pair: tuple[bytes, bytes]) -> list[Path]:
    cert, key = pair
    _write_new(directory / f"{stem}.key", key, secret=True)
    _write_new(directory / f"{stem}.pem", cert, secret=False)
    return [directory / f"{stem}.pem", directory / f"{stem}.key"]


def init_credentials(
    directory: str | Path, *, hosts: Iterable[str] = (), nodes: Iterable[str] = ()
) -> list[Path]:
    """Make a cluster CA and the Meta Service's, ``user:admin``'s and each node's identity; the files written.

    Refuses (``InvalidConfig``) a directory that already holds a ``ca.pem`` or ``ca.key``.
    """
    root = Path(directory)
    node_names = [node_principal(name) for name in nodes]  # validated before anything is written
    root.mkdir(parents=True, exist_ok=True)
    for name in ("ca.pem", "ca.key"):
        if (root / name).exists():
            raise InvalidConfig(f"{root / name} exists already: this directory has a CA", path=str(root))
    ca_cert, ca_key = _new_ca(root)
    written = [root / "ca.pem", root / "ca.key"]
    meta_hosts = ["localhost", "127.0.0.1", "::1", *hosts]
    written += _write_identity(root, "meta", _issue(ca_cert, ca_key, META, server=True, hosts=meta_hosts))
    written += _write_identity(root, "admin", _issue(ca_cert, ca_key, user_principal("admin"), server=False))
    for principal in node_names:
        written += _write_identity(
            root, f"node-{principal[5:]}", _issue(ca_cert, ca_key, principal, server=True, hosts=meta_hosts)
        )
    return written


def add_node(directory: str | Path, name: str, *, hosts: Iterable[str] = ()) -> list[Path]:
    """Issue ``node-NAME.pem``/``.key`` (CN ``node:NAME``) from the CA in ``directory``."""
    principal = node_principal(name)
    root = Path(directory)
    ca_cert, ca_key = _load_ca(root)
    pair = _issue(ca_cert, ca_key, principal, server=True, hosts=["localhost", "127.0.0.1", "::1", *hosts])
    return _write_identity(root, f"node-{name}", pair)


def add_etcd(directory: str | Path, *, hosts: Iterable[str] = ()) -> list[Path]:
    """Issue, from the CA in ``directory``, ``etcd.pem``/``.key`` (CN ``etcd``, server and client:
    etcd presents it to itself, for its JSON gateway) and ``etcd-client.pem``/``.key``: the Meta
    Services' client certificate for etcd, with no CN (etcd refuses one with a CN on its gateway
    under ``--client-cert-auth``; the etcd user comes from the login)."""
    root = Path(directory)
    written = add_server_cert(root, "etcd", hosts=hosts)
    ca_cert, ca_key = _load_ca(root)
    client = _issue(ca_cert, ca_key, None, server=False, hosts=["robustmq-meta"])
    return written + _write_identity(root, "etcd-client", client)


def add_user_cert(directory: str | Path, name: str) -> list[Path]:
    """Issue ``user-NAME.pem``/``.key`` (CN ``user:NAME``, client only) from the CA in ``directory``."""
    principal = user_principal(name)
    root = Path(directory)
    ca_cert, ca_key = _load_ca(root)
    return _write_identity(root, f"user-{name}", _issue(ca_cert, ca_key, principal, server=False))


def add_server_cert(directory: str | Path, name: str, *, hosts: Iterable[str] = ()) -> list[Path]:
    """Issue ``NAME.pem``/``.key`` from the CA in ``directory``: a TLS server certificate whose CN
    (``NAME``) is no principal, so it cannot log in to the cluster (the Kafka gateway's listener)."""
    if not name.replace("-", "").isalnum():
        raise InvalidConfig(f"a server certificate's name is letters, digits and '-', got {name!r}")
    root = Path(directory)
    ca_cert, ca_key = _load_ca(root)
    pair = _issue(ca_cert, ca_key, name, server=True, hosts=["localhost", "127.0.0.1", "::1", *hosts])
    return _write_identity(root, name, pair)

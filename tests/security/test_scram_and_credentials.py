"""SCRAM-SHA-256 against RFC 7677's example; `robustmq security init` certificates verify with openssl."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from robustmq.errors import AuthenticationFailed, InvalidConfig
from robustmq.security._credentials import add_node, add_user_cert, certificate_principal, init_credentials
from robustmq.security._scram import ScramClient, ScramServer, derive_keys

# RFC 7677, section 3: user "user", password "pencil".
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT = "W22ZaJ0SNY7soEsUEjb6gQ=="
CLIENT_FINAL = (
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_matches_rfc_7677() -> None:
    import base64

    stored = derive_keys("pencil", base64.b64decode(SALT), 4096)
    client = ScramClient("user", "pencil", nonce=CLIENT_NONCE)
    server = ScramServer(stored, secret=b"s", nonce=SERVER_NONCE)
    server_first = server.first(client.first())
    assert server_first == f"r={CLIENT_NONCE}{SERVER_NONCE},s={SALT},i=4096"
    assert client.final(server_first) == CLIENT_FINAL
    assert server.final(CLIENT_FINAL) == SERVER_FINAL
    client.verify(SERVER_FINAL)


def test_a_wrong_password_and_an_unknown_user_are_refused_alike() -> None:
    stored = derive_keys("right")
    for credential, password in ((stored, "wrong"), (None, "anything")):
        client = ScramClient("alice", password)
        server = ScramServer(credential, secret=b"s")
        final = client.final(server.first(client.first()))
        with pytest.raises(AuthenticationFailed) as caught:
            server.final(final)
        assert caught.value.message == "wrong user name or password"
    # An unknown user gets the same salt every time: nobody learns which users exist.
    salts = {
        ScramServer(None, secret=b"s").first(ScramClient("ghost", "x").first()).split(",")[1]
        for _ in range(3)
    }
    assert len(salts) == 1


def test_a_client_refuses_a_server_that_does_not_know_its_key() -> None:
    client = ScramClient("alice", "pw")
    server = ScramServer(derive_keys("other"), secret=b"s")
    client.final(server.first(client.first()))
    with pytest.raises(AuthenticationFailed):
        client.verify("v=" + "A" * 44)


def test_init_writes_certificates_that_verify(tmp_path: Path) -> None:
    init_credentials(tmp_path, hosts=["meta.example"], nodes=["n1"])
    add_node(tmp_path, "n2")
    add_user_cert(tmp_path, "bob")
    names = {
        "meta": "meta",
        "admin": "user:admin",
        "node-n1": "node:n1",
        "node-n2": "node:n2",
        "user-bob": "user:bob",
    }
    for stem, principal in names.items():
        assert certificate_principal((tmp_path / f"{stem}.pem").read_bytes()) == principal
        assert (tmp_path / f"{stem}.key").stat().st_mode & 0o077 == 0
    with pytest.raises(InvalidConfig):  # never overwritten
        init_credentials(tmp_path)
    with pytest.raises(InvalidConfig):
        add_node(tmp_path, "n1")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    pems = [str(tmp_path / f"{stem}.pem") for stem in names]
    result = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), *pems], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "meta.pem"), "-noout", "-text"],
        capture_output=True,
        text=True,
    ).stdout
    assert (
        "DNS:meta.example" in text
        and "IP Address:127.0.0.1" in text
        and "TLS Web Server Authentication" in text
    )


def test_scram_sha_512_round_trip_and_its_keys_differ_from_sha_256() -> None:
    from robustmq.security._scram import SHA512

    stored = derive_keys("pencil", b"0123456789abcdef", 4096, SHA512)
    assert len(stored.stored_key) == len(stored.server_key) == 64
    assert stored.stored_key != derive_keys("pencil", b"0123456789abcdef", 4096).stored_key + b"\0" * 32
    client = ScramClient("user", "pencil", mechanism=SHA512)
    server = ScramServer(stored, secret=b"s", mechanism=SHA512)
    client.verify(server.final(client.final(server.first(client.first()))))
    # a SHA-256 proof against the SHA-512 keys (a client with the wrong mechanism) is refused
    wrong = ScramClient("user", "pencil")
    server = ScramServer(stored, secret=b"s", mechanism=SHA512)
    with pytest.raises(AuthenticationFailed):
        server.final(wrong.final(server.first(wrong.first())))

"""The Meta Service's revoked certificates (meta/_revocations.py) on a real RocksDB store."""

from __future__ import annotations

from pathlib import Path

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest
from robustmq.meta import _revocations
from robustmq.meta._revocations import RevocationTable, fingerprint
from robustmq.meta._store import RocksDBMetaStore
from robustmq.security._credentials import add_user_cert, init_credentials, read_certificate_file


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    creds = tmp_path_factory.mktemp("creds")
    init_credentials(creds)
    for name in ("a", "b", "c"):
        add_user_cert(creds, name)
    return [read_certificate_file(creds / f"user-{name}.pem") for name in ("a", "b", "c")]


def test_revocations_are_durable_and_a_second_one_changes_nothing(
    tmp_path: Path, certificates: list[str]
) -> None:
    from cryptography import x509

    store = RocksDBMetaStore(tmp_path / "store")
    table = RevocationTable(store)
    record, already = table.revoke(
        pb.RevokeCertificateRequest(certificate_pem=certificates[0], reason="lost"), "user:admin"
    )
    sha256 = fingerprint(x509.load_pem_x509_certificate(certificates[0].encode()))
    assert not already and record.sha256 == sha256 and record.principal == "user:a" and record.serial
    assert record.not_after_ms > record.revoked_ms and record.revoked_by == "user:admin"
    again, already = table.revoke(pb.RevokeCertificateRequest(sha256=sha256), "user:ops")
    assert already and again == record and table.version == 1
    store.close()
    reopened = RevocationTable(RocksDBMetaStore(tmp_path / "store"))
    assert reopened.version == 1
    assert reopened.revoked([b"\x00" * 32, sha256]) == record
    assert reopened.list() == [record] and reopened.fingerprints() == [sha256]


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        (
            {"certificate_pem": "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"},
            "certificate_pem",
        ),
        ({"sha256": b"\x01" * 31}, "sha256"),
        ({}, "sha256"),
        ({"sha256": b"\x01" * 32, "reason": "x" * 201}, "reason"),
        ({"sha256": b"\x01" * 32, "reason": "two\nlines"}, "reason"),
    ],
)
def test_a_bad_revocation_is_refused_naming_the_field_and_changes_nothing(
    tmp_path: Path, request_fields: dict[str, object], field: str
) -> None:
    store = RocksDBMetaStore(tmp_path / "store")
    table = RevocationTable(store)
    with pytest.raises(InvalidRequest) as refused:
        table.revoke(pb.RevokeCertificateRequest(**request_fields), "user:admin")  # type: ignore[arg-type]
    assert refused.value.fields.get("field") == field
    assert table.version == 0 and table.list() == [] and list(store.scan(b"F")) == []
    store.close()


def test_at_the_limit_expired_revocations_make_room_and_live_ones_never_go(
    tmp_path: Path, certificates: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_revocations, "MAX_REVOCATIONS", 2)
    store = RocksDBMetaStore(tmp_path / "store")
    table = RevocationTable(store)
    table.revoke(pb.RevokeCertificateRequest(certificate_pem=certificates[0]), "user:admin")
    table.revoke(pb.RevokeCertificateRequest(sha256=b"\x07" * 32), "user:admin")  # expiry unknown: kept
    with pytest.raises(InvalidRequest, match="replace the cluster CA"):
        table.revoke(pb.RevokeCertificateRequest(certificate_pem=certificates[1]), "user:admin")
    assert len(table.list()) == 2
    # The first certificate's revocation outlives it: pretend it expired a moment ago.
    first = next(record for record in table.list() if record.principal)  # the list is in hash order
    expired = pb.Revocation()
    expired.CopyFrom(first)
    expired.not_after_ms = 1
    store.write({b"F" + first.sha256: expired.SerializeToString()})
    table = RevocationTable(store)
    table.revoke(pb.RevokeCertificateRequest(certificate_pem=certificates[2]), "user:admin")
    assert sorted(record.principal for record in table.list()) == ["", "user:c"]
    assert table.revoked([first.sha256]) is None
    store.close()

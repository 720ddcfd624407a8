"""The connector's credential options: parsed into one Credentials, never shown (repr, errors),
part of the client cache key. Pure logic; the secured end-to-end runs are in tests/security."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from robustmq.connector import SinkOptions, SourceOptions, _source
from robustmq.errors import InvalidConfig
from robustmq.security._client_auth import Credentials

SECRET = "s3cr3t-Hunter2"


def _read(**options: str) -> SourceOptions:
    return SourceOptions.parse({"topic": "t", **options}, "load")


def test_no_credential_option_means_an_unsecured_cluster() -> None:
    assert _read().credentials is None
    assert SinkOptions.parse({"topic": "t"}, ["value"]).credentials is None


def test_user_and_password_become_credentials_whose_repr_hides_the_password(tmp_path: Path) -> None:
    options = _read(user="alice", password=SECRET, tlsCa="ca.pem")
    assert options.credentials == Credentials(user="alice", password=SECRET, ca="ca.pem")
    assert SECRET not in repr(options) and "alice" in repr(options)
    sink = SinkOptions.parse(
        {"topic": "t", "user": "alice", "password": SECRET, "tlsca": "ca.pem"}, ["value"]
    )
    assert sink.credentials == options.credentials and SECRET not in repr(sink)
    # Options travel to executors by pickle: the password goes with them (it is needed there).
    assert pickle.loads(pickle.dumps(options)).credentials == options.credentials


def test_a_password_file_is_read_on_the_driver(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(SECRET + "\n")
    options = _read(user="alice", passwordFile=str(tmp_path / "pw"), tlsCa="ca.pem")
    assert options.credentials is not None and options.credentials.password == SECRET
    with pytest.raises(InvalidConfig, match="option 'passwordFile': cannot read"):
        _read(user="alice", passwordFile=str(tmp_path / "missing"), tlsCa="ca.pem")


def test_a_client_certificate_needs_its_key() -> None:
    options = _read(tlsCa="ca.pem", tlsCert="etl.pem", tlsKey="etl.key")
    assert options.credentials == Credentials(ca="ca.pem", cert="etl.pem", key="etl.key")
    with pytest.raises(InvalidConfig, match="option 'tlsKey'"):
        _read(tlsCa="ca.pem", tlsCert="etl.pem")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"user": "alice", "tlsCa": "ca.pem"}, "user"),
        ({"password": SECRET, "tlsCa": "ca.pem"}, "password"),
        ({"user": "alice", "password": SECRET}, "tlsCa"),
        ({"user": "alice", "password": SECRET, "passwordFile": "pw", "tlsCa": "ca.pem"}, "passwordFile"),
        ({"user": "alice", "password": "", "tlsCa": "ca.pem"}, "password"),
        ({"user": "alice", "password": SECRET, "tlsCa": "ca.pem", "kafka.sasl.jaas.config": SECRET}, ""),
    ],
)
def test_credential_errors_name_the_option_and_never_show_the_password(options: dict, named: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        _read(**options)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value.fields)
    if named:
        assert str(caught.value).startswith(f"option '{named}'")


def test_kafka_security_options_point_at_ours() -> None:
    with pytest.raises(InvalidConfig, match=r"option 'kafka\.sasl\.mechanism': not supported: .*user and"):
        _read(**{"kafka.sasl.mechanism": "SCRAM-SHA-256"})
    with pytest.raises(InvalidConfig, match=r"option 'kafka\.ssl\.truststore\.location': .*tlsCa"):
        _read(**{"kafka.ssl.truststore.location": "x"})
    with pytest.raises(InvalidConfig, match=r"option 'kafka\.security\.protocol': .*tlsCa"):
        _read(**{"kafka.security.protocol": "SASL_SSL"})


def test_the_client_cache_keeps_one_client_per_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[str, Credentials | None]] = []

    class FakeClient:
        def __init__(self, address: str, credentials: Credentials | None) -> None:
            opened.append((address, credentials))

    import robustmq

    monkeypatch.setattr(_source, "_clients", {})
    monkeypatch.setattr(
        robustmq, "connect", lambda address, timeout_s, credentials: FakeClient(address, credentials)
    )
    alice = Credentials(user="alice", password="a", ca="ca.pem")
    bob = Credentials(user="bob", password="b", ca="ca.pem")
    first = _source.client_for("127.0.0.1:1", 30, alice)
    again = Credentials(user="alice", password="a", ca="ca.pem")
    changed = Credentials(user="alice", password="new", ca="ca.pem")
    assert _source.client_for("127.0.0.1:1", 30, again) is first
    assert _source.client_for("127.0.0.1:1", 30, bob) is not first
    assert _source.client_for("127.0.0.1:1", 30, None) is not first
    # A changed password is another client (a client logged in with the old one would keep failing).
    assert _source.client_for("127.0.0.1:1", 30, changed) is not first
    assert len(opened) == 4

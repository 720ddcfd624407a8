"""The etcd of ``robustmq cluster --store etcd``: one member on loopback, plain or secured.

Plain (no ``--secure``): http on loopback, no authentication; the Meta Services are
given its URL and nothing else.

Secured (``--secure``), from the cluster's credentials directory (``robustmq security
init``, its CA)::

    etcd.pem, etcd.key                etcd's certificate (CN "etcd", SAN loopback), made once
    etcd-client.pem, etcd-client.key  the Meta Services' client certificate for etcd (no CN:
                                      etcd's JSON gateway refuses one with a CN)
    etcd-root.password                etcd's root user (0600, made once)
    etcd-meta.password                etcd user ``robustmq-meta`` (0600, made once)

etcd serves https only, on its client and peer URLs, and asks every client for a
certificate of the cluster CA (``--client-cert-auth``). Once it answers, its auth is
turned on (what ``etcdctl user add root``, ``role add root``, ``user grant-role root
root``, ``user add robustmq-meta``, ``role add robustmq-meta``, ``role grant-permission
robustmq-meta readwrite --prefix=true /robustmq/``, ``user grant-role robustmq-meta
robustmq-meta``, ``auth enable`` do), unless it is on already (a restart on the same data
directory). The Meta Services log in as ``robustmq-meta``, whose role may read and write
``/robustmq/`` only, with the password from its file (never on a command line).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from robustmq.errors import InvalidConfig, RobustMQError

if TYPE_CHECKING:  # imported where used: robustmq.meta is heavy to import for every CLI command
    from robustmq.meta._etcd_client import EtcdClient, EtcdTls

__all__ = ["ETCD_PREFIX", "META_ETCD_USER", "etcd_command", "find_etcd", "prepare_etcd"]

ETCD_PREFIX = "/robustmq"
META_ETCD_USER = "robustmq-meta"
_ETCD_PATHS = ("/usr/bin/etcd", "/usr/local/bin/etcd")
_POLL_S = 0.2


def find_etcd() -> str:
    """The ``etcd`` program (Debian's ``etcd-server``), or ``InvalidConfig`` saying how to get it."""
    found = shutil.which("etcd") or next((p for p in _ETCD_PATHS if os.access(p, os.X_OK)), None)
    if found is None:
        raise InvalidConfig(
            "--store etcd needs etcd, which is not installed here: install Debian's etcd-server "
            "(sudo apt-get install etcd-server, or scripts/install_etcd)",
            field="store",
        )
    return found


def etcd_command(
    data_dir: Path, client_port: int, peer_port: int, credentials: Path | None
) -> tuple[list[str], str, list[str]]:
    """etcd's arguments, its client URL, and the flags that point a Meta Service at it
    (``--store`` and, secured, the TLS files and the etcd user); makes what a secured etcd
    needs in ``credentials`` first (the module docstring)."""
    from robustmq.meta._etcd_store import EtcdLimits

    limits = EtcdLimits()
    scheme = "https" if credentials is not None else "http"
    client_url, peer_url = f"{scheme}://127.0.0.1:{client_port}", f"{scheme}://127.0.0.1:{peer_port}"
    args = [
        "--name", "robustmq",
        "--data-dir", str(data_dir),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"robustmq={peer_url}",
        # The Meta Service's changes are single Txns larger than etcd's defaults allow (it checks).
        "--max-txn-ops", str(limits.max_txn_ops),
        "--max-request-bytes", str(limits.max_request_bytes),
    ]  # fmt: skip
    meta_args = ["--store", f"etcd://127.0.0.1:{client_port}{ETCD_PREFIX}"]
    if credentials is None:
        return args, client_url, meta_args
    _credentials(credentials)
    ca, cert, key = (str(credentials / name) for name in ("ca.pem", "etcd.pem", "etcd.key"))
    args += ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth"]
    args += ["--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", ca]
    args += ["--peer-client-cert-auth"]
    meta_args += [
        "--etcd-ca", ca,
        "--etcd-cert", str(credentials / "etcd-client.pem"),
        "--etcd-key", str(credentials / "etcd-client.key"),
        "--etcd-user", META_ETCD_USER,
        "--etcd-password-file", str(credentials / "etcd-meta.password"),
    ]  # fmt: skip
    return args, client_url, meta_args


def _credentials(directory: Path) -> None:
    from robustmq.security._credentials import add_etcd

    if not (directory / "etcd.pem").exists():
        add_etcd(directory)
    for name in ("etcd-root.password", "etcd-meta.password"):
        path = directory / name
        if path.exists():
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(24) + "\n")


def prepare_etcd(
    client_url: str, credentials: Path | None, exited: Callable[[], bool], timeout_s: float
) -> None:
    """Wait until etcd answers (``InvalidConfig`` if it exits or ``timeout_s`` passes), then,
    secured, turn its auth on with the Meta Services' user (the module docstring)."""
    from robustmq.meta._etcd_client import EtcdClient, EtcdError, EtcdTls

    tls = None
    if credentials is not None:
        files = (credentials / name for name in ("ca.pem", "etcd-client.pem", "etcd-client.key"))
        tls = EtcdTls(*(str(path) for path in files))
    endpoint = client_url.partition("://")[2]
    deadline = time.monotonic() + timeout_s
    with closing(EtcdClient([endpoint], timeout_s=1.0, tls=tls)) as etcd:
        while True:
            if exited():
                raise InvalidConfig("etcd exited at start (its log says why)")
            try:
                etcd.call("/v3/maintenance/status", {})
                break
            except EtcdError:
                raise  # it answered, and refused: waiting will not help
            except RobustMQError as error:
                if time.monotonic() > deadline:
                    raise InvalidConfig(
                        f"etcd did not answer within {timeout_s:.0f} s: {error.message}"
                    ) from None
            time.sleep(_POLL_S)
        if credentials is not None:
            _enable_auth(etcd, credentials, tls, endpoint)


def _enable_auth(etcd: EtcdClient, credentials: Path, tls: EtcdTls | None, endpoint: str) -> None:
    from robustmq.meta._etcd_client import EtcdClient, EtcdError, b64

    root_password = _read(credentials / "etcd-root.password")
    with closing(EtcdClient([endpoint], tls=tls, user="root", password=root_password)) as as_root:
        try:
            as_root.call("/v3/maintenance/status", {})
            return  # auth is on already, set up by an earlier start on this data directory
        except EtcdError as error:
            if "authentication is not enabled" not in str(error.fields.get("reason", "")):
                raise
    prefix = (ETCD_PREFIX + "/").encode()
    prefix_end = prefix[:-1] + bytes([prefix[-1] + 1])
    permission = {"permType": "READWRITE", "key": b64(prefix), "range_end": b64(prefix_end)}
    meta_password = _read(credentials / "etcd-meta.password")
    steps = [
        ("/v3/auth/user/add", {"name": "root", "password": root_password}),
        ("/v3/auth/role/add", {"name": "root"}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/user/add", {"name": META_ETCD_USER, "password": meta_password}),
        ("/v3/auth/role/add", {"name": META_ETCD_USER}),
        ("/v3/auth/role/grant", {"name": META_ETCD_USER, "perm": permission}),
        ("/v3/auth/user/grant", {"user": META_ETCD_USER, "role": META_ETCD_USER}),
        ("/v3/auth/enable", {}),
    ]
    for path, body in steps:
        try:
            etcd.call(path, body, timeout_s=5.0)
        except EtcdError as error:  # a start that stopped half-way made it already
            if "already exists" not in str(error.fields.get("reason", "")):
                raise


def _read(path: Path) -> str:
    try:
        return path.read_text().rstrip("\n")
    except OSError as exc:
        raise InvalidConfig(f"cannot read {path}: {exc.strerror or exc}", path=str(path)) from exc

"""A real S3 API server (``moto_server``, its conditional writes made atomic by
``tests/_moto_atomic.py``) on loopback, started and stopped by pid.

Shared by every test that needs S3 (the ``s3_server`` fixture in ``tests/conftest.py``
wraps :func:`run_moto_server`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e._procs import ROOT, free_port


@dataclass(frozen=True, slots=True)
class S3Server:
    """A running ``moto_server``: its endpoint and the options delta-rs and boto3 need."""

    endpoint_url: str
    process: Any = field(default=None, repr=False, compare=False)  # the moto_server child

    def stop(self) -> None:
        """Stop the server now (tests of an unreachable store); exiting the context is still safe."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)

    @property
    def storage_options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
        }

    def boto3_client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    @property
    def environment(self) -> dict[str, str]:
        """The environment variables boto3 (and so ``ObjectStore``) reads to reach this server."""
        return {key: value for key, value in self.storage_options.items() if key != "AWS_ALLOW_HTTP"} | {
            "AWS_DEFAULT_REGION": "us-east-1"
        }


@contextmanager
def run_moto_server(directory: Path) -> Iterator[S3Server]:
    """A ``moto_server`` on a free loopback port, its log in ``directory``; stopped by pid on exit."""
    port = free_port()
    log = directory / "moto.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests._moto_atomic", "-H", "127.0.0.1", "-p", str(port)],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/moto-api/", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield S3Server(url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

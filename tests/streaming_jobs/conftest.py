"""Fixtures of the Spark-job tests: a Meta Service client of the module's embedded cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from robustmq._meta_client import MetaClient


@pytest.fixture(scope="module")
def meta(cluster: Any) -> Iterator[MetaClient]:
    with MetaClient(cluster.meta_address, timeout_s=30) as connected:
        yield connected

"""Fixtures of the tiering tests: a file:// object store and controllers on a real store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq.tier._store import ObjectStore

from .test_tiering import Controllers


@pytest.fixture
def tier(tmp_path: Path) -> ObjectStore:
    store = ObjectStore.from_url(f"file://{tmp_path}/tier")
    store.check()
    return store


@pytest.fixture
def controllers(tmp_path: Path, tier: ObjectStore) -> Iterator[Controllers]:
    made = Controllers(tmp_path, tier.url)
    yield made
    made.controller.close()

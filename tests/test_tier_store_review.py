"""Adversarial review of issue 9: defects of ``robustmq/tier/_store.py`` (failing tests, xfail strict)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from robustmq.errors import ObjectStoreError
from robustmq.tier._store import ObjectStore


def test_put_refuses_when_the_tier_directory_is_gone(tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    store = ObjectStore.from_url(f"file://{share}/tier")
    store.check()  # creates the last directory only, as documented
    shutil.rmtree(share / "tier")  # the share is unmounted: its mount point is empty
    with pytest.raises(ObjectStoreError, match="does not exist") as refused:
        store.put_if_absent("t/0/1/0000000000-00000000000000000000.parquet", b"data")
    assert store.url in str(refused.value)
    assert not (share / "tier").exists()

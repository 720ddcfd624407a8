"""The node's cache of tiered row groups: least recently used, never above its byte bound."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from robustmq.storage_node.tiered._tier_cache import TierCache


def test_least_recently_used_goes_first() -> None:
    cache = TierCache(300)
    for group in range(3):
        cache.put(("u", 1, group), bytes(100))
    assert cache.get(("u", 1, 0)) is not None  # 0 is now the most recently used
    cache.put(("u", 1, 3), bytes(100))
    assert ("u", 1, 1) not in cache
    assert all(("u", 1, group) in cache for group in (0, 2, 3))
    stats = cache.stats()
    assert (stats.bytes, stats.entries, stats.evictions, stats.hits) == (300, 3, 1, 1)


def test_a_frame_larger_than_the_cache_is_not_kept() -> None:
    cache = TierCache(100)
    cache.put(("u", 1, 0), bytes(50))
    cache.put(("u", 1, 1), bytes(101))
    assert ("u", 1, 1) not in cache and ("u", 1, 0) in cache
    assert cache.stats().bytes == 50


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_reference_lru_and_stays_bounded(seed: int) -> None:
    """Model-based: random puts and gets against an OrderedDict reference."""
    rng = random.Random(seed)
    limit = 10_000
    cache = TierCache(limit)
    reference: OrderedDict[tuple[str, int, int], int] = OrderedDict()
    for _ in range(3_000):
        key = ("obj-%d" % rng.randrange(3), 7, rng.randrange(40))
        if rng.random() < 0.5:
            size = rng.randrange(1, 3_000)
            cache.put(key, bytes(size), read_ahead=rng.random() < 0.3)
            reference.pop(key, None)
            while reference and sum(reference.values()) + size > limit:
                reference.popitem(last=False)
            reference[key] = size
        else:
            found = cache.get(key)
            expected = reference.get(key)
            assert (None if found is None else len(found)) == expected
            if expected is not None:
                reference.move_to_end(key)
        stats = cache.stats()
        assert stats.bytes == sum(reference.values()) <= limit
        assert stats.peak_bytes <= limit

"""CRC-32C combination against the CRC of the joined bytes (seeded, every length class)."""

from __future__ import annotations

import random

from robustmq._crc import crc32c, crc32c_combine


def test_combine_equals_the_crc_of_the_concatenation() -> None:
    rng = random.Random(7)
    lengths = [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        63,
        64,
        65,
        15,
        16,
        255,
        256,
        1000,
        1023,
        1024,
        4095,
        4096,
        65_537,
        1 << 20,
    ]
    lengths += [rng.randrange(1, 300_000) for _ in range(20)]
    for _ in range(200):
        a = rng.randbytes(rng.choice(lengths[:10]))
        b = rng.randbytes(rng.choice(lengths))
        assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b), (len(a), len(b))


def test_combine_solves_for_the_second_part() -> None:
    # combine(crc(a), crc(a + b), len(b)) == crc(b): how recovery gets a payload's CRC from its frame's.
    rng = random.Random(8)
    a, b = rng.randbytes(60), rng.randbytes(123_457)
    assert crc32c_combine(crc32c(a), crc32c(a + b), len(b)) == crc32c(b)

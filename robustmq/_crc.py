"""CRC-32C (Castagnoli) and combining two CRCs without reading the bytes again.

``crc32c_combine(crc_a, crc_b, len_b)`` is the CRC of ``a + b`` given the CRCs
of ``a`` and ``b`` and the length of ``b`` (zlib's ``crc32_combine``, for the
Castagnoli polynomial). The write path uses it to build a frame's CRC (header
bytes, then payload) from a payload CRC it already has, and recovery uses it
the other way round to get a stored payload's CRC from its frame's, so each
payload is read once however many CRCs are needed.

How: appending ``n`` zero bytes to a CRC register multiplies it by
``x^(8n)`` modulo the polynomial, a linear map on 32 bits. For each bit ``i``
of ``n`` the map for ``x^(8 * 2^i)`` is kept as four 256-entry tables (one per
byte of the register), built on first use; a combine costs one table step per
set bit of ``len_b``. Thread-safe: tables are built idempotently.
"""

from __future__ import annotations

from typing import Any

import crc32c as _crc32c

__all__ = ["crc32c", "crc32c_combine"]

_POLY = 0x82F63B78  # Castagnoli, bit-reflected
_TOP = 1 << 31  # x^0 in the reflected representation


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``value`` (the CRC of what came before)."""
    return int(_crc32c.crc32c(data, value=value))


def _multiply(a: int, b: int) -> int:
    """``a(x) * b(x)`` modulo the polynomial, both reflected (zlib's ``multmodp``)."""
    product = 0
    mask = _TOP
    while mask:
        if a & mask:
            product ^= b
        mask >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers() -> list[int]:
    """``x^(2^k)`` modulo the polynomial for k = 0..63 (they cycle with period 31 after k = 3)."""
    power = _TOP >> 1  # x^1
    found = []
    for _ in range(64):
        found.append(power)
        power = _multiply(power, power)
    return found


_X_POW_2K = _powers()
_TABLES: dict[int, tuple[list[int], ...]] = {}


def _tables(bit: int) -> tuple[list[int], ...]:
    """Byte tables of the map "append 2^bit zero bytes" (multiply by ``x^(8 * 2^bit)``)."""
    tables = _TABLES.get(bit)
    if tables is None:
        factor = _X_POW_2K[bit + 3]
        images = [_multiply(factor, 1 << position) for position in range(32)]
        built = []
        for byte in range(4):
            table = [0] * 256
            for value in range(1, 256):
                low = value & -value
                table[value] = table[value ^ low] ^ images[byte * 8 + low.bit_length() - 1]
            built.append(table)
        tables = _TABLES.setdefault(bit, tuple(built))
    return tables


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC-32C of ``a + b`` from ``crc32c(a)``, ``crc32c(b)`` and ``len(b)``."""
    value = crc_a
    bit = 0
    while length_b:
        if length_b & 1:
            t0, t1, t2, t3 = _tables(bit)
            value = t0[value & 0xFF] ^ t1[(value >> 8) & 0xFF] ^ t2[(value >> 16) & 0xFF] ^ t3[value >> 24]
        length_b >>= 1
        bit += 1
    return value ^ crc_b

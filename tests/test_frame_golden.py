"""The frame format is fixed: these bytes must never change by accident.

If a test here fails, the on-disk and wire format changed. Old segment files
would no longer read. Bump FRAME_VERSION and keep a reader for version 1
instead of editing the expected bytes.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._crc import crc32c
from robustmq._frame import (
    FLAG_REENCODED,
    FRAME_HEADER_SIZE,
    client_checksum,
    decode_header,
    encode_header,
    payload_crc,
    verify_payload,
)
from robustmq._records import RECORD_SCHEMA, build_records, decode_batch, encode_batch
from robustmq.errors import CorruptRecordBatch

EXPECTED_HEADER = bytes.fromhex(
    "524d5146"  # magic "RMQF"
    "01"
    "00"
    "0000"  # version 1, flags, reserved
    "0102030405060708"  # base_offset
    "00000003"  # record_count
    "00000007"  # epoch
    "0000018bcfe56800"  # first_timestamp_ms 1_700_000_000_000
    "0000018bcfe569f4"  # max_timestamp_ms   1_700_000_000_500
    "000000000000002a"  # producer_id 42
    "0000000000000009"  # producer_sequence 9
    "00000007"  # payload_length
    "81488bc4"  # crc32c of bytes 0..60 + payload
)


def golden_header(payload: bytes | pa.Buffer, **options: int) -> bytes:
    """The header of the golden fields for ``payload`` (``options``: payload_crc, flags)."""
    return encode_header(
        base_offset=0x0102030405060708,
        record_count=3,
        epoch=7,
        first_timestamp_ms=1_700_000_000_000,
        max_timestamp_ms=1_700_000_000_500,
        producer_id=42,
        producer_sequence=9,
        payload=payload,
        **options,
    )


def test_header_bytes_are_stable() -> None:
    header = golden_header(b"payload")
    assert FRAME_HEADER_SIZE == 64
    assert header == EXPECTED_HEADER


def test_the_reencoded_flag_is_bit_0_of_byte_5_and_covered_by_the_crc() -> None:
    header = golden_header(b"payload", flags=FLAG_REENCODED)
    assert header == EXPECTED_HEADER[:5] + b"\x01" + EXPECTED_HEADER[6:60] + bytes.fromhex("8db88062")
    assert decode_header(header).flags == FLAG_REENCODED
    assert decode_header(EXPECTED_HEADER).flags == 0


def test_a_crc_combined_from_the_payload_crc_is_the_same_crc() -> None:
    rng = random.Random(8)
    payloads = [b"", b"payload", bytes(range(256)) * 300]
    payloads += [rng.randbytes(length) for length in (1, 100, 4096, 123_457)]
    for payload in payloads:
        read_twice = golden_header(payload)
        combined = golden_header(payload, payload_crc=crc32c(payload))
        assert read_twice == combined
        assert payload_crc(decode_header(combined), combined) == crc32c(payload)


def test_the_producers_checksum_survives_in_the_frame() -> None:
    sent = encode_batch(build_records([b"a"], timestamps_ms=[1]))
    plain = golden_header(sent)
    assert client_checksum(decode_header(plain), plain, sent) == crc32c(sent)
    stored = encode_batch(
        build_records([b"a"], timestamps_ms=[2]), custom_metadata={b"robustmq.client_crc32c": b"77"}
    )
    flagged = golden_header(stored, flags=FLAG_REENCODED)
    assert client_checksum(decode_header(flagged), flagged, stored) == 77


def test_version_1_frame_fixture_still_decodes() -> None:
    frame = bytes.fromhex((Path(__file__).parent / "fixtures" / "frame_v1.hex").read_text().replace("\n", ""))
    header = decode_header(frame)
    assert (header.base_offset, header.record_count, header.epoch) == (1000, 3, 2)
    assert (header.first_timestamp_ms, header.max_timestamp_ms) == (1, 3)
    assert (header.producer_id, header.producer_sequence) == (-1, -1)
    verify_payload(header, frame[:FRAME_HEADER_SIZE], frame[FRAME_HEADER_SIZE:], where="fixture", position=0)
    records = decode_batch(frame[FRAME_HEADER_SIZE:])
    assert records.schema.equals(RECORD_SCHEMA)
    assert records.to_pylist() == [
        {
            "key": b"k1",
            "value": b"v1",
            "timestamp": records.column("timestamp")[0].as_py(),
            "tags": ["a"],
            "headers": [{"key": "h", "value": b"x"}],
        },
        {
            "key": b"k2",
            "value": None,
            "timestamp": records.column("timestamp")[1].as_py(),
            "tags": None,
            "headers": None,
        },
        {
            "key": None,
            "value": b"v3",
            "timestamp": records.column("timestamp")[2].as_py(),
            "tags": ["b", "c"],
            "headers": None,
        },
    ]
    assert records.column("timestamp").cast("int64").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize("position", [0, 7, 20, 60, 63, 64, 100])
def test_any_flipped_byte_is_detected(position: int) -> None:
    frame = bytes.fromhex((Path(__file__).parent / "fixtures" / "frame_v1.hex").read_text().replace("\n", ""))
    damaged = bytearray(frame)
    damaged[position] ^= 0x40
    with pytest.raises(CorruptRecordBatch):
        header = decode_header(damaged)
        verify_payload(
            header,
            damaged[:FRAME_HEADER_SIZE],
            damaged[FRAME_HEADER_SIZE:],
            where="fixture",
            position=0,
        )

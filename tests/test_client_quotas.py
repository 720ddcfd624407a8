"""Quota entries and how a principal's rates are resolved (``robustmq/_client_quotas.py``)."""

from __future__ import annotations

import pytest

from robustmq._client_quotas import MAX_RATE, Quota, QuotaTable, Rates, validated_quota
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest


def test_each_rate_comes_from_the_principal_then_the_default_entry_then_the_node() -> None:
    table = QuotaTable(
        [
            Quota("*", produce_bytes_per_s=1000, requests_per_s=50),
            Quota("user:etl", produce_bytes_per_s=0, fetch_bytes_per_s=7),
        ],
        Rates(produce_bytes_per_s=5, fetch_bytes_per_s=6, requests_per_s=9),
    )
    assert table.rates_of("user:etl") == Rates(0, 7, 50)  # 0 is "no limit", not "unset"
    assert table.rates_of("user:other") == Rates(1000, 6, 50)
    assert QuotaTable().rates_of("user:x").unlimited


def test_an_entry_round_trips_and_keeps_unset_rates_unset() -> None:
    quota = validated_quota(pb.QuotaEntry(principal=" user:a ", fetch_bytes_per_s=0))
    assert quota == Quota("user:a", fetch_bytes_per_s=0)
    assert validated_quota(quota.to_pb()) == quota
    assert not quota.to_pb().HasField("produce_bytes_per_s")
    assert str(quota) == "user:a: fetch_bytes_per_s=unlimited"


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (pb.QuotaEntry(principal="node:n1", requests_per_s=1), "principal"),
        (pb.QuotaEntry(principal="meta", requests_per_s=1), "principal"),
        (pb.QuotaEntry(principal="alice", requests_per_s=1), "principal"),
        (pb.QuotaEntry(principal="", requests_per_s=1), "principal"),
        (pb.QuotaEntry(principal="user:a", requests_per_s=-1), "requests_per_s"),
        (pb.QuotaEntry(principal="*", produce_bytes_per_s=MAX_RATE + 1), "produce_bytes_per_s"),
    ],
)
def test_a_bad_entry_is_refused_naming_its_field(entry: pb.QuotaEntry, field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validated_quota(entry)
    assert refused.value.fields["field"] == field

"""A client's lookups against a long chain, on real processes (issue 22, item 5).

400 produce-and-seal rounds by one client make a 400-segment chain. The client's
write route and read route used to ask ``GetShard`` for the whole chain (15.8 KB
at 400 segments, 40 KB at the 1,000-segment quota) after every seal or leader
change; they now ask for the active segment (``tail``) or the segments from the
one holding the offset (``offset``), answers of a few hundred bytes whatever
the chain's length, and reads across the chain stay contiguous.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from tests.e2e._procs import NodeCluster

pytestmark = pytest.mark.e2e

SEGMENTS = 400
SMALL_ANSWER_BYTES = 1024


def test_the_clients_write_and_read_lookups_stay_small_on_a_400_segment_chain(tmp_path: Path) -> None:
    cluster = NodeCluster(tmp_path, nodes=1).start()
    try:
        with robustmq.connect(cluster.meta_address, timeout_s=10.0) as client:
            client.create_topic("chain")
            for round_number in range(SEGMENTS - 1):  # as the hostile client did
                client.produce("chain", 0, build_records([f"r{round_number}"]), acks="1")
                client.seal("chain", 0)
            client.produce("chain", 0, build_records([f"r{SEGMENTS - 1}"]), acks="1")
            whole = client.meta.get_shard("chain_0")
            assert len(whole.segments) == SEGMENTS and whole.ByteSize() > 10 * SMALL_ANSWER_BYTES

            answers: list[pb.ShardInfo] = []
            looked_up = client.meta.get_shard

            def get_shard(shard: str, **asked: Any) -> pb.ShardInfo:
                answer = looked_up(shard, **asked)
                answers.append(answer)
                return answer

            client.meta.get_shard = get_shard  # type: ignore[method-assign]  # records, then answers
            client.metadata.invalidate("chain")
            client.metadata.topic("chain")  # the topic is cached: the next lookups are GetShard's
            client.metadata.invalidate("chain", 0)  # as after a seal or a leader change

            client.produce("chain", 0, build_records(["after"]), acks="1")  # the write route
            assert len(answers) == 1 and answers[0].ByteSize() < SMALL_ANSWER_BYTES
            assert answers[0].segments[-1].epoch == SEGMENTS - 1
            assert (answers[0].log_start_offset, answers[0].first_epoch) == (0, 0)

            answers.clear()
            client.metadata.invalidate("chain", 0)
            table = client.read("chain", 0, 123, max_records=1)  # a sealed segment's read route
            assert table.column("offset").to_pylist() == [123]
            assert table.column("value").to_pylist() == [b"r123"]
            assert answers and all(answer.ByteSize() < SMALL_ANSWER_BYTES for answer in answers)

            answers.clear()
            table = client.read("chain", 0, 0, max_records=1000)  # across every segment
            assert table.column("offset").to_pylist() == list(range(SEGMENTS + 1))
            assert table.column("value").to_pylist()[-2:] == [f"r{SEGMENTS - 1}".encode(), b"after"]
            assert answers and all(answer.ByteSize() < SMALL_ANSWER_BYTES for answer in answers)
    finally:
        cluster.stop()

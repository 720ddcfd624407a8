"""``acks``: what a produce waits for before it is acknowledged, parsed in one place.

The producer, :meth:`robustmq.Client.produce`, the Spark sink's ``acks`` option
and ``robustmq produce --acks`` all take the same spellings:

- ``"all"`` (also Kafka's ``-1`` / ``"-1"``): every in-sync replica holds the
  records durably, and the ISR has at least the topic's
  ``min_insync_replicas`` members (else ``NotEnoughReplicas``, retriable);
- ``"quorum"``: a majority of the replica set holds them durably;
- ``"1"`` (also the int ``1``): the leader's durable append.

The default everywhere is ``"all"``: on a topic with a replication factor of 1
the ISR is the leader alone and ``min_insync_replicas`` is 1, so ``"all"`` is
then exactly ``"1"`` (same latency, same guarantee), and a topic created with
replicas gets the guarantee replication is for without a second setting (as
Kafka's producer does since 3.0). See ``docs/replication.md`` for what each
level survives.
"""

from __future__ import annotations

from typing import Any

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidConfig

__all__ = ["ACKS_CHOICES", "DEFAULT_ACKS", "acks_wire", "parse_acks"]

ACKS_CHOICES = ("all", "quorum", "1")
DEFAULT_ACKS = "all"
_WIRE = {"all": pb.ACKS_ALL, "quorum": pb.ACKS_QUORUM, "1": pb.ACKS_LEADER}
_ALIASES = {"-1": "all"}  # Kafka's spelling of all


def parse_acks(value: Any) -> str:
    """The canonical form (``"all"``, ``"quorum"`` or ``"1"``) of an ``acks`` setting.

    Accepts those strings in any case and with surrounding blanks, the ints
    ``1`` and ``-1`` and the string ``"-1"`` (Kafka's alias for all). Anything
    else raises ``InvalidConfig`` naming the allowed values; ``0`` (Kafka's
    fire-and-forget) is refused with the reason.
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        text = None
    else:
        text = str(value).strip().lower()
        text = _ALIASES.get(text, text)
    if text in _WIRE:
        return text
    shown = repr(value)[:80]
    why = ": acks=0 (no acknowledgement) is not offered, every write is acknowledged" if text == "0" else ""
    raise InvalidConfig(
        f'acks must be "all", "quorum" or "1" (or -1, Kafka\'s name for "all"), not {shown}{why}',
        field="acks",
        value=shown,
    )


def acks_wire(acks: Any) -> pb.Acks:
    """The ``ProduceRequest.acks`` value of a setting (any spelling :func:`parse_acks` takes)."""
    return _WIRE[parse_acks(acks)]

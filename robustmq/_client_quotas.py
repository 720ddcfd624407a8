"""Per-principal quotas of the storage nodes (Kafka's client quotas, KIP-13/KIP-124): the model.

A quota entry names a principal and up to three rates; what each one measures on a node:

- ``produce_bytes_per_s``: payload bytes of the principal's produce requests;
- ``fetch_bytes_per_s``: payload bytes of the answers to its fetches, reads and scans;
- ``requests_per_s``: its requests of any kind.

``principal`` is ``user:NAME`` (security on: the session token's principal, over every
connection it has to the node), ``anonymous`` (security off: every caller; the rates then
apply to each connection on its own, as nothing tells two callers apart) or ``*``, the
default of every principal without an entry of its own. Each rate is resolved on its own
(as Kafka's): the principal's entry if it sets that rate, else the ``*`` entry's, else the
node's own default (``storage-node --quota-...``). 0 means no limit; an entry leaves a rate
unset with ``None`` (absent on the wire). Storage nodes (``node:`` principals) and the Meta
Service (``meta``) are never throttled: replication is not a client's traffic.

Entries live in the Meta Service (``robustmq quota set|list|remove``); nodes load them when
the ``acl_version`` of a heartbeat answer moves. Every node enforces them on its own share:
a principal may produce at its rate to each node it writes to, as with Kafka's brokers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

__all__ = [
    "ANONYMOUS",
    "DEFAULT_PRINCIPAL",
    "MAX_QUOTA_ENTRIES",
    "MAX_RATE",
    "NO_LIMITS",
    "RATE_NAMES",
    "Quota",
    "QuotaTable",
    "Rates",
    "validated_quota",
]

DEFAULT_PRINCIPAL = "*"
ANONYMOUS = "anonymous"
RATE_NAMES = ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s")
MAX_RATE = 1 << 40  # 1 TiB/s or 10^12 requests/s: far past anything a node does
MAX_QUOTA_ENTRIES = 10_000
_USER = re.compile(r"user:[A-Za-z0-9._@-]{1,128}")


@dataclass(frozen=True, slots=True)
class Rates:
    """Resolved rates of one principal (0: no limit)."""

    produce_bytes_per_s: int = 0
    fetch_bytes_per_s: int = 0
    requests_per_s: int = 0

    @property
    def unlimited(self) -> bool:
        return not (self.produce_bytes_per_s or self.fetch_bytes_per_s or self.requests_per_s)


NO_LIMITS = Rates()


@dataclass(frozen=True, slots=True)
class Quota:
    """One quota entry, validated (:func:`validated_quota` makes them); ``None``: not set here."""

    principal: str
    produce_bytes_per_s: int | None = None
    fetch_bytes_per_s: int | None = None
    requests_per_s: int | None = None

    def to_pb(self) -> pb.QuotaEntry:
        entry = pb.QuotaEntry(principal=self.principal)
        for name in RATE_NAMES:
            value = getattr(self, name)
            if value is not None:
                setattr(entry, name, value)
        return entry

    def __str__(self) -> str:
        rates = ", ".join(
            f"{name}={'unlimited' if value == 0 else f'{value:,}'}"
            for name in RATE_NAMES
            if (value := getattr(self, name)) is not None
        )
        return f"{self.principal}: {rates or 'nothing set'}"


def validated_quota(entry: pb.QuotaEntry) -> Quota:
    """``entry`` as a :class:`Quota`, or ``InvalidRequest`` naming what is wrong."""
    principal = entry.principal.strip()
    if principal.startswith("node:") or principal == "meta":
        raise InvalidRequest(
            f"{principal!r} is a storage node or the Meta Service, which quotas never throttle "
            "(replication is not client traffic): name a user:NAME, 'anonymous' or '*'",
            field="principal",
            principal=principal[:140],
        )
    if principal not in (DEFAULT_PRINCIPAL, ANONYMOUS) and not _USER.fullmatch(principal):
        raise InvalidRequest(
            f"principal {principal[:140]!r} is not user:NAME, 'anonymous' (security off) or '*' "
            "(every principal without an entry of its own)",
            field="principal",
            principal=principal[:140],
        )
    rates: dict[str, int | None] = {}
    for name in RATE_NAMES:
        if not entry.HasField(name):
            rates[name] = None
            continue
        value = int(getattr(entry, name))
        if not 0 <= value <= MAX_RATE:
            raise InvalidRequest(
                f"{name} must be from 0 (no limit) to {MAX_RATE:,}, got {value:,}",
                field=name,
                value=value,
            )
        rates[name] = value
    return Quota(principal, **rates)


class QuotaTable:
    """The quota entries a node enforces, and its own defaults; resolves a principal's rates.

    Immutable once made: a node swaps in a new table when the entries change.
    """

    def __init__(self, entries: Iterable[Quota] = (), defaults: Rates = NO_LIMITS) -> None:
        self.entries = {quota.principal: quota for quota in entries}
        self.defaults = defaults
        default = self.entries.get(DEFAULT_PRINCIPAL)
        self._fallback = Rates(
            *(
                _first(None if default is None else getattr(default, name), getattr(defaults, name))
                for name in RATE_NAMES
            )
        )
        self._resolved: dict[str, Rates] = {}

    def rates_of(self, principal: str) -> Rates:
        """The rates that apply to ``principal`` (see the module docstring)."""
        rates = self._resolved.get(principal)
        if rates is not None:
            return rates
        entry = self.entries.get(principal)
        if entry is None:
            rates = self._fallback
        else:
            rates = Rates(
                *(_first(getattr(entry, name), getattr(self._fallback, name)) for name in RATE_NAMES)
            )
        if len(self._resolved) < 4 * MAX_QUOTA_ENTRIES:  # principals without an entry share the fallback
            self._resolved[principal] = rates
        return rates


def _first(value: int | None, otherwise: int) -> int:
    return otherwise if value is None else value

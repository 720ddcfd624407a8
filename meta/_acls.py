"""The Meta Service's ACLs, their version, and the producer ids it hands out.

:class:`AclControl` is a mixin of :class:`~robustmq.meta._controller.MetaController` under
the controller's rules (one lock, validate first, one atomic batch, memory updated only once
the batch is durable).

ACLs (docs/security.md, "Authorization") are stored one per key, the binding's fields in the
key (so the same binding twice is one entry) and the serialized ``AclBinding`` as the value::

    "C" text(principal) text(resource_type) text(pattern) text(resource_name)
        text(operation) text(permission)              AclBinding (protobuf, validated)
    "K"                                               be64(acl_version)
    "J"                                               be64(producer ids reserved: every id
                                                      handed out is below it)
    "B" text(principal) text(transactional_id)        be64(producer id): a transactional id's
                                                      producer id
    "Z" be64(producer id)                             be64(handed out, ms) utf8(principal): who
                                                      an id went to (security on)

``acl_version`` goes up by one in the batch of every change that alters what an authorizer
decides: an ACL created or deleted here, a user created, removed or given a new password
(the user store calls :meth:`AclControl._stage_acl_change`). Nodes see it in heartbeat
answers and call ``ListAcls`` when it moves. A create of an ACL that exists, or a delete of
one that does not, changes nothing (and not the version). At most :data:`MAX_ACLS` ACLs.

Producer ids (``InitProducerId``, as Kafka's): ids are handed out from 1 upwards, never twice,
across restarts and crashes. The store records a reservation ``J`` ahead of the ids handed
out (:data:`PRODUCER_ID_BLOCK` at a time, synced before the first of them is answered), and a
restarted service starts at the reservation: a crash skips at most a block of ids, never
repeats one, and a store write is paid once per block, not per producer.

Owners (security on): ``InitProducerId`` records who each id went to under ``Z``, in the batch
that hands the id out, before it is answered (a store write per id, where without security one
is paid per block). ``IssueToken`` then gives a producer id to any session of that principal (a
restarted Kafka gateway, or another one, that a producer moved to holds no earlier token to show),
and to nobody else. The records expire as Kafka's producer ids do (``producer.id.expiration.ms``):
each retention pass deletes those older than ``producer_id_expiration_ms`` (7 days by default;
:mod:`robustmq.meta._quotas`), oldest first (ids are handed out in time order, so a pass reads
only what it deletes, at most :data:`MAX_OWNER_EXPIRIES_PER_PASS`). An expired id is taken up
only with proof (an earlier token of the principal naming it), as before.

Transactional ids (Kafka's ``transactional.id``): a writer that is replayed in another process (a
Spark task) names itself, and ``InitProducerId`` answers the same producer id for the same
(principal, transactional id) every time: a fresh id from the counter the first time, stored
under ``B`` in the same batch as the reservation it may need, before it is answered. The mapping
is per principal (with security off, every caller is ``anonymous``), so nobody can take over
another user's producer id by naming its transactional id. At most
:data:`MAX_TRANSACTIONAL_IDS` mappings (each at most :data:`MAX_TRANSACTIONAL_ID_BYTES` of UTF-8);
past it a new one is an ``InvalidRequest`` naming the limit (known ones still answer). Mappings
are never removed (as Kafka's expire only after a week unused; ours are a few dozen bytes).
"""

from __future__ import annotations

import itertools
import struct
import time
from contextlib import AbstractContextManager

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, Unavailable
from robustmq.security._acl import Acl, acl_matches_filter, validated_acl

from ._keys import text
from ._quotas import MetaQuotas
from ._store import MetaStore, WriteSet

__all__ = [
    "ACL",
    "ACL_VERSION_KEY",
    "MAX_ACLS",
    "MAX_OWNER_EXPIRIES_PER_PASS",
    "MAX_PRODUCER_ID",
    "MAX_TRANSACTIONAL_IDS",
    "MAX_TRANSACTIONAL_ID_BYTES",
    "PRODUCER_ID_BLOCK",
    "PRODUCER_ID_KEY",
    "PRODUCER_OWNER",
    "TRANSACTIONAL_ID",
    "AclControl",
    "acl_key",
]

ACL = b"C"
ACL_VERSION_KEY = b"K"
PRODUCER_ID_KEY = b"J"
TRANSACTIONAL_ID = b"B"
PRODUCER_OWNER = b"Z"
MAX_OWNER_EXPIRIES_PER_PASS = 10_000
_OWNER_BATCH = 100
MAX_TRANSACTIONAL_IDS = 1_000_000
MAX_TRANSACTIONAL_ID_BYTES = 1_000
MAX_ACLS = 10_000
PRODUCER_ID_BLOCK = 1_000
MAX_PRODUCER_ID = (1 << 63) - 1
_U64 = struct.Struct(">Q")


def acl_key(acl: Acl) -> bytes:
    return ACL + b"".join(
        text(part)
        for part in (
            acl.principal,
            acl.resource_type,
            acl.pattern,
            acl.resource_name,
            acl.operation,
            acl.permission,
        )
    )


def _decode_u64(raw: bytes | None) -> int:
    return 0 if raw is None else int(_U64.unpack(raw)[0])


def _display_order(acl: Acl) -> tuple[str, ...]:
    return (acl.resource_type, acl.resource_name, acl.pattern, acl.principal, acl.operation, acl.permission)


class AclControl:
    """ACL, ACL version and producer id operations of the Meta Service (see the module docstring)."""

    _store: MetaStore
    quotas: MetaQuotas

    def _locked(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the controller's

    def _load_acls(self) -> None:
        """Read ACLs, their version and the producer id reservation (the controller's start)."""
        self._acls: dict[bytes, Acl] = {
            key: validated_acl(pb.AclBinding.FromString(value)) for key, value in self._store.scan(ACL)
        }
        self._acl_version = _decode_u64(self._store.get(ACL_VERSION_KEY))
        self._producer_ids_reserved = max(1, _decode_u64(self._store.get(PRODUCER_ID_KEY)))
        self._next_producer_id = self._producer_ids_reserved
        self._transactional_ids = sum(1 for _ in self._store.scan(TRANSACTIONAL_ID))

    # -- the version ----------------------------------------------------------

    @property
    def acl_version(self) -> int:
        """Changes with every ACL or user change (0: none ever)."""
        return self._acl_version

    def _stage_acl_change(self, ws: WriteSet) -> int:
        """Stage the next ``acl_version`` in ``ws``; the caller calls :meth:`_acl_changed` with it
        once ``ws`` is durable (under the lock)."""
        version = self._acl_version + 1
        ws.put(ACL_VERSION_KEY, _U64.pack(version))
        return version

    def _acl_changed(self, version: int) -> None:
        self._acl_version = version

    # -- ACLs -----------------------------------------------------------------

    def create_acl(self, binding: pb.AclBinding) -> Acl:
        """Store ``binding`` (validated); the ACL as stored. An existing one changes nothing."""
        acl = validated_acl(binding)
        key = acl_key(acl)
        with self._locked():
            if key in self._acls:
                return acl
            if len(self._acls) >= MAX_ACLS:
                raise InvalidRequest(
                    f"the cluster has {MAX_ACLS} ACLs already: remove some, or use prefixed ones",
                    limit=MAX_ACLS,
                )
            ws = WriteSet()
            ws.put(key, acl.to_pb().SerializeToString())
            version = self._stage_acl_change(ws)
            ws.commit(self._store)
            self._acls[key] = acl
            self._acl_changed(version)
        return acl

    def delete_acl(self, binding: pb.AclBinding) -> int:
        """Remove the ACL ``binding`` names exactly (defaults as for create); 1, or 0 if there was none."""
        key = acl_key(validated_acl(binding))
        with self._locked():
            if key not in self._acls:
                return 0
            ws = WriteSet()
            ws.delete(key)
            version = self._stage_acl_change(ws)
            ws.commit(self._store)
            del self._acls[key]
            self._acl_changed(version)
        return 1

    def list_acls(
        self, principal: str = "", resource_type: str = "", resource_name: str = ""
    ) -> tuple[list[Acl], int]:
        """The ACLs a filter selects ("" matches anything), by resource then principal, and the version."""
        with self._locked():
            acls = [
                acl
                for acl in self._acls.values()
                if acl_matches_filter(acl, principal, resource_type.lower(), resource_name)
            ]
            acls.sort(key=_display_order)
            return acls, self._acl_version

    # -- producer ids ----------------------------------------------------------

    def init_producer_id(
        self, principal: str = "", transactional_id: str = "", *, record_owner: bool = False
    ) -> int:
        """A producer id never handed out before; with a ``transactional_id``, the one ``principal``
        got for it before, if any; ``record_owner``: a new id's owner is stored with it (see the
        module docstring)."""
        key = _transactional_key(principal, transactional_id) if transactional_id else None
        with self._locked():
            if key is not None:
                known = self._store.get(key)
                if known is not None:
                    return _decode_u64(known)
                if self._transactional_ids >= MAX_TRANSACTIONAL_IDS:
                    raise InvalidRequest(
                        f"the cluster has {MAX_TRANSACTIONAL_IDS} transactional ids already: reuse "
                        "them (a Spark sink's come from its query ids: keep a query's checkpoint)",
                        limit=MAX_TRANSACTIONAL_IDS,
                    )
            producer_id = self._next_producer_id
            if producer_id >= MAX_PRODUCER_ID:
                raise Unavailable("every producer id has been handed out")
            ws = WriteSet()
            reserved = self._producer_ids_reserved
            if producer_id >= reserved:
                reserved = min(MAX_PRODUCER_ID, producer_id + PRODUCER_ID_BLOCK)
                ws.put(PRODUCER_ID_KEY, _U64.pack(reserved))
            if key is not None:
                ws.put(key, _U64.pack(producer_id))
            if record_owner:
                ws.put(_owner_key(producer_id), _U64.pack(int(time.time() * 1000)) + principal.encode())
            ws.commit(self._store)  # nothing to write within a reserved block without a transactional id
            self._producer_ids_reserved = reserved
            self._next_producer_id = producer_id + 1
            if key is not None:
                self._transactional_ids += 1
            return producer_id

    def producer_id_owner(self, producer_id: int) -> str | None:
        """The principal ``producer_id`` was handed to, while its record lasts (None: unknown)."""
        if not 0 <= producer_id < MAX_PRODUCER_ID:
            return None
        with self._locked():
            value = self._store.get(_owner_key(producer_id))
        return None if value is None else value[_U64.size :].decode()

    def expire_producer_owners(self, now_ms: int) -> int:
        """Delete the owner records older than ``producer_id_expiration_ms``; how many (at most
        :data:`MAX_OWNER_EXPIRIES_PER_PASS`, the oldest first)."""
        cutoff = now_ms - self.quotas.producer_id_expiration_ms
        expired = 0
        while expired < MAX_OWNER_EXPIRIES_PER_PASS:
            with self._locked():  # in batches of 100: small etcd transactions, short lock holds
                ws = WriteSet()
                for key, value in itertools.islice(self._store.scan(PRODUCER_OWNER), _OWNER_BATCH):
                    if _decode_u64(value[: _U64.size]) >= cutoff:
                        break
                    ws.delete(key)
                if not ws:
                    return expired
                ws.commit(self._store)
                expired += len(ws.deletes)
        return expired


def _owner_key(producer_id: int) -> bytes:
    return PRODUCER_OWNER + _U64.pack(producer_id)


def _transactional_key(principal: str, transactional_id: str) -> bytes:
    raw = transactional_id.encode()
    if len(raw) > MAX_TRANSACTIONAL_ID_BYTES or any(ord(c) < 32 for c in transactional_id):
        raise InvalidRequest(
            f"transactional_id must be at most {MAX_TRANSACTIONAL_ID_BYTES} bytes of printable "
            f"UTF-8 (got {len(raw)} bytes)",
            field="transactional_id",
        )
    return TRANSACTIONAL_ID + text(principal) + text(transactional_id)

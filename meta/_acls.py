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

import struct
from contextlib import AbstractContextManager

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, Unavailable
from robustmq.security._acl import Acl, acl_matches_filter, validated_acl

from ._keys import text
from ._store import MetaStore, WriteSet

__all__ = [
    "ACL",
    "ACL_VERSION_KEY",
    "MAX_ACLS",
    "MAX_PRODUCER_ID",
    "MAX_TRANSACTIONAL_IDS",
    "MAX_TRANSACTIONAL_ID_BYTES",
    "PRODUCER_ID_BLOCK",
    "PRODUCER_ID_KEY",
    "TRANSACTIONAL_ID",
    "AclControl",
    "acl_key",
]

ACL = b"C"
ACL_VERSION_KEY = b"K"
PRODUCER_ID_KEY = b"J"
TRANSACTIONAL_ID = b"B"
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

    def init_producer_id(self, principal: str = "", transactional_id: str = "") -> int:
        """A producer id never handed out before; with a ``transactional_id``, the one ``principal``
        got for it before, if any (see the module docstring)."""
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
            ws.commit(self._store)  # nothing to write within a reserved block without a transactional id
            self._producer_ids_reserved = reserved
            self._next_producer_id = producer_id + 1
            if key is not None:
                self._transactional_ids += 1
            return producer_id


def _transactional_key(principal: str, transactional_id: str) -> bytes:
    raw = transactional_id.encode()
    if len(raw) > MAX_TRANSACTIONAL_ID_BYTES or any(ord(c) < 32 for c in transactional_id):
        raise InvalidRequest(
            f"transactional_id must be at most {MAX_TRANSACTIONAL_ID_BYTES} bytes of printable "
            f"UTF-8 (got {len(raw)} bytes)",
            field="transactional_id",
        )
    return TRANSACTIONAL_ID + text(principal) + text(transactional_id)

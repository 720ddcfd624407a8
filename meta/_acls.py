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
    "PRODUCER_ID_BLOCK",
    "PRODUCER_ID_KEY",
    "AclControl",
    "acl_key",
]

ACL = b"C"
ACL_VERSION_KEY = b"K"
PRODUCER_ID_KEY = b"J"
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

    def init_producer_id(self) -> int:
        """A producer id never handed out before (see the module docstring)."""
        with self._locked():
            producer_id = self._next_producer_id
            if producer_id >= MAX_PRODUCER_ID:
                raise Unavailable("every producer id has been handed out")
            if producer_id >= self._producer_ids_reserved:
                reserved = min(MAX_PRODUCER_ID, producer_id + PRODUCER_ID_BLOCK)
                ws = WriteSet()
                ws.put(PRODUCER_ID_KEY, _U64.pack(reserved))
                ws.commit(self._store)
                self._producer_ids_reserved = reserved
            self._next_producer_id = producer_id + 1
            return producer_id

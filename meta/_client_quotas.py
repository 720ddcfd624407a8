"""The Meta Service's per-principal quota entries (Kafka's client quotas; docs/operators.md, "Quotas").

:class:`ClientQuotaControl` is a mixin of :class:`~robustmq.meta._controller.MetaController`
under the controller's rules (one lock, validate first, one atomic batch, memory updated only
once the batch is durable). The storage nodes enforce the entries (``storage_node/node/_throttle``);
the model and its resolution rules are :mod:`robustmq._client_quotas`.

One key per principal, the validated ``QuotaEntry`` as the value::

    "M" text(principal)                       QuotaEntry (protobuf, validated)

A change (an entry set to other rates, or removed) moves ``acl_version`` in the same batch
(:meth:`~robustmq.meta._acls.AclControl._stage_acl_change`): nodes see it in heartbeat
answers, security on or off, and call ``ListQuotas``. Setting an entry to what it is, or
removing one that does not exist, changes nothing (and not the version). At most
:data:`~robustmq._client_quotas.MAX_QUOTA_ENTRIES` entries.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from robustmq._client_quotas import MAX_QUOTA_ENTRIES, Quota, validated_quota
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest

from ._keys import text
from ._store import MetaStore, WriteSet

__all__ = ["CLIENT_QUOTA", "ClientQuotaControl"]

CLIENT_QUOTA = b"M"


def _key(principal: str) -> bytes:
    return CLIENT_QUOTA + text(principal)


class ClientQuotaControl:
    """Set, remove and list quota entries (see the module docstring)."""

    _store: MetaStore

    def _locked(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the controller's

    def _stage_acl_change(self, ws: WriteSet) -> int:
        raise NotImplementedError  # AclControl's

    def _acl_changed(self, version: int) -> None:
        raise NotImplementedError  # AclControl's

    def _load_client_quotas(self) -> None:
        """Read the entries (the controller's start)."""
        self._client_quotas: dict[str, Quota] = {}
        for _key_bytes, value in self._store.scan(CLIENT_QUOTA):
            quota = validated_quota(pb.QuotaEntry.FromString(value))
            self._client_quotas[quota.principal] = quota

    def set_client_quota(self, entry: pb.QuotaEntry) -> Quota:
        """Store ``entry`` (validated), replacing the principal's former one; the entry as stored."""
        quota = validated_quota(entry)
        with self._locked():
            if self._client_quotas.get(quota.principal) == quota:
                return quota
            if quota.principal not in self._client_quotas and len(self._client_quotas) >= MAX_QUOTA_ENTRIES:
                raise InvalidRequest(
                    f"the cluster has {MAX_QUOTA_ENTRIES} quota entries already: remove some, or "
                    "let principals share the default entry '*'",
                    limit="max_quota_entries",
                    max=MAX_QUOTA_ENTRIES,
                )
            ws = WriteSet()
            ws.put(_key(quota.principal), quota.to_pb().SerializeToString())
            version = self._stage_acl_change(ws)
            ws.commit(self._store)
            self._client_quotas[quota.principal] = quota
            self._acl_changed(version)
        return quota

    def delete_client_quota(self, principal: str) -> bool:
        """Remove ``principal``'s entry; whether there was one."""
        principal = principal.strip()
        with self._locked():
            if principal not in self._client_quotas:
                return False
            ws = WriteSet()
            ws.delete(_key(principal))
            version = self._stage_acl_change(ws)
            ws.commit(self._store)
            del self._client_quotas[principal]
            self._acl_changed(version)
        return True

    def list_client_quotas(self) -> list[Quota]:
        """Every entry, the default ``*`` first, then by principal."""
        with self._locked():
            return sorted(
                self._client_quotas.values(), key=lambda quota: (quota.principal != "*", quota.principal)
            )

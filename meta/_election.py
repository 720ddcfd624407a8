"""Which ``robustmq meta`` process leads, decided by etcd: a lease-bound leader key.

The election (etcd's ``concurrency.Election`` pattern, without its library):

- **Campaign**: grant a lease of ``ttl_s`` seconds, then one ``Txn``: if
  ``{prefix}/leader`` does not exist, put this instance's advertised ``host:port``
  there, bound to the lease. The put's revision is the key's create revision: with
  the lease id it is the :class:`~robustmq.meta._etcd_store.Fence` every write of
  this term compares, so a write can land only while this term's key is in etcd.
- **Lead**: renew the lease every ``ttl_s / 3``. The term ends (``on_deposed``) when
  etcd says the lease is gone, when no renewal succeeded for ``ttl_s`` (the lease may
  have expired: the fence is lost at once, before etcd even says so), when a write
  found the fence gone or ended with an unknown outcome (:meth:`Fence.lose`), or on
  :meth:`LeaderElection.stop` (which revokes the lease: the others take over at once
  instead of after ``ttl_s``).
- **Follow**: read the leader key every ``poll_s``; its value is what
  :attr:`LeaderElection.leader` reports (the ``leader`` of ``NotLeader``); when it is
  gone (the leader's lease expired or was revoked), campaign.

A leader that was paused (SIGSTOP, a long GC, a VM migration) past its lease
resumes believing it leads, until its next renewal or write: the renewal says the
lease is gone, and any write it tries in between fails in etcd. It never writes
after its lease expired. Callbacks run on the election thread, one at a time;
``on_elected`` may take a while (it loads the whole state from etcd) and a failure
in it ends the term.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from robustmq.errors import RobustMQError

from ._etcd_client import EtcdClient, b64, unb64
from ._etcd_store import Fence

__all__ = ["DEFAULT_LEASE_TTL_S", "LeaderElection"]

# etcd's shortest lease with its default timing. A dead leader is replaced 1.3 to 2.5 s after
# it died (the lease runs out 1.3 to 2 s after the last renewal, etcd checks expiries every
# 0.5 s). On a 2-core machine at load average ~30 it cost one needless election in 900 s
# (renewals late by 2 s; 3 s: none in 300 s): harmless, the fence, not the lease, keeps writes safe.
DEFAULT_LEASE_TTL_S = 2
logger = logging.getLogger("robustmq.meta")


class LeaderElection:
    """One instance's side of the election (module docstring).

    Parameters
    ----------
    client
        The etcd connection.
    leader_key
        ``{prefix}/leader``.
    advertise
        This instance's client address (``host:port``), what followers answer with.
    on_elected
        Called with the term's fence once this instance leads (on the election thread).
    on_deposed
        Called with the reason when the term ends (on the election thread).
    ttl_s
        The leader lease, in whole seconds (etcd's unit; at least 2).
    poll_s
        How often a follower reads the leader key.
    """

    def __init__(
        self,
        client: EtcdClient,
        leader_key: bytes,
        advertise: str,
        *,
        on_elected: Callable[[Fence], None],
        on_deposed: Callable[[str], None],
        ttl_s: int = DEFAULT_LEASE_TTL_S,
        poll_s: float = 0.1,
    ) -> None:
        if ttl_s < 2:
            raise ValueError("the leader lease is at least 2 s (etcd's shortest)")
        self._client = client
        self._key = leader_key
        self.advertise = advertise
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self.ttl_s = ttl_s
        self._poll_s = poll_s
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._fence: Fence | None = None
        self._renewed = 0.0  # monotonic time the last successful renewal was sent
        self.leader = ""  # the leader's address as last seen ("" unknown); ours while we lead
        self.terms = 0  # terms this instance has led
        self._thread = threading.Thread(target=self._run, name="meta-election", daemon=True)

    @property
    def leading(self) -> bool:
        fence = self._fence
        return fence is not None and not fence.lost.is_set()

    def start(self) -> LeaderElection:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """End this instance's term if it leads (revoking its lease) and stop campaigning."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._fence is None:
                    self._follow_or_campaign()
                else:
                    self._renew()
            except Exception:  # the election must outlive any one failure; it retries
                logger.exception("the Meta Service election failed a step; retrying")
                self._wake.wait(self._poll_s)
        if self._fence is not None:
            self._end_term("stopping", revoke=True)

    def _follow_or_campaign(self) -> None:
        try:
            answer = self._client.range(self._key, timeout_s=max(1.0, self.ttl_s / 2))
        except RobustMQError as error:
            logger.warning("cannot read the Meta Service leader key from etcd: %s", error.message)
            self.leader = ""
            self._wake.wait(self._poll_s)
            return
        kvs = answer.get("kvs") or []
        if kvs:
            self.leader = unb64(kvs[0].get("value")).decode("utf-8", errors="replace")
            self._wake.wait(self._poll_s)
            return
        self.leader = ""
        self._campaign()

    def _campaign(self) -> None:
        lease = self._client.lease_grant(self.ttl_s)
        granted = time.monotonic()
        key = b64(self._key)
        try:
            answer = self._client.txn(
                [{"target": "CREATE", "key": key, "create_revision": "0", "result": "EQUAL"}],
                [{"request_put": {"key": key, "value": b64(self.advertise.encode()), "lease": str(lease)}}],
                [{"request_range": {"key": key}}],
                timeout_s=max(1.0, self.ttl_s / 2),
            )
        except RobustMQError:
            self._revoke(lease)  # maybe ours, maybe not: revoking removes the key if it was
            raise
        if not answer.get("succeeded"):
            self._revoke(lease)
            for response in answer.get("responses") or []:
                for kv in (response.get("response_range") or {}).get("kvs") or []:
                    self.leader = unb64(kv.get("value")).decode("utf-8", errors="replace")
            return
        revision = int(answer["header"]["revision"])
        fence = Fence(self._key, lease, revision, on_lost=self._lost, ttl_s=self.ttl_s, renewed=granted)
        self._fence = fence
        self._renewed = granted
        self.leader = self.advertise
        self.terms += 1
        logger.info(
            "this Meta Service (%s) leads now (etcd lease %x, leader key revision %d)",
            self.advertise,
            lease,
            revision,
        )
        try:
            self._on_elected(fence)
        except Exception as exc:
            logger.exception("taking over as the Meta Service leader failed")
            fence.lose(f"taking over failed: {exc}")
            self._end_term(f"taking over failed: {exc}", revoke=True)

    def _renew(self) -> None:
        fence = self._fence
        assert fence is not None
        interval_s = self.ttl_s / 3
        if fence.lost.is_set():
            self._end_term("a write found this term's fence gone", revoke=True)
            return
        sent = time.monotonic()
        try:
            ttl = self._client.lease_keepalive(fence.lease, timeout_s=interval_s)
        except RobustMQError as error:
            if time.monotonic() - self._renewed >= self.ttl_s:
                fence.lose(f"the lease was not renewed for {self.ttl_s} s ({error.message})")
                self._end_term(f"the etcd lease could not be renewed ({error.message})", revoke=True)
            else:
                logger.warning("renewing the Meta Service leader lease failed: %s", error.message)
            return
        if ttl <= 0:
            fence.lose("the etcd lease expired")
            self._end_term("the etcd lease expired (this process was paused or cut off)", revoke=False)
            return
        self._renewed = fence.renewed = sent
        self._wake.wait(max(0.0, interval_s - (time.monotonic() - sent)))

    def _lost(self, reason: str) -> None:
        """From a writer's thread: the fence is gone; the election thread ends the term now."""
        logger.warning("this Meta Service's writes are fenced: %s", reason)
        self._wake.set()

    def _end_term(self, reason: str, *, revoke: bool) -> None:
        fence = self._fence
        assert fence is not None
        fence.lose(reason)
        self._fence = None
        self.leader = ""
        self._wake.clear()
        logger.warning("this Meta Service (%s) no longer leads: %s", self.advertise, reason)
        try:
            self._on_deposed(reason)
        finally:
            if revoke:
                self._revoke(fence.lease)

    def _revoke(self, lease: int) -> None:
        try:
            self._client.lease_revoke(lease, timeout_s=1.0)
        except RobustMQError as error:  # it expires by itself within ttl_s
            logger.info("revoking etcd lease %x failed (%s); it expires by itself", lease, error.message)

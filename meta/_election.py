"""Which ``robustmq meta`` process leads, decided by etcd: a lease-bound leader key.

The election (etcd's ``concurrency.Election`` pattern, without its library):

- **Campaign**: grant a lease of ``ttl_s`` seconds, then one ``Txn``: if
  ``{prefix}/leader`` does not exist, put this instance's advertised ``host:port``
  there, bound to the lease. The put's revision is the key's create revision: with
  the lease id it is the :class:`~robustmq.meta._etcd_store.Fence` every write of
  this term compares, so a write can land only while this term's key is in etcd.
- **Lead**: renew the lease every ``ttl_s / 3`` and read the leader key back (a failed
  renewal is tried again after 0.1 s). The term ends (``on_deposed``) when etcd says the
  lease is gone, when the leader key no longer has this term's lease and create revision
  (deleted by hand while the lease lived: another instance may lead and write), when no
  renewal succeeded for ``ttl_s`` (the lease may
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
``on_elected`` may take a while (it loads the whole state from etcd, maybe for longer
than the lease): a thread of its own renews the lease meanwhile, and a renewal that
finds the term over loses the fence, which ``on_elected`` checks once loaded. A failure
in it ends the term. The lease's clock (:func:`~robustmq.meta._etcd_store.lease_clock`)
counts time the machine was suspended; every renewal counts from when it was *sent*.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from robustmq.errors import RobustMQError

from ._etcd_client import EtcdClient, b64, unb64
from ._etcd_store import Fence, lease_clock

__all__ = ["DEFAULT_LEASE_TTL_S", "LeaderElection"]

# etcd's shortest lease with its default timing. A dead leader is replaced 1.3 to 2.5 s after
# it died (the lease runs out 1.3 to 2 s after the last renewal, etcd checks expiries every
# 0.5 s). On a 2-core machine at load average ~30 it cost one needless election in 900 s
# (renewals late by 2 s; 3 s: none in 300 s): harmless, the fence, not the lease, keeps writes safe.
DEFAULT_LEASE_TTL_S = 2
_RETRY_PAUSE_S = 0.1  # after a failed renewal, before the next try
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
        self._renewed = 0.0  # lease_clock() when the last successful renewal was sent
        self._ending: tuple[str, bool] | None = None  # why the term ends, and whether to revoke
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
        # The lease runs from when etcd granted it, which is after this: the clock is read
        # before the grant is sent, never after its answer came back (that may be late).
        asked = lease_clock()
        lease = self._client.lease_grant(self.ttl_s)
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
        fence = Fence(self._key, lease, revision, on_lost=self._lost, ttl_s=self.ttl_s, renewed=asked)
        self._fence = fence
        self._renewed = asked
        self.leader = self.advertise
        self.terms += 1
        logger.info(
            "this Meta Service (%s) leads now (etcd lease %x, leader key revision %d)",
            self.advertise,
            lease,
            revision,
        )
        self._take_over(fence)

    def _take_over(self, fence: Fence) -> None:
        """``on_elected`` (here, on the election thread) while a thread of its own keeps the
        lease renewed: loading the state may take longer than the lease. If a renewal finds the
        term gone meanwhile, the fence is lost (``on_elected`` sees it) and the term ends next."""
        loaded = threading.Event()

        def keep_alive() -> None:
            pause_s = self.ttl_s / 3 - (lease_clock() - fence.renewed)
            while not loaded.wait(max(0.0, pause_s)) and not fence.lost.is_set():
                pause_s = self._renew_once(fence)

        keeper = threading.Thread(target=keep_alive, name="meta-election-keepalive", daemon=True)
        keeper.start()
        try:
            self._on_elected(fence)
        except Exception as exc:
            logger.exception("taking over as the Meta Service leader failed")
            self._lose(fence, f"taking over failed: {exc}", revoke=True)
        finally:
            loaded.set()
            keeper.join()

    def _renew(self) -> None:
        fence = self._fence
        assert fence is not None
        if fence.lost.is_set():
            reason, revoke = self._ending or ("a write found this term's fence gone", True)
            self._ending = None
            self._end_term(reason, revoke=revoke)
            return
        self._wake.wait(self._renew_once(fence))

    def _renew_once(self, fence: Fence) -> float:
        """Renew the lease and check that the leader key is still this term's (its lease and
        create revision: the key may have been deleted, and another instance elected, while the
        lease lives on); the seconds until the next renewal. If the term is over, the fence is
        lost (:meth:`_lose`)."""
        interval_s = self.ttl_s / 3
        sent = lease_clock()
        try:
            ttl = self._client.lease_keepalive(fence.lease, timeout_s=interval_s)
            kvs = self._client.range(self._key, timeout_s=interval_s).get("kvs") if ttl > 0 else None
        except RobustMQError as error:
            if lease_clock() - self._renewed >= self.ttl_s:
                self._lose(fence, f"the etcd lease could not be renewed for {self.ttl_s} s ({error.message})")
                return 0.0
            logger.warning("renewing the Meta Service leader lease failed: %s", error.message)
            return min(_RETRY_PAUSE_S, interval_s)  # not at once: a failure may come back fast
        if ttl <= 0:
            self._lose(fence, "the etcd lease expired (this process was paused or cut off)", revoke=False)
            return 0.0
        kv = (kvs or [{}])[0]
        if (
            int(kv.get("lease", 0)) != fence.lease
            or int(kv.get("create_revision", 0)) != fence.create_revision
        ):
            holder = unb64(kv["value"]).decode("utf-8", errors="replace") if kv.get("value") else ""
            self._lose(fence, f"the leader key is no longer this term's (held by {holder or 'nobody'})")
            return 0.0
        self._renewed = fence.renewed = sent
        return max(0.0, interval_s - (lease_clock() - sent))

    def _lose(self, fence: Fence, reason: str, *, revoke: bool = True) -> None:
        """The term is over: lose its fence (writes are refused from now on); the election
        thread ends it (``on_deposed``) with ``reason``."""
        self._ending = (reason, revoke)
        fence.lose(reason)

    def _lost(self, reason: str) -> None:
        """From a writer's thread: the fence is gone; the election thread ends the term now."""
        logger.warning("this Meta Service's writes are fenced: %s", reason)
        self._wake.set()

    def _end_term(self, reason: str, *, revoke: bool) -> None:
        fence = self._fence
        assert fence is not None
        fence.lose(reason)
        self._fence = None
        self._ending = None
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

"""A Meta Service proxy that loses or delays answers (or loses requests), for history runs and fault tests.

:class:`MetaProxy` is a gRPC server (``grpc.server`` with one generic handler)
that forwards every unary call, as raw bytes (``request_deserializer=None``,
no message is parsed), to the real Meta Service over its own channel, with
the caller's remaining deadline and metadata, and passes the answer back:
the response bytes, or the error's status code, details and trailing metadata
(so a typed error such as ``TopicAlreadyExists`` reaches the caller as the
service sent it). Storage nodes and clients are pointed at it with their
``--meta`` / ``connect()`` address.

Faults are :class:`Rule`\\ s, matched in order against each call's method name
(``CreateTopic``, ``UpdateIsr``, ...; empty: every method) and caller host
(the peer's IP address; empty: every caller); the first rule that matches and
whose seeded coin (``probability``) says yes acts on the call:

- ``drop``: the request **is forwarded and applied** upstream; its answer is
  thrown away and the call is held until the caller gives up (its deadline),
  so the caller sees ``DEADLINE_EXCEEDED`` (the client: ``RequestTimeout``)
  for a call that took effect: a lost answer;
- ``delay``: the answer is held for a delay drawn from ``delay_s`` after the
  request was applied (past the caller's deadline, the caller times out too).
- ``lose``: the request **is not forwarded**: the call is held until the caller
  gives up, as for ``drop``, but nothing was applied: a lost request.

A rule with ``count`` acts on the next ``count`` calls it matches, then stops
matching; without one it acts until :meth:`MetaProxy.clear`. ``clear`` heals:
no rule is left, and calls held for a drop are let go at once (each answers
``DEADLINE_EXCEEDED``, which its caller has already seen or will take as a
lost answer); it returns the statistics since the previous ``clear``. Only
unary calls are proxied (every Meta Service call is
unary); another kind is answered ``UNIMPLEMENTED``.

The module also runs as a process (``python -m tests.e2e._meta_proxy
--listen HOST:PORT --upstream HOST:PORT --seed N``), so it can live in a
network namespace of :class:`tests.e2e._netns.NetLab`: it prints ``ready``,
then takes one JSON command per line on stdin (``{"op": "rules", "rules":
[...]}``, ``{"op": "clear"}``, ``{"op": "stats"}``) and answers each with one
JSON line (``{"ok": true, "stats": {...}}``); it exits when stdin closes.
:class:`ProxyProcess` is the parent's handle on such a process.

Every wait is bounded: a drop holds a call at most ``MAX_HOLD_S``; the
upstream call carries the caller's deadline (``MAX_HOLD_S`` if it has none).
Thread-safety: rules and statistics are guarded by one lock; each call runs
on the server's thread pool (``WORKERS`` threads, so held calls do not starve
the others).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.e2e._procs import JsonLineProcess, serve_json_lines

__all__ = ["MAX_HOLD_S", "MetaProxy", "ProxyProcess", "Rule"]

MAX_HOLD_S = 60.0
WORKERS = 128
_MESSAGE_BYTES = 64 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_receive_message_length", _MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_SKIPPED_METADATA = ("user-agent", "grpc-")  # set by each channel itself


@dataclass(frozen=True, slots=True)
class Rule:
    """What to do to which calls; see the module docstring."""

    action: str  # "drop" | "delay" | "lose"
    methods: tuple[str, ...] = ()
    callers: tuple[str, ...] = ()
    probability: float = 1.0
    count: int | None = None
    delay_s: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        if self.action not in ("drop", "delay", "lose"):
            raise ValueError(f"a rule drops, delays or loses, not {self.action!r}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability {self.probability} is not in [0, 1]")

    @classmethod
    def of(cls, data: dict[str, Any]) -> Rule:
        values = dict(data)
        for key in ("methods", "callers", "delay_s"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def matches(self, method: str, caller: str) -> bool:
        return (not self.methods or method in self.methods) and (not self.callers or caller in self.callers)


@dataclass(slots=True)
class _Armed:
    rule: Rule
    left: int | None


@dataclass(slots=True)
class _Stats:
    calls: Counter[str] = field(default_factory=Counter)  # method -> calls forwarded
    dropped: Counter[str] = field(default_factory=Counter)  # "method caller" -> answers lost
    delayed: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)  # "method caller" -> requests never forwarded
    upstream_errors: Counter[str] = field(default_factory=Counter)  # "method STATUS"

    def view(self) -> dict[str, dict[str, int]]:
        names = ("calls", "dropped", "delayed", "lost", "upstream_errors")
        return {name: dict(getattr(self, name)) for name in names}


def _caller_host(peer: str) -> str:
    """``ipv4:10.1.0.3:4567`` -> ``10.1.0.3``; ``ipv6:[::1]:80`` -> ``::1``; else as given."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


class MetaProxy:
    """See the module docstring. ``start()`` binds; ``stop()`` lets held calls go and stops."""

    def __init__(self, listen: str, upstream: str, *, seed: int = 0) -> None:
        self.listen = listen
        self.upstream = upstream
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rules: list[_Armed] = []
        self._stats = _Stats()
        self._healed = threading.Event()  # set by clear(): held calls are let go
        self._channel = grpc.insecure_channel(upstream, options=_OPTIONS)
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="meta-proxy"), options=_OPTIONS
        )
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self.port = 0

    def start(self) -> MetaProxy:
        host, _, port = self.listen.rpartition(":")
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise RuntimeError(f"the Meta Service proxy cannot listen at {self.listen}")
        self._server.start()
        return self

    @property
    def address(self) -> str:
        return f"{self.listen.rpartition(':')[0]}:{self.port}"

    def stop(self) -> None:
        self._healed.set()
        self._server.stop(grace=1.0).wait(10.0)
        self._channel.close()

    def __enter__(self) -> MetaProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------

    def set_rules(self, rules: Sequence[Rule]) -> None:
        """Replace the rules (calls already held stay held until ``clear``)."""
        with self._lock:
            self._rules = [_Armed(rule, rule.count) for rule in rules]
            self._healed.clear()

    def clear(self) -> dict[str, dict[str, int]]:
        """Heal: no rule; held calls are let go. Returns the statistics since the last clear (and
        starts counting again)."""
        with self._lock:
            self._rules = []
            self._healed.set()
            stats, self._stats = self._stats, _Stats()
            return stats.view()

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return self._stats.view()

    def _decide(self, method: str, caller: str) -> tuple[str, float] | None:
        with self._lock:
            for armed in self._rules:
                if armed.left == 0 or not armed.rule.matches(method, caller):
                    continue
                if self._rng.random() >= armed.rule.probability:
                    continue
                if armed.left is not None:
                    armed.left -= 1
                key = f"{method} {caller}"
                if armed.rule.action in ("drop", "lose"):
                    (self._stats.dropped if armed.rule.action == "drop" else self._stats.lost)[key] += 1
                    return armed.rule.action, 0.0
                self._stats.delayed[key] += 1
                return "delay", self._rng.uniform(*armed.rule.delay_s)
        return None

    # -- the call ----------------------------------------------------------------------

    def forward(self, method_path: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        method = method_path.rsplit("/", 1)[-1]
        caller = _caller_host(context.peer())
        remaining = context.time_remaining()
        timeout = MAX_HOLD_S if remaining is None else max(0.001, min(remaining, MAX_HOLD_S))
        metadata = [
            (key, value)
            for key, value in context.invocation_metadata()
            if not key.startswith(_SKIPPED_METADATA) and not key.startswith(":")
        ]
        decision = self._decide(method, caller)
        if decision is not None and decision[0] == "lose":
            self._hold(context)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"the test proxy lost the {method} request")
        call = self._channel.unary_unary(method_path, request_serializer=None, response_deserializer=None)
        with self._lock:
            self._stats.calls[method] += 1
        answer: bytes | None = None
        failure: grpc.RpcError | None = None
        try:
            answer, _ = call.with_call(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as error:
            failure = error
            with self._lock:
                self._stats.upstream_errors[f"{method} {error.code().name}"] += 1
        if decision is not None and decision[0] == "drop":
            self._hold(context)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"the test proxy lost the answer to {method}")
        if decision is not None:
            self._healed.wait(decision[1])
        if failure is not None:
            trailing = failure.trailing_metadata() if hasattr(failure, "trailing_metadata") else None
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
            context.abort(failure.code(), failure.details() or "")
        assert answer is not None
        return answer

    def _hold(self, context: grpc.ServicerContext) -> None:
        """Until the caller gave up (its deadline passed or it cancelled), a heal, or MAX_HOLD_S."""
        ended = threading.Event()
        if not context.add_callback(ended.set):
            return  # already over
        deadline = time.monotonic() + MAX_HOLD_S
        while not ended.is_set() and not self._healed.is_set() and time.monotonic() < deadline:
            ended.wait(0.05)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: MetaProxy) -> None:
        self._proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method

        def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
            return self._proxy.forward(path, request, context)

        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=None, response_serializer=None
        )


# -- the proxy as a process (inside a network namespace) -------------------------------------


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="a Meta Service proxy that loses or delays calls")
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    proxy = MetaProxy(args.listen, args.upstream, seed=args.seed).start()

    def handle(command: dict[str, Any]) -> dict[str, Any]:
        if command["op"] == "rules":
            proxy.set_rules([Rule.of(rule) for rule in command["rules"]])
            return {}
        if command["op"] == "clear":
            return {"stats": proxy.clear()}
        if command["op"] == "stats":
            return {"stats": proxy.stats()}
        raise ValueError(f"unknown op {command['op']!r}")

    try:
        serve_json_lines(handle)
    finally:
        proxy.stop()
    return 0


class ProxyProcess(JsonLineProcess):
    """The parent's handle on ``python -m tests.e2e._meta_proxy`` run under ``wrapper`` (for
    example ``ip netns exec NS``)."""

    def __init__(
        self,
        listen: str,
        upstream: str,
        *,
        seed: int,
        wrapper: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        argv = [*wrapper, sys.executable, "-m", "tests.e2e._meta_proxy"]
        super().__init__(
            [*argv, "--listen", listen, "--upstream", upstream, "--seed", str(seed)], log_path=log_path
        )
        self.address = listen

    def set_rules(self, rules: Sequence[Rule]) -> None:
        self.command({"op": "rules", "rules": [asdict(rule) for rule in rules]})

    def clear(self) -> dict[str, Any]:
        return dict(self.command({"op": "clear"})["stats"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

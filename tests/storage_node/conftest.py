"""Fixtures of the storage node tests: a node and a Meta Service over a faulty network."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._fork_server import ForkServer
from tests.storage_node._led import Led, start_led
from tests.storage_node._meta_network import Cluster, start_cluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(methods=..., budget=..., **node_settings)``: a started :class:`Cluster`."""
    started: list[Cluster] = []

    def make(**settings: Any) -> Cluster:
        cluster = start_cluster(tmp_path / f"cluster-{len(started)}", **settings)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture
def lead(tmp_path: Path) -> Iterator[Callable[..., Led]]:
    """``lead(spares=..., lose=..., **node_settings)``: a started :class:`Led` (stopped at the end)."""
    started: list[Led] = []

    def make(**settings: Any) -> Led:
        led = start_led(tmp_path / f"led-{len(started)}", **settings)
        started.append(led)
        return led

    yield make
    for led in started:
        led.stop()


@pytest.fixture(scope="module")
def writers(request: pytest.FixtureRequest) -> Iterator[ForkServer]:
    """The module's ``WRITER`` (a writer child of a kill test) forked from one process that
    imported it once: the imports cost most of each round (tests/e2e/_fork_server.py)."""
    with ForkServer(request.module.WRITER) as server:
        yield server

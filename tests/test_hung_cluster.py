"""Saves while the whole Redis Cluster hangs (every node SIGSTOPped): each pays its own round trips.

Found by the fault run ``redis-hung`` on a cluster (``scripts/chaos --redis-cluster``): after a
node timed out, redis-py refreshed its map of slots on the saving thread, asking each node in
turn (a timeout each) under one lock, so the saves of a process's threads waited for each
other's refreshes: 0.4 s for the first of six threads, 1.9 s for the last, where a standalone
Redis costs each save its own round trip of ``SCHEDULE_TIMEOUT``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from chaos.servers import PrivateRedisCluster
from order_timeout.models import Order

from .conftest import finish
from .helpers import RecordingConnection, Traffic

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

THREADS = 6
TRAFFIC = Traffic()


class Recorded(RecordingConnection):
    """Every node connection of the hung cluster's alias records into ``TRAFFIC`` (redis-py's
    cluster passes a connection class to its nodes, but no argument of its own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, traffic=TRAFFIC, **kwargs)


@pytest.fixture
def hung_cluster(tmp_path: Path, settings: Any) -> Iterator[PrivateRedisCluster]:
    """The queue on a private cluster of three primaries, every save's round trip recorded."""
    cluster = PrivateRedisCluster(tmp_path / "cluster")
    cluster.start(fresh=True)
    settings.CACHES = {**settings.CACHES, "hung": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": cluster.url.rsplit("/", 1)[0],
        "OPTIONS": {"CONNECTION_FACTORY": "order_timeout.redis_cluster.ClusterConnectionFactory",
                    "CONNECTION_POOL_KWARGS": {"connection_class": Recorded}}}}
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "hung"}
    TRAFFIC.trips.clear()
    try:
        yield cluster
    finally:
        cluster.kill()


def test_saves_from_many_threads_to_a_hung_cluster_each_wait_only_their_own_round_trips(hung_cluster):
    def checkout(number: int) -> None:
        try:
            Order.objects.create(expires_at=timezone.now() + timedelta(minutes=30))
        finally:
            connection.close()

    # Every thread saved once: its connections are open, the script loaded, as in a web process.
    warm = [threading.Thread(target=checkout, args=(n,), name=f"request-{n}") for n in range(THREADS)]
    for thread in warm:
        thread.start()
    for thread in warm:
        finish(thread)
    before = len(TRAFFIC.trips)

    hung_cluster.freeze()
    try:
        requests = [threading.Thread(target=checkout, args=(n,), name=f"request-{n}") for n in range(THREADS)]
        for thread in requests:
            thread.start()
        for thread in requests:
            finish(thread)
    finally:
        hung_cluster.thaw()

    during = TRAFFIC.trips[before:]
    waited = Counter(trip.thread for trip in during
                     if trip.outcome == "timed out" and trip.thread.startswith("request-"))
    # CLUSTER SLOTS (or SHARDS): the map's refresh.
    asked_for_the_map = [trip.thread for trip in during if "CLUSTER" in trip.commands]
    assert Order.objects.count() == 2 * THREADS  # every save committed, Redis or not
    assert set(waited) == {f"request-{n}" for n in range(THREADS)}
    # The docs' bound for a hung Redis: about three round trips (a connection, the script, a reload).
    assert max(waited.values()) <= 3, waited
    assert not [name for name in asked_for_the_map if name.startswith("request-")]

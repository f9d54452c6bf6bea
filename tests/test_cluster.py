"""The queue on a Redis Cluster: shards spread over the masters, and a failover heals itself."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db.models import Count
from django.test import override_settings
from django.utils import timezone
from django_redis.pool import ConnectionFactory
from redis import Redis
from redis.cluster import RedisCluster

from chaos.servers import ClusterNode, PrivateRedisCluster
from order_timeout import schedule
from order_timeout.checks import check_redis_permissions
from order_timeout.conf import settings as order_settings
from order_timeout.models import Order
from order_timeout.queue import TimeoutQueue
from order_timeout.timers.members import deadline_score
from testproject.shop.models import Expiry

from .conftest import free_port, wait_for
from .helpers import count_in, leased_members, pending_count, score_of

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.parametrize("redis_backend", ["cluster"], indirect=True)]


def masters(client: RedisCluster) -> list:
    return client.get_primaries()


def test_sixteen_shards_spread_their_members_over_all_three_masters(redis_backend, queue, make_order):
    orders = [make_order(in_seconds=600) for _ in range(300)]
    shards = {queue.shard_for(str(o.pk)).index for o in orders}

    per_master = {node.name: node.redis_connection.dbsize() for node in masters(queue.client)}

    assert len(per_master) == 3 and all(per_master.values()), per_master
    assert pending_count(queue) == 300
    assert len(shards) == 16


def test_a_consumer_closes_orders_of_every_shard(redis_backend, queue, make_order, consumer):
    orders = [make_order(in_seconds=-1) for _ in range(100)]
    assert len({queue.shard_for(str(o.pk)).index for o in orders}) == 16

    stats = consumer(batch_size=50).run(once=True)

    assert stats.closed == 100 and count_in(Order, "closed") == 100
    assert pending_count(queue) == 0 and leased_members(queue) == []


def cluster_alias(settings: Any, **changes: Any) -> Any:
    """The "cluster" cache alias with some of its entry changed (LOCATION, OPTIONS)."""
    entry = settings.CACHES["cluster"]
    return override_settings(CACHES={**settings.CACHES, "cluster": {**entry, **changes}})


@pytest.fixture(params=["comma-separated", "list"])
def dead_seed_first(request: pytest.FixtureRequest, settings: Any, redis_backend: str) -> Iterator[Any]:
    """LOCATION names a node that is gone (nothing listens there) first, then a live one."""
    dead, live = f"redis://127.0.0.1:{free_port()}", settings.CACHES["cluster"]["LOCATION"]
    location = f"{dead},{live}" if request.param == "comma-separated" else [dead, live]
    with cluster_alias(settings, LOCATION=location):
        yield location


def test_a_location_whose_first_seed_is_gone_still_schedules_claims_reports_and_rebuilds(
        dead_seed_first, make_order, consumer):
    due = [make_order(in_seconds=-1) for _ in range(20)]  # scheduled through the saves' own client
    waiting = make_order(in_seconds=600)
    queue = TimeoutQueue.from_settings()
    assert pending_count(queue) == 21

    stats = consumer(batch_size=50).run(once=True)

    assert stats.closed == 20 and all(Order.objects.get(pk=o.pk).status == "closed" for o in due)
    out = io.StringIO()
    call_command("order_timeout_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["pending"] == 1
    queue.client.zrem(queue.shard_for(str(waiting.pk)).keys.pending, str(waiting.pk))  # lost
    call_command("order_timeout_compensate", "--rebuild", stdout=out)
    assert score_of(queue, str(waiting.pk)) == deadline_score(waiting.expires_at)


def test_connection_pool_kwargs_reach_every_nodes_connections(settings, redis_backend, make_order):
    options = {**settings.CACHES["cluster"]["OPTIONS"],
               "CONNECTION_POOL_KWARGS": {"client_name": "order-timeout-kwargs"}}
    with cluster_alias(settings, OPTIONS=options):
        make_order(in_seconds=600)  # the saves' client
        for client in (TimeoutQueue.from_settings().client, TimeoutQueue.for_saves().client):
            names = {node.name: node.redis_connection.client_getname() for node in client.get_nodes()}

            assert len(names) == 6 and set(names.values()) == {"order-timeout-kwargs"}, names


class PlainClusterFactory(ConnectionFactory):
    """A shop's own connection factory: a RedisCluster redis-py's way, nothing of this app's."""

    def get_connection(self, params: dict[str, Any]) -> Any:
        return RedisCluster.from_url(params["url"], socket_timeout=2)


def test_a_cluster_client_built_by_another_factory_schedules_through_a_bounded_twin(
        settings, redis_backend, make_order):
    options = {**settings.CACHES["cluster"]["OPTIONS"],
               "CONNECTION_FACTORY": "tests.test_cluster.PlainClusterFactory"}
    with cluster_alias(settings, OPTIONS=options):
        order = make_order(in_seconds=600)
        bounded = TimeoutQueue.for_saves().client

        assert score_of(TimeoutQueue.from_settings(), str(order.pk)) is not None
        assert isinstance(bounded, RedisCluster) and len(bounded.get_nodes()) == 6
        pools = [node.redis_connection.connection_pool for node in bounded.get_nodes()]
        assert {pool.connection_kwargs["socket_timeout"] for pool in pools} == {order_settings.SCHEDULE_TIMEOUT}


def test_the_deploy_checks_probe_of_the_users_commands_runs_on_a_cluster(redis_backend):
    """Scripts, sharded pub/sub and key commands, each routed to the node of the queue's probe key."""
    assert check_redis_permissions() == []


def node_of(client: RedisCluster, key: str) -> tuple[str, int]:
    node = client.get_node_from_key(key)
    return node.host, int(node.port)


def cluster_is_ok(cluster: PrivateRedisCluster, dead: ClusterNode) -> bool:
    survivor = next(node for node in cluster.nodes if node is not dead)
    return b"cluster_state:ok" in Redis(port=survivor.port).execute_command("CLUSTER", "INFO")


def every_master_has_a_replica(client: RedisCluster) -> bool:
    replicas = [node for node in client.get_nodes() if node.server_type == "replica"]
    return len(replicas) >= 3


@pytest.fixture
def failover_cluster(redis_backend: str, tmp_path: Path) -> Iterator[PrivateRedisCluster]:
    """A cluster of the test's own, three primaries each with a replica: a test that fails a node
    over must not take the shared cluster (other workers' tests run on it) down with it."""
    cluster = PrivateRedisCluster(tmp_path / "cluster", replicas=1)
    cluster.start(fresh=True)
    # The replicas are in the slot table before a client reads it (it reads it once).
    wait_for(lambda: all(len(served) >= 4 for served in
                         Redis(port=cluster.port).execute_command("CLUSTER", "SLOTS")), timeout=30)
    location = cluster.url.rsplit("/", 1)[0]
    # The shared cluster's alias, moved: consumer processes build it from REDIS_CLUSTER_URL.
    caches = {**django_settings.CACHES, "cluster": {**django_settings.CACHES["cluster"], "LOCATION": location}}
    try:
        with override_settings(CACHES=caches):
            yield cluster
    finally:
        cluster.kill()


@pytest.mark.slow
def test_a_failover_of_the_master_holding_a_shard_heals_itself(failover_cluster, consumer_process, order_model):
    """Consumers and their wake-ups ride through; nothing closes twice; every due order closes."""
    queue = TimeoutQueue.from_settings()
    wait_for(lambda: every_master_has_a_replica(queue.client), timeout=30)
    start = timezone.now() + timedelta(seconds=2)
    orders = order_model.objects.bulk_create(
        [order_model(expires_at=start + timedelta(milliseconds=20 * i)) for i in range(300)])
    schedule(orders)
    victim_port = node_of(queue.client, queue.shards[0].keys.pending)[1]
    victim = next(node for node in failover_cluster.nodes if node.port == victim_port)
    for node in masters(queue.client):  # what was scheduled has reached the replicas
        node.redis_connection.execute_command("WAIT", 1, 2000)
    # Leases of 2 s that heartbeats keep; a batch may run 10 s (a busy machine's batch that waits on
    # the failover is not the stuck receiver BATCH_TIME_LIMIT is for).
    env = {"ORDER_TIMEOUT_LEASE_SECONDS": "2", "ORDER_TIMEOUT_HEARTBEAT_SECONDS": "0.5",
           "ORDER_TIMEOUT_BATCH_TIME_LIMIT": "10", "ORDER_TIMEOUT_MAX_WAIT": "30",
           "REDIS_CLUSTER_URL": failover_cluster.url.rsplit("/", 1)[0]}
    workers = [consumer_process(env=env) for _ in range(2)]
    wait_for(lambda: Expiry.objects.count() > 50)

    victim.kill()
    try:
        # As long as the failover and the consumers' backoff take on a busy machine: the test's own time.
        wait_for(lambda: Expiry.objects.count() == 300)
        wait_for(lambda: cluster_is_ok(failover_cluster, victim))
        # The wake-up subscriptions came back: an order due in 1 s on the failed-over shard
        # closes though the consumers would otherwise sleep MAX_WAIT (30 s).
        late = next(o for o in (order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=1))
                                for _ in range(200))
                    if queue.shard_for(str(o.pk)).index == 0 and score_of(queue, str(o.pk)))
        wait_for(lambda: order_model.objects.get(pk=late.pk).status == order_model.TIMEOUT_CLOSED_STATUS,
                 timeout=20)
    except AssertionError as failed:
        raise AssertionError(f"{failed}\n" + "\n".join(f"-- consumer {n}:\n{worker.err[-3000:]}"
                                                       for n, worker in enumerate(workers))) from None
    finally:
        for worker in workers:
            worker.kill()

    assert not Expiry.objects.values("order_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert count_in(order_model, "closed") >= 301

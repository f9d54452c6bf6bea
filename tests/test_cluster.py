"""The queue on a Redis Cluster: shards spread over the masters, and a failover heals itself."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models import Count
from django.utils import timezone
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError

from order_timeout import schedule
from order_timeout.models import Order
from testproject.shop.models import Expiry

from .conftest import wait_for
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


def node_of(client: RedisCluster, key: str) -> tuple[str, int]:
    node = client.get_node_from_key(key)
    return node.host, int(node.port)


def kill_node(port: int) -> None:
    pid = Redis(host="127.0.0.1", port=port).info("server")["process_id"]
    os.kill(int(pid), signal.SIGKILL)


def restart_node(port: int) -> None:
    """Start a killed node again as scripts/lib/prepare.sh did; it rejoins as a replica."""
    directory = Path(os.environ.get("CLUSTER_DIR", "/tmp/order-timeout-cluster")) / str(port)
    subprocess.run(["redis-server", "--daemonize", "yes", "--port", str(port), "--bind", "127.0.0.1",
                    "--dir", str(directory), "--cluster-enabled", "yes", "--cluster-config-file",
                    "nodes.conf", "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                    "--logfile", str(directory / "redis.log")], check=True)
    wait_for(lambda: replication(port).get("master_link_status") == "up", timeout=30)
    # Every node has heard that it is a replica now: nobody sends it writes any more.
    wait_for(lambda: all("slave" in line.split()[2].split(",")
                         for other in cluster_ports() for line in cluster_nodes(other)
                         if f"127.0.0.1:{port}@" in line), timeout=30)


def replication(port: int) -> dict:
    """The node's INFO replication, or nothing while it is still starting."""
    try:
        return Redis(port=port).info("replication")
    except ConnectionError:
        return {}


def cluster_ports() -> list[int]:
    return [int(port) for port in os.environ.get("CLUSTER_PORTS", "7101 7102 7103 7104 7105 7106").split()]


def cluster_nodes(port: int) -> list[str]:
    try:
        return Redis(port=port).execute_command("CLUSTER", "NODES").decode().splitlines()
    except ConnectionError:
        return []


def cluster_is_ok(dead_port: int) -> bool:
    survivor = next(port for port in cluster_ports() if port != dead_port)
    return b"cluster_state:ok" in Redis(port=survivor).execute_command("CLUSTER", "INFO")


def every_master_has_a_replica(client: RedisCluster) -> bool:
    replicas = [node for node in client.get_nodes() if node.server_type == "replica"]
    return len(replicas) >= 3


@pytest.mark.slow
def test_a_failover_of_the_master_holding_a_shard_heals_itself(redis_backend, queue, consumer_process,
                                                              order_model):
    """Consumers and their wake-ups ride through; nothing closes twice; every due order closes."""
    wait_for(lambda: every_master_has_a_replica(queue.client), timeout=30)
    start = timezone.now() + timedelta(seconds=2)
    orders = order_model.objects.bulk_create(
        [order_model(expires_at=start + timedelta(milliseconds=20 * i)) for i in range(300)])
    schedule(orders)
    victim_port = node_of(queue.client, queue.shards[0].keys.pending)[1]
    for node in masters(queue.client):  # what was scheduled has reached the replicas
        node.redis_connection.execute_command("WAIT", 1, 2000)
    env = {"ORDER_TIMEOUT_LEASE_SECONDS": "2", "ORDER_TIMEOUT_MAX_WAIT": "30"}
    workers = [consumer_process(env=env) for _ in range(2)]
    wait_for(lambda: Expiry.objects.count() > 50, timeout=60)

    kill_node(victim_port)
    try:
        wait_for(lambda: Expiry.objects.count() == 300, timeout=90)
        wait_for(lambda: cluster_is_ok(victim_port), timeout=30)
        # The wake-up subscriptions came back: an order due in 1 s on the failed-over shard
        # closes though the consumers would otherwise sleep MAX_WAIT (30 s).
        late = next(o for o in (order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=1))
                                for _ in range(200))
                    if queue.shard_for(str(o.pk)).index == 0 and score_of(queue, str(o.pk)))
        wait_for(lambda: order_model.objects.get(pk=late.pk).status == order_model.TIMEOUT_CLOSED_STATUS,
                 timeout=20)
    finally:
        restart_node(victim_port)
        for worker in workers:
            worker.kill()

    assert not Expiry.objects.values("order_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert count_in(order_model, "closed") >= 301

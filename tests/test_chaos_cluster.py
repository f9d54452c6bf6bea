"""The chaos harness's private Redis Cluster (``scripts/chaos --redis-cluster``), outside a fault run.

The Redis scenarios kill, freeze and restart the queue's Redis without knowing whether it is
one server or a cluster, so the cluster must come back the way one server does: empty after a
restart without persistence, with what it held at its snapshot after one from a snapshot, and
serving every slot again each time, on the same ports.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from chaos.servers import PrivateRedisCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server and redis-cli"),
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[PrivateRedisCluster]:
    servers = PrivateRedisCluster(tmp_path / "cluster")
    servers.start(fresh=True)
    try:
        yield servers
    finally:
        servers.kill()


def client(cluster: PrivateRedisCluster) -> RedisCluster:
    return RedisCluster.from_url(cluster.url, socket_timeout=2)


def keys_on_every_node(client: RedisCluster, count: int = 30) -> list[str]:
    """``count`` keys, written through the cluster, whose slots fall on more than one node."""
    keys = [f"{{tag{index}}}:pending" for index in range(count)]
    for key in keys:
        client.set(key, "1")
    assert len({client.get_node_from_key(key).name for key in keys}) == PrivateRedisCluster.size
    return keys


def test_a_fresh_cluster_serves_every_slot_on_three_primaries(cluster: PrivateRedisCluster) -> None:
    info = redis.Redis(port=cluster.port).cluster("info")
    assert (info["cluster_state"], info["cluster_slots_ok"], info["cluster_size"]) == ("ok", "16384", "3")


def test_a_cluster_killed_and_restarted_without_persistence_comes_back_empty_with_its_slots(
        cluster: PrivateRedisCluster) -> None:
    keys = keys_on_every_node(client(cluster))
    ports = [node.port for node in cluster.nodes]
    cluster.kill()
    assert not cluster.running
    cluster.start()
    after = client(cluster)
    assert [node.port for node in cluster.nodes] == ports
    assert after.exists(*keys) == 0
    after.set(keys[0], "again")  # every slot is served again
    assert after.get(keys[0]) == b"again"


def test_a_cluster_restarted_after_a_snapshot_of_every_primary_has_what_it_held_then(
        cluster: PrivateRedisCluster) -> None:
    before = client(cluster)
    kept = keys_on_every_node(before)
    before.save(target_nodes=RedisCluster.PRIMARIES)
    lost = [f"{{late{index}}}:pending" for index in range(30)]
    for key in lost:
        before.set(key, "1")
    cluster.kill()
    cluster.start()
    after = client(cluster)
    assert (after.exists(*kept), after.exists(*lost)) == (len(kept), 0)


def test_a_frozen_cluster_answers_again_once_thawed(cluster: PrivateRedisCluster) -> None:
    cluster.freeze()
    with pytest.raises(redis.TimeoutError):
        redis.Redis(port=cluster.port, socket_timeout=0.3).ping()
    cluster.thaw()
    assert cluster.answers()

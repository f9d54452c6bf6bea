"""Scale measurements: a bulk ``schedule()``, and one burst on a Redis Cluster with 1 and with 16 shards.

The cluster is the local one ``scripts/lib/prepare.sh`` starts (3 masters, 3
replicas, all on this machine), reached through ``REDIS_CLUSTER_URL``; the
harness empties it, like its own Redis database.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.test import override_settings
from django.utils import timezone
from django_redis import get_redis_connection

from order_timeout import schedule
from order_timeout.models import Order
from order_timeout.queue import SCHEDULE_SLICE, TimeoutQueue
from order_timeout.timers.members import now_score

from .ownership import keep_mark
from .recorder import read_commits
from .systems import Ours
from .workloads import make_orders, reset, script_names


def bulk_schedule(size: int) -> dict[str, Any]:
    """One ``schedule()`` of ``size`` members: how long, how many script calls, how long each held Redis.

    Every command is logged (SLOWLOG at 0 us, long enough for all of them:
    Redis logs a script's inner commands too); the schedule script's own
    calls are picked out by its SHA, so ``script_calls`` counts calls, and
    their durations are Redis's own.
    """
    queue = TimeoutQueue.from_settings()
    client = queue.client
    client.flushdb()
    expected_calls = -(-size // SCHEDULE_SLICE) * len(queue.shards)
    log_size = 4 * expected_calls + 1000
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", log_size)
    client.slowlog_reset()
    due = now_score(timezone.now()) + 3_600_000
    began = time.perf_counter()
    queue.schedule({str(pk): due + pk % 1000 for pk in range(1, size + 1)})
    elapsed = time.perf_counter() - began
    names = script_names()
    calls = sorted(entry["duration"] for entry in client.slowlog_get(log_size)
                   if entry["command"].split(b" ")[0].lower() == b"evalsha"
                   and names.get(entry["command"].split(b" ")[1].decode()) == "schedule")
    client.config_set("slowlog-log-slower-than", 1000)
    client.config_set("slowlog-max-len", 128)
    client.slowlog_reset()
    client.flushdb()
    keep_mark(client)
    return {"members": size, "seconds": round(elapsed, 2), "slice": SCHEDULE_SLICE, "script_calls": len(calls),
            "slowest_call_ms": calls[-1] / 1000 if calls else None,
            "p99_call_ms": calls[int(0.99 * (len(calls) - 1))] / 1000 if calls else None,
            "median_call_ms": calls[len(calls) // 2] / 1000 if calls else None}


class OursOnCluster(Ours):
    """Our consumers with the queue on the cluster."""

    workloads = ("burst",)
    measures_create = False

    def __init__(self, record_dir: Path, shards: int) -> None:
        super().__init__(record_dir)
        self.shards = shards
        self.name = f"cluster_{shards}"
        self.label = f"django-order-timeout on a 3-master Redis Cluster, SHARDS={shards}"
        self.extra_env = {"ORDER_TIMEOUT_REDIS_ALIAS": "cluster", "ORDER_TIMEOUT_SHARDS": str(shards)}


def _masters() -> list[Any]:
    from redis.cluster import RedisCluster

    return RedisCluster.from_url(django_settings.CACHES["cluster"]["LOCATION"]).get_primaries()


def _cpu_seconds(nodes: list[Any]) -> dict[str, float]:
    cpu = {}
    for node in nodes:
        info = node.redis_connection.info("cpu")
        cpu[node.name] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return cpu


def cluster_burst(shards: int, orders: int, record_dir: Path, cap_seconds: float) -> dict[str, Any]:
    """``orders`` due at one instant, closed by 2 consumers; closes/s and Redis CPU per master."""
    overrides = {**django_settings.ORDER_TIMEOUT, "REDIS_ALIAS": "cluster", "SHARDS": shards}
    with override_settings(ORDER_TIMEOUT=overrides):
        from redis.cluster import RedisCluster

        cluster = get_redis_connection("cluster")
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        keep_mark(cluster)
        reset()
        system = OursOnCluster(record_dir, shards)
        system.start()
        try:
            start = timezone.now() + timedelta(seconds=2 + orders * 0.00006 * 1.5)
            created = make_orders([start] * orders)
            schedule(created)
            masters = _masters()
            keys_per_master = {node.name: node.redis_connection.dbsize() for node in masters}
            wait = (start - timezone.now()).total_seconds()
            if wait > 0:
                time.sleep(wait)
            cpu_before = _cpu_seconds(masters)
            deadline = time.monotonic() + cap_seconds
            unpaid = Order.objects.filter(status="unpaid", pk__gte=created[0].pk)
            while unpaid.exists() and time.monotonic() < deadline:
                time.sleep(0.25)
            cpu = {name: round(after - cpu_before[name], 2)
                   for name, after in _cpu_seconds(masters).items()}
        finally:
            system.stop()
        commits = [at for pk, at in read_commits(record_dir) if pk >= created[0].pk]
        span = max(commits) - start.timestamp() if commits else None
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        keep_mark(cluster)
    return {"shards": shards, "orders": orders, "closed": len(commits),
            "closes_per_s": len(commits) / span if span else None,
            "drain_s": span if len(commits) == orders else None,
            "keys_per_master": keys_per_master, "redis_cpu_s_per_master": cpu,
            "errors": system.errors}

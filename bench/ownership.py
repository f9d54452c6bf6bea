"""The benchmark empties the Redis databases it runs on: only ever databases that are its own.

A database is the benchmark's when it is empty, or holds the mark the
benchmark left there on an earlier run. Anything else (a shop's cache on a
shared Redis, another project's keys) makes the harness refuse to start.
"""

from __future__ import annotations

from typing import Any

MARK = "order-timeout-bench:owner"


class NotOurs(Exception):
    pass


def claim(client: Any, where: str) -> None:
    """Check that ``client``'s database is ours, then mark it so (a cluster: every master)."""
    from redis.cluster import RedisCluster

    nodes = ([node.redis_connection for node in client.get_primaries()]
             if isinstance(client, RedisCluster) else [client])
    for node in nodes:
        keys = node.dbsize()
        if keys and not node.exists(MARK):
            raise NotOurs(
                f"{where} holds {keys} keys the benchmark did not write; it empties the databases "
                "it runs on, so point it at empty ones (BENCH_REDIS_URL, BENCH_BROKER_URL) or "
                "empty this one yourself.")
    for node in nodes:
        node.set(MARK, "1")


def keep_mark(client: Any) -> None:
    """After a FLUSHDB: the database is still ours."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            node.redis_connection.set(MARK, "1")
    else:
        client.set(MARK, "1")
